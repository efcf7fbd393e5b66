"""The GUI's entry point: `run(app)` opens the main window on an `App` and returns the exit code.

`desktop_app.launcher` calls it for `kvdesk gui` and `make run`. When the user changes the
model, context size or data folder and asks for a restart, the window closes and `run` builds a
new `App` from the new settings and opens a new window, in the same process.

It never touches the engine itself: the window asks for it on a worker thread, because loading
a model takes seconds.
"""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication

from desktop_app.app import App

from .main_window import MainWindow


def _ready_engine(app: App):
    """The engine, with its codec readied in the background (runs on the window's worker)."""
    engine = app.engine
    engine.warm_up()
    return engine


def run(app: App) -> int:
    qapp = QApplication.instance() or QApplication(sys.argv)
    qapp.setApplicationName("kvdesk")
    while True:
        restart = []
        window = MainWindow(lambda app=app: _ready_engine(app), app.settings)
        window.restart_requested.connect(restart.append)
        window.show()
        code = qapp.exec()
        app.close()
        if not restart:
            return code
        app = App(restart[-1])
