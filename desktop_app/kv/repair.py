"""Repairing what `verify` found: quarantined chunks recomputed under the model, or dropped.

A chunk quarantined after a failed check is recomputed when its entry belongs to the loaded
model: the entry's tokens are prefilled once (in the attach context) up to its last damaged
chunk (to its end, for a damaged part of its window: the window is the state there), and each
damaged chunk is encoded again at its level (with the codec calibration its entry names) and
stored in place. A chunk made under another model, or whose calibration is gone, cannot be
recomputed here: it is dropped, and an entry left with a chunk at no level is
deleted with what extends it (`Store.drop_chunk`); the next question recomputes it.

It never touches chunks that passed their check.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

import codec
from store import Store

from ..calibration.calibrations import Calibrations
from ..errors import Cancelled
from ..model.kvstate import in_position_order
from ..results import Progress
from .contexts import ATTACH, Contexts


def repair(store: Store, contexts: Contexts, calibrations: Calibrations, *,
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
        # A chunk is encoded again as its entry's others are: with the calibration they name.
        cal = None if entry.calibration is None else \
            calibrations.resolver(rt.fingerprint)(entry.calibration)
        if entry.model != rt.fingerprint or (entry.calibration is not None and cal is None):
            for chunk_index, level in chunks:
                report["dropped"].append({"entry": entry_id, "chunk": chunk_index,
                                          "level": level})
                report["deleted_entries"] += store.drop_chunk(entry_id, chunk_index, level)
        else:
            spans = {s.chunk_index: s for s in store.spans(entry_id)}
            windows = {s.chunk_index: s for s in store.windows([entry_id]).get(entry_id, ())}
            # A window part is the state at the entry's very end: prefill all of it then.
            end = entry.token_end if any(c in windows for c, _ in chunks) else \
                max(spans[c].token_end for c, _ in chunks)
            rt.reset()
            rt.prefill(store.tokens(entry_id)[:end], cancel=cancel)
            seq = rt.capture()
            for chunk_index, level in chunks:
                span = spans.get(chunk_index) or windows[chunk_index]
                kv = in_position_order(seq.sections[chunk_index in windows])
                first = int(kv.positions[0])
                blob = codec.encode(kv.keys[:, span.token_start - first:span.token_end - first],
                                    kv.values[:, span.token_start - first:span.token_end - first],
                                    level, first_token=span.token_start, calibration=cal,
                                    part=int(chunk_index in windows))
                store.repair_chunk(entry_id, chunk_index, level, blob)
                report["repaired"].append({"entry": entry_id, "chunk": chunk_index,
                                           "level": level})
            rt.reset()
        done += len(chunks)
        if progress is not None:
            progress(Progress("repair", done, total))
    return report
