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
