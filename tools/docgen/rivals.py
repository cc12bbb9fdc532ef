"""The rivals block: ``python -m experiments.compare --grid``'s cells (results/compare.json) as
one table, method by latency regime."""

from __future__ import annotations

from tools.docgen.core import RESULTS, block, load, table

COMPARE = "compare.json"


def _label(cell: dict, groups: int) -> str:
    s = cell["settings"]
    if groups == 1:
        return s["latency"]
    return f"{s['latency']} ({s['task']}, {s['n']}×{s['cohort']})"


def _ratio(entry: dict | None, seeds: int, auto: dict | None = None) -> str:
    """``geomean [lo, hi] (k/N)`` with a marker where the rival is faster than auto (▼ also
    where auto never reached the target and the rival did)."""
    if entry is None:
        return "not run"
    ratio = entry.get("time_to_target_vs_auto", {})
    per_seed = ratio.get("per_seed", {})
    both = sum(v is not None for v in per_seed.values())
    reached = f"{entry['reached_target']}/{entry['seeds']}"
    if ratio.get("geomean") is None:
        if auto is not None and auto["reached_target"] == 0 and entry["reached_target"]:
            return f"auto never reached the target; this method {reached} ▼"
        return f"no paired seed (reached {reached})"
    lo, hi = ratio["ci95"]
    mark = " ▼" if hi < 1.0 else " ▽" if ratio["geomean"] < 1.0 else ""
    text = f"{ratio['geomean']:.2f} [{lo:.2f}, {hi:.2f}]{mark}"
    return text + ("" if both == seeds and entry["reached_target"] == seeds
                   else f" (paired {both}/{seeds}, reached {reached})")


@block("compare-table")
def compare_table() -> str:
    if not (RESULTS / COMPARE).exists():
        return "No cell of the grid has been run yet (`results/compare.json` is missing)."
    d = load(COMPARE)
    cells = [d["cells"][name] for name in d["done"]]
    if not cells:
        return "No cell of the grid has been run yet."
    groups = len({(c["settings"]["task"], c["settings"]["n"], c["settings"]["cohort"])
                  for c in cells})
    methods = list(dict.fromkeys(m for c in cells for m in c["settings"]["methods"]))
    header = ["method", *(_label(c, groups) for c in cells)]
    auto = ["auto: median time to target (reached)"]
    for c in cells:
        entry = c["summary"].get("auto")
        auto.append("not run" if entry is None else
                    f"{entry['median_time_to_target']:.1f} s "
                    f"({entry['reached_target']}/{entry['seeds']})"
                    if entry["median_time_to_target"] is not None else
                    f"never ({entry['reached_target']}/{entry['seeds']})")
    rows = [auto]
    for method in methods:
        if method == "auto":
            continue
        rows.append([method, *(_ratio(c["summary"].get(method), len(c["settings"]["seeds"]),
                                      c["summary"].get("auto")) for c in cells)])
    first = cells[0]["settings"]
    same = all(c["settings"]["seeds"] == first["seeds"] for c in cells)
    seeds = (f"evaluation seeds {first['seeds'][0]}-{first['seeds'][-1]}" if same
             else "each cell's seeds")
    scope = (f"{first['task']}, n = {first['n']}, cohort {first['cohort']}, "
             if groups == 1 else "")
    not_run = sorted({m for c in cells for m in c.get("methods_not_run", [])})
    est = d.get("estimate", {})
    notes = [
        f"Time to target of each method over auto's ({scope}{first['rounds']} rounds, "
        f"{seeds}, paired by seed): geometric mean of the per-seed ratios and its 95 % "
        "bootstrap interval over seeds, as `experiments/grid.toml` states. Below 1 the "
        "rival reaches the target sooner than auto: ▼ the whole interval is below 1, "
        "▽ only the geometric mean (▼ also where auto never reached the target and the "
        "rival did). A seed counts only where both reached the target "
        "(else the pair is named).",
        f"Cells run: {len(cells)} of {len(d['done']) + len(d['not_done'])} "
        f"({', '.join(d['done'])}); wall time "
        + ", ".join(f"{c['runtime_s'] / 60:.0f} min" for c in cells) + " on this machine."]
    if not_run:
        notes.append("Not run yet in these cells: " + ", ".join(not_run) + ".")
    if est.get("whole_grid_s"):
        notes.append(f"The whole grid, extrapolated from these cells' run times: about "
                     f"{est['whole_grid_s'] / 3600:.0f} h on this machine "
                     f"({est['remaining_s'] / 3600:.0f} h left).")
    return table(header, rows) + "\n\n" + "\n\n".join(notes)
