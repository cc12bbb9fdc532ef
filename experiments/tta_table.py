"""The tables of ``experiments.time_to_accuracy``: times to target, comparisons with the fixed
codes and the hindsight oracles, the goals of adaptive coding and the worst case over settings.

Every function reads the runs' per-round lists (``virtual_s``, ``accuracy``, ``decode``, ``s``)
as ``time_to_accuracy.one_run`` returns them; nothing here runs a strategy.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ADAPTIVE", "EXACT_FIXED", "GOAL_FACTOR", "build_table", "goals", "nested_key",
           "ratio_ci", "summarize", "times_to_target", "worst_case"]

ADAPTIVE = ("auto", "auto-exclude", "auto-warm", "auto-deadline")
# with the nested s=v schemes (busy clients queued from the simulator's clock): auto's
# hindsight rivals; with the nested-fit s=v schemes (queued from the server's knowledge, as
# auto): the rivals that know what auto knows
EXACT_FIXED = ("uncoded", "exact")


def nested_key(scheme: str) -> tuple[int, int]:
    """``(v, 0)`` for ``nested s=v``, ``(v, 1)`` for ``nested-fit s=v``, ``(v, 2)`` for
    ``oracle s=v``, ``(v, 3)`` for ``deadline-fit s=v`` (legend order)."""
    kinds = ("nested s=", "nested-fit s=", "oracle s=", "deadline-fit s=")
    kind = next(i for i, prefix in enumerate(kinds) if scheme.startswith(prefix))
    return int(scheme.split("=")[-1]), kind


def times_to_target(rs: list, target: float | None) -> np.ndarray:
    """Per run, the virtual time of the first round at or above ``target`` (``nan``: never).

    ``target=None``: the time to the final model, i.e. of the last round, for runs whose
    every round decoded exactly (``nan`` otherwise). Every such run of one seed computes the
    same sequence of models, so this compares the time to the same final model, over all
    rounds: both regimes of a drift setting (a target reached before the switch measures only
    the first regime)."""
    if target is None:
        return np.array([r["virtual_s"][-1] if all(d == "exact" for d in r["decode"])
                         else np.nan for r in rs], dtype=float)
    return np.array([next((t for t, a in zip(r["virtual_s"], r["accuracy"], strict=True)
                           if a >= target), np.nan) for r in rs], dtype=float)


def summarize(runs, target):
    tta = times_to_target(runs, target)
    final = [r["accuracy"][-1] for r in runs]
    return {
        "time_to_target_mean": float(np.nanmean(tta)) if np.isfinite(tta).any() else None,
        "time_to_target_std": float(np.nanstd(tta)) if np.isfinite(tta).any() else None,
        "reached": int(np.isfinite(tta).sum()),
        "final_accuracy_mean": float(np.mean(final)),
        "final_accuracy_std": float(np.std(final)),
    }



def ratio_ci(auto: list, fixed: list, target: float | None,
              draws: int = 4000) -> tuple[float, float]:
    """95% paired bootstrap interval (percentile) of ``mean(auto) / mean(fixed)`` over the
    seeds where both reached the target: seeds resampled with replacement, the same seeds for
    both (runs of one seed share data, partitions and latency draws); ``nan`` with fewer than
    two such seeds. Seeded: the same runs give the same interval."""
    a, f = times_to_target(auto, target), times_to_target(fixed, target)
    if len(a) != len(f):
        return (math.nan, math.nan)
    both = np.isfinite(a) & np.isfinite(f)
    a, f = a[both], f[both]
    if len(a) < 2:
        return (math.nan, math.nan)
    idx = np.random.default_rng(0).integers(0, len(a), size=(draws, len(a)))
    ratio = a[idx].mean(axis=1) / f[idx].mean(axis=1)
    return float(np.quantile(ratio, 0.025)), float(np.quantile(ratio, 0.975))


def build_table(runs: dict, target: float) -> dict:
    """Per configuration and scheme: time to target, final accuracy, gap to uncoded; for
    ``auto`` also its time over the best exact fixed choice (``vs_best_fixed``)."""
    table = {}
    for key, by_scheme in runs.items():
        ref = by_scheme.get("uncoded")
        table[key] = {}
        for scheme, rs in by_scheme.items():
            row = summarize(rs, target)
            if ref is not None and len(ref) == len(rs):
                row["max_accuracy_gap_to_uncoded"] = float(max(
                    np.max(np.abs(np.array(r["accuracy"]) - np.array(u["accuracy"])))
                    for r, u in zip(rs, ref, strict=True)))
            row["exact_rounds"] = float(np.mean([r["decode"].count("exact") for r in rs]))
            row["epsilon"] = rs[0]["epsilon"]
            unc = summarize(ref, target)["time_to_target_mean"] if ref else None
            if row["time_to_target_mean"] and unc:
                row["speedup_vs_uncoded"] = unc / row["time_to_target_mean"]
            table[key][scheme] = row
        for name in ADAPTIVE:
            _compare_with_fixed(table[key], runs[key], name, target)
            _compare_with_fixed(table[key], runs[key], name, None)
        _compare_with_oracle(table[key], runs[key], target)
        _compare_with_oracle(table[key], runs[key], None)
    return table


def _mean_on_seeds(rs: list, target: float | None, seeds: np.ndarray) -> float | None:
    """Mean time to target of ``rs`` over ``seeds`` (auto's), or ``None`` if it did not reach
    the target on each of them."""
    f = times_to_target(rs, target)
    if len(f) != len(seeds) or not np.isfinite(f[seeds]).all():
        return None
    return float(np.mean(f[seeds]))


def _same_information(scheme: str, rs: list) -> bool:
    """A fixed choice whose busy clients are queued by auto's rule from the server's
    knowledge: ``nested-fit s=v``, or an ``oracle s=v`` run that kept one ``s`` in every round
    (``v = s_max``: the same runs as ``nested-fit s=s_max``, checked run for run)."""
    if scheme.startswith("nested-fit s="):
        return True
    return scheme.startswith("oracle s=") and len({s for r in rs for s in r["s"]}) == 1


def _compare_with_oracle(table: dict, runs: dict, target: float | None) -> None:
    """``auto`` against the best ``oracle s=v`` (the best constant ``v`` after the mandated
    round at ``s_max``; not a lower bound: a policy that changes ``s`` can beat it), on the
    seeds where auto reached the target, in place: ``vs_oracle`` (what auto's choices cost
    against it), ``oracle_start_cost`` (its time over the same ``v`` fixed from round 1 with
    the same information, ``nested-fit s=v``: what the round at ``s_max`` costs) and
    ``oracle_vs_best_fixed``; ``target=None``: to the final model (keys end in ``_final``)."""
    auto = table.get("auto")
    if auto is None or (target is not None and not auto["time_to_target_mean"]):
        return
    a = times_to_target(runs["auto"], target)
    seeds = np.isfinite(a)
    if not seeds.any():
        return
    final = "_final" if target is None else ""
    bounds = {}
    for k in runs:
        # forced to one v, a round can lack a decodable set (e.g. v = 0 with a client skipped
        # as too busy): such a run computes other models and is no reference
        if k.startswith("oracle s=") and all(d == "exact" for r in runs[k] for d in r["decode"]):
            mean = _mean_on_seeds(runs[k], target, seeds)
            if mean is not None:
                bounds[k] = mean
    if not bounds:
        return
    best = min(bounds, key=bounds.get)
    auto[f"oracle{final}"] = best
    auto[f"oracle{final}_time"] = bounds[best]
    auto[f"oracle{final}_compared"] = sorted(bounds, key=nested_key)
    auto[f"vs_oracle{final}"] = float(np.mean(a[seeds])) / bounds[best]
    auto[f"vs_oracle{final}_ci95"] = list(ratio_ci(runs["auto"], runs[best], target))
    if f"best_fixed{final}_time" in auto:
        auto[f"oracle_vs_best_fixed{final}"] = bounds[best] / auto[f"best_fixed{final}_time"]
    fixed_v = f"nested-fit s={best.removeprefix('oracle s=')}"
    if _same_information(best, runs[best]):  # v = s_max: no round differs from the fixed v
        auto[f"oracle_start_cost{final}"] = 1.0
    elif fixed_v in runs and (mean := _mean_on_seeds(runs[fixed_v], target, seeds)) is not None:
        auto[f"oracle_start_cost{final}"] = bounds[best] / mean


def _compare_with_fixed(table: dict, runs: dict, name: str, target: float | None) -> None:
    """An adaptive scheme's time over the best exact fixed choice in hindsight, in place;
    ``_with_deadline``: over the best ``deadline-fit s=v`` (fixed codes with the deadline rule
    of ``auto-deadline``), when they were run.

    ``target=None``: the time to the final model instead (keys end in ``_final``; see
    :func:`times_to_target`: only runs whose every round was exact)."""
    auto = table.get(name)
    if auto is None or (target is not None and not auto["time_to_target_mean"]):
        return
    # on the seeds where auto reached the target; a fixed choice competes if it reached
    # it on each of them (exact schemes share the iterates: the same seeds reach it)
    a = times_to_target(runs[name], target)
    seeds = np.isfinite(a)
    if not seeds.any():
        return
    final = "_final" if target is None else ""
    clock = {k for k in table if k.startswith("nested s=")}
    same = {k for k in table if _same_information(k, runs[k])}
    # fixed codes with auto-deadline's rule: rounds may be approximate or skipped, as its
    with_deadline = {k for k in table if k.startswith("deadline-fit s=")}
    reached = {}  # every fixed choice that reached the target on auto's seeds
    for k in table:
        if k in EXACT_FIXED or k in clock or k in same or k in with_deadline:
            mean = _mean_on_seeds(runs[k], target, seeds)
            if mean is not None:
                reached[k] = mean
    for kind, suffix, base in ((clock, "", EXACT_FIXED), (same, "_same_information", EXACT_FIXED),
                               (with_deadline, "_with_deadline", ())):
        fixed = {k: t for k, t in reached.items() if k in base or k in kind}
        if not any(k in kind for k in fixed) and suffix:
            continue  # no such fixed code in this setting
        if fixed:
            best = min(fixed, key=fixed.get)
            suffix += final
            auto[f"best_fixed{suffix}"] = best
            auto[f"best_fixed{suffix}_time"] = fixed[best]
            auto[f"vs_best_fixed{suffix}"] = float(np.mean(a[seeds])) / fixed[best]
            auto[f"fixed_compared{suffix}"] = sorted(fixed)
            auto[f"seeds_compared{final}"] = int(seeds.sum())
            low, high = ratio_ci(runs[name], runs[best], target)
            auto[f"vs_best_fixed{suffix}_ci95"] = [low, high]
    if final and reached:
        auto["time_to_final_model_mean"] = float(np.mean(a[seeds]))



GOAL_FACTOR = 1.05  # an adaptive scheme should take at most this over the best fixed choice
# the comparisons the goals are read from: (table key suffix, what the rivals are, the
# adaptive schemes it is a like-for-like comparison for)
GOAL_RIVALS = (("", "fixed codes queued from the virtual clock, uncoded, exact", ADAPTIVE),
               ("_same_information", "fixed codes with the adaptive scheme's information",
                ADAPTIVE),
               ("_with_deadline", "fixed codes with auto-deadline's deadline rule",
                ("auto-deadline",)))
GOALS_SPEEDUP = (("speedup_pareto", "n=12 s=3 pareto", 2.0),
                 ("speedup_n256_bimodal", "n=256 s=32 bimodal", 1.0))


def goals(table: dict, factor: float = GOAL_FACTOR) -> dict:
    """Each adaptive scheme against the goals of adaptive coding, read from ``table``:

    * ``within``: per rival kind (``GOAL_RIVALS``), the settings where its time to target is at
      most ``factor`` times the best fixed choice's (``vs_best_fixed*``; ``best_fixed``
      names it) and those where it is not (``missed``, with the ratio, ``None`` when the
      scheme did not reach the target on as many seeds as some other scheme of the setting:
      an unbounded ratio); settings where no scheme reached the target on any seed (the DP
      ones) or without that comparison are left out;
    * ``drift``: per ``drift`` / ``drift-early`` setting, its ratio to the best fixed choice
      to the target and to the final model, and whether each is strictly below 1 (``None``:
      not measured, e.g. no time to the final model for a run with rounds that were not
      exact);
    * ``speedup_pareto`` / ``speedup_n256_bimodal``: its speed-up over uncoded there, and
      ``speedup_met``: whether each is at least its goal (2 and 1);
    * ``exact``: the settings where every round was exact and matched the uncoded run
      (``equal``: largest accuracy gap 0), where every round was exact but the accuracy
      differs (``differ``: a broken exactness), and where some rounds were approximate or
      skipped by design (``approximate``: ``auto-deadline``'s missed deadlines).
    """
    out: dict = {}
    for name in ADAPTIVE:
        rows = {key: by[name] for key, by in table.items() if name in by}
        if not rows:
            continue
        result: dict = {"within": {}, "drift": {},
                        "exact": {"equal": [], "differ": [], "approximate": []}}
        for suffix, rivals, schemes in GOAL_RIVALS:
            if name not in schemes:
                continue
            ratios: dict = {}
            best: dict = {}
            for key, r in rows.items():
                ratio = r.get(f"vs_best_fixed{suffix}")
                if ratio is not None:
                    # compared on its seeds: a rival that also reached the target on others
                    # makes the ratio unbounded
                    most = max((table[key][k].get("reached", 0)
                                for k in r.get(f"fixed_compared{suffix}", ()) if k in table[key]),
                               default=0)
                    ratios[key] = ratio if r.get("reached", 0) >= most else math.inf
                    best[key] = r.get(f"best_fixed{suffix}")
                elif not suffix and (table[key].get("uncoded", {}).get("reached", 0)
                                     > r.get("reached", 0)):
                    ratios[key] = math.inf  # uncoded reached the target on a seed it did not
            if ratios:
                result["within"][suffix.lstrip("_") or "hindsight"] = {
                    "rivals": rivals,
                    "met": sorted(k for k, v in ratios.items() if v <= factor),
                    "missed": {k: (v if math.isfinite(v) else None)
                               for k, v in sorted(ratios.items()) if v > factor},
                    "best_fixed": dict(sorted(best.items()))}
        for key, r in rows.items():
            if key.endswith(("drift", "drift-early")):
                to_target, final = r.get("vs_best_fixed"), r.get("vs_best_fixed_final")
                result["drift"][key] = {
                    "to_target": to_target, "to_final_model": final,
                    "strictly_better_to_target": None if to_target is None else to_target < 1,
                    "strictly_better_to_final_model": None if final is None else final < 1}
            rounds = table[key].get("uncoded", {}).get("exact_rounds")
            gap = r.get("max_accuracy_gap_to_uncoded")
            if gap is None or rounds is None:
                continue
            if r.get("exact_rounds") != rounds:
                result["exact"]["approximate"].append(key)
            else:
                result["exact"]["equal" if gap == 0.0 else "differ"].append(key)
        result["speedup_met"] = {}
        for label, key, goal in GOALS_SPEEDUP:
            result[label] = rows.get(key, {}).get("speedup_vs_uncoded")
            if result[label] is not None:
                result["speedup_met"][label] = result[label] >= goal
        out[name] = result
    return out


def _relative_v(v: int, s_max: int) -> str:
    """A fixed tolerance named relative to ``s_max``, so that one name covers every scale."""
    for name, value in (("0", 0), ("s_max", s_max), ("1", 1), ("2", 2),
                        ("s_max/4", s_max // 4), ("s_max/2", s_max // 2)):
        if v == value:
            return name
    return str(v)


def worst_case(table: dict, seeds: int | None = None) -> dict:
    """What not knowing the regime costs: per group of rivals, every fixed choice (named
    relative to ``s_max``: ``s=0``, ``s=1``, ``s=2``, ``s=s_max/4``, ``s=s_max/2``, ``s=s_max``)
    and the adaptive scheme that has the same information, its time to target over the
    fastest of them all in each setting, and the worst of these ratios over the settings
    (``worst``, ``worst_setting``), over all settings (``all``) and per cohort size
    (``n=12``, ...). A choice that did not reach the target on every seed of a setting
    (``seeds``; ``None``: as many as the most of any member) is listed in ``never`` there (an
    unbounded ratio), not in ``worst``, so every ratio compares means over the same seeds;
    ``ran_in`` counts the settings it ran in (``s_max/4`` and ``s_max/2`` are not distinct
    choices at ``s_max = 3``). Groups:

    * ``same_information``: ``auto`` against uncoded (``s=0``), every ``nested-fit s=v``
      (busy clients queued by auto's rule) and, for ``s=s_max``, the faster of ``exact`` and
      ``oracle s=s_max`` (the fixed ``s_max`` queued like auto) where it ran;
    * ``with_deadline``: ``auto-deadline`` against every ``deadline-fit s=v``.

    Only settings where the adaptive scheme and at least two fixed choices ran count, and
    where some member reached the target (not the DP ones)."""
    groups = {"same_information": ("auto", "nested-fit s="),
              "with_deadline": ("auto-deadline", "deadline-fit s=")}
    out: dict = {}
    for group, (adaptive, prefix) in groups.items():
        ratios: dict = {}  # setting -> {member: ratio, inf if it did not reach the target}
        for key, by in table.items():
            if adaptive not in by:
                continue
            s_max = int(key.split(" s=")[1].split()[0])
            members = {f"s={_relative_v(int(k.removeprefix(prefix)), s_max)}": by[k]
                       for k in by if k.startswith(prefix)}
            if group == "same_information":
                if "uncoded" in by:
                    members["s=0"] = by["uncoded"]
                fixed_max = [by[k] for k in ("exact", f"oracle s={s_max}") if k in by]
                if fixed_max:
                    members["s=s_max"] = min(fixed_max, key=lambda r: (
                        -r["reached"], r["time_to_target_mean"] or math.inf))
            if len(members) < 2:
                continue
            members[adaptive] = by[adaptive]
            every = seeds if seeds is not None else max(r["reached"] for r in members.values())
            times = {m: (r["time_to_target_mean"] if r["reached"] >= every
                         and r["time_to_target_mean"] is not None else math.inf)
                     for m, r in members.items()}
            best = min(times.values())
            if math.isfinite(best):
                ratios[key] = {m: t / best for m, t in times.items()}
        scopes = {"all": list(ratios)}
        for key in ratios:
            scopes.setdefault(key.split()[0], []).append(key)
        for scope, keys in scopes.items():
            if not keys:
                continue
            names = sorted({m for k in keys for m in ratios[k]},
                           key=lambda m: (m == adaptive, m))
            finite = {m: {k: ratios[k][m] for k in keys
                          if m in ratios[k] and math.isfinite(ratios[k][m])} for m in names}
            out.setdefault(group, {})[scope] = {
                "settings": keys,
                "worst": {m: max(f.values()) if f else None for m, f in finite.items()},
                "worst_setting": {m: max(f, key=f.get) if f else None
                                  for m, f in finite.items()},
                "never": {m: [k for k in keys if m in ratios[k]
                              and not math.isfinite(ratios[k][m])] for m in names},
                "ran_in": {m: sum(m in ratios[k] for k in keys) for m in names}}
    return out
