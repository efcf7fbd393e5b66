"""Icons drawn in code, so they look the same on every platform and in offscreen screenshots
(emoji need a colour-emoji font, which many Linux machines and CI images lack).

Only painting: no state, no engine.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap


def paperclip(color: str, size: int = 64) -> QIcon:
    """A paperclip: two nested U-shaped loops, tilted like the usual attach symbol."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    p = QPainter(pixmap)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setPen(QPen(QColor(color), size / 14, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap,
                  Qt.PenJoinStyle.RoundJoin))
    p.translate(size / 2, size / 2)
    p.rotate(40)
    p.scale(size / 64, size / 64)
    path = QPainterPath(QPointF(6, -6))
    path.lineTo(6, 14)  # inner loop, right side, down
    path.arcTo(QRectF(-6, 8, 12, 12), 0, -180)  # inner bottom turn
    path.lineTo(-6, -18)  # inner loop, left side, up
    path.arcTo(QRectF(-6, -28, 18, 18), 180, -180)  # top turn, over to the outer right side
    path.lineTo(12, 16)  # outer right side, down
    path.arcTo(QRectF(-12, 4, 24, 24), 0, -180)  # outer bottom turn
    path.lineTo(-12, -12)  # outer left side, up to the end
    p.drawPath(path)
    p.end()
    return QIcon(pixmap)
