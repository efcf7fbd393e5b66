"""The rows of documents being attached: each one's phase and percent with a cancel button,
or why it failed; and the scrolling area holding them above the documents list.

These widgets display what they are given and turn clicks into signals; they never call the
engine (the main window does, on worker threads).
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.results import Progress

from ..text.formatting import in_window_terms, shortened

PHASE_WORDS = {"extract": "reading the file", "prefill": "computing the cache",
               "encode": "compressing", "store": "saving", "restore": "restoring",
               "recompute": "recomputing", "pull": "fetching from the shared cache",
               "push": "sharing", "wait": "waiting for another kvdesk window's answer",
               "repair": "repairing", "passages": "computing the passages' cache",
               "split": "longer than the context: splitting into passages"}


class AttachRow(QFrame):
    """One document being attached: its phase and percent, and a cancel button; or why it
    failed, with a button to dismiss the message."""

    cancel_clicked = Signal()
    dismissed = Signal()
    failed = Signal()

    def __init__(self, title: str, error_color: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = QLabel(shortened(title, 60), toolTip=title, minimumWidth=1)
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.phase = QLabel("waiting…", minimumWidth=1)
        self.phase.setWordWrap(True)  # (its row is as tall as its wrapped text: rows scroll)
        self.error = ""  # why it failed, once it has
        self._note = ""
        # (a screen reader says what the ✕ does, and to which document: its sign says neither)
        self.bar = QProgressBar(maximum=100, textVisible=False, maximumHeight=6,
                                accessibleName=f"Attaching {title}")
        self.button = QToolButton(text="✕", autoRaise=True, toolTip="Cancel",
                                  accessibleName=f"Cancel attaching {title}")
        self._title = title
        self.button.clicked.connect(self.cancel_clicked)
        self._error_color = error_color
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        layout.setSpacing(2)
        layout.addLayout(top)
        layout.addWidget(self.phase)
        layout.addWidget(self.bar)

    def show_progress(self, p: Progress) -> None:
        """A phase's percent; a phase of one step (reading the file: 1 of 1 once read, and
        what follows says nothing until the next phase) without one, its bar busy."""
        percent = int(100 * p.done / p.total) if p.total else 0
        if p.note:  # said at once (a document longer than the context), kept under the row
            self._note = in_window_terms(p.note)
        measured = p.total > 1
        if p.phase == "extract" and p.total != 1:  # a folder: its files found, then read
            said = (f"reading the folder's files {percent}% ({p.done:,} of {p.total:,})"
                    if p.total else f"looking through the folder: {p.done:,} found so far…")
        else:
            said = PHASE_WORDS.get(p.phase, p.phase) + (f" {percent}%" if measured else "…")
        self.phase.setText(said + (f"\n{self._note}" if self._note else ""))
        self.bar.setMaximum(100 if measured else 0)  # (0: a busy bar)
        self.bar.setValue(percent)

    def show_error(self, message: str) -> None:
        self.error = message
        self.bar.hide()
        self.phase.setText(message)
        self.phase.setStyleSheet(f"color: {self._error_color}")
        self.phase.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.button.setToolTip("Dismiss")
        self.button.setAccessibleName(f"Dismiss {self._title}")
        self.button.clicked.disconnect()
        self.button.clicked.connect(self.dismissed)
        self.failed.emit()


class RowsArea(QScrollArea):
    """The attach rows, scrolling: as tall as they are, up to a third of the sidebar, so that
    however many there are the window never grows and the lists keep their room."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.setWidget(QWidget())
        self.rows = QVBoxLayout(self.widget())
        self.rows.setContentsMargins(0, 0, 0, 0)
        self.rows.setSpacing(4)

    def sizeHint(self) -> QSize:
        inner = self.widget()
        width = self.viewport().width() or inner.sizeHint().width()
        tall = (inner.heightForWidth(width) if inner.hasHeightForWidth() else -1)
        return QSize(inner.sizeHint().width(),
                     min(max(tall, inner.sizeHint().height()), self.maximumHeight()))

    def minimumSizeHint(self) -> QSize:  # one row's worth at least, when there are rows
        return QSize(0, min(self.sizeHint().height(), 4 * self.fontMetrics().height()))

    def resizeEvent(self, event) -> None:  # (a new width wraps the errors anew)
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self.updateGeometry()
