"""A model's calibration, one at a time in a data directory, kept as it goes and adopted.

The window and `kvdesk serve` each calibrate a new model by themselves, and a user may run
`kvdesk calibrate` beside them: minutes of both cores each. `calibrate_once` holds the data
directory's lock for the model's calibration (`store.datadir.locks`) while `calibrate` runs;
a second process waits, says so, and then takes the calibration the first one stored instead
of measuring the model again. The run's measurements are kept as they are made (`steps`), so
one stopped goes on where it was, and the result is adopted for the model's new caches.

This module orders runs; it measures nothing itself (`calibrate` does) and never decodes KV.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

import codec
import store as store_mod
from store.datadir.locks import TurnCancelled

from ..errors import Cancelled
from ..results import Progress
from . import calibrate
from .calibrations import Calibrations
from .steps import KeptSteps

WAITING = ("another kvdesk process is calibrating this model: waiting for it, then using its "
           "calibration")


def calibrate_once(store: store_mod.Store, calibrations: Calibrations, model_path: str | Path,
                   fingerprint: str, *, progress: Callable[[Progress], None] | None = None,
                   cancel: threading.Event | None = None,
                   pause: Callable[[], None] | None = None) -> codec.Calibration:
    """Calibrate the model (see the module docstring); raises Cancelled."""
    def say(stage: str, fraction: float, note: str = "") -> None:
        if progress is not None:
            progress(Progress("calibrate", round(fraction * 100), 100, stage, note))

    before = calibrations.current(fingerprint)
    turn = (contextlib.nullcontext() if store.read_only else store.locks.calibration(
        fingerprint, cancel=cancel, on_wait=lambda: say("waiting", 0.0, WAITING)))
    try:
        with turn:
            # another process may have stored one since `before` was read, waited for or not
            made = calibrations.reread(fingerprint)
            if made is not None and (before is None or made.to_bytes() != before.to_bytes()):
                return made
            steps = KeptSteps(store, fingerprint)
            cal = calibrate.calibrate(model_path, fingerprint=fingerprint, cancel=cancel,
                                      keep=steps, pause=pause,
                                      progress=lambda stage, f: say(stage, f, steps.note))
            calibrations.adopt(cal)
            steps.clear()
            return cal
    except TurnCancelled:
        raise Cancelled("calibration cancelled while waiting for another one") from None
