"""Which passage entries hold which passages' KV: a passage's KV is found by content.

A long document's passage has its KV in a passage entry (store.caches.kv, `passage`), keyed by the
tokens it was computed from, which say nothing of the passage row. The entry is named by the
SHA-256 of the passage's text (`passage_hash`, the passages' `content_hash`), so the same text
in two documents, or twice in one, has one entry, counted for each, and deleting the document
that stored it hands it on (`hand_over`). This module never reads chunks or evicts anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import sqlite_utils

from ..datadir.db import Connections
from ..records import Entry
from .passages import COLUMNS, StoredPassage, _record, text_hash


def hand_over(db: sqlite_utils.Database, document_id: int) -> None:
    """Before document `document_id` is deleted: each passage entry it stored whose text
    another (attached) document holds becomes that document's, instead of going with it."""
    db.execute(
        "UPDATE kv_entries SET document_id = (SELECT min(p.document_id) FROM passages p"
        " JOIN documents d ON d.id = p.document_id WHERE p.content_hash = kv_entries.passage_hash"
        " AND p.document_id != :doc AND d.attach_pid IS NULL)"
        " WHERE document_id = :doc AND passage AND passage_hash IN (SELECT p.content_hash FROM"
        " passages p JOIN documents d ON d.id = p.document_id WHERE p.document_id != :doc AND"
        " d.attach_pid IS NULL)", {"doc": document_id})


class PassageKVStore:
    """The Store's passage entries by content (a base class of `store.Store`, which owns `_db`)."""

    _db: Connections

    def passage_entries(self, fingerprint: str) -> dict[int, int]:
        """{document id: how many of its passages have their KV stored under a model}, counted
        by content: a passage whose text another document's passage shares has the same KV."""
        return {doc: len(held) for doc, held in self.passage_kv(fingerprint).items()}

    def passage_sizes(self, fingerprint: str) -> dict[tuple[str, ...], tuple[int, int]]:
        """{levels held: (bytes, tokens)} of the passage entries stored under a model: what a
        passage's KV takes, measured (a passage entry's tokens are its own, not its head's)."""
        out = {}
        for levels, nbytes, tokens in self._db.get().execute(
                "SELECT levels, sum(nbytes), sum(token_end - token_start) FROM kv_entries"
                " WHERE passage AND complete AND model = ? GROUP BY levels", (fingerprint,)):
            with contextlib.suppress(ValueError, TypeError):  # (damaged: `verify` says so)
                out[tuple(json.loads(levels))] = (nbytes, tokens)
        return out

    def passage_kv(self, fingerprint: str) -> dict[int, dict[int, int]]:
        """{document id: {passage id: the entry holding its KV}} under a model, found by
        content (an entry shared by two documents, or two passages, is each's)."""
        out: dict[int, dict[int, int]] = {}
        for doc_id, passage_id, entry_id in self._db.get().execute(
                "SELECT p.document_id, p.id, min(e.id) FROM passages p JOIN kv_entries e ON"
                " e.passage_hash = p.content_hash WHERE e.passage AND e.complete AND e.model = ?"
                " GROUP BY p.id", (fingerprint,)):
            out.setdefault(doc_id, {})[passage_id] = entry_id
        return out

    def passage_named(self, document_id: int | None, name: str | None) -> StoredPassage | None:
        """The passage whose text has the hash `name` (a passage entry's `passage_hash`), of
        document `document_id` where it holds one, else of any document; None: no passage
        (a document read whole beside the passages, or one deleted)."""
        conn = self._db.get().conn
        row = conn.execute(
            f"SELECT {COLUMNS} FROM passages WHERE content_hash = ?"
            " ORDER BY document_id IS NOT ?, document_id, idx LIMIT 1",
            (name, document_id)).fetchone()
        return None if row is None else _record(conn, row)

    def name_passage(self, entry: Entry, text: str) -> Entry:
        """Passage entry `entry` holding the KV of `text`, named by the text's hash (what
        `passage_entries` counts by) if it has no name yet: one stored by a kvdesk before
        names. (A name is never changed: two texts of the same tokens share one entry.)"""
        if not entry.passage or entry.passage_hash is not None:
            return entry
        name = text_hash(text)
        with self._db.write() as db:
            db.execute("UPDATE kv_entries SET passage_hash = ? WHERE id = ?", (name, entry.id))
        return dataclasses.replace(entry, passage_hash=name)
