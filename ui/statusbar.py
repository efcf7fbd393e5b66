"""The window's status bar, whose messages fit: one too long for the room beside the
permanent widgets is cut with "…", and the whole of it is in the tooltip.

Qt's own status bar draws a message on one line and clips it at the first permanent widget
or at the window's edge: "...a larger storage budget (Settings) cac" (probe 119). Here the
message is a label laid out with the permanent widgets, so it gets the room they leave, and
`showMessage`, `currentMessage`, `clearMessage` and `messageChanged` keep Qt's meaning
(`currentMessage` is the whole message). It never decides what is said.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QStatusBar


class ElidedLabel(QLabel):
    """A one-line label that shrinks to any width, its text cut with "…" where it does not
    fit, and then given whole in its tooltip (before `about`, what the tooltip says anyway)."""

    about = ""

    def minimumSizeHint(self) -> QSize:
        return QSize(0, super().minimumSizeHint().height())

    def cut(self) -> bool:
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def paintEvent(self, event) -> None:
        rect = self.contentsRect()
        shown = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight,
                                              rect.width())
        QPainter(self).drawText(rect, Qt.AlignmentFlag.AlignLeft
                                | Qt.AlignmentFlag.AlignVCenter, shown)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._tip()

    def setText(self, text: str) -> None:
        super().setText(text)
        self._tip()

    def _tip(self) -> None:
        self.setToolTip("\n\n".join(t for t in (self.text() * self.cut(), self.about) if t))


class StatusBar(QStatusBar):
    def __init__(self):
        super().__init__()
        self.message = ElidedLabel()
        self.message.setTextFormat(Qt.TextFormat.PlainText)
        self.addWidget(self.message, 1)
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.clearMessage)

    def showMessage(self, text: str, timeout: int = 0) -> None:
        """Say `text` until the next message, or for `timeout` ms."""
        self.message.setText(text)
        if timeout > 0:
            self._timer.start(timeout)
        else:
            self._timer.stop()
        self.messageChanged.emit(text)

    def currentMessage(self) -> str:
        return self.message.text()

    def clearMessage(self) -> None:
        self._timer.stop()
        if self.message.text():
            self.message.setText("")
            self.messageChanged.emit("")
