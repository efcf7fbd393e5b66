"""The settings dialog's fields hold only values the settings accept."""

from __future__ import annotations

from desktop_app.settings import Settings
from ui.settings_dialog import SettingsDialog


def test_the_context_size_box_holds_automatic_or_a_size_the_settings_accept(qtbot):
    """It allowed 1 to 255 tokens, which saving then refused ("greater than or equal to 256")."""
    dialog = SettingsDialog(Settings(n_ctx=4096))
    qtbot.addWidget(dialog)
    box = dialog.n_ctx
    assert dialog.result_settings().n_ctx == 4096
    for typed in (1, 100, 255, 256, 300):
        box.setValue(typed)
        n_ctx = dialog.result_settings().n_ctx  # (raised InvalidValue under 256)
        assert n_ctx is None or n_ctx == typed >= 256, typed
    box.setValue(0)
    assert box.text().startswith("Automatic") and dialog.result_settings().n_ctx is None
    box.stepBy(1)
    assert dialog.result_settings().n_ctx == 1024  # whole steps from Automatic
    box.stepBy(-1)
    assert box.text().startswith("Automatic") and dialog.result_settings().n_ctx is None
