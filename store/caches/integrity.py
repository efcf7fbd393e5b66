"""Integrity: checking every stored chunk, quarantining what fails, finding what is missing,
dropping what cannot be repaired, putting an entry's chunks at other levels in place of its own.

A chunk that fails its check on a read or in `verify` is quarantined: it stays in the database
(counted, reported) but is never read again, so a restore reads that chunk at another stored
level, or recomputes it. A complete entry holds every chunk at every level it lists, and can be
decoded only with the codec calibration it names: `verify` also reports the chunks whose rows
are gone and the calibrations that are missing or fail their hash, and `damaged` counts all of
these as chunks that cannot be read. Repairing is re-encoding (`Store.repair_chunk`, which needs
the model: the engine does it); what nothing can repair is dropped a level at a time, so an
entry keeps every chunk at each level it still lists, and one left with no level is deleted with
every entry extending it. An entry encoded again at other levels (`replace_levels`: the engine
does the encoding) changes its chunks, its levels and the calibration it names in one
transaction, so a reader finds it whole at either.

This module decides nothing about the engine's fallbacks; it only keeps the store honest.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence

from ..datadir.db import Connections
from ..datadir.values import stored_json
from ..errors import NotFoundError
from ..tokens import chunk_spans, prefix_hashes
from . import blobs, calibrations
from .kv import get_entry, prefix_tokens, subtree

Chunk = tuple[int, int, str]  # (entry, chunk index, level)

# Every (chunk, level) a complete entry lists but holds no row for.
_MISSING = (
    "SELECT s.entry_id, s.chunk_index, l.value FROM kv_entries e"
    " JOIN kv_spans s ON s.entry_id = e.id JOIN json_each(e.levels) l"
    " WHERE e.complete {where} AND NOT EXISTS (SELECT 1 FROM kv_chunks c"
    " WHERE c.entry_id = s.entry_id AND c.chunk_index = s.chunk_index AND c.level = l.value)"
    " ORDER BY s.entry_id, s.chunk_index, l.value"
)


def _levels(conn: sqlite3.Connection, entry_id: int, levels: str) -> list[str]:
    """An entry's stored list of levels (DamagedError where it no longer decodes)."""
    return stored_json(conn, levels, f"the levels of KV entry {entry_id}")


def verify(db: Connections) -> dict:
    """Check every chunk of every complete entry; quarantine what fails (unless read-only).

    Returns {"entries", "chunks", "bytes", "corrupt": [{"entry", "chunk", "level", "new"}],
    "missing": [{"entry", "chunk", "level"}], "calibrations": [...]}: every quarantined
    chunk (`new` for those this scan found), every chunk whose row (or span row) is gone, and
    the state of every codec calibration stored or named (`calibration_states`).
    """
    with db.read() as rdb:
        rows = blobs.chunk_rows(rdb.conn)
        (n_entries,) = rdb.execute("SELECT count(*) FROM kv_entries WHERE complete").fetchone()
    n_chunks = n_bytes = 0
    corrupt = []
    for rowid, entry_id, chunk_index, level, nbytes, quarantined in rows:
        where = {"entry": entry_id, "chunk": chunk_index, "level": level}
        if quarantined:
            n_chunks += 1
            corrupt.append({**where, "new": False})
            continue
        # One short read transaction per chunk: a scan of many GB must not pin the WAL.
        with db.read() as rdb:
            sound = blobs.check(rdb.conn, rowid)
        if sound is None:  # evicted meanwhile
            continue
        n_chunks += 1
        n_bytes += nbytes
        if not sound:
            corrupt.append({**where, "new": True})
            quarantine(db, entry_id, chunk_index, level)
    return {"entries": n_entries, "chunks": n_chunks, "bytes": n_bytes, "corrupt": corrupt,
            "missing": [{"entry": e, "chunk": c, "level": lvl} for e, c, lvl in missing(db)],
            "calibrations": calibration_states(db)}


def missing(db: Connections, entry_ids: Iterable[int] | None = None) -> list[Chunk]:
    """(entry, chunk, level) of every chunk a complete entry lists but no longer holds, its
    row or its span's row gone (of `entry_ids` only, if given)."""
    ids = None if entry_ids is None else list(entry_ids)
    if ids == []:
        return []
    where, args = ("", []) if ids is None else (f"AND e.id IN ({','.join('?' * len(ids))})", ids)
    with db.read() as rdb:
        found = set(rdb.execute(_MISSING.format(where=where), args).fetchall())
        for entry_id, start, end, size, levels, present in rdb.execute(
                "SELECT id, token_start, token_end, chunk_size, levels, (SELECT"
                " json_group_array(chunk_index) FROM kv_spans WHERE entry_id = e.id AND NOT"
                f" window_part) FROM kv_entries e WHERE complete {where}", args):
            lost = set(range(len(chunk_spans(start, end, size)))) - set(json.loads(present))
            found |= {(entry_id, i, level) for i in lost
                      for level in _levels(rdb.conn, entry_id, levels)}
    return sorted(found)


def restore_spans(db: Connections, entry_id: int) -> list[int]:
    """Put back the span rows of an entry's own chunks that are gone (each chunk's tokens and
    prefix hash follow from the entry's); returns their chunk indexes."""
    with db.write() as wdb:
        entry = get_entry(wdb.conn, entry_id)
        present = {i for (i,) in wdb.conn.execute(
            "SELECT chunk_index FROM kv_spans WHERE entry_id = ?", (entry_id,))}
        spans = chunk_spans(entry.token_start, entry.token_end, entry.chunk_size)
        lost = [i for i in range(len(spans)) if i not in present]
        if lost:
            hashes = prefix_hashes(entry.model, prefix_tokens(wdb.conn, entry_id),
                                   [spans[i][1] for i in lost])
            wdb.conn.executemany(
                "INSERT INTO kv_spans (entry_id, chunk_index, token_start, token_end,"
                " prefix_hash, window_part) VALUES (?, ?, ?, ?, ?, 0)",
                [(entry_id, i, *spans[i], h) for i, h in zip(lost, hashes, strict=True)])
    return lost


def calibration_states(db: Connections) -> list[dict]:
    """[{"id", "model", "state", "entries"}] for every codec calibration stored or named by a
    complete entry: state "ok", "damaged" (its bytes fail their hash) or "missing" (named, not
    stored); `entries`: how many complete entries need it. `model` is None for a missing one."""
    with db.read() as rdb:
        needed = dict(rdb.execute(
            "SELECT calibration, count(*) FROM kv_entries WHERE complete AND calibration"
            " IS NOT NULL GROUP BY calibration").fetchall())
        stored = {r.id: r.model for r in calibrations.records(rdb.conn)}
        sound = {cal_id: calibrations.intact(rdb.conn, cal_id) for cal_id in stored}
    return [{"id": cal_id, "model": stored.get(cal_id),
             "state": "missing" if cal_id not in stored else "ok" if sound[cal_id] else
             "damaged", "entries": needed.get(cal_id, 0)}
            for cal_id in sorted(set(stored) | set(needed))]


def unusable_calibrations(db: Connections) -> set[str]:
    """Ids of the calibrations complete entries name that are missing or damaged."""
    return {c["id"] for c in calibration_states(db) if c["state"] != "ok" and c["entries"]}


def quarantine(db: Connections, entry_id: int, chunk_index: int, level: str) -> None:
    if not db.read_only:
        with db.write() as wdb:
            blobs.quarantine(wdb.conn, entry_id, chunk_index, level)


def quarantined(db: Connections, entry_ids: Iterable[int] | None = None) -> list[Chunk]:
    """(entry, chunk, level) of every quarantined chunk of a complete entry (of `entry_ids`
    only, if given)."""
    ids = None if entry_ids is None else list(entry_ids)
    if ids == []:
        return []
    with db.read() as rdb:
        return [(e, c, lvl) for _, e, c, lvl, _, q in blobs.chunk_rows(rdb.conn, ids) if q]


def damaged(db: Connections, entry_ids: Iterable[int]) -> dict[int, int]:
    """{entry id: chunks that cannot be read} for those of `entry_ids` that have any: the
    quarantined and the missing ones, and every chunk of an entry whose calibration is
    unusable (each chunk counted once per level)."""
    ids = list(entry_ids)
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    unusable = unusable_calibrations(db)
    out: dict[int, int] = {}
    whole: dict[int, int] = {}  # an unusable calibration: every chunk, whatever else
    with db.read() as rdb:
        for entry_id, calibration, levels, n_spans in rdb.execute(
                "SELECT id, calibration, levels, (SELECT count(*) FROM kv_spans"
                f" WHERE entry_id = e.id) FROM kv_entries e WHERE id IN ({marks})", ids):
            if calibration in unusable:
                whole[entry_id] = n_spans * len(_levels(rdb.conn, entry_id, levels))
        for entry_id, n in rdb.execute(
                "SELECT entry_id, count(*) FROM kv_chunks WHERE quarantined AND entry_id IN"
                f" ({marks}) GROUP BY entry_id", ids):
            out[entry_id] = n
    for entry_id, _, _ in missing(db, ids):
        out[entry_id] = out.get(entry_id, 0) + 1
    return {**out, **whole}


def drop_level(db: Connections, entry_id: int, level: str) -> list[int]:
    """Remove every chunk of an entry at one level, and the level from the entry's list; an
    entry left with no level is deleted with every entry extending it. Returns the ids of the
    entries deleted."""
    with db.write() as wdb:
        (levels,) = wdb.conn.execute("SELECT levels FROM kv_entries WHERE id = ?",
                                     (entry_id,)).fetchone() or (None,)
        if levels is None:
            return []
        left = [name for name in _levels(wdb.conn, entry_id, levels) if name != level]
        wdb.conn.execute("DELETE FROM kv_chunks WHERE entry_id = ? AND level = ?",
                         (entry_id, level))
        if left:
            wdb.conn.execute("UPDATE kv_entries SET levels = ? WHERE id = ?",
                             (json.dumps(left), entry_id))
            blobs.recount(wdb.conn, entry_id)
            return []
        tree = subtree(wdb.conn, entry_id)
        wdb.conn.execute("DELETE FROM kv_entries WHERE id = ?", (entry_id,))
    return [deleted for deleted, _, _ in tree]


def replace_levels(db: Connections, entry_id: int, levels: Sequence[str],
                   chunks: Mapping[tuple[int, str], bytes], calibration: str | None) -> None:
    """Put `chunks` ({(chunk index, level): bytes}: every chunk of the complete entry, window
    parts too, at each of `levels`) in place of the entry's own, which go; the entry then
    lists `levels` and names `calibration` (stored and sound, or NotFoundError)."""
    with db.write() as wdb:
        row = wdb.conn.execute("SELECT complete FROM kv_entries WHERE id = ?",
                               (entry_id,)).fetchone()
        if row is None or not row[0]:
            raise NotFoundError(f"no complete KV entry {entry_id}")
        if calibration is not None:
            calibrations.read(wdb.conn, calibration)
        indexes = {i for (i,) in wdb.conn.execute(
            "SELECT chunk_index FROM kv_spans WHERE entry_id = ?", (entry_id,))}
        if not levels or set(chunks) != {(i, lvl) for i in indexes for lvl in levels}:
            raise ValueError(f"entry {entry_id}: not every chunk at every level given")
        wdb.conn.execute("DELETE FROM kv_chunks WHERE entry_id = ?", (entry_id,))
        for (index, level), data in chunks.items():
            blobs.put(wdb.conn, entry_id, index, level, data)
        wdb.conn.execute("UPDATE kv_entries SET levels = ?, calibration = ? WHERE id = ?",
                         (json.dumps(list(levels)), calibration, entry_id))
        blobs.recount(wdb.conn, entry_id)
