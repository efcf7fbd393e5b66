"""The model contexts the engine holds: one per role, each loaded on first use.

`chat` answers questions and restores chats; `attach` prefills documents, so a GUI can compute
documents on one worker while the user chats on another. Loading a context registers its
model's fingerprint in the store and refuses, with a message saying why, a model whose cache
kvdesk cannot store and restore. `warm_up` readies the codec in the background once, so the
first restore or attach does not pay for it.

It owns the runtimes' lifetime and nothing else: what runs in a context is the sessions'.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from store import Store

from . import streaming
from .errors import EngineError
from .runtime import Runtime

CHAT = "chat"
ATTACH = "attach"


class Contexts:
    def __init__(self, store: Store, factory: Callable[[], Runtime], *, model_path: str,
                 levels: Sequence[str], chunk_tokens: int):
        self.store = store
        self._factory = factory
        self._model_path = model_path
        self._levels = tuple(levels)
        self._chunk_tokens = chunk_tokens
        self._runtimes: dict[str, Runtime] = {}
        self._lock = threading.Lock()
        self._warm_up: threading.Thread | None = None

    def get(self, role: str) -> Runtime:
        with self._lock:
            if role not in self._runtimes:
                rt = self._factory()
                if rt.sliding_window:
                    rt.close()
                    raise EngineError(
                        f"{rt.model_path.name} uses sliding-window attention, whose KV cache "
                        "kvdesk can measure (kvdesk eval) but not yet store and restore: "
                        "choose another model (--model, or Settings)")
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
        with self._lock:
            if self._warm_up is not None:
                return
            self._warm_up = threading.Thread(
                target=streaming.warm_up, name="codec-warm-up", daemon=True,
                args=(self._levels, (lay.n_layer, self._chunk_tokens, lay.channels)))
            self._warm_up.start()

    def wait_warm(self) -> None:
        """Block until the codec is ready (a server says it serves only then)."""
        if self._warm_up is not None:
            self._warm_up.join()

    def close(self) -> None:
        if self._warm_up is not None:
            self._warm_up.join()  # never leave numba working while the interpreter exits
        with self._lock:
            for rt in self._runtimes.values():
                rt.close()
            self._runtimes.clear()
