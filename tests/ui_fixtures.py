"""Helpers for the UI tests: a main window on the scripted FakeEngine, ready to use."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from desktop_app.settings import Settings
from ui.main_window import MainWindow
from ui.settings.settings_dialog import SettingsDialog
from ui.testing import FakeEngine


# (named apart from the fixtures, so that a test module importing them can take `engine` and
# `window` as arguments without shadowing an import)
@pytest.fixture(name="engine")
def engine_fixture() -> FakeEngine:
    """A quick scripted engine with its documents and chats."""
    return FakeEngine(step_s=0.002, token_s=0.001).seed()


@pytest.fixture(name="window")
def window_fixture(qtbot, engine):
    """The main window on `engine`, loaded."""
    return open_window(qtbot, engine)


def open_window(qtbot, engine: FakeEngine, settings: Settings | None = None,
                local_api=None) -> MainWindow:
    """A window whose engine, chats and documents have loaded (nothing else pending)."""
    window = MainWindow(lambda: engine, settings or Settings(), local_api=local_api)
    qtbot.addWidget(window)
    with qtbot.waitSignals([window.engine_ready, window.chats_changed,
                            window.documents_changed], timeout=5000):
        pass
    return window


def text_file(tmp_path, name: str, words: int = 50) -> str:
    path = tmp_path / name
    path.write_text("lorem ipsum " * (words // 2))
    return str(path)


def edit_settings(monkeypatch, change: Callable[[SettingsDialog], None]) -> None:
    """The window's next settings dialog applies `change` and is accepted, without a modal loop."""
    def edit(dialog: SettingsDialog) -> int:
        change(dialog)
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr("ui.main_window.SettingsDialog.exec", edit)
