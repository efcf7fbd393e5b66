"""KV chunk bytes, stored as BLOBs inside the SQLite database, one row per (entry, chunk, level).

Decision (measured by benchmarks/bench_store.py, numbers in benchmarks/RESULTS.md "Store"):
in-database BLOBs read with incremental blob I/O, not content-addressed files beside the database.
PLACEHOLDER_NUMBERS

Writes are atomic for free: a chunk row commits or does not, and an entry becomes visible only
when the transaction marking it complete commits (store.kv). Files would need temp+fsync+rename,
a directory fsync, and orphan sweeps that race with writers in other processes.

Every chunk carries a CRC-32 (the fastest checksum in the standard library, ~2 GB/s; it guards
against rot and torn writes, not against an adversary) checked on every read. This module must
never return bytes that failed their checksum, and never read more than the one chunk asked for.
"""

from __future__ import annotations

import sqlite3
import zlib

from .errors import CorruptChunkError, NotFoundError


def checksum(data: bytes | memoryview) -> int:
    return zlib.crc32(data)


def put(conn: sqlite3.Connection, entry_id: int, chunk_index: int, level: str, data) -> None:
    """Store (or replace) one chunk; call inside a write transaction."""
    conn.execute(
        "INSERT INTO kv_chunks (entry_id, chunk_index, level, nbytes, checksum, data)"
        " VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (entry_id, chunk_index, level) DO UPDATE SET"
        " nbytes = excluded.nbytes, checksum = excluded.checksum, data = excluded.data",
        (entry_id, chunk_index, level, len(data), checksum(data), data),
    )


def read(conn: sqlite3.Connection, entry_id: int, chunk_index: int, level: str) -> bytes:
    """One chunk of a complete entry, checksum verified; call inside a read transaction."""
    row = conn.execute(
        "SELECT c.id, c.nbytes, c.checksum FROM kv_chunks c"
        " JOIN kv_entries e ON e.id = c.entry_id"
        " WHERE c.entry_id = ? AND c.chunk_index = ? AND c.level = ? AND e.complete",
        (entry_id, chunk_index, level),
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no chunk {chunk_index} at level {level!r} in KV entry {entry_id}")
    rowid, nbytes, expected = row
    data = _load(conn, rowid)
    if len(data) != nbytes or checksum(data) != expected:
        raise CorruptChunkError(entry_id, chunk_index, level)
    return data


def chunk_rows(conn: sqlite3.Connection) -> list[tuple[int, int, int, str, int]]:
    """(rowid, entry, chunk, level, nbytes) of each chunk of each complete entry, in entry order."""
    return conn.execute(
        "SELECT c.id, c.entry_id, c.chunk_index, c.level, c.nbytes FROM kv_chunks c"
        " JOIN kv_entries e ON e.id = c.entry_id WHERE e.complete"
        " ORDER BY c.entry_id, c.chunk_index, c.level"
    ).fetchall()


def is_intact(conn: sqlite3.Connection, rowid: int) -> bool | None:
    """Whether a chunk row's bytes match its checksum; None if the row is gone."""
    row = conn.execute("SELECT nbytes, checksum FROM kv_chunks WHERE id = ?", (rowid,)).fetchone()
    if row is None:
        return None
    data = _load(conn, rowid)
    return len(data) == row[0] and checksum(data) == row[1]


def _load(conn: sqlite3.Connection, rowid: int) -> bytes:
    # Incremental blob I/O copies the value straight from the (mmapped) pages into one bytes
    # object; a SELECT of the column is 2-5x slower on multi-MB values (see the module docstring).
    with conn.blobopen("kv_chunks", "data", rowid, readonly=True) as blob:
        return blob.read()
