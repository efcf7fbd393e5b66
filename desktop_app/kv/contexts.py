"""The model contexts the engine holds: one per role, each loaded on first use.

`chat` answers questions and restores chats; `attach` prefills documents, so a GUI can compute
documents on one worker while the user chats on another. Loading a context registers its
model's fingerprint in the store; a model whose cache kvdesk cannot store and restore is refused
by the runtime as it loads, with a message saying why (`support`). `warm_up` readies the codec
in the background once, so the first restore or attach does not pay for it: its kernels loaded
from numba's caches, or compiled where none has them (`codec_prep`: `codec_state()` says how
far that is, for a GUI and for a question asked meanwhile), then its per-shape tables built
for the model's chunks, with its calibration when it has one.

It owns the runtimes' lifetime and nothing else: what runs in a context is the sessions'.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from store import Store

from ..calibration import codec_prep
from ..calibration.calibrations import Calibrations
from ..model.runtime import Runtime
from ..results import PrepState
from . import streaming

CHAT = "chat"
ATTACH = "attach"


class Contexts:
    def __init__(self, store: Store, factory: Callable[[], Runtime], *, model_path: str,
                 levels: Sequence[str], chunk_tokens: int, calibrations: Calibrations):
        self.store = store
        self._calibrations = calibrations
        self._factory = factory
        self._model_path = model_path
        self._levels = tuple(levels)
        self._chunk_tokens = chunk_tokens
        self._runtimes: dict[str, Runtime] = {}
        self._lock = threading.Lock()
        self._warm_up: threading.Thread | None = None
        self._closing = threading.Event()
        self._prep: codec_prep.CodecPrep | None = None

    def get(self, role: str) -> Runtime:
        with self._lock:
            if role not in self._runtimes:
                rt = self._factory()  # refuses a model whose cache kvdesk cannot keep
                self._runtimes[role] = rt
                self.store.register_model(rt.fingerprint, self._model_path or str(rt.model_path),
                                          {**rt.layout.__dict__, "n_ctx": rt.n_ctx})
            return self._runtimes[role]

    @property
    def fingerprint(self) -> str:
        """The model's cache fingerprint (loading the chat context if none is loaded)."""
        rt = self._runtimes.get(CHAT) or self._runtimes.get(ATTACH) or self.get(CHAT)
        return rt.fingerprint

    def warm_up(self, rt: Runtime | None = None) -> None:
        """Ready the codec in the background (once): the flows that encode or decode call it
        first thing, a GUI may call it at start-up."""
        lay = (rt or self.get(CHAT)).layout
        # The shapes of the chunks encoded and decoded: the full-attention layers' chunks and,
        # for a sliding-window model, its window's parts.
        shapes = [(layers, self._chunk_tokens, lay.channels)
                  for layers in (lay.full_layers, lay.swa_layers) if layers]
        cal = self._calibrations.current((rt or self.get(CHAT)).fingerprint)
        with self._lock:
            if self._warm_up is not None:
                return
            # numba compiles per argument type, not shape: one shape compiles every kernel
            self._prep = codec_prep.CodecPrep(shapes[0], self._levels)
            self._warm_up = threading.Thread(
                target=self._prepare, name="codec-warm-up", daemon=True,
                args=(self._prep, shapes, cal))
            self._warm_up.start()

    def _prepare(self, prep: codec_prep.CodecPrep, shapes, cal) -> None:
        prep.start()
        prep.wait()
        # The preparation ran every level at the first shape already: without a calibration,
        # only the other shapes (a sliding-window model's window parts) still need tables.
        streaming.warm_up(self._levels, shapes if cal is not None else shapes[1:], cal,
                          cancel=self._closing)

    def codec_state(self) -> PrepState:
        """How far readying the codec is (phase "idle" before `warm_up`)."""
        prep = self._prep
        return PrepState("idle", 0, 0, "", 0.0, 0.0, 0) if prep is None \
            else prep.state()

    def wait_codec(self) -> None:
        """Block until the codec's kernels are ready (or their preparation failed)."""
        if self._prep is not None:
            self._prep.wait()

    def wait_warm(self) -> None:
        """Block until the codec is ready (a server says it serves only then)."""
        if self._warm_up is not None:
            self._warm_up.join()

    def close(self) -> None:
        # What is left of the warm-up serves no one once the app closes: it stops at its next
        # step. It is still joined: numba must never be working while the interpreter exits.
        self._closing.set()
        if self._prep is not None:
            self._prep.stop()
        if self._warm_up is not None:
            self._warm_up.join()
        with self._lock:
            for rt in self._runtimes.values():
                rt.close()
            self._runtimes.clear()
