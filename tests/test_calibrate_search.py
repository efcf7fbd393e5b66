"""The level search on a scripted rate-quality curve (no model): where it places a level when
the contract holds, and where when even its finest scale misses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from desktop_app.calibration import calibrate, search

SETTINGS = calibrate.Settings(iterations=7, cont_tokens=256)


def curve(floor: float, se: float = 0.0005):
    """KLD falling with the scale until the layers' alphabets are full (below scale 1 every
    layer has 128 bins: the same bytes, the same KLD); bits rise as the scale falls."""
    seen = []

    def measure(scale: float) -> dict:
        kld = floor + 0.002 * max(scale - 1.0, 0.0)
        bits = 3.0 - np.log2(scale) if scale > 1 else 3.0
        seen.append(scale)
        return {"kld": kld, "kld_se": se, "top1": 0.97, "top1_se": 0.01,
                "bits_per_element": bits, "scale": scale}

    return measure, seen


def test_a_level_that_keeps_its_contract_gets_the_coarsest_scale_that_does():
    measure, seen = curve(floor=0.001)
    scale, row = search.place(measure, "kld", 0.01, 1 / 64, 64.0, SETTINGS)
    assert row["met"] and row["kld"] <= 0.01 * SETTINGS.kld_margin
    # the next scale tried above it missed
    assert all(measure(s)["kld"] > 0.008 for s in list(seen) if s > scale)


def test_when_every_scale_misses_it_keeps_the_cheapest_scale_within_the_noise():
    # the goal (0.8 x 0.0056 = 0.00448) lies below what any scale reaches (0.0047)
    measure, seen = curve(floor=0.0047)
    scale, row = search.place(measure, "kld", 0.0056, 1 / 512, 64.0, SETTINGS)
    assert row["met"] is False
    # not the finest scale (which buys bits and no measurable quality) ...
    assert scale > min(seen) * 100
    # ... but still within one standard error of the best KLD measured
    assert row["kld"] - 0.0047 <= 0.0005
    coarser = [s for s in list(seen) if s > scale]
    assert all(measure(s)["kld"] - 0.0047 > 0.0005 for s in coarser)
def test_a_top1_level_aims_above_its_target_by_the_measurements_noise():
    def measure(scale):
        top1 = 0.99 - 0.01 * scale
        return {"kld": 0.01 * scale, "kld_se": 0.001, "top1": top1,
                "top1_se": np.sqrt(top1 * (1 - top1) / 256), "scale": scale}

    no_kld = dataclasses.replace(SETTINGS, top1_kld_safety=1.0)
    _, row = search.place(measure, "top1", 0.94, 1 / 64, 64.0, no_kld)
    noise = np.sqrt(0.94 * 0.06 / 256)
    assert row["goal"] == pytest.approx(0.94 + noise)
    assert row["met"] and row["top1"] >= 0.94 + noise
    wider = dataclasses.replace(no_kld, top1_z=2.0)
    _, strict = search.place(measure, "top1", 0.94, 1 / 64, 64.0, wider)
    assert strict["scale"] < row["scale"]


def two_registers(main_drop: float, other_drop: float):
    """Top-1 falling with the scale on the calibration text and, faster, on another register
    (KLD twice as high there and in proportion to the scale, on the calibration text in
    proportion to its square)."""

    def row(scale, drop, kld):
        top1 = 0.99 - drop * scale
        return {"kld": kld, "kld_se": 0.001, "top1": top1,
                "top1_se": np.sqrt(top1 * (1 - top1) / 256)}

    def measure(scale):
        return {**row(scale, main_drop, 0.01 * scale**2), "scale": scale,
                "registers": {"other": row(scale, other_drop, 0.02 * scale)}}

    return measure


def test_a_level_holds_on_every_register_the_worst_one_deciding():
    measure = two_registers(0.01, 0.03)
    no_kld = dataclasses.replace(SETTINGS, top1_kld_safety=1.0)
    alone, _ = search.place(lambda s: {k: v for k, v in measure(s).items() if k != "registers"},
                            "top1", 0.94, 1 / 64, 64.0, no_kld)
    scale, row = search.place(measure, "top1", 0.94, 1 / 64, 64.0, no_kld,
                              {"other": (0.93, 256)})
    goal = 0.93 + np.sqrt(0.93 * 0.07 / 256)
    assert row["met"] and row["registers"]["other"]["top1"] >= goal
    assert row["register_goals"]["other"] == pytest.approx(goal)
    assert scale < alone / 2  # the other register's top-1 falls three times as fast


def test_the_second_stage_halves_every_registers_kld():
    measure = two_registers(0.01, 0.03)
    first, _ = search.place(measure, "top1", 0.94, 1 / 64, 64.0,
                            dataclasses.replace(SETTINGS, top1_kld_safety=1.0),
                            {"other": (0.93, 256)})
    scale, row = search.place(measure, "top1", 0.94, 1 / 64, 64.0, SETTINGS,
                              {"other": (0.93, 256)})
    # halving the calibration text's KLD alone would stop at first / sqrt(2)
    assert row["kld_goal_met"] and scale <= first / 2 * 1.001
    assert row["registers"]["other"]["kld"] <= 0.02 * first / 2 * 1.001
