"""Caches stored before their model was calibrated, moved to its calibrated levels.

Two kinds wait for a model's calibration. A sliding-window model's caches are stored lossless
only until then (`levels.stored_by_default`: the model-independent levels lose its answers);
once it is calibrated each such entry is read back (lossless: the exact KV, nothing computed)
and encoded at the levels the model's new caches get. And a document's own cache stored at the
model-independent levels (any model's, attached before the calibration) is computed again from
its text (its tokens prefilled in the attach context: re-encoding a lossy level would add the
calibrated level's loss to its own) and encoded at the same levels, calibrated now; one that
holds lossless too is encoded from that instead. Either way the new chunks go in place of the
entry's (`Store.replace_levels`: one transaction an entry, so a restore meanwhile finds it whole
at either; a run stopped partway leaves the rest for the next one), and a store then over its
storage budget evicts as a new cache would (the calibrated levels are larger).

It never touches an entry of another model, a passage's, a chat's own at lossy levels (a turn
stores its next one at the calibrated levels; eviction takes the rest), one stored at levels
the calibration does not define (CacheGen's), or one stored under the calibration (lossless
then is a choice of the user's; before it, even `--levels lossless` is taken for the rule's).
An entry with a chunk that cannot be read is left for `verify --repair`. It holds one entry's
new chunks in memory at a time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import codec
from store import Entry, ReadOnlyError, StoreError

from ..errors import Cancelled
from ..model.kvstate import in_position_order
from ..model.runtime import Runtime
from ..results import Progress
from .contexts import ATTACH, Contexts
from .kvcache import KVCache
from .levels import EXACT, stored_by_default

RELEVEL_STAGE = "relevel"  # a calibration's stage: the caches stored before it moved


def lossless_only(kv: KVCache, rt: Runtime) -> list[Entry]:
    """The entries of `rt`'s sliding-window model stored lossless only (none for a model
    without a sliding window: its caches are stored at the levels asked for)."""
    if not rt.layout.swa_layers:
        return []
    return [e for e in kv.store.entries() if e.model == rt.fingerprint and
            e.levels == (EXACT,) and e.calibration is None and not e.passage]


def model_independent(entry: Entry, calibrated: frozenset[str] | set[str]) -> bool:
    """Whether `entry` is a document's own cache at model-independent levels that the levels
    `calibrated` (a calibration's) can take: what the calibration moves once it exists."""
    lossy = set(entry.levels) - {EXACT}
    return (entry.calibration is None and entry.document_id is not None and
            entry.parent_id is None and not entry.passage and bool(lossy) and
            lossy <= set(calibrated))


def waiting(kv: KVCache, rt: Runtime) -> list[Entry]:
    """`rt`'s model's entries its calibration moves (see the module docstring): none before
    it is calibrated."""
    cal = kv.calibrations.current(rt.fingerprint)
    if cal is None:
        return []
    names = set(cal.level_names)
    return lossless_only(kv, rt) + [e for e in kv.store.entries() if e.model == rt.fingerprint
                                    and model_independent(e, names)]


def relevel(kv: KVCache, rt: Runtime, *, contexts: Contexts | None = None,
            lock: contextlib.AbstractContextManager | None = None,
            progress: Callable[[Progress], None] | None = None,
            cancel: threading.Event | None = None,
            pause: Callable[[], None] | None = None) -> dict:
    """Move `rt`'s model's caches stored before its calibration to its levels (see the module
    docstring), `pause` called before each (to let a question go first); those computed
    again are computed in `contexts`' attach context, holding `lock` (none: left for a call
    that gives them). {"entries": moved, "computed": of them computed from their text,
    "skipped": left unreadable, "left": not reached, "bytes_before", "bytes_after",
    "evicted": caches evicted for their growth, "stopped": why it stopped early (cancelled, a
    store that takes no more writes) or None}. Nothing before the model is calibrated, or in
    a read-only store."""
    report = {"entries": 0, "computed": 0, "skipped": 0, "left": 0, "bytes_before": 0,
              "bytes_after": 0, "evicted": 0, "stopped": None}
    cal = kv.calibrations.current(rt.fingerprint)
    if cal is None or kv.store.read_only or stored_by_default(
            kv.levels, rt, kv.calibrations) == (EXACT,):
        return report
    todo = [e for e in waiting(kv, rt) if contexts is not None or EXACT in e.levels]
    for n, entry in enumerate(todo):
        if pause is not None:
            pause()
        if cancel is not None and cancel.is_set():  # (the next `kvdesk calibrate` goes on)
            report.update(stopped="cancelled", left=len(todo) - n)
            break
        levels = entry.levels if entry.calibration is None and entry.levels != (EXACT,) \
            else stored_by_default(kv.levels, rt, kv.calibrations)
        try:
            with lock or contextlib.nullcontext():
                chunks, computed = _encoded(kv, entry, levels, cal, contexts, cancel)
            kv.store.replace_levels(entry.id, levels, chunks, cal.id)
        except Cancelled:
            report.update(stopped="cancelled", left=len(todo) - n)
            break
        except ReadOnlyError as e:  # (a full disk, a store found damaged: nothing more)
            report.update(stopped=str(e), left=len(todo) - n)
            break
        except (StoreError, codec.CodecError):  # damaged, or deleted meanwhile
            report["skipped"] += 1
            continue
        report["entries"] += 1
        report["computed"] += computed
        report["bytes_before"] += entry.nbytes
        report["bytes_after"] += sum(len(b) for b in chunks.values())
        if progress is not None:  # (the last stage of a calibration: said as one)
            progress(Progress("calibrate", 100 * (n + 1) // len(todo), 100, RELEVEL_STAGE))
    if report["bytes_after"] > report["bytes_before"]:
        with contextlib.suppress(StoreError):  # (the caches are moved: eviction is a bonus)
            report["evicted"] = len(kv.store.gc()["evicted_entries"])
    return report


def _encoded(kv: KVCache, entry: Entry, levels: tuple[str, ...], cal: codec.Calibration,
             contexts: Contexts | None, cancel: threading.Event | None
             ) -> tuple[dict[tuple[int, str], bytes], bool]:
    """Every chunk and window part of `entry` encoded at `levels` with `cal`, from its exact
    KV: its lossless chunks, else its tokens prefilled in the attach context; and whether
    they were computed so."""
    parts = [(s, 0) for s in kv.store.spans(entry.id)] + [
        (s, 1) for s in kv.store.windows([entry.id]).get(entry.id, ())]
    chunks: dict[tuple[int, str], bytes] = {}
    if EXACT in entry.levels:
        for span, section in parts:
            blob = kv.store.read_chunk(entry.id, span.chunk_index, EXACT)
            k, v = codec.decode(blob)
            for level in levels:
                chunks[span.chunk_index, level] = blob if level == EXACT else codec.encode(
                    k, v, level, first_token=span.token_start, calibration=cal, part=section)
        return chunks, False
    rt = contexts.get(ATTACH)
    rt.reset()
    try:
        rt.prefill(kv.store.tokens(entry.id), cancel=cancel, logits=False)
        sections = [in_position_order(s) for s in rt.capture().sections]
    finally:
        rt.reset()
    for span, section in parts:
        source = sections[section]
        first = int(source.positions[0])
        k = source.keys[:, span.token_start - first:span.token_end - first]
        v = source.values[:, span.token_start - first:span.token_end - first]
        for level in levels:
            chunks[span.chunk_index, level] = codec.encode(
                k, v, level, first_token=span.token_start, calibration=cal, part=section)
    return chunks, True
