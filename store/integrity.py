"""Integrity: checking every stored chunk, quarantining what fails, dropping what cannot be
repaired.

A chunk that fails its check on a read or in `verify` is quarantined: it stays in the database
(counted, reported) but is never read again, so a restore reads that chunk at another stored
level, or recomputes it. `verify` also gives rows written before per-chunk hashes existed their
SHA-256 once their CRC passes. Repairing a chunk is re-encoding it (`Store.repair_chunk`, which
needs the model: the engine does it); a chunk nothing can repair is dropped, and an entry left
with a chunk at no level at all is deleted with every entry extending it.

This module decides nothing about the engine's fallbacks; it only keeps the store honest.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import blobs
from .db import Connections
from .kv import subtree


def verify(db: Connections) -> dict:
    """Check every chunk of every complete entry; quarantine what fails (unless read-only).

    Returns {"entries", "chunks", "bytes", "corrupt": [{"entry", "chunk", "level", "new"}]}:
    every quarantined chunk, `new` for those this scan found.
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
            checked = blobs.check(rdb.conn, rowid)
        if checked is None:  # evicted meanwhile
            continue
        n_chunks += 1
        n_bytes += nbytes
        sound, sha = checked
        if not sound:
            corrupt.append({**where, "new": True})
            quarantine(db, entry_id, chunk_index, level)
        elif sha is not None and not db.read_only:
            with db.write() as wdb:
                wdb.conn.execute("UPDATE kv_chunks SET sha256 = ? WHERE id = ?", (sha, rowid))
    return {"entries": n_entries, "chunks": n_chunks, "bytes": n_bytes, "corrupt": corrupt}


def quarantine(db: Connections, entry_id: int, chunk_index: int, level: str) -> None:
    if not db.read_only:
        with db.write() as wdb:
            blobs.quarantine(wdb.conn, entry_id, chunk_index, level)


def quarantined(db: Connections) -> list[tuple[int, int, str]]:
    """(entry, chunk, level) of every quarantined chunk of a complete entry."""
    with db.read() as rdb:
        return [(e, c, lvl) for _, e, c, lvl, _, q in blobs.chunk_rows(rdb.conn) if q]


def damaged(db: Connections, entry_ids: Iterable[int]) -> dict[int, int]:
    """{entry id: quarantined chunks} for those of `entry_ids` that have any."""
    ids = list(entry_ids)
    if not ids:
        return {}
    with db.read() as rdb:
        return dict(rdb.execute(
            "SELECT entry_id, count(*) FROM kv_chunks WHERE quarantined AND entry_id IN"
            f" ({','.join('?' * len(ids))}) GROUP BY entry_id", ids).fetchall())


def drop(db: Connections, entry_id: int, chunk_index: int, level: str) -> list[int]:
    """Remove a chunk at one level; if no level of that chunk is left, delete its entry and
    every entry extending it. Returns the ids of the entries deleted."""
    with db.write() as wdb:
        wdb.conn.execute("DELETE FROM kv_chunks WHERE entry_id = ? AND chunk_index = ?"
                         " AND level = ?", (entry_id, chunk_index, level))
        (left,) = wdb.conn.execute(
            "SELECT count(*) FROM kv_chunks WHERE entry_id = ? AND chunk_index = ?"
            " AND NOT quarantined", (entry_id, chunk_index)).fetchone()
        if left:
            return []
        tree = subtree(wdb.conn, entry_id)
        wdb.conn.execute("DELETE FROM kv_entries WHERE id = ?", (entry_id,))
    return [deleted for deleted, _, _ in tree]
