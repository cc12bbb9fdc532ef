"""The paired summary ``python -m experiments.compare`` stores and prints beside its runs."""

from __future__ import annotations

from experiments.summary import print_summary, summarize


def test_the_summary_median_counts_an_unreached_seed_as_the_verdict_does(capsys):
    """The verdict's median: a seed that never reached the target is infinite (here the
    sorted times are 1, 2, inf, inf, inf: the median is inf, not the reached seeds' 1.5)."""
    def run(method, seed, time, final):
        return {"method": method, "seed": seed, "time_to_target": time,
                "final_accuracy": final, "client_compute_s": 1.0, "bytes_up": 1}

    runs = [run("auto", s, t, f) for s, t, f in [(0, 1.0, 0.9), (1, 2.0, 0.8),
                                                 (2, None, 0.5), (3, None, 0.6),
                                                 (4, None, 0.7)]]
    runs += [run("fedbuff", s, t, 0.9) for s, t in [(0, 3.0), (1, 1.0), (2, None), (3, 2.0),
                                                    (4, 9.0)]]
    summary = summarize(runs, {"bootstrap_resamples": 10, "bootstrap_seed": 0})
    auto, fedbuff = summary["auto"], summary["fedbuff"]
    assert auto["median_time_to_target"] == 1.5  # reached seeds only, as named
    assert auto["median_time_to_target_all_seeds"] is None  # infinite
    assert auto["median_final_accuracy"] == 0.7
    assert fedbuff["median_time_to_target_all_seeds"] == 3.0  # 1, 2, 3, 9, inf
    print_summary({"summary": summary})
    lines = capsys.readouterr().out.splitlines()
    assert "median time ∞" in lines[0] and "median time 3.00 s" in lines[1]
