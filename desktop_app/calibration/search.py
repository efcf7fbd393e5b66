"""The level search's bisection: the coarsest codec scale at which a level keeps its
contract, with the margins of `calibrate.Settings`, on the calibration text and on every
further register (registers.py).

`measure(scale)` is the caller's: it returns a row ({"kld", "top1", "kld_se", "top1_se",
"scale"}, and with registers their rows under "registers"). This module only decides where to
measure and which row to keep: it must never run a model or build a level itself.
"""

from __future__ import annotations

import numpy as np


def _goal(metric: str, target: float, cont_tokens: int, settings) -> float:
    if metric == "kld":
        return target * settings.kld_margin
    return target + settings.top1_z * np.sqrt(max(target * (1 - target), 0.0) / cont_tokens)


def _holds(row: dict, metric: str, goal: float) -> bool:
    return row[metric] <= goal if metric == "kld" else row[metric] >= goal


def place(measure, metric: str, target: float, lo_scale: float, hi_scale: float,
           settings, others: dict | None = None) -> tuple[float, dict]:
    """Bisect log(scale) in [lo_scale, hi_scale] for the coarsest scale whose row keeps the
    contract's target with margin: `high` at settings.kld_margin of its KLD budget; a top-1
    level settings.top1_z binomial standard errors above its target on the scored tokens (the
    measurement's own noise: a level placed on its target exactly misses on half the texts),
    then at settings.top1_kld_safety of the KLD at which that held. `others` ({register:
    (target, scored tokens)}): the row's "registers" must hold theirs too, in both stages
    (when none ever does, the fallback of `bisect` is judged on the calibration text)."""
    goal = _goal(metric, target, settings.cont_tokens, settings)
    goals = {n: _goal(metric, t, m, settings) for n, (t, m) in (others or {}).items()}

    def everywhere(r, metric, goal, goals):
        return _holds(r, metric, goal) and all(_holds(r["registers"][n], metric, g)
                                               for n, g in goals.items())

    best = bisect(measure, lo_scale, hi_scale, lambda r: everywhere(r, metric, goal, goals),
                   metric, settings.iterations)
    if (metric == "top1" and best["met"] and settings.top1_kld_safety < 1
            and settings.iterations > 2):
        kld_goal = best["kld"] * settings.top1_kld_safety
        kld_goals = {n: best["registers"][n]["kld"] * settings.top1_kld_safety for n in goals}
        safe = bisect(measure, lo_scale, best["scale"],
                       lambda r: everywhere(r, "kld", kld_goal, kld_goals), "kld",
                       settings.iterations - 2)
        # top-1 held at a coarser scale already
        best = {**safe, "met": True, "kld_goal": kld_goal, "kld_goal_met": safe["met"]}
    best["goal"] = goal
    if goals:
        best["register_goals"] = goals
    return best["scale"], best


def bisect(measure, lo_scale: float, hi_scale: float, ok, metric: str,
            iterations: int) -> dict:
    """The coarsest measured row that is ok (bisecting log(scale)), marked "met". When every
    row misses (the finest tried too), finer scales buy bits that the measurement cannot tell
    apart: a layer whose alphabet is full codes the same at any finer step (RESULTS, "Per-
    component steps": pca-kv's `high` missed by 0.0002 at every scale, and the finest put 128
    bins everywhere for 4.1-4.2 bits, where a 4x coarser scale kept the contract on both
    held-out texts at 3.3-3.4). Then the coarsest row within one standard error of the best
    measured value, marked "met": False."""
    lo, hi = np.log(lo_scale), np.log(hi_scale)
    rows, best = [], None
    for _ in range(iterations):
        mid = (lo + hi) / 2
        row = measure(float(np.exp(mid)))
        rows.append(row)
        if ok(row):
            lo, best = mid, row
        else:
            hi = mid
    if best is not None:
        return {**best, "met": True}
    sign = 1.0 if metric == "kld" else -1.0  # lower KLD, higher top-1 is better
    top = min(rows, key=lambda r: sign * r[metric])
    near = [r for r in rows if sign * (r[metric] - top[metric]) <= top[f"{metric}_se"]]
    return {**max(near, key=lambda r: r["scale"]), "met": False}
