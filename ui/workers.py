"""Running engine calls off the GUI thread and bringing their results back through signals.

Every engine method blocks (a model, the codec and the store work inside it), so the window
never calls one directly: it wraps the call in a `Job`, which runs on a `QThreadPool` and
reports through Qt signals, which Qt delivers on the GUI thread. Cancellation is the
`threading.Event` that the engine polls.

This module never touches widgets and never decides what a result means for the user.
"""

from __future__ import annotations

import logging
import threading
import traceback
import weakref
from collections.abc import Callable

from PySide6.QtCore import QObject, QThreadPool, Signal

from desktop_app.errors import Cancelled, is_user_error, out_of_memory

log = logging.getLogger(__name__)


class JobSignals(QObject):
    progress = Signal(object)  # desktop_app.results.Progress
    token = Signal(str)  # a piece of the answer being generated
    restored = Signal(object)  # desktop_app.results.RestoreReport, before the first token
    finished = Signal(object)  # whatever the call returned
    failed = Signal(str)  # a message for the user (a traceback only went to the log)
    cancelled = Signal()
    done = Signal()  # after finished, failed or cancelled: the job is over


class Job:
    """One blocking call, `work(job)`, which may use `job.cancel` and `job.signals`' emitters.

    A plain object whose `run` a pool calls (its own runnable, deleted once it has run): a
    QRunnable of Python's is kept by the pool's wrapper for good."""

    def __init__(self, work: Callable[[Job], object]):
        self.work = work
        self.cancel = threading.Event()
        self.signals = JobSignals()
        self.error: Exception | None = None  # what it failed with, set before `failed` fires

    def run(self) -> None:
        try:
            if self.cancel.is_set():  # cancelled while it waited in the pool's queue
                raise Cancelled("cancelled before it started")
            result = self.work(self)
        except Cancelled:
            self.signals.cancelled.emit()
        except Exception as e:
            self.error = e
            if is_user_error(e):
                self.signals.failed.emit(str(e))
            elif isinstance(e, MemoryError):  # (not a bug: the machine's memory, said plainly)
                self.signals.failed.emit(out_of_memory(e, "Settings ▸ Context size"))
            else:  # a bug: keep the traceback for the log, say it briefly
                log.error("engine call failed:\n%s", traceback.format_exc())
                self.signals.failed.emit(f"Unexpected error: {type(e).__name__}: {e}")
        else:
            self.signals.finished.emit(result)
        self.signals.done.emit()


class Runner(QObject):
    """The window's thread pools; keeps each job alive until it is done.

    `attach` has one thread (the engine computes one document at a time, on its own model
    context); `chat` has one thread so that a reopen, the question typed meanwhile and a
    regenerate run in the order the user asked for them; `misc` serves quick listings;
    `calibrate` has one thread for the codec's calibration, which takes minutes and must hold
    up neither a listing nor a question.
    """

    LANES = ("attach", "chat", "misc", "calibrate")

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.pools = {lane: QThreadPool(self) for lane in self.LANES}
        for lane in ("attach", "chat", "calibrate"):
            self.pools[lane].setMaxThreadCount(1)
        self.pools["misc"].setMaxThreadCount(2)
        self.active: set[Job] = set()

    def start(self, lane: str, work: Callable[[Job], object], *,
              finished: Callable[[object], None] | None = None,
              failed: Callable[[str], None] | None = None, **signals: Callable) -> Job:
        """Run `work` on `lane`, its `finished`, `failed` and other `JobSignals` (`progress=`,
        `token=`, `cancelled=`...) connected first: a job that fails at once emits before a
        connection made after this returns, and its result would be lost."""
        job = Job(work)
        for name, slot in {"finished": finished, "failed": failed, **signals}.items():
            if slot is not None:
                getattr(job.signals, name).connect(slot)
        # Nothing but `active` holds the job once it has run: a slot holding it would be a
        # cycle through a Qt connection, which Python's collector cannot see (every job the
        # window ever ran was kept, with all its slots held).
        held = weakref.ref(job)
        job.signals.done.connect(lambda: self.active.discard(held()))
        self.active.add(job)
        self.pools[lane].start(job.run)
        return job

    def shutdown(self, timeout_ms: int = 10000) -> None:
        """Cancel everything and wait for the running calls to notice."""
        for job in list(self.active):
            job.cancel.set()
        for pool in self.pools.values():
            pool.waitForDone(timeout_ms)
