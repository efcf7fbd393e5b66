"""An entry cut in two at one of its chunk boundaries, its chunks moved, never encoded again.

A prompt of the local API's (or a chat's turn) that leaves a stored entry partway, as requests
sharing a long system prompt each with its own question do, has its shared part read back
from that entry; the new entry can only extend one that ends where it begins. Rather than
encode the shared part again from the context (where it came back at a lossy level: compact's
error stored under `high`'s name), the entry is split there: a new entry takes its first
chunks, at every level, bytes unchanged (sealed again to their new place), and the rest of it
extends the new one; both parts hold the documents it held (`kv_entry_documents`). Nothing is
read but the chunks' bytes, to check and seal them.

Only an entry of no document and no passage (a prompt's or a chat's), without a window part
(a sliding-window model's entry ends where its window does), is split. This module never
evicts, encodes or decodes anything.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from ..datadir.db import Connections
from ..records import Entry
from . import blobs, kv


def split(conn: sqlite3.Connection, entry_id: int, at: int, now: float) -> int:
    """Split entry `entry_id` at token `at`, one of its chunk boundaries; return the id of the
    new entry holding its tokens before `at` (which the rest of it now extends). Call inside
    a write transaction. ValueError for an entry that cannot be split there; the store's
    errors for a chunk that fails its check (nothing changed)."""
    entry = kv.get_entry(conn, entry_id)
    spans = kv.entry_spans(conn, entry_id)
    head = [s for s in spans if s.token_end <= at]
    if entry.document_id is not None or entry.passage or not head or \
            head[-1].token_end != at or len(head) == len(spans) or \
            kv.entry_spans(conn, entry_id, window=True):
        raise ValueError(f"KV entry {entry_id} cannot be split at token {at}")
    prefix = conn.execute("SELECT prefix_hash FROM kv_spans WHERE entry_id = ? AND"
                          " chunk_index = ?", (entry_id, head[-1].chunk_index)).fetchone()[0]
    tokens = conn.execute("SELECT tokens FROM kv_entries WHERE id = ?", (entry_id,)).fetchone()[0]
    cut = (at - entry.token_start) * 4
    new_id = conn.execute(
        "INSERT INTO kv_entries (model, prefix_hash, token_start, token_end, parent_id,"
        " chunk_size, levels, tokens, document_id, chat_id, complete, last_used, created,"
        " calibration) SELECT model, ?, token_start, ?, parent_id, chunk_size, levels, ?,"
        " document_id, chat_id, 1, last_used, ?, calibration FROM kv_entries WHERE id = ?",
        (prefix, at, tokens[:cut], now, entry_id)).lastrowid
    # (the documents it holds: deleting one deletes both parts, as it did the whole)
    conn.execute("INSERT INTO kv_entry_documents SELECT ?, document_id FROM kv_entry_documents"
                 " WHERE entry_id = ?", (new_id, entry_id))
    conn.executemany(
        "INSERT INTO kv_spans (entry_id, chunk_index, token_start, token_end, prefix_hash,"
        " window_part) SELECT ?, chunk_index, token_start, token_end, prefix_hash, 0"
        " FROM kv_spans WHERE entry_id = ? AND chunk_index = ?",
        [(new_id, entry_id, s.chunk_index) for s in head])
    _move(conn, entry_id, new_id, [(s.chunk_index, s.chunk_index) for s in head], prefix)
    conn.executemany("DELETE FROM kv_spans WHERE entry_id = ? AND chunk_index = ?",
                     [(entry_id, s.chunk_index) for s in head])
    # The rest keeps its name (the hash of all its tokens), renumbered from 0.
    for s in spans[len(head):]:
        index = s.chunk_index - len(head)
        conn.execute("INSERT INTO kv_spans (entry_id, chunk_index, token_start, token_end,"
                     " prefix_hash, window_part) SELECT entry_id, ?, token_start, token_end,"
                     " prefix_hash, 0 FROM kv_spans WHERE entry_id = ? AND chunk_index = ?",
                     (index, entry_id, s.chunk_index))
        _move(conn, entry_id, entry_id, [(s.chunk_index, index)], entry.prefix_hash)
        conn.execute("DELETE FROM kv_spans WHERE entry_id = ? AND chunk_index = ?",
                     (entry_id, s.chunk_index))
    conn.execute("UPDATE kv_entries SET token_start = ?, parent_id = ?, tokens = ? WHERE id = ?",
                 (at, new_id, tokens[cut:], entry_id))
    for eid in (new_id, entry_id):
        conn.execute("UPDATE kv_entries SET nbytes = (SELECT coalesce(sum(nbytes), 0) FROM"
                     " kv_chunks WHERE entry_id = ?) WHERE id = ?", (eid, eid))
    return new_id


def _move(conn: sqlite3.Connection, source: int, target: int,
          indices: list[tuple[int, int]], prefix_hash: bytes) -> None:
    """Chunks of entry `source` at (old index, new index) become entry `target`'s, checked
    first and sealed to their new place (`blobs.seal_digest`)."""
    for old, new in indices:
        for level, in conn.execute("SELECT level FROM kv_chunks WHERE entry_id = ? AND"
                                   " chunk_index = ?", (source, old)).fetchall():
            data = blobs.read(conn, source, old, level)  # (raises for a damaged one)
            conn.execute("UPDATE kv_chunks SET entry_id = ?, chunk_index = ?, sha256 = ?"
                         " WHERE entry_id = ? AND chunk_index = ? AND level = ?",
                         (target, new, blobs.seal_digest(prefix_hash, new, level,
                                                         blobs.digest(data)),
                          source, old, level))


class SplitStore:
    """Splitting entries (a base class of `store.Store`, which owns `_db` and `_clock`)."""

    _db: Connections
    _clock: Callable[[], float]

    def split_entry(self, entry_id: int, at: int) -> Entry:
        """Split entry `entry_id` at token `at`, one of its chunk boundaries: the new entry
        of its tokens before `at`, which the rest extends (`split`)."""
        with self._db.write() as db:
            new_id = split(db.conn, entry_id, at, self._clock())
        return kv.get_entry(self._db.get().conn, new_id)
