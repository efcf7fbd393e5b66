"""Saves PNG screenshots of the window's main states into docs/screenshots/ (`make screenshots`).

The states are driven through the window's own code paths on the scripted `ui.testing.FakeEngine`
(canned documents, chats and answers), so the pictures need no model and look the same on every
machine. Run as `python -m ui.screenshots [OUTPUT_DIR]`; it renders offscreen unless a Qt
platform is set. It writes only PNG files into the output folder.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEventLoop
from PySide6.QtWidgets import QApplication, QWidget

from desktop_app.settings import Settings

from . import theme
from .main_window import MainWindow
from .settings.settings_dialog import SettingsDialog
from .testing import FakeEngine
from .text.formatting import calibration_line

SIZE = (1180, 760)


def spin() -> None:
    # An event loop object, not the static QApplication.processEvents: in PySide6 6.12 the
    # static call leaks a reference to None on every call and soon aborts the interpreter.
    QEventLoop().processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not reach the state to capture")
        spin()


def settle(seconds: float = 0.3) -> None:
    """Let pending signals and repaints land before grabbing."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        spin()


def window(engine: FakeEngine, look: str = "light") -> MainWindow:
    # Not calibrating by itself: the calibration has a picture of its own, asked for by hand.
    w = MainWindow(lambda: engine, Settings(theme=look, calibrate_automatically=False))
    w.resize(*SIZE)
    w.show()
    wait_until(lambda: w.engine is not None and bool(w.chats or not engine.chats()))
    settle()
    return w


def save(widget: QWidget, out: Path, name: str) -> None:
    settle(0.2)
    path = out / f"{name}.png"
    widget.grab().save(str(path))
    print(path)


def main(argv: list[str]) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    out = Path(argv[0] if argv else "docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    QApplication.instance() or QApplication([])
    files = Path(tempfile.mkdtemp(prefix="kvdesk-shots-"))
    (files / "quarterly-report.md").write_text("quarterly revenue grew " * 3000)
    (files / "meeting-notes.txt").write_text("notes on the roadmap " * 400)
    (files / "diagram.png").write_bytes(b"\x89PNG\r\n\x1a\n")

    w = window(FakeEngine())
    save(w, out, "empty")
    w.close()

    engine = FakeEngine(step_s=0.15).seed()
    w = window(engine)
    w.attach_files([str(files / n) for n in ("quarterly-report.md", "meeting-notes.txt",
                                             "diagram.png")])
    wait_until(lambda: "computing" in w.doc_list.rows.itemAt(0).widget().phase.text())
    wait_until(lambda: w.doc_list.rows.itemAt(0).widget().bar.value() >= 40)
    save(w, out, "attaching")
    w.close()

    engine = FakeEngine().seed()
    w = window(engine)
    w.doc_list.list.item(0).setCheckState(w.doc_list.list.item(0).checkState().Checked)
    w.send("What does the paper say about restoring the cache?")
    wait_until(lambda: w.generation is None)
    save(w, out, "chatting")
    w.close()

    for look in ("light", "dark"):
        engine = FakeEngine().seed()
        w = window(engine, look)
        w.open_chat(engine.chats()[2].chat_id)
        wait_until(lambda w=w: w.reopen_job is None and len(w.chat_view.transcript()) > 1)
        save(w, out, "reopened" if look == "light" else "reopened-dark")
        w.close()

    # The codec calibrated for the model in the background while a reopened chat is read.
    engine = FakeEngine().seed()
    w = window(engine)
    w.open_chat(engine.chats()[0].chat_id)
    wait_until(lambda: w.reopen_job is None and len(w.chat_view.transcript()) > 1)
    engine.step_s = 1.0  # one stage a second: time to catch it in the middle
    w.calibrate_action.trigger()
    wait_until(lambda: w.calibration_bar.bar.value() >= 30)
    save(w, out, "calibrating")
    w.cancel_calibration()
    w.close()

    theme.apply(QApplication.instance(), "light")  # the dark window above repainted the app
    dialog = SettingsDialog(Settings(), codec_levels=calibration_line(FakeEngine().calibrate()))
    dialog.show()
    save(dialog, out, "settings")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
