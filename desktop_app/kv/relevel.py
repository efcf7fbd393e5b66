"""Caches stored lossless only before their model was calibrated, encoded at its levels.

Until a sliding-window model is calibrated its caches are stored lossless only
(`levels.stored_by_default`: the model-independent levels lose its answers). Once it is, each
such entry of the model is read back (lossless: the exact KV, nothing computed), every chunk
and window part encoded at the levels the model's new caches get, and those put in place of
its lossless chunks (`Store.replace_levels`: one transaction an entry, so a restore meanwhile
finds the entry whole at either; a run stopped partway leaves the rest for the next one).

It never computes KV, and never touches an entry of another model, a passage's, one stored at
other levels, or one stored under the calibration (lossless then is a choice of the user's;
before it, even `--levels lossless` is taken for the rule's). An entry with a chunk that cannot
be read is left for `verify --repair`. It holds one entry's new chunks in memory at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import codec
from store import Entry, ReadOnlyError, StoreError

from ..model.runtime import Runtime
from ..results import Progress
from .kvcache import KVCache
from .levels import EXACT, stored_by_default

RELEVEL_STAGE = "relevel"  # a calibration's stage: its lossless-only caches encoded again


def lossless_only(kv: KVCache, rt: Runtime) -> list[Entry]:
    """The entries of `rt`'s sliding-window model stored lossless only (none for a model
    without a sliding window: its caches are stored at the levels asked for)."""
    if not rt.layout.swa_layers:
        return []
    return [e for e in kv.store.entries() if e.model == rt.fingerprint and
            e.levels == (EXACT,) and e.calibration is None and not e.passage]


def relevel(kv: KVCache, rt: Runtime, *, progress: Callable[[Progress], None] | None = None,
            cancel: threading.Event | None = None,
            pause: Callable[[], None] | None = None) -> dict:
    """Encode `rt`'s model's lossless-only caches at its calibrated levels (see the module
    docstring), `pause` called before each (to let a question go first): {"entries":
    re-encoded, "skipped": left unreadable, "left": not reached, "bytes_before",
    "bytes_after", "stopped": why it stopped early (cancelled, a store that takes no more
    writes) or None}. Nothing before the model is calibrated, or in a read-only store."""
    report = {"entries": 0, "skipped": 0, "left": 0, "bytes_before": 0, "bytes_after": 0,
              "stopped": None}
    cal = kv.calibrations.current(rt.fingerprint)
    levels = stored_by_default(kv.levels, rt, kv.calibrations)
    if cal is None or kv.store.read_only or levels == (EXACT,):
        return report
    todo = lossless_only(kv, rt)
    for n, entry in enumerate(todo):
        if pause is not None:
            pause()
        if cancel is not None and cancel.is_set():  # (the next `kvdesk calibrate` goes on)
            report.update(stopped="cancelled", left=len(todo) - n)
            break
        parts = [(s, 0) for s in kv.store.spans(entry.id)] + [
            (s, 1) for s in kv.store.windows([entry.id]).get(entry.id, ())]
        chunks: dict[tuple[int, str], bytes] = {}
        try:
            for span, section in parts:
                blob = kv.store.read_chunk(entry.id, span.chunk_index, EXACT)
                k, v = codec.decode(blob)
                for level in levels:
                    chunks[span.chunk_index, level] = blob if level == EXACT else codec.encode(
                        k, v, level, first_token=span.token_start, calibration=cal,
                        part=section)
            kv.store.replace_levels(entry.id, levels, chunks, cal.id)
        except ReadOnlyError as e:  # (a full disk, a store found damaged: nothing more)
            report.update(stopped=str(e), left=len(todo) - n)
            break
        except (StoreError, codec.CodecError):  # damaged, or deleted meanwhile
            report["skipped"] += 1
            continue
        report["entries"] += 1
        report["bytes_before"] += entry.nbytes
        report["bytes_after"] += sum(len(b) for b in chunks.values())
        if progress is not None:  # (the last stage of a calibration: said as one)
            progress(Progress("calibrate", 100 * (n + 1) // len(todo), 100, RELEVEL_STAGE))
    return report
