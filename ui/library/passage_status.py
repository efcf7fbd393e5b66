"""The background passage pass in the status bar: the document it caches, how far it is and
how long it should take, with Pause and Resume.

A mixin of `MainWindow` (ui.main_window), which calls `_build_passage_status` while it builds
itself; `ui.library.listing` hands it the pass's state with every look at the documents
(`_show_pass`). While the pass works or waits, the window looks at it again every
`PASS_POLL_MS`: `EngineAPI.passage_pass` is read from the engine's memory, never the store.
The time left is the pass's own measured rate (`desktop_app.passagepass`).

A pause holds the pass before its next passage for this run of kvdesk: it goes on at Resume
or at the next start; the setting `passages_in_background` is the permanent off switch.
Questions are answered either way, and still cache the passages they read. It never calls
the engine on the GUI thread.
"""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QPushButton, QWidget

from desktop_app.passagepass import PassagePass

from ..statusbar import ElidedLabel

PASS_POLL_MS = 2000
PAUSE_TIP = ("Stop caching passages in the background until Resume, or until kvdesk next "
             "starts. Questions still cache the passages they read. To turn it off for good: "
             "Settings ▸ \"Compute every passage's cache in the background after attaching\"")
RESUME_TIP = "Go on caching passages in the background from where the pass stopped"


class PassageBar(QWidget):
    """The running pass in the status bar: its document and count, a bar, and Pause/Resume."""

    pause_clicked = Signal(bool)  # True: pause, False: resume

    def __init__(self):
        super().__init__(visible=False)
        self.paused = False
        self.label = ElidedLabel(minimumWidth=120)  # (never widens the window: cut to fit)
        self.bar = QProgressBar(maximum=100, textVisible=False, maximumWidth=90,
                                maximumHeight=12)
        self.button = QPushButton("Pause")
        self.button.clicked.connect(lambda: self.pause_clicked.emit(not self.paused))
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label)
        row.addWidget(self.bar)
        row.addWidget(self.button)

    def show_state(self, state: PassagePass) -> None:
        if state.doc_id is None:
            self.hide()
            return
        self.paused = state.paused
        rate = (f" Here it computes about {state.per_minute:.0f} a minute." if state.per_minute
                else "")
        self.label.about = ("Each passage of a long document gets its cache in the background, "
                            f"so that no question waits for it.{rate} It waits while a question "
                            "is answered, and stops when the storage budget is full.")
        self.label.setText(("Passage caching paused: " if state.paused else
                            "Caching passages: ") + state.line())
        self.bar.setValue(100 * state.done // state.total if state.total else 0)
        self.button.setText("Resume" if state.paused else "Pause")
        self.button.setToolTip(RESUME_TIP if state.paused else PAUSE_TIP)
        self.button.setEnabled(True)
        self.show()


class PassagesMixin:
    def _build_passage_status(self) -> None:
        self.passage_bar = PassageBar()
        self.statusBar().addPermanentWidget(self.passage_bar)
        self.passage_bar.pause_clicked.connect(self.pause_passages)
        self.pass_timer = QTimer(self, singleShot=True, interval=PASS_POLL_MS)
        self.pass_timer.timeout.connect(self.look_at_passages)
        self.passage_state = PassagePass()

    def look_at_passages(self) -> None:
        engine = self.engine
        if engine is not None:
            self.runner.start("misc", lambda job: engine.passage_pass(),
                              finished=self._show_pass, failed=self._pass_unread)

    def _show_pass(self, state: PassagePass) -> None:
        self.passage_state = state
        self.passage_bar.show_state(state)
        if state.doc_id is not None or state.queued:  # (working, or waiting: looked at again)
            self.pass_timer.start()

    def _pass_unread(self, message: str) -> None:
        self.passage_bar.hide()  # (the documents' list says what cannot be read)

    def pause_passages(self, paused: bool) -> None:
        """Pause the background pass (until Resume or the next start), or resume it."""
        engine = self.engine
        if engine is None:
            return
        self.passage_bar.button.setEnabled(False)  # (until the engine says it is done)
        self.runner.start("misc", lambda job: (engine.pause_passages(paused),
                                               engine.passage_pass())[1],
                          finished=self._show_pass, failed=self._pause_failed)

    def _pause_failed(self, message: str) -> None:
        self.passage_bar.button.setEnabled(True)
        self._say(message, True)
