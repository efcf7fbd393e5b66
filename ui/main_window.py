"""The main window: wires the sidebar, the conversation and the input to the engine.

Every engine call goes through `ui.workers.Runner` onto a worker thread and comes back as a
signal; this module decides what each result means on screen. It never calls an engine method
on the GUI thread (even `documents()` may take seconds on a cold disk), never imports the
model runtime, codec or store, and never shows a traceback: user errors arrive as messages.

A view serial number guards against late results: a reply that arrives after the user has
moved to another chat is not drawn into the wrong conversation. Asking lives in
`ui.chat.asking`, switching between chats in `ui.library.switching`, the library's actions
(attach, delete, rename, export) in `ui.library.library_actions`, the codec's preparation and
calibration in `ui.library.codec_status`, the background passage pass in
`ui.library.passage_status`: mixins of this window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from html import escape

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from desktop_app import settings as settings_mod
from desktop_app.errors import data_folder_fault
from desktop_app.protocol import EngineAPI, LocalAPIControl
from desktop_app.results import ChatInfo, DocumentInfo, ModelFile
from desktop_app.settings import Settings
from desktop_app.validation import InvalidValue

from . import theme
from .chat.asking import Answering, AskingMixin
from .chat.chat_view import ChatView, PromptEdit
from .icons import paperclip
from .library.codec_status import CodecMixin
from .library.document_list import DocumentList
from .library.library_actions import LibraryMixin
from .library.listing import BLENDED_POLL_MS, ListingMixin
from .library.passage_status import PassagesMixin
from .library.sidebar import ChatList
from .library.switching import SwitchingMixin
from .settings.quality import QualitySlider
from .settings.settings_dialog import SERVER_FIELDS, SettingsDialog, needs_restart
from .statusbar import StatusBar
from .text.formatting import in_window_terms, shortened
from .text.start_failure import start_failure
from .workers import Job, Runner

DRAFT_PAUSE_MS = 300  # typing pause after which the draft question is computed


def standard_key(key: QKeySequence.StandardKey, fallback: str) -> QKeySequence:
    """The platform's keys for `key` (Cmd+, for Preferences on macOS), or `fallback` where the
    platform has none: one binding per key, shown in the menu."""
    bound = QKeySequence.keyBindings(key)
    return bound[0] if bound else QKeySequence(fallback)


class MainWindow(SwitchingMixin, AskingMixin, LibraryMixin, ListingMixin, CodecMixin,
                 PassagesMixin, QMainWindow):
    # For the launcher and for tests: each fires once the GUI has drawn the outcome.
    engine_ready = Signal()
    engine_failed = Signal(str)
    chats_changed = Signal()
    documents_changed = Signal()
    attach_done = Signal(object)  # AttachResult, or an error message (str)
    restored = Signal(object)  # RestoreReport
    answer_done = Signal(object)  # AskResult, or None when stopped or failed
    messages_loaded = Signal()
    restart_requested = Signal(object)  # the new Settings; the launcher rebuilds the App
    local_api_changed = Signal(object)  # its URL while it serves, else None
    # CalibrationInfo, "cancelled", or an error message (str)
    calibration_done = Signal(object)

    def __init__(self, engine_factory: Callable[[], EngineAPI], settings: Settings, *,
                 local_api: LocalAPIControl | None = None,
                 list_models: Callable[[], list[ModelFile]] | None = None,
                 start_notes: Callable[[], list[str]] = list,
                 now: Callable[[], float] = time.time):
        super().__init__()
        self.settings = settings
        # What opening the data directory has to say once (an upgrade's notes): shown as the
        # engine is ready, where a command line prints them
        self.start_notes = start_notes
        self.local_api = local_api  # the local API server the settings toggle (None: none)
        self.list_models = list_models  # the models on this machine, for the settings
        self.engine: EngineAPI | None = None  # set once engine_factory has run on a worker
        self.now = now
        self.runner = Runner(self)
        self.chat_id: int | None = None  # None: a new chat, not yet asked anything
        self.serial = 0  # bumped whenever the conversation shown changes
        self.generation: Job | None = None
        self.answering: Answering | None = None  # the question whose answer is coming
        self.answer_serial = 0  # the view that shows it (self.serial while it is shown)
        self.reopen_job: Job | None = None
        self.draft_job: Job | None = None
        self.documents: list[DocumentInfo] = []
        self._passage_notes: dict[int, str] = {}  # why a document's passage pass stopped short
        self.chats: list[ChatInfo] = []
        self._check_next: set[int] = set()  # attached documents to tick once listed
        self._new_chat_ticks: set[int] = set()  # a new chat's, while another chat is shown
        self._finding: tuple[int, str] = (-1, "")  # (view serial, a chat search's words in it)
        self._progress_shown = False  # whether self.info shows a phase's progress
        # (view serial, question, its documents) of the last answer shown when it was stopped
        # or failed before the engine stored its turn
        self._unsaved: tuple[int, str, tuple[int, ...]] | None = None
        self._build()
        self._apply_theme(settings.theme)
        theme.scale_text(QApplication.instance(), settings.text_scale)
        self._set_ready(False)
        self.info.setText("Loading the model…")
        self._starting = self.runner.start("misc", lambda job: engine_factory(),
                                           finished=self._engine_loaded,
                                           failed=self._engine_failed)

    # -- layout -------------------------------------------------------------------------------

    def _build(self) -> None:
        self.setWindowTitle("kvdesk")
        self.resize(1100, 720)
        self.setStatusBar(StatusBar())  # (a long message cut with "…", whole in its tooltip)
        self.setAcceptDrops(True)

        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("New chat  (Ctrl+N)")
        self.chat_list = ChatList()
        self.doc_list = DocumentList()
        side = QWidget()
        side_layout = QVBoxLayout(side)
        side_layout.addWidget(self.new_button)
        side_layout.addWidget(self.chat_list, 3)
        side_layout.addWidget(self.doc_list, 2)

        self.header = QLabel()
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setMinimumWidth(1)  # a long title is cut, never widens the window
        self.info = QLabel(wordWrap=True)
        self.api_label = QLabel()  # the local API's address while it serves
        self.api_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.statusBar().addPermanentWidget(self.api_label)
        # Documents cached only under another model (it was switched): computed again, in
        # the background, when the user says so.
        self.prefill_button = QPushButton(visible=False)
        self.prefill_button.setToolTip("These documents' caches were made under another model "
                                       "(or evicted): computing them now makes their first "
                                       "question quick")
        self.statusBar().addPermanentWidget(self.prefill_button)
        # (reached and copied from the keyboard too: restore reports and errors are quoted)
        self.info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                          | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.chat_view = ChatView()
        self.prompt = PromptEdit()
        for widget in (self.chat_view, self.chat_view.viewport(), self.prompt,
                       self.prompt.viewport()):
            widget.setAcceptDrops(False)  # dropped files go to the window: they are attached
        self.attach_button = QPushButton(accessibleName="Attach documents")
        self.attach_button.setToolTip("Attach documents…  (Ctrl+O)")
        self.attach_button.setFixedWidth(40)
        self.send_button = QPushButton("Send")
        self.quality = QualitySlider()
        # A new chat's ticked documents the context cannot hold together: said before asking
        self.fit_note = QLabel(wordWrap=True, visible=False)
        self._fit_notes: tuple[list[int], list[str]] = ([], [])  # (for which ticks, notes)
        # A chat filling its context (from 80 %: how full, the engine's words), or one whose
        # question was refused as full: a new chat over its documents, one click away.
        self._room_notes: tuple[int | None, list[str]] = (None, [])  # (for which chat, notes)
        self._refused_in: int | None = None  # the chat a question was last refused in, full
        self.continue_button = QPushButton("Continue in a new chat", visible=False)
        self.continue_button.setToolTip("A new chat over this chat's documents, ticked; this "
                                        "chat's turns do not go with it")
        inputs = QHBoxLayout()
        inputs.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
        inputs.addWidget(self.prompt, 1)
        inputs.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        main = QWidget()
        main_layout = QVBoxLayout(main)
        main_layout.addWidget(self.header)
        main_layout.addWidget(self.info)
        main_layout.addWidget(self.chat_view, 1)
        main_layout.addWidget(self.quality)
        fit_row = QHBoxLayout()
        fit_row.addWidget(self.fit_note, 1)
        fit_row.addWidget(self.continue_button, 0, Qt.AlignmentFlag.AlignTop)
        main_layout.addLayout(fit_row)
        main_layout.addLayout(inputs)

        splitter = QSplitter()
        splitter.addWidget(side)
        splitter.addWidget(main)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([300, 800])
        self.setCentralWidget(splitter)

        menu = self.menuBar().addMenu("&File")
        for text, keys, slot in (
            ("&New chat", QKeySequence.StandardKey.New, self.new_chat),
            ("&Attach documents…", QKeySequence.StandardKey.Open, self.choose_files),
            ("Attach a &folder…", QKeySequence("Ctrl+Shift+O"), self.choose_folder),
            ("&Settings…", standard_key(QKeySequence.StandardKey.Preferences, "Ctrl+,"),
             self.open_settings),
            ("&Quit", standard_key(QKeySequence.StandardKey.Quit, "Ctrl+Q"), self.close),
        ):
            action = QAction(text, self, shortcut=keys)
            action.triggered.connect(slot)
            menu.addAction(action)
            self.addAction(action)  # shortcuts work even where the menu bar is hidden
        view = self.menuBar().addMenu("&View")
        for text, keys, steps in (
            # (Ctrl+=: the + key unshifted, where browsers and editors take it too)
            ("&Larger text", [standard_key(QKeySequence.StandardKey.ZoomIn, "Ctrl++"),
                              QKeySequence("Ctrl+=")], 1),
            ("&Smaller text", [standard_key(QKeySequence.StandardKey.ZoomOut, "Ctrl+-")], -1),
            ("&Actual size", [QKeySequence("Ctrl+0")], 0),
        ):
            action = QAction(text, self)
            action.setShortcuts(keys)
            action.triggered.connect(lambda _=False, steps=steps: self.size_text(steps))
            view.addAction(action)
            self.addAction(action)
        self._build_codec_status()
        self._build_passage_status()
        QShortcut(QKeySequence("Ctrl+K"), self, self._focus_search)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self._escape)

        self.new_button.clicked.connect(self.new_chat)
        self.continue_button.clicked.connect(self.continue_in_new_chat)
        self.prefill_button.clicked.connect(self._prefill_stale)
        self.attach_button.clicked.connect(self.choose_files)
        self.send_button.clicked.connect(self._send_clicked)
        self.prompt.submitted.connect(self.send)
        # The question is computed while it is typed, after each short pause, so the answer
        # starts as soon as it is sent (engine.prepare).
        self.doc_poll = QTimer(self, singleShot=True, interval=BLENDED_POLL_MS)
        self._doc_polled = False  # whether the refresh under way is the timer's
        self.doc_poll.timeout.connect(self._poll_documents)
        self.draft_timer = QTimer(self, singleShot=True, interval=DRAFT_PAUSE_MS)
        self.draft_timer.timeout.connect(self._prepare_draft)
        self.prompt.textChanged.connect(self.draft_timer.start)
        self.chat_list.chat_selected.connect(self.open_chat)
        self.chat_list.rename_requested.connect(self.rename_chat)
        self.chat_list.delete_requested.connect(self.delete_chat)
        self.chat_list.export_requested.connect(self.export_chat)
        self.chat_list.search_requested.connect(self.search_chats)
        self.doc_list.attach_requested.connect(self.choose_files)
        self.doc_list.delete_requested.connect(self.delete_document)
        self.doc_list.checked_changed.connect(self._new_chat_docs_changed)
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.in_document.connect(self.show_in_document)
        self.chat_view.copied.connect(lambda what: self.statusBar().showMessage(
            f"Copied the {what} to the clipboard", 3000))

    def _apply_theme(self, name: str) -> None:
        self.colors = theme.apply(QApplication.instance(), name)
        self.chat_view.set_colors(self.colors)
        clip = paperclip(self.colors.text)
        self.attach_button.setIcon(clip)
        self.doc_list.attach_button.setIcon(clip)

    def _set_ready(self, ready: bool) -> None:
        for widget in (self.prompt, self.send_button, self.attach_button, self.new_button,
                       self.doc_list.attach_button):
            widget.setEnabled(ready)

    def _escape(self) -> None:
        """Esc stops the answer coming, wherever the keyboard is; with none coming, it empties
        the search or filter it is typed in, as it would in any search field."""
        field = self.focusWidget()
        if self.generation is None and field in (self.chat_list.search, self.doc_list.filter):
            field.clear()
            return
        self.stop()

    def _focus_search(self) -> None:
        self.chat_list.search.setFocus()
        self.chat_list.search.selectAll()

    def _say(self, text: str, error: bool = False) -> None:
        """The line above the conversation: restore reports, notices, errors; when there is
        nothing to say, why the data directory takes no new work, if it does not."""
        if not text and self.engine is not None and self.engine.storage_problem:
            text, error = self.engine.storage_problem, True
        # (an error told by more than its colour: bold, and named so to a screen reader)
        self.info.setStyleSheet(f"color: {self.colors.error}; font-weight: bold" if error else "")
        self.info.setAccessibleName("Error" if error else "Status")
        # (a Tab stop while it says something: keyboard selection alone is a click's focus)
        self.info.setFocusPolicy(Qt.FocusPolicy.StrongFocus if text else Qt.FocusPolicy.NoFocus)
        self.info.setText(in_window_terms(text))  # (errors too may advise a command)
        self._progress_shown = False  # (a progress line says so after this)

    # -- engine and listings ----------------------------------------------------------------

    def _engine_loaded(self, engine: EngineAPI) -> None:
        self.engine = engine
        self.setWindowTitle(f"{engine.model_name} — kvdesk")
        self.quality.set_levels(tuple(engine.levels))
        self._set_ready(True)
        self.new_chat()
        self._say(" ".join(f"Note: {note}" for note in self.start_notes()))  # (after: it clears)
        self.refresh_chats()
        self.refresh_documents()
        self._apply_local_api(self.settings)
        self._watch_codec()
        self.engine_ready.emit()

    def _engine_failed(self, message: str) -> None:
        heading, status, chats, documents = start_failure(
            message, data_folder_fault(self._starting.error), self.settings.data_path)
        self._say(status, True)
        self.chat_view.show_blank(heading, in_window_terms(status))
        self.chat_list.note.setText(chats)
        self.chat_list.note.show()
        self.doc_list.show_note(documents)
        self.engine_failed.emit(message)

    def _current_chat(self) -> ChatInfo | None:
        return next((c for c in self.chats if c.chat_id == self.chat_id), None)

    def _update_header(self) -> None:
        # (the titles the sources say too, deleted documents' included: one name for each)
        titles = self.chat_view.doc_titles
        chat = self._current_chat()
        if self.chat_id is None:
            title, doc_ids = "New chat", self.doc_list.checked_ids()
        else:
            title, doc_ids = (chat.title, chat.doc_ids) if chat else ("", [])
        # (a chat just created, not listed yet, is about the documents still ticked)
        self.chat_view.set_chat_documents(
            doc_ids if chat or self.chat_id is None else self.doc_list.checked_ids())
        about = ", ".join(titles.get(d, f"document {d} (deleted)") for d in doc_ids)
        hint = (" — tick documents on the left to ask about them"
                if self.chat_id is None and not doc_ids else "")
        # (title and subtitle each a paragraph of its own: each laid out in its own direction,
        # so a right-to-left title never turns "about ..." around)
        self.header.setText(
            "<p style='margin:0' align='left'><b style='font-size:large'>"
            f"{escape(shortened(title))}</b>"
            + ("</p>" if about else f"{hint}</p>")
            + (f"<p style='margin:0'>about {escape(shortened(about, 200))}</p>" if about else ""))
        self.header.setToolTip("".join(f"<p>{escape(t)}</p>" for t in (title, about) if t))
        self._show_fit()

    def _update_estimate(self) -> None:
        if self.engine is None:
            return
        chat_id, doc_ids = self.chat_id, self.doc_list.checked_ids()
        # (a bound method, not a lambda: Qt drops it with a window closed before it comes)
        self.runner.start("misc", lambda job: ((chat_id, doc_ids), self.engine.estimate(
            chat_id=chat_id, doc_ids=() if chat_id is not None else doc_ids)),
            finished=self._show_estimate)

    # -- settings and closing -----------------------------------------------------------------

    def open_settings(self) -> None:
        """The settings dialog, with the models on this machine to pick from (listed off the
        GUI thread: the first listing reads every model's header)."""
        if self.list_models is None:
            self._show_settings([])
            return
        list_models = self.list_models
        self.statusBar().showMessage("Looking for models on this computer…")
        self.runner.start("misc", lambda job: list_models(), finished=self._show_settings,
                          failed=lambda msg: self._show_settings([]))

    def _show_settings(self, found: list[ModelFile]) -> None:
        self.statusBar().clearMessage()
        dialog = SettingsDialog(self.settings, self, models=found,
                                codec_levels=self.codec_levels_line())
        if not dialog.exec():
            return
        old, new = self.settings, dialog.result_settings()
        settings_mod.save_edits(old, new)  # (what the environment set stays out of the file)
        self.settings = new
        if self.engine is not None:
            self.engine.generation_defaults = new.generation  # from the next answer on
            if new.storage_budget_gb != old.storage_budget_gb:  # now, evicting down to it
                engine, gb = self.engine, new.storage_budget_gb
                self.runner.start("misc", lambda job: engine.set_storage_budget(gb))
        if new.theme != old.theme:
            self._apply_theme(new.theme)
        if new.text_scale != old.text_scale:
            theme.scale_text(QApplication.instance(), new.text_scale)
        if any(getattr(new, f) != getattr(old, f) for f in SERVER_FIELDS):
            self._apply_local_api(new)
        if changed := needs_restart(old, new):
            restart = QMessageBox.question(
                self, "kvdesk", f"Changed: {', '.join(changed)}. The change is saved, and "
                "takes effect when the engine restarts. Restart it now? (No: the next time "
                "kvdesk starts.)" + (" Restarting stops the codec's calibration now running: "
                "what it measured is kept for its next run." if self.calibration_job else ""))
            if restart == QMessageBox.StandardButton.Yes:
                self.restart_requested.emit(new)
                self.close()
                return
            self.statusBar().showMessage("The change applies the next time kvdesk starts")
        self._maybe_calibrate()  # calibrate_automatically may have been turned on

    def size_text(self, steps: int) -> None:
        """View ▸ Larger text (1) / Smaller text (-1) / Actual size (0): the whole window's
        text at once, kept as the `text_scale` setting."""
        old = self.settings
        scale = theme.text_step(old.text_scale, steps) if steps else 1.0
        said = f"Text size: {round(scale * 100)} %"
        if scale != old.text_scale:
            new = old.with_values(text_scale=scale)
            try:
                settings_mod.save_edits(old, new)
            except (InvalidValue, OSError) as e:  # (a settings file broken or unwritable since)
                self._say(f"The text size applies until kvdesk closes: it could not be saved "
                          f"({e})", True)
            self.settings = new
            theme.scale_text(QApplication.instance(), scale)
        elif steps:
            said += " (the largest)" if steps > 0 else " (the smallest)"
        self.statusBar().showMessage(said, 4000)

    def _apply_local_api(self, settings: Settings) -> None:
        """Serve the local API, or stop serving it, as the settings say (off the GUI thread)."""
        if self.local_api is None or self.engine is None:
            return
        control = self.local_api

        def shown(url: str | None) -> None:
            self.api_label.setText(f"Local API: {url}" if url else "")
            self.local_api_changed.emit(url)

        work = (lambda job: control.start(settings)) if settings.server_enabled else (
            lambda job: control.stop())
        self.runner.start("misc", work, finished=lambda _: shown(control.url),
                          failed=lambda msg: (shown(None), self._say(
                              f"The local API could not start: {msg}", True)))

    def closeEvent(self, event) -> None:
        self.runner.shutdown()
        if self.local_api is not None:
            self.local_api.stop()
        super().closeEvent(event)
