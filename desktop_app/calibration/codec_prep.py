"""Readying the codec's kernels in the background at start, and what a question does meanwhile.

`CodecPrep(shape, levels).start()` runs `codec.precompile` on a daemon thread, after the
caller's `first` steps, each step when `pause` lets it (the engine's restores go first): every
kernel the app reaches is loaded from its cache, or compiled where no cache has it (a checkout
whose `make venv` warm-up could not write, a bundle on a CPU its shipped cache does not fit, a
changed codec). `state()` says, at any moment, whether it is still checking (loading from the
caches: about a second), compiling (the GUI's "preparing the codec (once)"), ready or failed,
how far it is, and how many seconds are expected to be left. Those expectations come from a
profile of the last compile on this machine (`profile_path`), else from the prior below, and
are scaled by how the steps done so far compared with it.

`decide(...)` is the choice a question asked meanwhile makes: wait for the codec and restore
from the store, or recompute from text, whichever is expected sooner. It is pure: the engine
passes its own expectations.

A failure here is reported in the state, never raised: the codec then compiles on first use,
as it would without this module. Nothing here knows of Qt, llama.cpp or the store.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from codec import precompile
from codec.jit import jitcache

from ..results import CHECKING, COMPILING, FAILED, READY, PrepState

# Until this machine has compiled the codec once: the whole compile measured 15-30 s on the
# 2-core reference machine (benchmarks/RESULTS.md, "Compiled kernels"), and a load from the
# caches about a second.
PRIOR_COMPILE_S = 25.0
PRIOR_LOAD_S = 1.0

@dataclass(frozen=True)
class Decision:
    action: str  # "restore" (the codec is ready), "wait" (for it, then restore), "recompute"
    expected_s: float  # until the KV is in place, by that action
    reason: str  # one sentence for the user, read once the answer is there: as done


def decide(*, prep_left_s: float, restore_s: float, recompute_s: float) -> Decision:
    """Whichever is sooner for a question that needs stored KV while the codec prepares:
    waiting `prep_left_s` more, then restoring (`restore_s`), or recomputing the tokens from
    text (`recompute_s`, which needs no codec). A tie waits: the restored KV is the one the
    user chose to keep."""
    if prep_left_s <= 0:
        return Decision("restore", restore_s, "the codec is ready")
    wait_s = prep_left_s + restore_s
    if wait_s <= recompute_s:
        return Decision("wait", wait_s, f"waited about {wait_s:.0f} s for it to finish "
                        f"(recomputing from text would have taken about {recompute_s:.0f} s)")
    return Decision("recompute", recompute_s, f"recomputed from text (about {recompute_s:.0f} "
                    f"s) rather than wait about {prep_left_s:.0f} s more for it")


def estimate_left_s(names: Sequence[str], done: int, compiling: bool,
                    expected: dict[str, float], took: dict[str, float],
                    in_step_s: float) -> float:
    """Expected seconds until the steps `names` are all done, `done` of them finished (taking
    `took`) and the next one running for `in_step_s`. Loading from the caches: the prior. While
    compiling: the profile's seconds (`expected`; the prior spread evenly for steps it lacks)
    for the steps left, scaled by how the finished ones compared with their expectation."""
    if not names:
        return PRIOR_COMPILE_S if compiling else PRIOR_LOAD_S
    if not compiling:
        return PRIOR_LOAD_S * (len(names) - done) / len(names)
    expect = [expected.get(n, PRIOR_COMPILE_S / len(names)) for n in names]
    spent_expected = sum(expect[:done])
    scale = (sum(took.get(n, 0.0) for n in names[:done]) / spent_expected
             if spent_expected > 1.0 else 1.0)
    current = expect[done] * scale - in_step_s if done < len(names) else 0.0
    return max(0.0, current) + sum(expect[done + 1:]) * scale


class CodecPrep:
    """The background preparation of the codec for chunks of `shape` at `levels`."""

    def __init__(self, shape: tuple[int, int, int], levels: Sequence[str] | None = None, *,
                 profile_path: Path | None = None,
                 on_change: Callable[[PrepState], None] | None = None,
                 pause: Callable[[], None] | None = None,
                 first: Sequence[precompile.Step] = ()):
        self._shape, self._levels = shape, levels
        self._first = list(first)  # the caller's steps, run before precompile's
        self._pause = pause  # called before each step: returns when it may run
        self._profile_path = profile_path
        self._on_change = on_change  # called from the worker thread
        self._expected = self._load_profile()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done_event = threading.Event()
        self._cancel = threading.Event()
        self._started = 0.0
        self._step_started = 0.0
        self._took: dict[str, float] = {}
        self._names: list[str] = []
        self._compiled_before = 0
        self._state = PrepState("idle", 0, 0, "", 0.0, 0.0, 0)

    def start(self) -> None:
        """Start the preparation (once; later calls do nothing)."""
        with self._lock:
            if self._thread is not None:
                return
            self._compiled_before = jitcache.compiles()[0]  # also starts watching compiles
            self._started = self._step_started = time.perf_counter()
            self._state = PrepState(CHECKING, 0, 0, "", 0.0, PRIOR_LOAD_S, 0)
            self._thread = threading.Thread(target=self._run, name="codec-prep", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until ready or failed (True), or until `timeout` seconds passed (False)."""
        return self._done_event.wait(timeout)

    def join(self) -> None:
        """Wait for the thread to end (never leave numba compiling while the process exits)."""
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        """Stop before the next step (a closing process needs no kernel it has not used yet:
        what it used, it loaded itself; what was compiled so far stays cached)."""
        self._cancel.set()

    def state(self) -> PrepState:
        with self._lock:
            s = self._state
            if not s.busy:
                return s
            now = time.perf_counter()
            compiled = jitcache.compiles()[0] - self._compiled_before
            phase = COMPILING if compiled or jitcache.compiling() else CHECKING
            return replace(s, phase=phase, elapsed_s=round(now - self._started, 2),
                           compiled=compiled, left_s=round(self._left_s(s, phase, now), 1))

    # -- the worker ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            todo = [*self._first, *precompile.steps(self._shape, self._levels)]
            with self._lock:
                self._names = [step.name for step in todo]
            took = precompile.run_steps(todo, progress=self._progress, cancel=self._cancel,
                                        pause=self._pause)
            compiled = jitcache.compiles()[0] - self._compiled_before
            if len(took) < len(todo):
                self._finish(FAILED, compiled, "stopped before it finished: the app is closing")
                return
            if compiled:
                self._save_profile(took)
            self._finish(READY, compiled, None)
        except Exception as e:  # noqa: BLE001 - reported in the state; the codec still works
            self._finish(FAILED, jitcache.compiles()[0] - self._compiled_before,
                         f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")

    def _progress(self, done: int, total: int, step: str) -> None:
        now = time.perf_counter()
        with self._lock:
            prev = self._state.step
            if prev:
                self._took[prev] = now - self._step_started
            self._step_started = now
            self._state = replace(self._state, phase=CHECKING, done=done, total=total,
                                  step=step)
        self._notify()

    def _finish(self, phase: str, compiled: int, error: str | None) -> None:
        with self._lock:
            s = self._state
            self._state = PrepState(phase, s.total if phase == READY else s.done, s.total, "",
                                    round(time.perf_counter() - self._started, 2), 0.0,
                                    compiled, error)
        self._done_event.set()
        self._notify()

    def _notify(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change(self.state())
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the preparation
                traceback.print_exc()

    # -- expectations ----------------------------------------------------------------------

    def _left_s(self, s: PrepState, phase: str, now: float) -> float:
        return estimate_left_s(self._names, s.done, phase == COMPILING, self._expected,
                               self._took, now - self._step_started)

    def _load_profile(self) -> dict[str, float]:
        if self._profile_path is None:
            return {}
        try:
            data = json.loads(self._profile_path.read_text())
            return {str(k): float(v) for k, v in data["steps"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _save_profile(self, took: dict[str, float]) -> None:
        if self._profile_path is None:
            return
        try:
            self._profile_path.parent.mkdir(parents=True, exist_ok=True)
            self._profile_path.write_text(json.dumps({"steps": took, **jitcache.status()}))
        except OSError:
            pass  # the next preparation estimates from the prior instead
