"""The settings dialog's layout: it opens narrower than the main window, whatever the models
found and the codec's line say, and every wrapped note shows all its lines (no overlap)."""

from __future__ import annotations

from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QLabel, QLineEdit

from desktop_app.results import ModelFile
from desktop_app.settings import Settings
from ui.settings.settings_dialog import SettingsDialog

CODEC_LINE = ("Model-independent levels: this model is not calibrated (Tools ▸ Calibrate the "
              "codec for this model, or `kvdesk calibrate`); calibrating it now…")


def long_named_model() -> ModelFile:
    name = "hf.co/bartowski/SmolLM2-1.7B-Instruct-GGUF:SmolLM2-1.7B-Instruct-Q4_K_M"
    return ModelFile(name, f"/models/{name}.gguf", "ollama", 10**9, "llama", 1_700_000_000,
                     "Q4_K_M", 8192, 196608, None, None, "supported",
                     "a llama model, tested with kvdesk's codec and restores")


def test_the_settings_dialog_is_narrower_than_the_window_and_its_notes_are_whole(qtbot):
    """It opened 1197 px wide (a check box's long text, the longest model name), wider than
    the main window, and cut the end of long notes (AWS credentials, calibration)."""
    dialog = SettingsDialog(Settings(), models=[long_named_model()], codec_levels=CODEC_LINE)
    qtbot.addWidget(dialog)
    dialog.model.activated.emit(0)  # its description: three lines under the model
    dialog.show()
    qtbot.waitExposed(dialog)
    assert dialog.width() < 1000  # (the main window opens 1100 px wide)
    notes = [label for label in dialog.findChildren(QLabel)
             if label.isVisible() and len(label.text()) > 60]
    assert len(notes) >= 7
    for label in notes:
        assert label.wordWrap(), label.text()
        # (as tall as its wrapped lines at its width: not squeezed under the next row)
        assert label.height() >= label.heightForWidth(label.width()), label.text()
        assert label.geometry().right() <= label.parentWidget().width(), label.text()
    # (the rows made room for them: none squeezed below its own height)
    fields = [*dialog.findChildren(QLineEdit), *dialog.findChildren(QAbstractSpinBox)]
    for field in fields:
        if field.isVisible() and not isinstance(field.parentWidget(), (QAbstractSpinBox,
                                                                       QComboBox)):
            assert field.height() >= field.sizeHint().height(), field.objectName()


def test_the_settings_dialog_shrinks_and_scrolls_and_shows_a_model_path_by_its_name(qtbot):
    """The probe's L5: the dialog would not shrink below 957x643, its model field showed
    "dels/gemma-3-…gguf" (a path cut at the left), and its hint split `--api-key` in two."""
    path = "/work/models/gemma-3-270m-q4_k_m.gguf"
    dialog = SettingsDialog(Settings(model=path), codec_levels=CODEC_LINE)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    assert dialog.model.currentText() == "gemma-3-270m-q4_k_m.gguf"
    assert dialog.model.toolTip() == path and dialog.result_settings().model == path
    dialog.model.setEditText("other.gguf")  # (typed: taken as typed)
    assert dialog.result_settings().model == "other.gguf"
    dialog.resize(640, 480)
    qtbot.waitUntil(lambda: dialog.height() <= 480 and dialog.width() <= 640)
    assert dialog.scroll.verticalScrollBar().maximum() > 0  # (the fields scroll)
    assert dialog.address.text().endswith("\nkvdesk serve --host ... --api-key ...")
