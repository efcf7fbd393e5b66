"""What the window shows of the background passage pass, and its Pause (probe 119): the
document, the count and the time left in the status bar, as calibration's bar shows its own;
and a long status-bar message cut to fit, whole in its tooltip. On the scripted FakeEngine."""

from __future__ import annotations

from ui_fixtures import (
    engine_fixture,  # noqa: F401 (a fixture)
    open_window,
    window_fixture,  # noqa: F401 (a fixture)
)

from desktop_app.passagepass import PassagePass
from desktop_app.settings import Settings
from ui.library import passage_status

WORKING = PassagePass(7, "manbook.txt", 89, 4003, per_minute=30.0, queued=1)


def _refreshed(qtbot, window):
    with qtbot.waitSignal(window.documents_changed, timeout=5000):
        window.refresh_documents()


def test_the_status_bar_shows_the_pass_and_pauses_and_resumes_it(qtbot, window, engine,
                                                                  monkeypatch):
    """The window used a core for hours saying nothing; the only control was a setting."""
    monkeypatch.setattr(passage_status, "PASS_POLL_MS", 50)
    window.pass_timer.setInterval(50)
    bar = window.passage_bar
    assert not bar.isVisibleTo(window)  # nothing running: nothing shown
    engine.pass_state = WORKING
    _refreshed(qtbot, window)
    assert bar.isVisibleTo(window)
    assert bar.label.text() == ("Caching passages: manbook.txt 89 of 4,003 (about 2 h 10 min "
                                "left; 1 more document after it)")
    assert "30 a minute" in bar.label.toolTip()
    assert bar.bar.value() == 2 and bar.button.text() == "Pause"
    assert "until Resume, or until kvdesk next starts" in bar.button.toolTip()
    bar.button.click()
    qtbot.waitUntil(lambda: bar.button.text() == "Resume", timeout=5000)
    assert engine.last_call("pause_passages") == ("pause_passages", True)
    assert bar.label.text() == "Passage caching paused: manbook.txt 89 of 4,003 (1 more " \
                               "document after it)"
    bar.button.click()
    qtbot.waitUntil(lambda: bar.button.text() == "Pause", timeout=5000)
    assert engine.last_call("pause_passages") == ("pause_passages", False)
    # Followed while it works (from the engine's memory): it moves on, then ends.
    engine.pass_state = PassagePass(7, "manbook.txt", 90, 4003, per_minute=30.0)
    qtbot.waitUntil(lambda: "90 of 4,003" in bar.label.text(), timeout=5000)
    engine.pass_state = PassagePass()
    qtbot.waitUntil(lambda: not bar.isVisibleTo(window), timeout=5000)
    assert "passage_pass" not in engine.on_gui_thread


def test_a_long_status_bar_message_is_cut_to_fit_and_whole_in_its_tooltip(qtbot, engine):
    """"...a larger storage budget (Settings) cac": the message ran past the window's edge."""
    window = open_window(qtbot, engine, Settings(calibrate_automatically=False))  # (its end
    window.show()  # would say so in the status bar)
    qtbot.waitExposed(window)
    window.passage_bar.show_state(WORKING)  # (beside the permanent widgets, as it is then)
    said = ("manbook.txt: passage caching stopped at 89 of 4,003 — the storage budget "
            "(130.0 MB) is full. The rest are cached as questions read them; a larger "
            "storage budget (Settings) caches them all")
    window.statusBar().showMessage(said)
    label = window.statusBar().message
    qtbot.waitUntil(lambda: label.width() > 200, timeout=5000)  # (laid out)
    assert label.toolTip() == said and window.statusBar().currentMessage() == said
    assert label.geometry().right() < window.passage_bar.geometry().left()
    assert window.width() == 1100  # (the window did not widen for it, nor for the pass)
    window.statusBar().showMessage("Copied", 50)  # short: whole, no tooltip; then gone
    assert label.toolTip() == ""
    qtbot.waitUntil(lambda: window.statusBar().currentMessage() == "", timeout=5000)
