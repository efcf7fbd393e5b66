"""The settings dialog's fields hold only values the settings accept."""

from __future__ import annotations

import pytest

from desktop_app.results import ModelFile
from desktop_app.settings import Settings
from desktop_app.validation import InvalidValue
from ui.settings.settings_dialog import SettingsDialog


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


def test_ok_refuses_a_model_its_own_line_shows_unreadable_or_refused(qtbot, tmp_path):
    """(A text file and a LoRA adapter, listed so, were accepted, saved and restarted into.)"""
    def found(name, status, reason):
        path = tmp_path / name
        path.write_bytes(b"GGUF")
        return ModelFile(name, str(path), "folder", 4, None, None, None, None, None, None,
                         None, status, reason)

    models = [found("text.gguf", "unreadable", "not a GGUF file"),
              found("lora.gguf", "refused", "a LoRA adapter, not a model"),
              found("good.gguf", "untested", "not tested with kvdesk")]
    dialog = SettingsDialog(Settings(), models=models)
    qtbot.addWidget(dialog)
    for m in models[:2]:
        dialog.model.setEditText(m.path)  # (typed, or picked: the same)
        dialog.accept()
        assert dialog.result() == 0
        assert dialog.error.text() == f"Model: {m.name} cannot be used, {m.status}: {m.reason}"
        dialog.accept()  # (not a notice that a second OK keeps: refused again)
        assert dialog.result() == 0
    dialog.model.setEditText("good")
    dialog.accept()
    assert dialog.result() == 1 and dialog.result_settings().model == "good"


def test_the_dialog_refuses_what_the_settings_refuse_and_stays_open(qtbot, tmp_path):
    """A relative data folder or model folder: the settings' own rule and the value, by the
    field's label; a model folder not there now is told of, then kept."""
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    for edit, label, key in (
            (lambda: dialog.data_dir.setText("kvdesk-data"), "Data folder", "data_dir"),
            (lambda: dialog.folders.setText("models"), "Model folders", "model_folders")):
        edit()
        with pytest.raises(InvalidValue) as rule:  # what the settings file is told, too
            dialog.result_settings()
        dialog.accept()
        assert dialog.result() == 0 and dialog.error.isVisible() is dialog.isVisible()
        assert rule.value.key == key and "(got " in rule.value.reason
        assert dialog.error.text() == f"{label}: {rule.value.reason}"
        dialog.data_dir.setText("")
        dialog.folders.setText("")
    dialog.folders.setText(str(tmp_path / "usb"))  # (a drive unplugged)
    dialog.accept()
    assert dialog.result() == 0 and "is not a folder on this computer now" in \
        dialog.error.text() and dialog.error.text().startswith("Model folders: ")
    dialog.accept()  # told: OK again keeps it
    assert dialog.result() == 1, dialog.error.text()
    assert dialog.result_settings().model_folders == (str(tmp_path / "usb"),)
