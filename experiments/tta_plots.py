"""The figures of ``experiments.time_to_accuracy``: accuracy against virtual time per setting,
and the adaptive schemes against their goals."""

from __future__ import annotations

import numpy as np

from experiments.common import pyplot
from experiments.time_to_accuracy import ON_REQUEST, SCHEMES
from experiments.tta_table import ADAPTIVE, GOAL_FACTOR, nested_key

__all__ = ["SCHEME_COLORS", "plot", "plot_adaptive"]

# one colour per scheme in every figure (approx-deadline-stop shares approx-deadline's)
SCHEME_COLORS = dict(zip([*SCHEMES, *ON_REQUEST],
                         ["C0", "C1", "C2", "C3", "C4", "C5", "C8", "C6", "C3", "C9"],
                         strict=True))


def plot_adaptive(table: dict, factor: float = GOAL_FACTOR):
    """The goals at a glance: per setting (without DP), the time to target of ``auto``,
    ``auto-warm`` and ``auto-deadline`` (``auto-exclude``, identical to ``auto`` in most
    settings, is left out) over the best fixed choice with the same information (left;
    ``auto-deadline``: with the same deadline rule where those rivals ran, hollow: against
    rivals without a deadline), with its 95% paired bootstrap interval (an ``x`` at the right
    edge: no ratio, it did not reach the target), and its speed-up over uncoded (right)."""
    plt = pyplot()
    from matplotlib import ticker

    keys = [k for k in table if not k.endswith("+DP")
            and any(name in table[k] for name in ADAPTIVE)]
    names = [x for x in ("auto", "auto-warm", "auto-deadline") if any(x in table[k] for k in keys)]
    colors = SCHEME_COLORS
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.42 * len(keys) + 1.8), sharey=True,
                                      gridspec_kw={"width_ratios": (3, 2)})
    offsets = dict(zip(names, (np.linspace(-0.25, 0.25, len(names)) if len(names) > 1
                               else [0.0]), strict=True))
    never = []  # (y, colour) of schemes without a ratio
    for name in names:
        for row, key in enumerate(keys):
            r = table[key].get(name)
            if r is None:
                continue
            y = row + offsets[name]
            suffix = "_same_information"
            if name == "auto-deadline" and r.get("vs_best_fixed_with_deadline") is not None:
                suffix = "_with_deadline"
            hollow = name == "auto-deadline" and suffix == "_same_information"
            ratio = r.get(f"vs_best_fixed{suffix}")
            if ratio is not None:
                ci = r.get(f"vs_best_fixed{suffix}_ci95") or [None, None]
                if None not in ci and all(np.isfinite(ci)):
                    left.plot(ci, [y, y], color=colors[name], lw=1.2)
                left.plot([ratio], [y], "o", color=colors[name], ms=5,
                          mfc="white" if hollow else colors[name])
            else:
                never.append((y, colors[name]))
            speed = r.get("speedup_vs_uncoded")
            if speed is not None:
                right.plot([speed], [y], "o", color=colors[name], ms=5)
    for name in names:  # legend entries
        left.plot([], [], "o-", color=colors[name], label=name)
    left.plot([], [], "o", color=colors["auto-deadline"], mfc="white",
              label="auto-deadline, rivals without a deadline")
    left.axvline(1.0, color="k", lw=0.8)
    left.axvline(factor, color="k", lw=0.8, ls="--", label=f"{factor:g}x (the goal's factor)")
    xmax = left.get_xlim()[1]
    left.set_xlim(right=xmax)
    for y, color in never:  # at the right edge, once the limits are known
        left.plot([xmax], [y], "x", color=color, ms=6, clip_on=False)
    left.set_xlabel("time to target / best fixed choice with the same information "
                    "(auto-deadline: the same deadline rule), 95% CI", fontsize=8)
    left.set_yticks(range(len(keys)), keys, fontsize=8)
    left.invert_yaxis()
    fig.legend(*left.get_legend_handles_labels(), loc="upper center", ncol=5, fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 0.985))
    right.axvline(1.0, color="k", lw=0.8)
    right.set_xscale("log")
    right.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=6))
    right.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    right.xaxis.set_minor_formatter(ticker.NullFormatter())
    right.set_xlabel("speed-up over uncoded (time to target)", fontsize=8)
    for ax in (left, right):
        ax.grid(True, axis="x", lw=0.3, alpha=0.5)
        ax.tick_params(labelsize=7)
        for row in range(len(keys)):
            ax.axhline(row + 0.5, color="0.85", lw=0.5)
    fig.suptitle("Adaptive coding against its goals (mean over seeds)", fontsize=10, y=1.02)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def plot(runs: dict, target: float):
    plt = pyplot()
    from matplotlib import ticker

    keys = list(runs)
    cols = min(3, len(keys))
    rows_ = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(5.2 * cols, 3.9 * rows_), squeeze=False)
    main_colors = SCHEME_COLORS
    handles = {}
    nested = sorted({nested_key(s)[0] for by in runs.values() for s in by
                     if s not in main_colors
                     and not s.startswith(("oracle s=", "deadline-fit s="))})
    # one grey level per tolerance in every panel (darker: smaller s); dotted: nested-fit
    shades = dict(zip(nested, np.linspace(0.15, 0.7, max(len(nested), 1)), strict=False))
    for ax, key in zip(axes.flat, keys, strict=False):
        for scheme, rs in runs[key].items():
            if scheme.startswith(("oracle s=", "deadline-fit s=")):
                continue  # hindsight references, deadline rivals: in the table only
            t = np.mean([r["virtual_s"] for r in rs], axis=0)
            a = np.mean([r["accuracy"] for r in rs], axis=0)
            if scheme in main_colors:
                style = {"color": main_colors[scheme], "lw": 2.0 if scheme in ADAPTIVE else 1.3}
                if scheme == "auto-exclude":  # dashed: auto stays visible where they agree
                    style["ls"] = "--"
                if scheme in ON_REQUEST:  # dash-dot: the scheme it varies keeps its colour
                    style["ls"] = "-."
            else:
                v, fit = nested_key(scheme)
                style = {"color": str(shades[v]), "lw": 0.9, "ls": ":" if fit else "--"}
            (line,) = ax.plot(t, a, label=scheme, **style)
            handles.setdefault(scheme, line)
        ax.axhline(target, color="k", lw=0.6, ls=":")
        ax.set_title(key, fontsize=9, pad=4)
        ax.set_xlabel("virtual time (s)", fontsize=8)
        ax.set_ylabel("test accuracy", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xscale("log")
        # few, plain tick labels: log axes spanning less than a decade otherwise print every
        # minor tick in scientific notation on top of each other
        ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=6))
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_locator(ticker.LogLocator(base=10, subs="auto", numticks=12))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    order = [s for s in main_colors if s in handles]
    order += sorted((s for s in handles if s not in main_colors), key=nested_key)
    fig.legend([handles[s] for s in order], order, loc="upper center", ncol=min(len(order), 9),
               fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(f"time to {target:.0%} test accuracy (mean over seeds; nested s=v: fixed "
                 "tolerance on auto's placement; dotted nested-fit: busy clients queued from "
                 "the server's knowledge, as auto)", fontsize=10, y=1.025)
    fig.tight_layout(rect=(0, 0, 1, 0.97), h_pad=1.6, w_pad=1.2)
    return fig
