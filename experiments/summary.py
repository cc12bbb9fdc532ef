"""The paired summary of a comparison: per method, its runs against ``auto``'s on the same
seeds (geometric mean of per-seed ratios, 95 % Student-t interval on their logarithms), and the
lines ``python -m experiments.compare`` prints.

``python -m experiments.summary FILE.json ...`` restates the intervals of stored summaries
from their per-seed ratios (the runs are not read: the ratios are in the summary)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["fmt", "main", "median_all", "median_known", "median_time", "paired_ratio",
           "print_summary", "ratio_interval", "restate", "summarize"]


def median_known(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not ``None`` (``None`` when there are none)."""
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def median_time(values: Sequence[float | None]) -> float:
    """The median time to target with ``None`` (never reached) counted as infinite (numpy's
    median sorts: a middle value that is infinite makes it infinite)."""
    return float(np.median([np.inf if v is None else float(v) for v in values]))


def median_all(values: Sequence[float | None]) -> float | None:
    """:func:`median_time` for a JSON file: ``None`` when it is infinite or there are no
    values."""
    if not values:
        return None
    median = median_time(values)
    return median if np.isfinite(median) else None


def paired_ratio(new: float | None, old: float | None) -> float:
    """One seed's ratio of times to target ``new / old`` (``None``: not reached): a seed only
    ``old`` reached counts as 2, only ``new`` as 0.5, neither as 1."""
    if new is None:
        return 1.0 if old is None else 2.0
    if old is None:
        return 0.5
    return new / old if old > 0 else (1.0 if new == 0 else 2.0)


def ratio_interval(ratios: Sequence[float]) -> dict[str, Any]:
    """Geometric mean of paired per-seed ratios and its 95 % interval: the Student-t interval
    of the mean of their logarithms (``n - 1`` degrees of freedom), exponentiated; ``None``
    with fewer than two ratios. (A percentile bootstrap over 3 to 10 seeds covers well below
    95 %: its intervals are too narrow.)"""
    from scipy import stats

    logs = np.log(np.asarray(ratios, dtype=np.float64))
    if logs.size == 0:
        return {"geomean": None, "ci95": None}
    mean = float(logs.mean())
    if logs.size < 2:
        return {"geomean": float(np.exp(mean)), "ci95": None}
    half = float(stats.t.ppf(0.975, logs.size - 1) * logs.std(ddof=1) / np.sqrt(logs.size))
    return {"geomean": float(np.exp(mean)),
            "ci95": [float(np.exp(mean - half)), float(np.exp(mean + half))]}


def summarize(runs: Sequence[Mapping[str, Any]], reference: str = "auto") -> dict[str, Any]:
    """Per method: paired per-seed ratios method / ``reference`` (seeds where both are
    defined), their geometric mean and 95 % interval (:func:`ratio_interval`); seeds where
    either missed the target are counted, not guessed."""
    by = {(r["method"], r["seed"]): r for r in runs}
    methods = list(dict.fromkeys(r["method"] for r in runs))
    out: dict[str, Any] = {}
    for method in methods:
        seeds = [s for m, s in by if m == method]
        entry: dict[str, Any] = {
            "seeds": len(seeds),
            "reached_target": sum(by[method, s]["time_to_target"] is not None for s in seeds),
            # over the seeds that reached the target only
            "median_time_to_target": median_known([by[method, s]["time_to_target"]
                                              for s in seeds]),
            # the verdict's: a seed that never reached it counts as infinite (None: the
            # median is such a seed)
            "median_time_to_target_all_seeds": median_all(
                [by[method, s]["time_to_target"] for s in seeds]),
            "mean_final_accuracy": float(np.mean([by[method, s]["final_accuracy"] or 0.0
                                                  for s in seeds])),
            "median_final_accuracy": median_known([by[method, s]["final_accuracy"]
                                                   for s in seeds]),
        }
        if method != reference and any(m == reference for m, _ in by):
            paired = [s for s in seeds if (reference, s) in by]
            for metric in ("time_to_target", "client_compute_s", "bytes_up"):
                ratios = {s: by[method, s][metric] / by[reference, s][metric] for s in paired
                          if by[method, s][metric] and by[reference, s][metric]}
                entry[f"{metric}_vs_{reference}"] = {
                    "per_seed": {str(s): ratios.get(s) for s in paired},
                    **ratio_interval(list(ratios.values())),
                }
        out[method] = entry
    return out


def fmt(value: float | None, spec: str = ".2f") -> str:
    """``value`` formatted with ``spec``; ``-`` for ``None``."""
    return "-" if value is None else format(value, spec)



def print_summary(result: Mapping[str, Any], reference: str = "auto") -> None:
    """One line per method (seeds that reached the target, median time and final accuracy,
    its time over ``reference``'s, paired per seed), then what the medians count."""
    summary = result["summary"]
    ref = summary.get(reference)
    for method, entry in summary.items():
        ratio = entry.get(f"time_to_target_vs_{reference}", {})
        median = entry.get("median_time_to_target_all_seeds")
        paired = sum(v is not None for v in ratio.get("per_seed", {}).values())
        both = f"the {paired} seeds where both reached the target"
        print(f"{method:>16}: reached {entry['reached_target']}/{entry['seeds']}, median "
              f"time {'∞' if median is None else format(median, '.2f') + ' s'}, median "
              f"final {fmt(entry.get('median_final_accuracy'), '.3f')}"
              + (f", time / {reference} {fmt(ratio['geomean'])} [{fmt(ratio['ci95'][0])}, "
                 f"{fmt(ratio['ci95'][1])}] over {both}"
                 if ratio and ratio.get("geomean") is not None and ratio.get("ci95")
                 else f", time / {reference} {fmt(ratio['geomean'])} on one seed (no "
                 "interval)" if ratio and ratio.get("geomean") is not None
                 else f", time / {reference}: no seed where both reached the target ("
                 f"{reference} {ref['reached_target']}/{ref['seeds']})" if ratio and ref
                 else ""))
    print("  (median time: over every seed, one that never reached the target counting as ∞"
          + ("" if ref is not None or not summary else
             f"; no time / {reference}: {reference} did not run, give it in --methods for "
             "the paired ratios") + ")")


def restate(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` with every paired entry's geometric mean and interval recomputed from its
    stored per-seed ratios (:func:`ratio_interval`)."""
    out: dict[str, Any] = {}
    for method, entry in summary.items():
        entry = dict(entry)
        for key, value in list(entry.items()):
            if isinstance(value, Mapping) and "per_seed" in value:
                ratios = [r for r in value["per_seed"].values() if r is not None]
                entry[key] = {**value, **ratio_interval(ratios)}
        out[method] = entry
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Restate the intervals of the summaries in each JSON file given (a comparison's, or a
    grid's under ``cells``), in place."""
    import argparse
    import json
    from pathlib import Path

    from experiments.common import dumps

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    for path in parser.parse_args(argv).files:
        text = path.read_text()
        data = json.loads(text)
        # written back as it was written (an older file: plain indented JSON)
        write = dumps if text == dumps(data) else (lambda value: json.dumps(value, indent=2))
        holders = list(data["cells"].values()) if "cells" in data else [data]
        for holder in holders:
            if holder.get("summary"):
                holder["summary"] = restate(holder["summary"])
        path.write_text(write(data))
        print(f"summary: restated {len(holders)} summaries in {path}")


if __name__ == "__main__":
    main()
