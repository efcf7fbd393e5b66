"""The settings dialog: the model (a file, or one of the models found on this computer),
model folders, context size, data folder, storage budget, theme and text size (`appearance`),
the shared cache (an S3-compatible bucket; credentials are never settings: boto3 reads them),
how answers are generated (`generation_settings`) and whether the codec is calibrated for each
model automatically, with which codec levels the loaded model's new caches use (told by the
window), the local API (its port, Ollama's port, the web pages allowed) and how documents
longer than the context keep their passages' caches.

It edits a `desktop_app.settings.Settings` and returns the new one; the main window saves it and
decides what a change means (a new theme or text size applies at once, a new model or data
folder needs the engine rebuilt). It never saves, loads a model, lists models or touches the
data folder itself: the models found (`desktop_app.results.ModelFile`, from their headers) are
given to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtWidgets import (
    QBoxLayout,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from desktop_app.model.models import ModelNotFoundError, find_named
from desktop_app.model.support import SUPPORTED, UNTESTED
from desktop_app.results import ModelFile
from desktop_app.settings import Settings, SettingsError
from desktop_app.validation import InvalidValue

from .. import theme
from .appearance import TextSizeBox, ThemeBox
from .context_size import ContextSizeBox
from .generation_settings import GenerationBox

# Settings that change which model or store the engine opens: changing them rebuilds it.
ENGINE_FIELDS = ("model", "data_dir", "n_ctx", "flash_attn", "remote_bucket",
                 "remote_endpoint_url", "remote_prefix", "remote_auto_push", "remote_auto_pull",
                 "keep_lossless", "passage_level", "passages_in_background")
# Settings of the local API: changing them restarts it (not the engine).
SERVER_FIELDS = ("server_enabled", "server_port", "ollama_port", "cors_origins")
PASSAGE_LEVELS = {"high": "high (the most faithful lossy level)",
                  "balanced": "balanced (the default)", "compact": "compact (the least disk)",
                  "lossless": "lossless (exact; several times the disk)"}


# What the user sees each setting as: errors and the restart question name it so.
LABELS = {"model": "Model", "model_folders": "Model folders", "n_ctx": "Context size",
          "data_dir": "Data folder", "storage_budget_gb": "Storage budget",
          "flash_attn": "Flash attention", "remote_bucket": "Bucket",
          "remote_endpoint_url": "Endpoint URL", "remote_prefix": "Prefix",
          "remote_auto_push": "Share each attached document",
          "remote_auto_pull": "Look in the shared cache before computing",
          "keep_lossless": "Exact (lossless) copy of each document",
          "passage_level": "Passages' cache level",
          "passages_in_background": "Passages' caches in the background",
          "server_port": "Port", "ollama_port": "Ollama's port",
          "cors_origins": "Web pages allowed"}


def needs_restart(old: Settings, new: Settings) -> list[str]:
    """The settings changed from `old` to `new` that take effect when the engine restarts,
    by their labels (none: nothing to restart for)."""
    return [LABELS[f] for f in ENGINE_FIELDS if getattr(old, f) != getattr(new, f)]


def describe(m: ModelFile) -> str:
    """One line about a model found: what its header says, and whether kvdesk supports it."""
    facts = [m.architecture or "?",
             f"{m.parameters / 1e9:.1f}B parameters" if m.parameters else "",
             m.quantization or "",
             f"{m.context_length:,}-token context" if m.context_length else "",
             f"{m.kv_bytes_per_token / 1024:.0f} KiB of KV per token"
             if m.kv_bytes_per_token else ""]
    return f"{', '.join(f for f in facts if f)} ({m.source}) — {m.status}: {m.reason}"


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent: QWidget | None = None, *,
                 models: Sequence[ModelFile] = (), codec_levels: str = ""):
        super().__init__(parent)
        self.setWindowTitle("kvdesk settings")
        self._settings = settings
        self._models = list(models)
        # A file path or the name of a model found; picking one fills in its name (the
        # built-in default: nothing). Models kvdesk cannot use are listed, greyed, with why.
        self.model = QComboBox(editable=True, insertPolicy=QComboBox.InsertPolicy.NoInsert)
        self.model.lineEdit().setPlaceholderText("the built-in default model")
        # (not as wide as the longest model's name: a model file's path can be very long)
        self.model.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model.setMinimumContentsLength(20)
        for m in self._models:
            own = m.source == "kvdesk"
            self.model.addItem(f"{m.name} (built in)" if own else m.name, "" if own else m.name)
            item = self.model.model().item(self.model.count() - 1)
            item.setToolTip(describe(m))
            item.setEnabled(m.status in (SUPPORTED, UNTESTED))
        self.model.setCurrentIndex(-1)
        # A model file's path shows as its file name (a long path showed cut at the left),
        # the whole path in the tooltip; OK keeps the path (`_model_text`).
        self._model_path = settings.model if settings.model and Path(
            settings.model).name != settings.model else None
        self.model.setEditText(Path(self._model_path).name if self._model_path
                               else settings.model or "")
        self.model_about = QLabel(wordWrap=True)
        theme.muted(self.model_about)
        self.model.currentTextChanged.connect(self._show_model)
        self.model.activated.connect(self._picked)
        self._show_model(self.model.currentText())
        self.folders = QLineEdit("; ".join(settings.model_folders),
                                 placeholderText="more folders of GGUF files, separated by ;")
        self.n_ctx = ContextSizeBox(settings.n_ctx)
        self.data_dir = QLineEdit(settings.data_dir or "", placeholderText=str(settings.data_path))
        self.budget = QDoubleSpinBox(minimum=0.1, maximum=100000, decimals=1, suffix=" GB")
        self.budget.setValue(settings.storage_budget_gb)
        self.theme = ThemeBox(settings.theme)
        self.text_size = TextSizeBox(settings.text_scale)
        self.bucket = QLineEdit(settings.remote_bucket or "", placeholderText="none: off")
        self.endpoint = QLineEdit(settings.remote_endpoint_url or "",
                                  placeholderText="AWS S3; or e.g. http://minio.lan:9000")
        self.prefix = QLineEdit(settings.remote_prefix)
        self.auto_push = QCheckBox("Share each attached document (its text travels too)",
                                   checked=settings.remote_auto_push)
        self.auto_pull = QCheckBox("Look there before computing a document",
                                   checked=settings.remote_auto_pull)
        self.generation = GenerationBox(settings.generation)
        self.calibrate = QCheckBox("Calibrate it for each model automatically",
                                   checked=settings.calibrate_automatically)
        calibrate_about = QLabel("Once per model, minutes in the background: its new caches "
                                 "then use levels measured on the model itself.",
                                 wordWrap=True)
        theme.muted(calibrate_about)
        self.keep_lossless = QCheckBox("Also keep an exact (lossless) copy of each document",
                                       checked=settings.keep_lossless)
        self.keep_lossless.setToolTip("About twice the disk: exact reopens without recomputing."
                                      " Without it, the exact level recomputes from the text.")
        # The loaded model's levels (calibrated or not); none before the engine has said.
        self.codec_levels = QLabel(codec_levels, wordWrap=True)
        theme.muted(self.codec_levels)
        if not codec_levels:
            self.codec_levels.hide()
        # A check box's text never wraps: the long part is a wrapped label under it (on one
        # line it would make the dialog wider than the window).
        self.serve = QCheckBox("Serve the local API while kvdesk is open",
                               checked=settings.server_enabled)
        serve_about = QLabel("OpenAI-compatible: other tools can use the same models and "
                             "caches.", wordWrap=True)
        theme.muted(serve_about)
        self.port = QSpinBox(minimum=1, maximum=65535)
        self.port.setValue(settings.server_port or 8765)
        self.ollama_port = QSpinBox(minimum=0, maximum=65535, specialValueText="Off")
        self.ollama_port.setValue(settings.ollama_port or 0)
        self.ollama_port.setToolTip("Ollama's API is always served under /api on the port above;"
                                    " on this one too, where Ollama's clients look, when free.")
        self.origins = QLineEdit(" ".join(settings.cors_origins),
                                 placeholderText="none; e.g. http://localhost:3000")
        self.origins.setToolTip("Web pages (origins, separated by spaces) allowed to call the "
                                "local API from a browser.")
        self.passage_level = QComboBox()
        for key, label in PASSAGE_LEVELS.items():
            self.passage_level.addItem(label, key)
        self.passage_level.setCurrentIndex(list(PASSAGE_LEVELS).index(settings.passage_level))
        self.passages_background = QCheckBox(
            "Compute every passage's cache in the background after attaching",
            checked=settings.passages_in_background)
        self.passages_background.setToolTip(
            "Off: a passage's cache is computed the first time a question retrieves it. A "
            "sliding-window model (Gemma 3) keeps no passage's cache, in the background or "
            "not, until its codec is calibrated (Tools ▸ Calibrate the codec for this model).")
        self.address = QLabel(wordWrap=True)
        theme.muted(self.address)
        self.port.valueChanged.connect(self._show_address)
        self._show_address()
        self.error = QLabel(wordWrap=True)
        self.error.setStyleSheet("color: #c0392b")
        self.error.hide()
        self._told: list[str] = []  # the notices shown: the next OK with the same accepts

        model_row, form = QFormLayout(), QFormLayout()
        model_row.addRow("Model (GGUF file or name)", self._with_browse(self.model,
                                                                        self._browse_model))
        form.addRow("Model folders", self._with_browse(self.folders, self._browse_folder))
        form.addRow("Context size", self.n_ctx)
        form.addRow("Data folder", self._with_browse(self.data_dir, self._browse_data))
        form.addRow("Storage budget", self.budget)
        form.addRow("Theme", self.theme)
        form.addRow("Text size", self.text_size)
        # The model's description between two forms (see below), their fields in line.
        labels = [label for f in (model_row, form) for i in range(f.rowCount())  # (a row
                  # spanning both columns has no field, and no label)
                  if (item := f.itemAt(i, QFormLayout.ItemRole.FieldRole)) is not None
                  and (label := f.labelForField(item.widget())) is not None]
        for label in labels:
            label.setMinimumWidth(max(x.sizeHint().width() for x in labels))
        # A wrapped label in a form's row gets one line's height (its lines overlap the next
        # row): those go in a box under the form.
        shared = QGroupBox("Shared cache (S3-compatible storage)")
        shared_rows = QVBoxLayout(shared)
        remote = QFormLayout()
        shared_rows.addLayout(remote)
        remote.addRow("Bucket", self.bucket)
        remote.addRow("Endpoint URL", self.endpoint)
        remote.addRow("Prefix (a team's namespace)", self.prefix)
        remote.addRow(self.auto_push)
        remote.addRow(self.auto_pull)
        credentials = QLabel("Credentials come from the standard AWS variables and files "
                             "(AWS_PROFILE, ~/.aws/credentials); kvdesk never stores them.",
                             wordWrap=True)
        theme.muted(credentials)
        shared_rows.addWidget(credentials)
        local_api = QGroupBox("Local API")
        api_rows = QVBoxLayout(local_api)
        api_rows.addWidget(self.serve)
        api_rows.addWidget(serve_about)
        served = QFormLayout()
        api_rows.addLayout(served)
        served.addRow("Port", self.port)
        served.addRow("Ollama's port", self.ollama_port)
        served.addRow("Web pages allowed", self.origins)
        api_rows.addWidget(self.address)
        note = QLabel("Changing the model, context size, data folder, shared cache or "
                      "passages' caching restarts the engine.", wordWrap=True)
        theme.muted(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        general = QVBoxLayout()
        general.addLayout(model_row)
        general.addWidget(self.model_about)
        general.addLayout(form)
        general.addWidget(shared)
        general.addWidget(local_api)
        answers = QVBoxLayout()  # beside the rest: the dialog stays as tall as it was
        answers.addWidget(self.generation)
        codec = QGroupBox("Codec")
        codec_rows = QVBoxLayout(codec)
        codec_rows.addWidget(self.calibrate)
        codec_rows.addWidget(calibrate_about)
        codec_rows.addWidget(self.codec_levels)
        codec_rows.addWidget(self.keep_lossless)
        answers.addWidget(codec)
        long_docs = QGroupBox("Documents longer than the context")
        passages = QFormLayout(long_docs)
        passages.addRow("Passages' cache level", self.passage_level)
        passages.addRow(self.passages_background)
        answers.addWidget(long_docs)
        answers.addStretch(1)
        self.columns = columns = QHBoxLayout()
        columns.addLayout(general, 3)
        columns.addLayout(answers, 2)
        # The fields scroll in a small window (the dialog would not shrink below 957x643);
        # the note, an error and the buttons stay in view under them.
        content = QWidget()
        fields = QVBoxLayout(content)
        fields.setContentsMargins(0, 0, 0, 0)
        fields.addLayout(columns)
        self.scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self.scroll.setWidget(content)
        layout = QVBoxLayout(self)
        layout.addWidget(self.scroll, 1)
        layout.addWidget(note)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self._sized = False  # (opened as wide as its fields, as tall where the screen has room)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._sized:  # (first shown: then the user's size is kept)
            self._sized = True
            self.layout().activate()
            frame = self.width() - self.scroll.viewport().width()
            room = self.screen().availableGeometry().width() - 40 if self.screen() else 10**6
            if self.scroll.widget().minimumSizeHint().width() + frame > room:
                # (a large font: the two columns one above the other, which scroll)
                self.columns.setDirection(QBoxLayout.Direction.TopToBottom)
                self.scroll.widget().layout().activate()
                frame += self.scroll.verticalScrollBar().sizeHint().width()
            self.resize(min(self.scroll.widget().minimumSizeHint().width() + frame, room),
                        self.height())
        self._fit_height()

    def _fit_height(self) -> None:
        """As tall as the fields with the wrapped labels' lines at this width (a layout's
        first size hint counts one line each), where the screen has room: else they scroll."""
        self.layout().activate()
        self._fit_fields()
        needed = self.scroll.widget().minimumHeight() + self.height() \
            - self.scroll.viewport().height()
        screen = self.screen().availableGeometry().height() if self.screen() else needed
        self.resize(self.width(), max(self.height(), min(needed, screen - 40)))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_fields()

    def _fit_fields(self) -> None:
        """The fields as tall as their wrapped labels' lines at the width they get (the
        scroll area gives them no less): squeezed, the rows overlap."""
        content = self.scroll.widget()
        width = max(self.scroll.viewport().width(), content.minimumSizeHint().width())
        content.setMinimumHeight(content.layout().totalHeightForWidth(width))
        content.resize(width, max(content.minimumHeight(), self.scroll.viewport().height()))
        content.layout().activate()  # (now, not at the next event: shown so at once)

    @staticmethod
    def _with_browse(edit: QLineEdit, browse) -> QWidget:
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(edit, 1)
        button = QPushButton("Browse…")
        button.clicked.connect(browse)
        row.addWidget(button)
        return box

    def _browse_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Model file", self.model.currentText(),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.model.setEditText(path)

    def _browse_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "A folder of models", str(Path.home()))
        if path:
            self.folders.setText("; ".join([*self._folders(), path]))

    def _folders(self) -> list[str]:
        return [f.strip() for f in self.folders.text().split(";") if f.strip()]

    def _model_text(self) -> str:
        """The model field's value: the path of a file shown by its name, else as typed."""
        text = self.model.currentText().strip()
        return self._model_path if self._model_path and text == Path(
            self._model_path).name else text

    def _found(self, text: str) -> ModelFile | None:
        text = text.strip()
        if not text:
            return next((m for m in self._models if m.source == "kvdesk"), None)
        exact = next((m for m in self._models if text in (m.name, m.path)), None)
        try:  # (else by the names the command line takes: the file's stem, any case)
            path = exact.path if exact else find_named(text, [(m.name, m.path)
                                                              for m in self._models])
        except ModelNotFoundError:  # (several of that name: the whole one is needed)
            return None
        return next((m for m in self._models if m.path == path), None)

    def _picked(self, index: int) -> None:
        self.model.setEditText(self.model.itemData(index))

    def _show_model(self, text: str) -> None:
        found = self._found(self._model_text())
        self.model_about.setText(describe(found) if found else "")
        self.model.setToolTip(found.path if found else self._model_text())
        if self.isVisible():
            self._fit_height()

    def _browse_data(self) -> None:
        start = self.data_dir.text() or self.data_dir.placeholderText()
        path = QFileDialog.getExistingDirectory(self, "Data folder", start)
        if path:
            self.data_dir.setText(path)

    def _show_address(self) -> None:
        # (the command on a line of its own: split at a line's end, an option such as
        # --api-key read as two words)
        self.address.setText(f"http://127.0.0.1:{self.port.value()}/v1 — this computer only; "
                             "a network is served by\nkvdesk serve --host ... --api-key ...")

    def result_settings(self) -> Settings:
        """The edited settings, checked (raises InvalidValue naming the setting)."""
        # with_values, not with_overrides: an emptied field goes back to its default (None).
        default_prefix = Settings.model_fields["remote_prefix"].default
        return self._settings.with_values(
            model=self._model_text() or None,
            model_folders=tuple(self._folders()), n_ctx=self.n_ctx.context_size(),
            data_dir=self.data_dir.text().strip() or None,
            storage_budget_gb=self.budget.value(), theme=self.theme.currentData(),
            text_scale=self.text_size.scale(),
            remote_bucket=self.bucket.text().strip() or None,
            remote_endpoint_url=self.endpoint.text().strip() or None,
            remote_prefix=self.prefix.text().strip() or default_prefix,
            remote_auto_push=self.auto_push.isChecked(),
            remote_auto_pull=self.auto_pull.isChecked(),
            server_enabled=self.serve.isChecked(), server_port=self.port.value(),
            ollama_port=self.ollama_port.value() or None,
            cors_origins=tuple(self.origins.text().replace(";", " ").split()),
            passage_level=self.passage_level.currentData(),
            passages_in_background=self.passages_background.isChecked(),
            calibrate_automatically=self.calibrate.isChecked(),
            keep_lossless=self.keep_lossless.isChecked(),
            generation=self.generation.values())

    def accept(self) -> None:
        """Refuse what the settings refuse, saying why; tell of what they allow but a user
        should know (a model folder not there now), and accept at the next OK."""
        try:
            new = self.result_settings()
            found = self._found(new.model) if new.model else None
            if new.model and not Path(new.model).expanduser().is_file() and found is None:
                raise SettingsError(f"{new.model}: no such model file, nor a model found on "
                                    "this computer", "model")
            if found is not None and found.status not in (SUPPORTED, UNTESTED):  # (as shown)
                raise SettingsError(f"{found.name} cannot be used, {found.status}: "
                                    f"{found.reason}", "model")
        except InvalidValue as e:
            self._refuse(e)
            return
        notices = new.notices()
        if notices and [str(n) for n in notices] != self._told:
            self._told = [str(n) for n in notices]
            self._refuse(notices[0], "; ".join(n.reason for n in notices)
                         + ". OK again keeps it.")
            return
        super().accept()

    def _refuse(self, error: InvalidValue, reason: str | None = None) -> None:
        """Say what is wrong by the field's label, not the settings file's key, and go to it."""
        fields = {"model": self.model, "model_folders": self.folders, "n_ctx": self.n_ctx,
                  "data_dir": self.data_dir, "storage_budget_gb": self.budget,
                  "remote_bucket": self.bucket, "remote_endpoint_url": self.endpoint,
                  "remote_prefix": self.prefix, "server_port": self.port,
                  "ollama_port": self.ollama_port, "cors_origins": self.origins}
        key = error.key.split(".")[0]
        label, widget = LABELS.get(key) if key in fields else None, fields.get(key)
        reason = reason or error.reason
        self.error.setText(f"{label}: {reason}" if label else str(error))
        self.error.show()
        if widget is not None:
            widget.setFocus()
