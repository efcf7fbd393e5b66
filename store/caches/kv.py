"""KV entries: created pending and completed (store.caches.writers puts their chunks), the
longest-prefix lookup, and the tree of entries.

An entry caches tokens [token_start, token_end) of one model; a chat's entry extends its
document's entry (parent_id) and stores only its own tokens, so the document's chunks are reused,
never copied. An entry may also carry a window: the KV of a cache section that holds only the
last positions at the entry's end (a sliding-window model's), stored as parts of chunk_size
tokens of their own (kv_spans.window_part = 1, chunk indexes after the entry's chunks), at the
entry's levels; what those bytes mean is the caller's. A window part is never a prefix key.

Entries are written incomplete (invisible to every reader), one short write transaction per chunk
so the GUI and other writers are never blocked for a whole prefill, and become visible in the
single transaction that checks every (chunk, level) is present and sets complete = 1. A writer
that dies leaves an incomplete entry that store.caches.quota removes later.

This module must never let a reader see an incomplete entry, and never copy a parent's chunks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sqlite3
from collections.abc import Iterable

from ..datadir.values import stored_json
from ..errors import IncompleteEntryError, NotFoundError
from ..records import Entry, PrefixMatch, Span
from ..tokens import chunk_spans, decode, encode, prefix_hashes

ENTRY_COLUMNS = (
    "id, model, token_start, token_end, parent_id, chunk_size, levels, nbytes,"
    " document_id, chat_id, last_used, created, prefix_hash, calibration, passage, passage_hash"
)
# Under SQLite's default limit of host parameters per statement, with room for the others.
_BATCH = 500
MAX_TAIL_TOKENS = 4096  # longer than any chunk


def entry_from_row(conn: sqlite3.Connection, row: tuple) -> Entry:
    *head, levels, nbytes, document_id, chat_id, last_used, created, prefix_hash, cal, psg, ph = row
    return Entry(*head, tuple(stored_json(conn, levels, f"the levels of KV entry {head[0]}")),
                 nbytes, document_id, chat_id, last_used, created, prefix_hash, cal, bool(psg), ph)


def get_entry(conn: sqlite3.Connection, entry_id: int) -> Entry:
    row = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM kv_entries WHERE id = ? AND complete",
                       (entry_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no KV entry {entry_id}")
    return entry_from_row(conn, row)


def entry_spans(conn: sqlite3.Connection, entry_id: int, *, window: bool = False
                ) -> tuple[Span, ...]:
    """The chunks of an entry's own tokens, in order (`window`: the parts of its window)."""
    return tuple(
        Span(*row)
        for row in conn.execute(
            "SELECT entry_id, chunk_index, token_start, token_end FROM kv_spans"
            " WHERE entry_id = ? AND window_part = ? ORDER BY chunk_index",
            (entry_id, int(window)),
        )
    )


def create_pending(
    conn: sqlite3.Connection,
    *,
    fingerprint: str,
    tokens: Iterable[int],
    parent_id: int | None,
    chunk_size: int,
    levels: tuple[str, ...],
    document_id: int | None,
    chat_id: int | None,
    now: float,
    window_start: int | None = None,
    calibration: str | None = None,
    passage: bool = False,
    passage_hash: str | None = None,
    holds: Iterable[int] = (),
) -> int:
    """Insert an incomplete entry and its spans for `tokens` (the whole prefix); return its id.

    `window_start`: the entry also has a window, the positions [window_start, len(tokens)).
    `passage`: it is the KV of a passage of `document_id`, not that document's prefix, whose
    text has the `passage_hash` (store.documents.passagekv). `holds`: the documents whose KV
    it holds beyond its parent's, deleted with any of them. NotFoundError: its document or
    chat, or one it holds, is deleted already."""
    if chunk_size <= 0 or not levels or len(set(levels)) != len(levels):
        raise ValueError("an entry needs a positive chunk size and distinct level names")
    encoded = encode(tokens)
    n_tokens = len(encoded) // 4
    start = 0
    if parent_id is not None:
        parent = get_entry(conn, parent_id)
        if parent.model != fingerprint:
            raise ValueError(f"parent entry {parent_id} belongs to another model")
        start = parent.token_end
    if n_tokens <= start:
        raise ValueError("nothing to store: the tokens do not extend past the parent entry")
    holds = sorted(set(holds))
    owners = [("documents", "document", d) for d in [document_id, *holds] if d is not None]
    for table, what, row in owners + [("chats", "chat", chat_id)] * (chat_id is not None):
        if not conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", (row,)).fetchone():
            raise NotFoundError(f"{what} {row} is deleted")
    if window_start is not None and not 0 <= window_start < n_tokens:
        raise ValueError(f"a window from token {window_start} does not end at {n_tokens}")
    spans = chunk_spans(start, n_tokens, chunk_size)
    positions = ([start] if parent_id is not None else []) + [end for _, end in spans]
    hashes = prefix_hashes(fingerprint, encoded, positions)
    if parent_id is not None:
        (parent_hash,) = conn.execute("SELECT prefix_hash FROM kv_entries WHERE id = ?",
                                      (parent_id,)).fetchone()
        if hashes.pop(0) != parent_hash:
            raise ValueError(f"the tokens do not start with parent entry {parent_id}'s tokens")
    entry_id = conn.execute(
        "INSERT INTO kv_entries (model, prefix_hash, token_start, token_end, parent_id,"
        " chunk_size, levels, tokens, document_id, chat_id, last_used, created, writer_pid,"
        " writer_host, calibration, passage, passage_hash)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (fingerprint, hashes[-1], start, n_tokens, parent_id, chunk_size,
         json.dumps(list(levels)), encoded[start * 4 :], document_id, chat_id, now, now,
         os.getpid(), socket.gethostname(), calibration, int(passage),
         passage_hash if passage else None),
    ).lastrowid
    rows = [(entry_id, index, start, end, prefix_hash, 0)
            for index, ((start, end), prefix_hash) in enumerate(zip(spans, hashes, strict=True))]
    if window_start is not None:
        # Keyed by the entry's own hash, but never looked up (window_part = 1).
        parts = chunk_spans(window_start, n_tokens, chunk_size)
        rows += [(entry_id, len(spans) + i, start, end, hashes[-1], 1)
                 for i, (start, end) in enumerate(parts)]
    conn.executemany(
        "INSERT INTO kv_spans (entry_id, chunk_index, token_start, token_end, prefix_hash,"
        " window_part) VALUES (?, ?, ?, ?, ?, ?)", rows)
    conn.executemany("INSERT INTO kv_entry_documents VALUES (?, ?)",
                     [(entry_id, d) for d in holds])
    return entry_id


def complete(conn: sqlite3.Connection, entry_id: int, now: float) -> int:
    """Make a pending entry visible; return its id, or that of an identical one already stored."""
    row = conn.execute(
        "SELECT model, prefix_hash, parent_id, document_id, chat_id, chunk_size, levels,"
        " (SELECT count(*) FROM kv_spans WHERE entry_id = e.id)"
        " FROM kv_entries e WHERE id = ? AND NOT complete",
        (entry_id,),
    ).fetchone()
    if row is None:
        raise NotFoundError(f"KV entry {entry_id} was removed while being written")
    *identity, chunk_size, levels, n_chunks = row
    count, nbytes = conn.execute(
        "SELECT count(*), coalesce(sum(nbytes), 0) FROM kv_chunks WHERE entry_id = ?",
        (entry_id,),
    ).fetchone()
    if count != n_chunks * len(stored_json(conn, levels, f"the levels of KV entry {entry_id}")):
        raise IncompleteEntryError(f"KV entry {entry_id} has {count} of {n_chunks} chunks x "
                                   f"{levels} levels")
    # Two workers may prefill the same prefix at once; the first to finish wins, the second's copy
    # is dropped rather than kept as a duplicate nobody would ever look up.
    same = conn.execute(
        "SELECT id FROM kv_entries WHERE complete AND model = ? AND prefix_hash = ?"
        " AND parent_id IS ? AND document_id IS ? AND chat_id IS ? AND chunk_size = ?",
        (*identity, chunk_size),
    ).fetchone()
    if same is not None:
        conn.execute("INSERT OR IGNORE INTO kv_entry_documents SELECT ?, document_id"
                     " FROM kv_entry_documents WHERE entry_id = ?", (same[0], entry_id))
        conn.execute("DELETE FROM kv_entries WHERE id = ?", (entry_id,))
        return same[0]
    conn.execute("UPDATE kv_entries SET complete = 1, nbytes = ?, last_used = ? WHERE id = ?",
                 (nbytes, now, entry_id))
    return entry_id


def longest_prefix(
    conn: sqlite3.Connection, fingerprint: str, tokens: Iterable[int]
) -> PrefixMatch:
    """The stored chain covering the longest prefix of `tokens`; call inside a read transaction.

    Hashes the query once, only at positions where some stored chunk of this model ends, then
    looks the hashes up longest first: O(tokens + stored chunk ends), never pairwise compares.
    """
    encoded = encode(tokens)
    positions = [
        row[0]
        for row in conn.execute(
            "SELECT DISTINCT s.token_end FROM kv_spans s JOIN kv_entries e ON e.id = s.entry_id"
            " WHERE e.model = ? AND e.complete AND NOT s.window_part AND s.token_end <= ?"
            " ORDER BY s.token_end",
            (fingerprint, len(encoded) // 4),
        )
    ]
    hashes = prefix_hashes(fingerprint, encoded, positions)[::-1]
    for offset in range(0, len(hashes), _BATCH):
        batch = hashes[offset : offset + _BATCH]
        hit = conn.execute(
            "SELECT s.entry_id, s.token_end FROM kv_spans s JOIN kv_entries e ON e.id = s.entry_id"
            f" WHERE s.prefix_hash IN ({','.join('?' * len(batch))}) AND e.complete"
            " AND NOT s.window_part AND e.model = ?"
            # (of entries holding the same tokens, one that ends there: a new entry extends it)
            " ORDER BY s.token_end DESC, e.token_end = s.token_end DESC, e.last_used DESC, e.id"
            " LIMIT 1",
            (*batch, fingerprint),
        ).fetchone()
        if hit is not None:
            return _match(conn, *hit)
    return PrefixMatch(entries=(), spans=(), n_tokens=0)


def with_tail(conn: sqlite3.Connection, fingerprint: str, tokens: Iterable[int],
              match: PrefixMatch, minimum: int) -> PrefixMatch:
    """`match` with the stored chunk that continues it the furthest (at least `minimum`
    tokens past the match) as its tail: the next chunk of its deepest entry, or the first chunk
    of an entry extending it (of a root entry, when nothing matched)."""
    encoded = encode(tokens)
    n = match.n_tokens
    query = encoded[n * 4 : (n + MAX_TAIL_TOKENS) * 4]
    if len(query) < minimum * 4:
        return match
    last = match.entries[-1] if match.entries else None
    if last is not None and last.token_end > n:  # the deepest entry goes on
        candidates = [(last.id, last.token_start)]
    else:
        candidates = conn.execute(
            "SELECT id, token_start FROM kv_entries WHERE complete AND model = ? AND"
            " token_start = ? AND parent_id IS ?", (fingerprint, n, last.id if last else None)
        ).fetchall()
    best: tuple[int, Span, bytes] | None = None
    for entry_id, start in candidates:
        span = conn.execute(
            "SELECT entry_id, chunk_index, token_start, token_end FROM kv_spans"
            " WHERE entry_id = ? AND token_start = ? AND NOT window_part", (entry_id, n)).fetchone()
        (own,) = conn.execute("SELECT tokens FROM kv_entries WHERE id = ?",
                              (entry_id,)).fetchone()
        stored = own[(span[2] - start) * 4 : (span[3] - start) * 4]
        common = len(os.path.commonprefix([stored, query])) // 4
        if common >= minimum and (best is None or common > best[0]):
            best = (common, Span(*span), stored)
    if best is None:
        return match
    common, span, stored = best
    return dataclasses.replace(match, tail=span, tail_tokens=tuple(decode(stored)),
                               tail_match=common)


def _match(conn: sqlite3.Connection, entry_id: int, n_tokens: int) -> PrefixMatch:
    entries = chain(conn, entry_id)
    spans = [span for entry in entries for span in entry_spans(conn, entry.id)
             if span.token_end <= n_tokens]
    # A chunk whose span row is gone must not let the next one stand in its place: the match
    # ends where its chunks stop following on (verify reports the gap; a restore recomputes).
    ends = [0] + [span.token_end for span in spans]
    whole = next((i for i, span in enumerate(spans) if span.token_start != ends[i]), len(spans))
    if whole < len(spans):
        n_tokens = ends[whole]
        entries = tuple(e for e in entries if e.token_start < n_tokens)
    return PrefixMatch(entries=entries, spans=tuple(spans[:whole]), n_tokens=n_tokens)


def chain(conn: sqlite3.Connection, entry_id: int) -> tuple[Entry, ...]:
    """An entry and its ancestors, root first."""
    entries = tuple(
        entry_from_row(conn, row)
        for row in conn.execute(
            "WITH RECURSIVE chain(id, depth) AS (SELECT ?, 0 UNION ALL"
            " SELECT e.parent_id, chain.depth + 1 FROM kv_entries e JOIN chain ON e.id = chain.id"
            " WHERE e.parent_id IS NOT NULL)"
            f" SELECT {', '.join('e.' + c.strip() for c in ENTRY_COLUMNS.split(','))}"
            " FROM chain JOIN kv_entries e ON e.id = chain.id WHERE e.complete"
            " ORDER BY chain.depth DESC",
            (entry_id,),
        )
    )
    if not entries:
        raise NotFoundError(f"no KV entry {entry_id}")
    return entries


def prefix_tokens(conn: sqlite3.Connection, entry_id: int) -> bytes:
    """The whole token prefix an entry caches, encoded: its ancestors' tokens, then its own."""
    return b"".join(conn.execute("SELECT tokens FROM kv_entries WHERE id = ?",
                                 (entry.id,)).fetchone()[0] for entry in chain(conn, entry_id))


def subtree(conn: sqlite3.Connection, entry_id: int) -> list[tuple[int, bool, int]]:
    """(id, complete, chunk bytes) of an entry and every entry extending it, root first."""
    return conn.execute(
        "WITH RECURSIVE sub(id, depth) AS (SELECT ?, 0 UNION ALL"
        " SELECT e.id, sub.depth + 1 FROM kv_entries e JOIN sub ON e.parent_id = sub.id)"
        " SELECT k.id, k.complete,"
        " (SELECT coalesce(sum(nbytes), 0) FROM kv_chunks WHERE entry_id = k.id)"
        " FROM sub JOIN kv_entries k ON k.id = sub.id ORDER BY sub.depth, k.id",
        (entry_id,),
    ).fetchall()


def level_bytes(conn: sqlite3.Connection, chunks: list[tuple[int, int]]) -> dict[str, int]:
    """{level: bytes} summed over (entry, chunk index) pairs."""
    out: dict[str, int] = {}
    step = _BATCH // 2
    for offset in range(0, len(chunks), step):
        batch = chunks[offset : offset + step]
        rows = conn.execute(
            "SELECT level, sum(nbytes) FROM kv_chunks WHERE NOT quarantined AND"
            f" (entry_id, chunk_index) IN (VALUES {','.join(['(?, ?)'] * len(batch))})"
            " GROUP BY level",
            [x for pair in batch for x in pair],
        )
        for level, nbytes in rows:
            out[level] = out.get(level, 0) + nbytes
    return out


def entry_level_bytes(conn: sqlite3.Connection, entry_ids: list[int]) -> dict[int, dict[str, int]]:
    """{entry id: {level: bytes}} of whole entries."""
    out: dict[int, dict[str, int]] = {}
    for offset in range(0, len(entry_ids), _BATCH):
        batch = entry_ids[offset : offset + _BATCH]
        rows = conn.execute(
            "SELECT entry_id, level, sum(nbytes) FROM kv_chunks WHERE NOT quarantined"
            f" AND entry_id IN ({','.join('?' * len(batch))}) GROUP BY entry_id, level",
            batch,
        )
        for entry_id, level, nbytes in rows:
            out.setdefault(entry_id, {})[level] = nbytes
    return out


def touch(conn: sqlite3.Connection, entry_ids: Iterable[int], now: float) -> None:
    conn.executemany(
        "UPDATE kv_entries SET last_used = ? WHERE id = ?", [(now, i) for i in entry_ids]
    )
