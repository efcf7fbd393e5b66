"""The exact prefix of a blended chat, computed in the background and stored.

A chat over several documents first answers from their caches blended (approximate, never
stored). Then this pass computes the chat's whole context exactly — a prefill of its
documents and turns — in the attach context, and stores it as the chat's entry, so its later
turns and reopens are exact. It is low priority: it computes in small slices and waits while
the chat context is busy, so the user's next question never waits for more than a slice; it
can be cancelled (closing the engine) and stores nothing of a pass that does not finish; a
chat or document deleted meanwhile makes the store refuse the entry, and that is all.

It never touches the chat context itself: it only tells the session when a chat became exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..kv.contexts import ATTACH, Contexts
from ..kv.kvcache import KVCache
from ..model.runtime import PREFILL_SLICE
from .background import Background
from .fairlock import FairLock

# Tokens computed between checks for a waiting question: a plain prefill's slice, since
# llama.cpp's results depend on how tokens are batched and the stored context must equal what
# a prefill of the same tokens computes, bit for bit (~1 s on 2 cores).
SLICE = PREFILL_SLICE


class Exactness(Background):
    name = "kv-exact"
    what = "exact pass of chat"

    def __init__(self, contexts: Contexts, kv: KVCache, *, chat_lock: FairLock,
                 attach_lock: threading.RLock, conversation: Callable,
                 first_document: Callable, on_exact: Callable[[int], None]):
        super().__init__(chat_lock)
        self.contexts = contexts
        self.kv = kv
        self.attach_lock = attach_lock  # the attach context is shared with attaching
        self.conversation = conversation  # (runtime, chat id) -> (messages, tokens, notes)
        self.first_document = first_document  # (runtime, chat id) -> what its entry extends
        self.on_exact = on_exact

    def work(self, chat_id: int) -> None:
        """Compute chat `chat_id`'s exact context and store it."""
        with self.attach_lock:
            rt = self.contexts.get(ATTACH)
            _, tokens, _ = self.conversation(rt, chat_id)
            rt.reset()
            try:
                for start in range(0, len(tokens), SLICE):
                    self.yield_to_turns()
                    rt.prefill(tokens[start:start + SLICE], cancel=self.cancel)
                self.kv.store_chat(rt, chat_id, tokens, self.first_document(rt, chat_id))
            finally:
                rt.reset()
        self.on_exact(chat_id)
