"""KV chunk bytes, stored as BLOBs inside the SQLite database, one row per (entry, chunk, level).

Decision (measured by benchmarks/bench_store.py, numbers in benchmarks/RESULTS.md "Store"):
in-database BLOBs read with incremental blob I/O, not content-addressed files beside the database.
A 4,096-token entry of 16 chunks (94 MB "raw", 5.9 MB a chunk; SQLite 3.40, 2-core VM, warm
page cache, CRC-32 checked):

    read chunk by chunk    store (blob I/O, mmap) 2.2-2.4 GB/s;  without mmap 1.4-1.6 GB/s
                           SELECT of the column   1.6 GB/s;      files (read + CRC) 2.35-2.43 GB/s
    smaller chunks         1.5 MB: 1.9-2.0 GB/s;  0.74 MB: 3.5 GB/s
    write (durable)        store 70-140 MB/s (WAL writes each byte twice, fsync per chunk)
                           files 230-240 MB/s (temp file, fsync, rename, directory fsync)
    space overhead         0.34% of chunk bytes (4 KiB pages, all metadata included)

Reads, the hot path, are on par with files and well above the 1 GB/s target. Writes are slower
but a prefill of 4,096 tokens takes far longer than the ~1 s it costs to store it.

Writes are atomic for free: a chunk row commits or does not, and an entry becomes visible only
when the transaction marking it complete commits (store.caches.kv). Files would need
temp+fsync+rename, a directory fsync, and orphan sweeps that race with writers in other processes.

Every chunk row records, at write, a seal: the SHA-256 of its place (its entry's prefix hash, its
chunk index, its level) and of the SHA-256 of its bytes, checked on every read (~1.4 GB/s here,
in the reader thread while the previous chunk decodes). It catches rot and torn writes, and also
a valid chunk of another entry, chunk or level put in this one's place, hashes and all, which a
hash of the bytes alone, or the codec's own CRC trailer, cannot. (The `checksum` column, a CRC-32
of bytes that end with their own CRC, was the same number for every codec blob: nothing reads it
since m006, and new rows hold 0.) A chunk that fails is quarantined: never read again, and listed
by `verify` until repaired or dropped. This module must never return bytes that failed their
check, and never read more than the one chunk asked for.
"""

from __future__ import annotations

import hashlib
import sqlite3
import struct
from collections.abc import Iterable

from ..datadir.db import is_damage
from ..errors import CorruptChunkError, NotFoundError

# Version 1 of the seal; a new one would need a migration sealing every row again.
_SEAL_TAG = b"kvdesk chunk seal 1\0"
# What a chunk's check needs, as `_sound` takes it: the row's size and seal, and its place.
_CHECKED = "c.nbytes, c.sha256, e.prefix_hash, c.chunk_index, c.level"


def digest(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


def seal_digest(prefix_hash: bytes, chunk_index: int, level: str, content: bytes) -> bytes:
    """The seal of a chunk whose bytes hash to `content` (their SHA-256), at its place.

    Sealing the bytes' hash rather than the bytes lets migration m006 seal rows that already
    had a hash without reading them; each field is length-prefixed, so no two places collide.
    """
    name = level.encode()
    return hashlib.sha256(b"".join((
        _SEAL_TAG, struct.pack("<H", len(prefix_hash)), prefix_hash,
        struct.pack("<IH", chunk_index, len(name)), name, content))).digest()


def put(conn: sqlite3.Connection, entry_id: int, chunk_index: int, level: str, data) -> None:
    """Store (or replace, clearing any quarantine) one chunk; call inside a write transaction."""
    row = conn.execute("SELECT prefix_hash FROM kv_entries WHERE id = ?", (entry_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no KV entry {entry_id}")
    conn.execute(
        "INSERT INTO kv_chunks (entry_id, chunk_index, level, nbytes, checksum, sha256, data)"
        " VALUES (?, ?, ?, ?, 0, ?, ?)"
        " ON CONFLICT (entry_id, chunk_index, level) DO UPDATE SET nbytes = excluded.nbytes,"
        " checksum = 0, sha256 = excluded.sha256, data = excluded.data, quarantined = 0",
        (entry_id, chunk_index, level, len(data),
         seal_digest(row[0], chunk_index, level, digest(data)), data),
    )


def recount(conn: sqlite3.Connection, entry_id: int) -> None:
    """Set an entry's size to its chunks' after chunks were put or removed; call inside a
    write transaction."""
    conn.execute("UPDATE kv_entries SET nbytes = (SELECT coalesce(sum(nbytes), 0) FROM kv_chunks"
                 " WHERE entry_id = ?) WHERE id = ?", (entry_id, entry_id))


def read(conn: sqlite3.Connection, entry_id: int, chunk_index: int, level: str) -> bytes:
    """One chunk of a complete entry, checked; call inside a read transaction.

    NotFoundError for a chunk that is not there or quarantined, CorruptChunkError for one
    whose bytes fail their check (the caller quarantines it).
    """
    row = conn.execute(
        f"SELECT c.id, c.quarantined, {_CHECKED} FROM kv_chunks c"
        " JOIN kv_entries e ON e.id = c.entry_id"
        " WHERE c.entry_id = ? AND c.chunk_index = ? AND c.level = ? AND e.complete",
        (entry_id, chunk_index, level),
    ).fetchone()
    if row is None or row[1]:
        why = "quarantined after a failed check" if row else "not stored"
        raise NotFoundError(f"chunk {chunk_index} at level {level!r} of KV entry {entry_id}: "
                            f"{why}")
    data = _load(conn, row[0])
    if not _sound(data, *row[2:]):
        raise CorruptChunkError(entry_id, chunk_index, level)
    return data


def chunk_rows(conn: sqlite3.Connection, entry_ids: Iterable[int] | None = None
               ) -> list[tuple[int, int, int, str, int, int]]:
    """(rowid, entry, chunk, level, nbytes, quarantined) of each chunk of each complete entry
    (of `entry_ids` only, if given), in entry order."""
    ids = None if entry_ids is None else list(entry_ids)
    where = "" if ids is None else f" AND c.entry_id IN ({','.join('?' * len(ids))})"
    return conn.execute(
        "SELECT c.id, c.entry_id, c.chunk_index, c.level, c.nbytes, c.quarantined"
        f" FROM kv_chunks c JOIN kv_entries e ON e.id = c.entry_id WHERE e.complete{where}"
        " ORDER BY c.entry_id, c.chunk_index, c.level", ids or ()
    ).fetchall()


def check(conn: sqlite3.Connection, rowid: int) -> bool | None:
    """Whether a chunk row's bytes pass their check at its place; None if the row is gone."""
    row = conn.execute(f"SELECT {_CHECKED} FROM kv_chunks c JOIN kv_entries e"
                       " ON e.id = c.entry_id WHERE c.id = ?", (rowid,)).fetchone()
    if row is None:
        return None
    return _sound(_load(conn, rowid), *row)


def quarantine(conn: sqlite3.Connection, entry_id: int, chunk_index: int, level: str) -> None:
    conn.execute("UPDATE kv_chunks SET quarantined = 1 WHERE entry_id = ? AND chunk_index = ?"
                 " AND level = ?", (entry_id, chunk_index, level))


def _sound(data: bytes, nbytes: int, seal: bytes | None, prefix_hash: bytes, chunk_index: int,
           level: str) -> bool:
    # No seal at all: a row written behind the store's back (m006 sealed or quarantined
    # every row before it).
    return len(data) == nbytes and seal is not None and \
        seal == seal_digest(prefix_hash, chunk_index, level, digest(data))


def _load(conn: sqlite3.Connection, rowid: int) -> bytes:
    # Incremental blob I/O copies the value straight from the (mmapped) pages into one bytes
    # object; a SELECT of the column is 2-5x slower on multi-MB values (see the module docstring).
    try:
        with conn.blobopen("kv_chunks", "data", rowid, readonly=True) as blob:
            return blob.read()
    except sqlite3.DatabaseError as e:  # (around the cursors that translate it: `db`)
        owner = getattr(conn, "owner", None)
        if owner is None or not is_damage(e):
            raise
        owner.found_damage(str(e))  # the file's pages, not only this chunk's bytes
        return b""  # fails its check: the chunk is damaged, as rotten bytes are
