"""`docs` says which levels a document's cache uses: the model's calibrated ones, the
model-independent ones (stored before the model was calibrated), or lossless only until the
calibration (probe 120: nothing said it)."""

from __future__ import annotations

from desktop_app.cli.listings import level_words
from desktop_app.results import CalibrationInfo


def test_docs_says_which_levels_a_cache_uses():
    words = level_words(None)
    assert words["model-independent"] == (" at model-independent levels until this model is "
                                           "calibrated (kvdesk calibrate)")
    assert words["lossless-until-calibrated"].startswith(", lossless only until this model "
                                                         "is calibrated")
    cal = CalibrationInfo("c" * 64, "m.gguf", 1_700_000_000.0, 1.0, "centred", {}, {})
    assert "(calibrated ones since 2023-11-1" in level_words(cal)["model-independent"]
    assert "kvdesk calibrate moves it to them" in level_words(cal)["model-independent"]
