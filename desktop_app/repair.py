"""Repairing what `verify` found: quarantined chunks recomputed under the model, or dropped.

A chunk quarantined after a failed check is recomputed when its entry belongs to the loaded
model: the entry's tokens are prefilled once (in the attach context) up to its last damaged
chunk, and each damaged chunk is encoded again at its level and stored in place. A chunk made
under another model cannot be recomputed here: it is dropped, and an entry left with a chunk at
no level is deleted with what extends it (`Store.drop_chunk`); the next question recomputes it.

It never touches chunks that passed their check.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

import codec
from store import Store

from .contexts import ATTACH, Contexts
from .errors import Cancelled
from .kvstate import in_position_order
from .results import Progress


def repair(store: Store, contexts: Contexts, *,
           progress: Callable[[Progress], None] | None = None,
           cancel: threading.Event | None = None) -> dict:
    """Recompute or drop every quarantined chunk; {"repaired": [...], "dropped": [...],
    "deleted_entries": [ids]}, each chunk as {"entry", "chunk", "level"}."""
    bad: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for entry_id, chunk_index, level in store.quarantined():
        bad[entry_id].append((chunk_index, level))
    report: dict = {"repaired": [], "dropped": [], "deleted_entries": []}
    if not bad:
        return report
    rt = contexts.get(ATTACH)
    done = 0
    total = sum(len(chunks) for chunks in bad.values())
    for entry_id, chunks in bad.items():
        if cancel is not None and cancel.is_set():
            raise Cancelled("stopped while repairing")
        entry = store.entry(entry_id)
        if entry.model != rt.fingerprint:
            for chunk_index, level in chunks:
                report["dropped"].append({"entry": entry_id, "chunk": chunk_index,
                                          "level": level})
                report["deleted_entries"] += store.drop_chunk(entry_id, chunk_index, level)
        else:
            spans = {s.chunk_index: s for s in store.spans(entry_id)}
            end = max(spans[c].token_end for c, _ in chunks)
            rt.reset()
            rt.prefill(store.tokens(entry_id)[:end], cancel=cancel)
            kv = in_position_order(rt.capture())
            for chunk_index, level in chunks:
                span = spans[chunk_index]
                blob = codec.encode(kv.keys[:, span.token_start:span.token_end],
                                    kv.values[:, span.token_start:span.token_end], level,
                                    first_token=span.token_start)
                store.repair_chunk(entry_id, chunk_index, level, blob)
                report["repaired"].append({"entry": entry_id, "chunk": chunk_index,
                                           "level": level})
            rt.reset()
        done += len(chunks)
        if progress is not None:
            progress(Progress("repair", done, total))
    return report
