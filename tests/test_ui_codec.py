"""The codec in the window, on the scripted FakeEngine: its kernels compiling in the status bar,
and its calibration for the model running in the background (automatically once, or from the
Tools menu), cancellable, never in a question's way. Waits are on signals or conditions."""

from __future__ import annotations

import re
import threading

import pytest
from ui_fixtures import edit_settings, open_window, text_file

from desktop_app import settings as settings_mod
from desktop_app.errors import EngineError
from desktop_app.results import COMPILING, FAILED, READY, CalibrationInfo, PrepState
from desktop_app.settings import Settings
from ui.settings.settings_dialog import SettingsDialog
from ui.testing import FakeEngine

PROGRESS = re.compile(r"^Calibrating the codec for this model… [a-z' ]+ \d+%$")


def compiling(done: int, left_s: float) -> PrepState:
    return PrepState(COMPILING, done, 8, "quantize", 3.0, left_s, done)


def calibrate_calls(engine: FakeEngine) -> int:
    return sum(c[0] == "calibrate" for c in engine.calls)


def settled(window) -> bool:
    """The window knows the model's calibration and the codec is no longer preparing."""
    return window.calibration_known and not window.codec_busy


def ask(qtbot, window, text="What is attention?"):
    with qtbot.waitSignal(window.answer_done, timeout=5000) as blocker:
        window.send(text)
    return blocker.args[0]


def attach(qtbot, window, path: str) -> None:
    with qtbot.waitSignals([window.attach_done, window.documents_changed], timeout=5000):
        window.attach_files([path])


# -- preparing the codec's kernels -------------------------------------------------------------

def test_the_codec_compiling_shows_in_the_status_bar_until_ready(qtbot):
    engine = FakeEngine(step_s=0.002, token_s=0.001).seed()
    engine.codec = PrepState("checking", 0, 8, "", 0.2, 1.0, 0)  # loading from the caches
    window = open_window(qtbot, engine, Settings(calibrate_automatically=False))
    qtbot.waitUntil(window.prep_timer.isActive, timeout=3000)
    assert window.prep_label.isHidden() and window.codec_busy
    engine.codec = compiling(2, 14.2)
    qtbot.waitUntil(lambda: not window.prep_label.isHidden(), timeout=3000)
    assert window.prep_label.text() == "Preparing the codec (once)… 25%, about 14 s left"
    # A question is never held up by it (the engine waits or recomputes on its own).
    assert ask(qtbot, window) is not None
    engine.codec = compiling(6, 4.0)
    qtbot.waitUntil(lambda: window.prep_label.text().endswith("75%, about 4 s left"),
                    timeout=3000)
    engine.codec = compiling(7, 0.3)  # not "about 0 s left"
    qtbot.waitUntil(lambda: window.prep_label.text().endswith("88%, almost done"),
                    timeout=3000)
    engine.codec = PrepState(READY, 8, 8, "", 20.0, 0.0, 8)
    qtbot.waitUntil(window.prep_label.isHidden, timeout=3000)
    assert not window.codec_busy and not window.prep_timer.isActive()  # no more polling
    assert window.statusBar().currentMessage() == ""


def test_a_failed_preparation_is_a_short_note(qtbot):
    engine = FakeEngine(step_s=0.002)
    engine.codec = PrepState(FAILED, 3, 8, "", 5.0, 0.0, 3,
                             "TypingError: no kernel\nTraceback (most recent call last): ...")
    window = open_window(qtbot, engine)
    qtbot.waitUntil(lambda: not window.codec_busy, timeout=3000)
    assert window.statusBar().currentMessage() == (
        "The codec could not be prepared in advance (TypingError: no kernel); it compiles "
        "when first used")
    assert window.prep_label.isHidden()


# -- calibrating the codec for the model ---------------------------------------------------------

def test_an_uncalibrated_model_is_calibrated_once_after_the_first_attach(qtbot, tmp_path):
    engine = FakeEngine(step_s=0.002, token_s=0.001)  # no documents yet
    window = open_window(qtbot, engine)
    qtbot.waitUntil(lambda: settled(window), timeout=3000)
    assert window.calibration_job is None and calibrate_calls(engine) == 0
    engine.step_s = 0.05  # slow enough to watch the progress between the stages
    with qtbot.waitSignal(window.calibration_done, timeout=5000) as blocker:
        attach(qtbot, window, text_file(tmp_path, "a.txt"))
        assert window.calibration_job is not None  # begun as the documents were listed
        assert not window.calibration_bar.isHidden()
        assert not window.calibrate_action.isEnabled()
        qtbot.waitUntil(lambda: PROGRESS.match(window.calibration_bar.label.text()) is not None,
                        timeout=3000)
    assert isinstance(blocker.args[0], CalibrationInfo)
    assert engine.calibration() == blocker.args[0] == window.calibration_info
    assert window.calibration_bar.isHidden() and window.calibrate_action.isEnabled()
    assert window.statusBar().currentMessage() == ("Codec calibrated: new caches use the "
                                                   "model's own levels")
    attach(qtbot, window, text_file(tmp_path, "b.txt"))
    assert window.calibration_job is None and calibrate_calls(engine) == 1


def test_a_cancelled_calibration_stores_nothing_and_is_not_restarted(qtbot, tmp_path):
    engine = FakeEngine(step_s=0.002, token_s=0.001).seed()
    engine.hold["calibrate"] = held = threading.Event()
    window = open_window(qtbot, engine)
    # Documents exist at start: it begins once the codec is ready and the calibration read.
    qtbot.waitUntil(lambda: window.calibration_job is not None, timeout=3000)
    assert window.calibration_bar.label.text() == ("Calibrating the codec for this model… "
                                                   "starting")
    # Questions keep working while it runs.
    assert ask(qtbot, window) is not None
    assert window.calibration_job is not None
    with qtbot.waitSignal(window.calibration_done, timeout=5000) as blocker:
        window.calibration_bar.cancel_button.click()
        assert window.calibration_bar.label.text() == "Cancelling the calibration…"
        assert not window.calibration_bar.cancel_button.isEnabled()
        held.set()
    assert blocker.args == ["cancelled"]
    assert engine.calibration() is None and window.calibration_info is None
    assert window.calibration_bar.isHidden() and window.calibrate_action.isEnabled()
    assert window.statusBar().currentMessage() == (
        "Calibration cancelled: new caches keep model-independent levels; it starts again when "
        'the app does (Settings: "Calibrate it for each model automatically")')
    attach(qtbot, window, text_file(tmp_path, "a.txt"))
    assert window.calibration_job is None and calibrate_calls(engine) == 1


@pytest.mark.parametrize("why", ["the setting is off", "the model is calibrated"])
def test_no_calibration_runs_by_itself(qtbot, tmp_path, why):
    engine = FakeEngine(step_s=0.002, token_s=0.001).seed()
    settings = Settings(calibrate_automatically=why != "the setting is off")
    if why == "the model is calibrated":
        engine.calibrate()
        engine.calls.clear()
    window = open_window(qtbot, engine, settings)
    qtbot.waitUntil(lambda: settled(window), timeout=3000)
    attach(qtbot, window, text_file(tmp_path, "a.txt"))
    assert window.calibration_job is None and window.calibration_bar.isHidden()
    assert calibrate_calls(engine) == 0


def test_a_calibrated_models_documents_cached_before_it_are_moved_at_start(qtbot):
    """Documents cached at the model-independent levels under a model calibrated since (a
    calibration stopped partway, another process's) are moved to its levels in the
    background at start, once, as the calibration's last stage; their rows say their levels."""
    from dataclasses import replace

    engine = FakeEngine(step_s=0.002, token_s=0.001).seed()
    engine.calibrate()
    engine.calls.clear()
    first = min(engine._docs)
    engine._docs[first] = replace(engine._docs[first], levels="model-independent")
    window = open_window(qtbot, engine)
    with qtbot.waitSignal(window.calibration_done, timeout=5000) as blocker:
        qtbot.waitUntil(lambda: settled(window), timeout=3000)
    assert blocker.args[0]["entries"] == 1 and calibrate_calls(engine) == 0
    assert window.statusBar().currentMessage() == ("1 cache(s) stored before the calibration "
                                                   "moved to its levels")
    rows = window.doc_list.list
    qtbot.waitUntil(lambda: "Cached at the model's calibrated levels" in "".join(
        rows.item(i).toolTip() for i in range(rows.count())), timeout=3000)
    assert [c[0] for c in engine.calls].count("relevel") == 1


def test_the_tools_menu_calibrates_on_demand_and_the_settings_say_so(qtbot, monkeypatch):
    engine = FakeEngine(step_s=0.002, token_s=0.001).seed()
    engine.hold["calibrate"] = held = threading.Event()
    window = open_window(qtbot, engine, Settings(calibrate_automatically=False))
    qtbot.waitUntil(lambda: settled(window), timeout=3000)
    tools = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Tools")
    assert window.calibrate_action in tools.actions()
    assert window.calibrate_action.isEnabled()
    assert window.codec_levels_line().startswith("Model-independent levels")
    window.calibrate_action.trigger()
    assert not window.calibrate_action.isEnabled()  # one at a time
    assert window.codec_levels_line().endswith("; calibrating it now…")
    with qtbot.waitSignal(window.calibration_done, timeout=5000) as blocker:
        held.set()
    assert isinstance(blocker.args[0], CalibrationInfo)
    assert window.calibrate_action.isEnabled()
    assert window.codec_levels_line() == ("Calibrated for this model (cccccccc): high 4.0, "
                                          "balanced 2.5, compact 1.5 bits per value")
    shown = []

    def look(dialog: SettingsDialog) -> int:
        shown.append((dialog.calibrate.isChecked(), dialog.codec_levels.text(),
                       dialog.codec_levels.isHidden()))
        return 0

    monkeypatch.setattr("ui.main_window.SettingsDialog.exec", look)
    window.open_settings()
    qtbot.waitUntil(lambda: bool(shown), timeout=3000)
    assert shown == [(False, window.codec_levels_line(), False)]
    assert calibrate_calls(engine) == 1


def test_a_failed_calibration_is_a_message(qtbot):
    engine = FakeEngine(step_s=0.002, token_s=0.001).seed()
    engine.fail_next["calibrate"] = EngineError("not enough memory for a second context")
    window = open_window(qtbot, engine, Settings(calibrate_automatically=False))
    with qtbot.waitSignal(window.calibration_done, timeout=5000) as blocker:
        window.calibrate_action.trigger()
    assert blocker.args == ["not enough memory for a second context"]
    assert window.statusBar().currentMessage() == (
        "The codec could not be calibrated: not enough memory for a second context")
    assert window.calibration_bar.isHidden() and window.calibrate_action.isEnabled()
    assert engine.calibration() is None


def test_turning_the_setting_on_calibrates(qtbot, monkeypatch):
    engine = FakeEngine(step_s=0.002, token_s=0.001).seed()
    window = open_window(qtbot, engine, Settings(calibrate_automatically=False))
    qtbot.waitUntil(lambda: settled(window), timeout=3000)
    assert window.calibration_job is None

    seen = []
    edit_settings(monkeypatch, lambda dialog: (seen.append(dialog.codec_levels.text()),
                                               dialog.calibrate.setChecked(True)))
    with qtbot.waitSignal(window.calibration_done, timeout=5000) as blocker:
        window.open_settings()
    assert isinstance(blocker.args[0], CalibrationInfo)
    assert seen[0].startswith("Model-independent levels")
    assert settings_mod.load().calibrate_automatically


def test_the_settings_dialog_edits_the_setting(qtbot):
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    assert dialog.calibrate.isChecked() and dialog.codec_levels.isHidden()  # no engine: unsaid
    dialog.calibrate.setChecked(False)
    assert dialog.result_settings().calibrate_automatically is False
