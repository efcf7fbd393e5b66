"""Render packaging/kvdesk.svg to the 256 px PNG that desktops and installers ask for.

The SVG is the one source of the icon; the PNG is committed so a build needs no Qt SVG
renderer. Run with the venv's python after editing the SVG: `python packaging/make_icon.py`.
It never touches anything outside packaging/.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402 - the platform must be chosen before Qt loads
from PySide6.QtGui import QGuiApplication, QImage, QPainter  # noqa: E402
from PySide6.QtSvg import QSvgRenderer  # noqa: E402

HERE = Path(__file__).resolve().parent
SIZE = 256


def main() -> int:
    app = QGuiApplication(sys.argv[:1])  # noqa: F841 - QImage painting needs an application
    renderer = QSvgRenderer(str(HERE / "kvdesk.svg"))
    if not renderer.isValid():
        print("kvdesk.svg is not valid SVG", file=sys.stderr)
        return 1
    image = QImage(SIZE, SIZE, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    renderer.render(painter)
    painter.end()
    image.save(str(HERE / "kvdesk.png"))
    print(HERE / "kvdesk.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
