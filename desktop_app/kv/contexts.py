"""The model contexts the engine holds: one per role, each loaded on first use.

`chat` answers questions and restores chats; `attach` prefills documents, so a GUI can compute
documents on one worker while the user chats on another. Loading a context registers its
model's fingerprint in the store; a model whose cache kvdesk cannot store and restore is refused
by the runtime as it loads, with a message saying why (`support`). `warm_up` readies the codec
in the background once, so the first restore or attach does not pay for it: first a stored
chunk per level is decoded (the kernels and tables a reopen needs first), then every kernel is
loaded from numba's caches (or compiled where none has them); neither needs the model, so
both run while it loads (llama.cpp loads without holding the GIL); `codec_prep`:
`codec_state()` says how far that is, for a GUI and for a question asked meanwhile. Then, once a
context is loaded and the first restore is done (or an attach begins, or a server is about to
serve), the per-shape tables encoding needs for the model's chunks, with its calibration when
it has one: seconds of work that no restore needs, which would otherwise slow the first
reopen. That is in long-running processes: a one-shot command's warm-up stops once its model
has loaded, unless it is compiling, and its flow loads or builds the rest it uses; and when
numba's cache already holds every kernel (`jitcache.kernels_cached`, a stamp the last full
warm-up or `make venv` wrote), a one-shot command runs no warm-up at all: on two cores its
decoding would only compete with the imports, and nothing would be compiling for a question
to learn of. The warm-up gives way to restores (`restoring`): between its steps it waits
while one runs. Where the restore's kernels are compiled ahead of time (`codec.backend.aot`)
and numba's are cached, a reopen needs none of numba's, so loading them waits for the first
restore to finish (or an encode, or a few idle seconds).

It owns the runtimes' lifetime and nothing else: what runs in a context is the sessions'.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from codec import precompile
from codec.backend import aot
from codec.jit import jitcache
from store import Store

from ..calibration import codec_prep
from ..calibration.calibrations import Calibrations
from ..model.runtime import Runtime
from ..results import CHECKING, COMPILING, READY, PrepState
from . import streaming
from .speeds import Speeds

CHAT = "chat"
ATTACH = "attach"
# With the restore's kernels compiled ahead of time, how long a long-running process's warm-up
# waits for a first restore or encode before it loads numba's kernels all the same.
JIT_IDLE_S = 3.0


class Contexts:
    def __init__(self, store: Store, factory: Callable[[], Runtime], *, model_path: str,
                 levels: Sequence[str], chunk_tokens: int, calibrations: Calibrations,
                 background: bool = True):
        self.store = store
        # A long-running process (the window, a server) readies the per-shape tables ahead
        # too; a one-shot command only the kernels, and builds the tables it uses itself: its
        # exit would otherwise wait for a table it never needs (a second or more).
        self._tables_ahead = background
        self._calibrations = calibrations
        self._factory = factory
        self._model_path = model_path
        self._levels = tuple(levels)
        self._chunk_tokens = chunk_tokens
        self._runtimes: dict[str, Runtime] = {}
        self._lock = threading.Lock()
        self._warm_lock = threading.Lock()  # not _lock: that one is held while a model loads
        self._warm_up: threading.Thread | None = None
        self._cached = False  # a one-shot command found every kernel cached: no warm-up
        self._closing = threading.Event()
        self._prep: codec_prep.CodecPrep | None = None
        self._loaded = threading.Event()  # some context is loaded: the model's layout is known
        self._restores = 0
        self._no_restore = threading.Event()  # what the warm-up waits for between its steps
        self._no_restore.set()
        # The encoding side waits for this: the first restore done, an attach begun, a server
        # about to serve (`encoding_soon`).
        self._encoding_soon = threading.Event()
        # Loading numba's kernels waits for this (`_until_needed`): the first restore done,
        # something about to encode, or someone waiting for the codec.
        self._jit_needed = threading.Event()

    def get(self, role: str) -> Runtime:
        with self._lock:
            if role not in self._runtimes:
                rt = self._factory()  # refuses a model whose cache kvdesk cannot keep
                self._runtimes[role] = rt
                self.store.register_model(rt.fingerprint, self._model_path or str(rt.model_path),
                                          {**rt.layout.__dict__, "n_ctx": rt.n_ctx})
                self._loaded.set()
                self._one_shot_loaded()
            return self._runtimes[role]

    def _one_shot_loaded(self) -> None:
        """A one-shot command's model has loaded: from here its warm-up would only compete with
        the restore or prefill that follows, which loads what it uses itself; it stops at its
        next step. Unless it is compiling: what a question does meanwhile depends on it."""
        prep = self._prep
        if not self._tables_ahead and prep is not None and prep.state().phase == CHECKING:
            prep.stop()

    def loaded(self) -> Runtime:
        """A context of the model, one already loaded if any (else the chat's, loaded)."""
        return self._runtimes.get(CHAT) or self._runtimes.get(ATTACH) or self.get(CHAT)

    @property
    def fingerprint(self) -> str:
        """The model's cache fingerprint (loading the chat context if none is loaded)."""
        return self.loaded().fingerprint

    def warm_up(self) -> None:
        """Ready the codec in the background (once), starting now: the flows that encode or
        decode call it before they load their context, a GUI at start-up."""
        with self._warm_lock:
            if self._warm_up is not None or self._cached:
                return
            cached = jitcache.kernels_cached(list(self._levels))
            if not self._tables_ahead and cached:
                self._cached = True
                return
            # First what a reopen decodes first (a stored chunk per level: its kernels and
            # tables), then every kernel: numba compiles per argument type, not shape, so a
            # small chunk loads them all.
            first = [precompile.Step("stored chunks", lambda: streaming.warm_up_restore(
                self.store, self._levels, self._calibrations.resolver, cancel=self._closing))]
            if cached and aot.load() is not None:
                # Restores run the kernels compiled ahead of time: loading numba's (a second
                # of imports holding the GIL) would only slow the first reopen down; it waits
                # until one is done, something encodes, or nothing has come for a while.
                first.append(precompile.Step("until first needed", self._until_needed))
            self._prep = codec_prep.CodecPrep(precompile.SMALL_SHAPE, self._levels,
                                              pause=self._give_way, first=first)
            self._warm_up = threading.Thread(target=self._prepare, args=(self._prep,),
                                             name="codec-warm-up", daemon=True)
            self._warm_up.start()

    def _prepare(self, prep: codec_prep.CodecPrep) -> None:
        prep.start()
        prep.wait()
        if not self._tables_ahead:
            return
        # The tables need the model's layout; and encoding's are needed at the earliest after
        # the first answer: built before, they would compete with the first reopen.
        for event in (self._loaded, self._encoding_soon):
            while not event.wait(0.05):
                if self._closing.is_set():
                    return
        with self._lock:
            rt = next(iter(self._runtimes.values()), None)
        if rt is None:  # closed meanwhile
            return
        lay = rt.layout
        # The shapes of the chunks encoded and decoded: the full-attention layers' chunks and,
        # for a sliding-window model, its window's parts.
        shapes = [(layers, self._chunk_tokens, lay.channels)
                  for layers in (lay.full_layers, lay.swa_layers) if layers]
        streaming.warm_up(self._levels, shapes, self._calibrations.current(rt.fingerprint),
                          cancel=self._closing, pause=self._give_way)

    @contextlib.contextmanager
    def restoring(self) -> Iterator[None]:
        """Around a restore: the warm-up waits at its next step until it is done (the user's
        chat goes first; what the restore needs of the codec, it loads itself)."""
        with self._warm_lock:
            self._restores += 1
            self._no_restore.clear()
        try:
            yield
        finally:
            with self._warm_lock:
                self._restores -= 1
                if not self._restores:
                    self._no_restore.set()
            self._encoding_soon.set()
            self._jit_needed.set()

    def encoding_soon(self) -> None:
        """Something will encode soon (an attach begins): the warm-up builds encoding's tables
        now rather than after the first restore."""
        self._encoding_soon.set()
        self._jit_needed.set()

    def _until_needed(self) -> None:
        self._jit_needed.wait(JIT_IDLE_S)

    def _give_way(self) -> None:
        while not self._no_restore.wait(0.05):
            if self._closing.is_set():
                return

    def codec_state(self) -> PrepState:
        """How far readying the codec is (phase "idle" before `warm_up`)."""
        prep = self._prep
        if prep is None:
            return PrepState(READY if self._cached else "idle", 0, 0, "", 0.0, 0.0, 0)
        return prep.state()

    def recompute_while_compiling(self, rt: Runtime, n_tokens: int, speeds: Speeds,
                                  levels: Sequence[str], notes: list[str]) -> bool:
        """While the codec's kernels are being compiled: whether recomputing `n_tokens`
        stored tokens is sooner than waiting for them (said in `notes` either way; waited for
        here when waiting is sooner). While they are only loaded from numba's caches (a
        second or two), a restore goes ahead at once."""
        state = self.codec_state()
        if state.phase != COMPILING:
            return False
        decode_s = rt.layout.raw_bytes(n_tokens) / 1e6 / max(speeds.decode(lvl)
                                                              for lvl in levels)
        choice = codec_prep.decide(prep_left_s=state.left_s, restore_s=decode_s,
                                   recompute_s=n_tokens / speeds.prefill_tps)
        notes.append(f"the codec was being prepared (once): {choice.reason}")
        if choice.action == "wait":
            self.wait_codec()
        return choice.action == "recompute"

    def wait_codec(self) -> None:
        """Block until the codec's kernels are ready (or their preparation failed)."""
        self._jit_needed.set()
        if self._prep is not None:
            self._prep.wait()

    def wait_warm(self, stop: threading.Event | None = None) -> None:
        """Block until the codec is ready (a server says it serves only then), or `stop`."""
        self._encoding_soon.set()
        self._jit_needed.set()
        while self._warm_up is not None and self._warm_up.is_alive() and not (
                stop is not None and stop.is_set()):
            self._warm_up.join(0.1)

    def close(self) -> None:
        # What is left of the warm-up serves no one once the app closes: it stops at its next
        # step. It is still joined: numba must never be working while the interpreter exits.
        self._closing.set()
        self._jit_needed.set()  # ends a wait in `_until_needed`; no step runs after it
        if self._prep is not None:
            self._prep.stop()
        if self._warm_up is not None:
            self._warm_up.join()
        with self._lock:
            for rt in self._runtimes.values():
                rt.close()
            self._runtimes.clear()
