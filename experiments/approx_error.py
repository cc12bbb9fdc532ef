"""Experiment 3: approximate decoding error vs number of stragglers.

``n = k = 96`` clients, load ``d = 4`` for the coded schemes, ``r`` uniformly random
stragglers: mean ``||B_F^T a - 1||^2 / k`` of ignore-stragglers (``a = 1``, and rescaled
``n/(n-r)``), FRC with optimal decoding (and its closed form ``C(n-d, r-d)/C(n, r)``), the
Bernoulli code and the expander code with optimal (least-squares) decoding, and the expander's
fixed decoder with its spectral bound (Charles et al. 2017; Raviv et al. 2018).

Run: ``python -m experiments.approx_error [--quick] [--out results/approx_error]``.
"""

from __future__ import annotations

import argparse

import numpy as np

from experiments.common import progress, pyplot, save
from fl_gradcode.codes import frc_expected_error, make_code


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/approx_error")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n, d = 96, 4
    trials = 20 if args.quick else 150
    rs = [0, 2, 5, 10, 20, 30, 48, 60, 72, 84]
    codes = {
        "ignore (a=1)": make_code("ignore-stragglers", n=n, s=d - 1),
        "ignore (rescaled)": make_code("ignore-stragglers", n=n, s=d - 1, rescale=True),
        "FRC, optimal": make_code("frc", n=n, s=d - 1),
        "BGC, least squares": make_code("bgc", n=n, s=d - 1, seed=args.seed),
        "expander, least squares": make_code("expander", n=n, s=d - 1, seed=args.seed),
    }
    expander = codes["expander, least squares"]
    rng = np.random.default_rng(args.seed)
    result = {"n": n, "load": d, "trials": trials, "r": rs,
              "mean_error": {name: [] for name in codes}, "expander_fixed": [],
              "expander_bound": [], "frc_closed_form": []}
    for r in progress(rs, "approximate decoding error"):
        sets = [np.sort(rng.choice(n, size=n - r, replace=False)).tolist() for _ in range(trials)]
        for name, code in codes.items():
            errors = [code.decoding_error(f) for f in sets]
            result["mean_error"][name].append(float(np.mean(errors)))
        result["expander_fixed"].append(float(np.mean(
            [expander.decoding_error(f, expander.fixed_decoding_vector(f)) for f in sets])))
        result["expander_bound"].append(expander.error_bound(r))
        result["frc_closed_form"].append(frc_expected_error(n, d, r))
    result["expander_lambda"] = expander.spectral_lambda
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, errs in result["mean_error"].items():
        ax.plot(rs, errs, "o-", ms=3, label=name)
    ax.plot(rs, result["frc_closed_form"], "k:", label="FRC closed form")
    ax.plot(rs, result["expander_fixed"], "s--", ms=3, label="expander, fixed n/(n-r)")
    ax.plot(rs, result["expander_bound"], ":", label="expander spectral bound")
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.set_xlabel("number of stragglers r")
    ax.set_ylabel("mean decoding error ||B_F^T a - 1||^2 / k")
    ax.set_title(f"n = k = {n}, load {d}, {trials} random straggler sets per r")
    ax.legend(fontsize=8)
    print(f"{'r':>4}" + "".join(f"{name[:18]:>20}" for name in result["mean_error"]))
    for i, r in enumerate(rs):
        print(f"{r:>4}" + "".join(f"{v[i]:>20.4f}" for v in result["mean_error"].values()))
    save(result, args.out, fig)
    return result


if __name__ == "__main__":
    main()
