"""The GUI's entry point: `run(app, make_app)` opens the main window and returns the exit code.

`desktop_app.launcher` calls it for `kvdesk gui` and `make run`, with the `App` and how to
build another. When the user changes the model, context size or data folder and asks for a
restart, the window closes and `run` builds a new app from the new settings (`make_app`) and
opens a new window, in the same process; `ui` itself never imports the model runtime.

It never touches the engine itself: the window asks for it on a worker thread, because loading
a model takes seconds.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from desktop_app.protocol import AppAPI, EngineAPI, LocalAPIControl
from desktop_app.settings import Settings

from .main_window import MainWindow


@contextlib.contextmanager
def _closing_on_signals(window: MainWindow):
    """Ctrl-C in the terminal (SIGINT) and SIGTERM (a logout, a service manager) close the
    window as its close button does: answers in flight stop, the local API it serves stops
    cleanly. (Python runs a signal handler only between its own instructions, which Qt's
    event loop never reaches when idle: a timer brings it back often enough to see one.)"""
    def close(*_) -> None:  # a dialog open over it first: its own event loop runs meanwhile
        for widget in QApplication.topLevelWidgets():
            if widget is not window and widget.isVisible():
                widget.close()
        window.close()

    previous = {s: signal.signal(s, close) for s in (signal.SIGINT, signal.SIGTERM)}
    tick = QTimer(interval=200)
    tick.timeout.connect(lambda: None)
    tick.start()
    try:
        yield
    finally:
        tick.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _ready_engine(app: AppAPI) -> EngineAPI:
    """The engine, with its codec readied in the background (runs on the window's worker)."""
    engine = app.engine
    engine.warm_up()
    return engine


def run(app: AppAPI, make_app: Callable[[Settings], AppAPI],
        serve: Callable[[AppAPI], LocalAPIControl] | None = None) -> int:
    """The window on `app`; after a restart asked for in the settings, on make_app(settings).

    `serve(app)` makes the local API server the settings toggle (None: the window has none).
    """
    qapp = QApplication.instance() or QApplication(sys.argv)
    qapp.setApplicationName("kvdesk")
    while True:
        restart = []
        local_api = serve(app) if serve is not None else None
        window = MainWindow(lambda app=app: _ready_engine(app), app.settings,
                            local_api=local_api, list_models=app.list_models,
                            start_notes=app.take_notes)
        window.restart_requested.connect(restart.append)
        window.show()
        with _closing_on_signals(window):
            code = qapp.exec()
        if local_api is not None:
            local_api.stop()
        app.close()
        if not restart:
            return code
        app = make_app(restart[-1])
