"""A calibration's measurements kept as it goes, so that one stopped goes on where it was.

Calibrating takes minutes of model runs (`calibrate`); the window or the server calibrates in
the background, and either may be closed, stopped or killed before it ends. Each measurement
that runs the model is kept under its name for one run (`run_key`: the model, the calibration
text, the settings, kvdesk's version and `FORMAT`) as it is made, and the next run of the same
reads it back instead of measuring it again (`Run.kept`). `KeptSteps` keeps them in the store's
settings, one run's per model, written as each is made (a store that cannot take them: the run
goes on without) and cleared once the calibration is stored.

What is kept are measurements (numbers), never KV or a calibration; this module never runs a
model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

import store as store_mod

from .. import __version__
from ..errors import Cancelled

log = logging.getLogger(__name__)

# Named in every run's key with kvdesk's version: raised when what a step measures changes,
# so that steps kept by an earlier kvdesk are measured again, never read back into another
# method or codec.
FORMAT = 1
SETTING = "calibration.steps."  # + a model's fingerprint: `KeptSteps`


class Steps(Protocol):
    """Where a calibration keeps its measurements as it goes (JSON values by name)."""

    def begin(self, run: str) -> None:
        """Steps of run `run` from now on: those of any other are dropped."""

    def get(self, name: str) -> Any | None: ...

    def put(self, name: str, value: Any) -> None: ...


def run_key(fingerprint: str, settings, text: str) -> str:
    """What names one calibration's measurements: the model, the text and the settings (a
    dataclass)."""
    return hashlib.sha256(json.dumps(
        {"model": fingerprint, "settings": asdict(settings), "format": FORMAT,
         "kvdesk": __version__, "text": hashlib.sha256(text.encode()).hexdigest()},
        sort_keys=True).encode()).hexdigest()


class Run:
    """One calibration's progress, stops and kept measurements."""

    def __init__(self, settings, progress: Callable[[str, float], None] | None,
                 cancel: threading.Event | None, pause: Callable[[], None] | None = None,
                 steps: Steps | None = None):
        self.settings, self.progress, self.cancel, self.pause = settings, progress, cancel, pause
        self.steps = steps

    def check(self) -> None:
        if self.pause is not None:
            self.pause()
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("calibration cancelled")

    def say(self, stage: str, fraction: float) -> None:
        self.check()
        if self.progress is not None:
            self.progress(stage, fraction)

    def kept(self, name: str, measure: Callable[[], Any]) -> Any:
        """The measurement `name`: read back from the steps when they hold it, else made and
        kept. Made or read, it is the value as JSON holds it, so that a run that reads it back
        goes on exactly as the one that made it."""
        found = self.steps.get(name) if self.steps is not None else None
        if found is None:
            found = json.loads(json.dumps(measure(), default=float))
            if self.steps is not None:
                self.steps.put(name, found)
        return found


class KeptSteps:
    """`Steps` in the store's settings, per model: each written as it is made."""

    def __init__(self, store: store_mod.Store, fingerprint: str):
        self.store, self.key = store, SETTING + fingerprint
        self.run: str | None = None
        self.steps: dict[str, Any] = {}
        self.resumed = 0  # measurements a stopped run kept, read back by this one

    def begin(self, run: str) -> None:
        kept = self.store.setting(self.key) or {}
        self.run = run
        self.steps = dict(kept.get("steps", {})) if kept.get("run") == run else {}
        self.resumed = len(self.steps)

    @property
    def note(self) -> str:
        """What the user is told of a run going on from a stopped one ("" if none)."""
        return (f"going on from the stopped calibration: {self.resumed} of its measurements "
                "are kept (the model's own cache is measured again)") if self.resumed else ""

    def get(self, name: str) -> Any | None:
        return self.steps.get(name)

    def put(self, name: str, value: Any) -> None:
        self.steps[name] = value
        if self.run is None:  # (a store that took no step: the run goes on, unkept)
            return
        try:
            self.store.set_setting(self.key, {"run": self.run, "steps": self.steps})
        except store_mod.StoreError as e:  # read-only, full: a resume is only a saving
            log.warning("calibration steps not kept (%s): a stopped run starts over", e)
            self.run = None

    def clear(self) -> None:
        """The run's steps dropped (its calibration is stored)."""
        self.steps = {}
        if self.store.setting(self.key) is not None:
            self.store.set_setting(self.key, None)
