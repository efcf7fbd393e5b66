"""The window's text size: View ▸ Larger text (Ctrl++, Ctrl+=), Smaller text (Ctrl+-), Actual
size (Ctrl+0), applied at once to everything the platform's font sizes and kept as the
`text_scale` setting, within its bounds, and applied at start."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from ui_fixtures import (
    edit_settings,
    engine_fixture,  # noqa: F401 (a fixture)
    open_window,
    window_fixture,  # noqa: F401 (a fixture)
)

from desktop_app import settings as settings_mod
from desktop_app.settings import Settings
from ui import theme


@pytest.fixture(autouse=True)
def unscaled():
    """The application's font as it was, whatever a test scaled (the next test's windows
    start from it)."""
    app = QApplication.instance()
    yield app.font().pointSizeF()
    theme.scale_text(app, 1.0)
    theme.apply(app, "system")  # (as the next test's windows start: a high contrast undone)


def saved_scale() -> float | None:
    return json.loads((settings_mod.config_dir() / "settings.json").read_text()).get(
        "text_scale")


def activate(qtbot, window):
    """Keys only reach the active window."""
    with qtbot.waitActive(window):
        window.show()
        window.activateWindow()


def test_the_keys_scale_every_text_at_once_and_keep_the_setting(qtbot, window, unscaled):
    activate(qtbot, window)
    app, prompt = QApplication.instance(), window.prompt
    tree = window.chat_list.tree
    qtbot.keyClick(window, Qt.Key.Key_Equal, Qt.KeyboardModifier.ControlModifier)
    assert app.font().pointSizeF() == pytest.approx(unscaled * 1.1)
    assert window.settings.text_scale == 1.1 and saved_scale() == 1.1
    # (the application's font reaches each widget through posted events: at once on screen)
    qtbot.waitUntil(lambda: prompt.font().pointSizeF() == pytest.approx(unscaled * 1.1))
    # (the conversation's HTML sizes, small and x-large, are relative to its default font)
    for widget in (prompt, window.chat_view, tree, window.menuBar()):
        assert widget.font().pointSizeF() == pytest.approx(unscaled * 1.1), widget
    assert window.chat_view.document().defaultFont().pointSizeF() == pytest.approx(
        unscaled * 1.1)
    assert prompt.height() >= 4 * prompt.fontMetrics().lineSpacing()
    # (the date headings' own fonts, a tenth smaller, follow too)
    assert tree.topLevelItem(0).font(0).pointSizeF() == pytest.approx(unscaled * 1.1 * 0.9)
    qtbot.keyClick(window, Qt.Key.Key_Plus, Qt.KeyboardModifier.ControlModifier)
    assert window.settings.text_scale == 1.2
    assert window.statusBar().currentMessage() == "Text size: 120 %"
    for _ in range(3):
        qtbot.keyClick(window, Qt.Key.Key_Minus, Qt.KeyboardModifier.ControlModifier)
    assert window.settings.text_scale == 0.9 and saved_scale() == 0.9
    assert app.font().pointSizeF() == pytest.approx(unscaled * 0.9)
    qtbot.keyClick(window, Qt.Key.Key_0, Qt.KeyboardModifier.ControlModifier)
    assert window.settings.text_scale == 1.0 and saved_scale() == 1.0
    assert app.font().pointSizeF() == pytest.approx(unscaled)
    qtbot.waitUntil(lambda: tree.topLevelItem(0).font(0).pointSizeF() == pytest.approx(
        unscaled * 0.9))


def test_the_text_size_stays_within_its_bounds_and_a_bad_one_is_refused(window, tmp_path):
    for _ in range(20):
        window.size_text(1)
    assert window.settings.text_scale == 2.0
    assert window.statusBar().currentMessage() == "Text size: 200 % (the largest)"
    for _ in range(20):
        window.size_text(-1)
    assert window.settings.text_scale == 0.7
    assert window.statusBar().currentMessage() == "Text size: 70 % (the smallest)"
    assert theme.text_step(1.15, 1) == 1.2 and theme.text_step(1.15, -1) == 1.1
    (settings_mod.config_dir() / "settings.json").write_text("{")  # (broken since it started)
    window.size_text(1)
    assert window.settings.text_scale == 0.8  # (applied all the same, and said: no traceback)
    assert "could not be saved" in window.info.text() and "not valid JSON" in window.info.text()
    path = tmp_path / "settings.json"
    for value, says in ((2.5, "should be less than or equal to 2"),
                        (0.5, "should be greater than or equal to 0.7"),
                        ('"big"', "should be a number")):
        path.write_text(f'{{"text_scale": {value}}}')
        with pytest.raises(settings_mod.SettingsError, match=f"{path}: text_scale: {says}"):
            settings_mod.saved_settings(path)


def test_the_saved_size_applies_at_start_and_the_settings_dialog_edits_it(
        qtbot, engine, monkeypatch, unscaled):
    app = QApplication.instance()
    # (high contrast's style sheet: its widgets take a new font only when it is set again)
    window = open_window(qtbot, engine, Settings(text_scale=1.5, theme="high-contrast"))
    assert app.font().pointSizeF() == pytest.approx(unscaled * 1.5)
    prompt = window.prompt
    qtbot.waitUntil(lambda: prompt.font().pointSizeF() == pytest.approx(unscaled * 1.5))
    shown = []

    def change(dialog):
        shown.append(dialog.text_size.text())
        dialog.text_size.setValue(120)

    edit_settings(monkeypatch, change)
    window.open_settings()
    assert shown == ["150 %"]
    assert window.settings.text_scale == 1.2 and saved_scale() == 1.2
    assert app.font().pointSizeF() == pytest.approx(unscaled * 1.2)
    qtbot.waitUntil(lambda: prompt.font().pointSizeF() == pytest.approx(unscaled * 1.2))
