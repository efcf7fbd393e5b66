"""Repairing what `verify` found: damaged or missing chunks recomputed under the model, entries
whose codec calibration is unusable encoded again, and what cannot be recomputed dropped.

A chunk quarantined after a failed check, or whose row (or span row) is gone, is recomputed when
its entry belongs to the loaded model (a span row is put back first): the entry's tokens are
prefilled once (in the attach context) up to its last such chunk (to its end, for a part of its
window: the window is the state there), and each chunk is encoded again at its level (with the
codec calibration its entry names) and stored in place. An entry of the loaded model whose
calibration is missing or damaged is encoded again whole, with the calibration the model's new
caches use (the model-independent levels if it has none left), and then names that one, unless
the shared cache holds the calibration (pushed with an entry that needs it): then it is fetched
again and nothing is encoded. A damaged calibration no entry needs any more is removed.
Another model's chunks cannot be recomputed here: their level is dropped from the entry (every
level, for an unusable calibration), and an entry left with none is deleted with what extends
it (`Store.drop_level`); the next question under that model recomputes it.

It never touches chunks that passed their check, and never decodes with a calibration other than
the one a chunk names.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

import codec
from store import DiskFullError, Entry, NotFoundError, ReadOnlyError, Store

from ..calibration.calibrations import Calibrations
from ..errors import Cancelled
from ..model.kvstate import in_position_order
from ..model.runtime import Runtime
from ..results import Progress
from .contexts import ATTACH, Contexts
from .sharing import Sharing


def repair(store: Store, contexts: Contexts, calibrations: Calibrations, *,
           sharing: Sharing | None = None, progress: Callable[[Progress], None] | None = None,
           cancel: threading.Event | None = None) -> dict:
    """Recompute, re-encode or drop everything `verify` reports.

    Returns {"repaired": [{"entry", "chunk", "level"}], "reencoded": [{"entry",
    "calibration"}], "dropped": [{"entry", "level"}], "deleted_entries": [ids],
    "recovered_calibrations": [ids], "removed_calibrations": [ids], "messages": [...]}.
    """
    # Before loading a model for nothing, whatever is listed: `verify` sets nothing aside in
    # a read-only store, so the chunks it finds damaged there are in no list below
    if store.read_only:
        try:
            store.check_writable()
        except DiskFullError:
            raise  # (it says what to do)
        except ReadOnlyError:
            pass
        raise ReadOnlyError(f"the data directory {store.data_dir} is read-only: `verify` "
                            "lists what needs repairing, but nothing can be repaired there")
    report: dict = {"repaired": [], "reencoded": [], "dropped": [], "deleted_entries": [],
                    "recovered_calibrations": [], "removed_calibrations": [], "messages": []}
    bad: dict[int, set[tuple[int, str]]] = defaultdict(set)
    for entry_id, chunk_index, level in store.quarantined() + store.missing():
        bad[entry_id].add((chunk_index, level))
    unusable = store.unusable_calibrations()
    damaged = [c["id"] for c in store.calibration_states() if c["state"] == "damaged"]
    needing = {e.id: e for e in store.entries() if e.calibration in unusable}
    # The same bytes from the shared cache, where a push left them, spare encoding again.
    for cal_id in sorted(unusable):
        model = next(e.model for e in needing.values() if e.calibration == cal_id)
        recovered, notes = (False, []) if sharing is None else \
            sharing.recover_calibration(model, cal_id)
        report["messages"] += notes
        if recovered:
            report["recovered_calibrations"].append(cal_id)
            unusable.discard(cal_id)
    for entry in needing.values():
        if entry.calibration in unusable:
            bad.setdefault(entry.id, set())
    if bad:
        _fix(store, contexts.get(ATTACH), calibrations, bad, unusable, report, progress, cancel)
    for state in store.calibration_states():  # what no entry needs now, whatever it was
        if state["id"] in damaged and state["state"] == "damaged" and not state["entries"]:
            store.delete_calibration(state["id"])
            report["removed_calibrations"].append(state["id"])
    return report


def heal(store: Store, rt: Runtime, calibrations: Calibrations, entry_id: int, *,
         cancel: threading.Event | None = None) -> dict:
    """`repair` of one entry of `rt`'s model, in `rt` (whose content is replaced): its
    chunks set aside or missing recomputed (all of them, for an unusable calibration): a
    damaged passage met by a question (`passagekv`). Returns what `repair` does."""
    report: dict = {"repaired": [], "reencoded": [], "dropped": [], "deleted_entries": [],
                    "messages": []}
    bad = {(c, lvl) for _, c, lvl in store.quarantined([entry_id]) + store.missing([entry_id])}
    _fix(store, rt, calibrations, {entry_id: bad}, store.unusable_calibrations(), report,
         None, cancel)
    return report


def _fix(store: Store, rt: Runtime, calibrations: Calibrations,
         bad: dict[int, set[tuple[int, str]]], unusable: set[str], report: dict,
         progress: Callable[[Progress], None] | None, cancel: threading.Event | None) -> None:
    """Recompute the `bad` chunks of each entry (all of them, for an unusable calibration) or
    drop them, into `report`."""
    resolve = calibrations.resolver(rt.fingerprint)
    done, total = 0, sum(len(chunks) or 1 for chunks in bad.values())
    for entry_id, chunks in sorted(bad.items()):
        if cancel is not None and cancel.is_set():
            raise Cancelled("stopped while repairing")
        try:
            entry = store.entry(entry_id)
        except NotFoundError:  # deleted with an entry it extends, dropped just before
            continue
        # A chunk is encoded again as its entry's others are: with the calibration they name.
        cal = None if entry.calibration is None else resolve(entry.calibration)
        whole = entry.calibration is not None and (cal is None or entry.calibration in unusable)
        if entry.model != rt.fingerprint:
            for level in entry.levels if whole else sorted({lvl for _, lvl in chunks}):
                report["dropped"].append({"entry": entry_id, "level": level})
                report["deleted_entries"] += store.drop_level(entry_id, level)
        elif whole:
            store.restore_spans(entry_id)  # a span row gone: put back before its chunks
            cal = calibrations.current(rt.fingerprint)
            cal = None if cal is None or cal.id in unusable else cal
            n_chunks = len(store.spans(entry_id)) + len(store.windows([entry_id]).get(entry_id, ()))
            _encode(store, rt, entry, {(c, lvl) for c in range(n_chunks) for lvl in entry.levels},
                    cal, cancel)
            store.set_entry_calibration(entry_id, cal and cal.id)
            report["reencoded"].append({"entry": entry_id, "calibration": cal and cal.id})
        else:
            store.restore_spans(entry_id)
            _encode(store, rt, entry, chunks, cal, cancel)
            report["repaired"] += [{"entry": entry_id, "chunk": c, "level": lvl}
                                   for c, lvl in sorted(chunks)]
        done += len(chunks) or 1
        if progress is not None:
            progress(Progress("repair", done, total))


def _encode(store: Store, rt: Runtime, entry: Entry, chunks: set[tuple[int, str]],
            cal: codec.Calibration | None, cancel: threading.Event | None) -> None:
    """Prefill the entry's tokens as far as `chunks` need and store each (chunk, level) of it
    encoded again."""
    spans = {s.chunk_index: s for s in store.spans(entry.id)}
    windows = {s.chunk_index: s for s in store.windows([entry.id]).get(entry.id, ())}
    # A window part is the state at the entry's very end: prefill all of it then.
    end = entry.token_end if any(c in windows for c, _ in chunks) else \
        max(spans[c].token_end for c, _ in chunks)
    rt.reset()
    try:
        rt.prefill(store.tokens(entry.id)[:end], cancel=cancel)
        seq = rt.capture()
        for chunk_index, level in sorted(chunks):
            span = spans.get(chunk_index) or windows[chunk_index]
            kv = in_position_order(seq.sections[chunk_index in windows])
            first = int(kv.positions[0])
            blob = codec.encode(kv.keys[:, span.token_start - first:span.token_end - first],
                                kv.values[:, span.token_start - first:span.token_end - first],
                                level, first_token=span.token_start, calibration=cal,
                                part=int(chunk_index in windows))
            store.repair_chunk(entry.id, chunk_index, level, blob)
    finally:
        rt.reset()
