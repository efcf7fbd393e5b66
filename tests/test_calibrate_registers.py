"""The built-in calibration registers: shipped, long enough, and refused by a clear error when
named wrongly."""

from __future__ import annotations

import pytest

from desktop_app.calibration import calibrate, registers


def test_the_structured_register_is_shipped_and_differs_from_the_prose_text():
    text = registers.text("calibration-structured.txt")
    assert len(text) > 4000  # ~1,370 SmolLM2 tokens: 768 + 256 with room
    assert text != calibration_prose()
    assert "[station]" in text  # a configuration passage, not prose


def calibration_prose() -> str:
    return calibrate.calibration_text()


def test_an_unknown_register_is_a_clear_error():
    with pytest.raises(ValueError, match="no built-in calibration text"):
        registers.text("nonexistent.txt")
