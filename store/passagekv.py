"""Which passage entries hold which passages' KV: a passage's KV is found by content.

A long document's passage has its KV in a passage entry (store.kv, `passage`), keyed by the
tokens it was computed from, which say nothing of the passage row. The entry is named by the
SHA-256 of the passage's text (`passage_hash`, the passages' `content_hash`), so the same text
in two documents, or twice in one, has one entry, counted for each, and deleting the document
that stored it hands it on (store.library). This module never reads chunks or evicts anything.
"""

from __future__ import annotations

import dataclasses

from .db import Connections
from .passages import text_hash
from .records import Entry


class PassageKVStore:
    """The Store's passage entries by content (a base class of `store.Store`, which owns `_db`)."""

    _db: Connections

    def passage_entries(self, fingerprint: str) -> dict[int, int]:
        """{document id: how many of its passages have their KV stored under a model}, counted
        by content: a passage whose text another document's passage shares has the same KV."""
        rows = self._db.get().execute(
            "SELECT p.document_id, count(*) FROM passages p WHERE EXISTS (SELECT 1 FROM"
            " kv_entries e WHERE e.passage_hash = p.content_hash AND e.passage AND e.complete"
            " AND e.model = ?) GROUP BY p.document_id", (fingerprint,))
        return dict(rows.fetchall())

    def passage_entry_ids(self, fingerprint: str) -> dict[int, list[int]]:
        """{document id: the passage entries holding its passages' KV under a model}, found by
        content as `passage_entries` counts them (an entry shared by two documents is each's)."""
        rows = self._db.get().execute(
            "SELECT DISTINCT p.document_id, e.id FROM passages p JOIN kv_entries e ON"
            " e.passage_hash = p.content_hash WHERE e.passage AND e.complete AND e.model = ?"
            " ORDER BY p.document_id, e.id", (fingerprint,))
        out: dict[int, list[int]] = {}
        for doc_id, entry_id in rows:
            out.setdefault(doc_id, []).append(entry_id)
        return out

    def name_passage(self, entry: Entry, text: str) -> Entry:
        """Passage entry `entry` holding the KV of `text`, named by the text's hash (what
        `passage_entries` counts by) if it is not yet: an entry stored by an older kvdesk, or
        pulled from the shared cache."""
        name = text_hash(text)
        if not entry.passage or entry.passage_hash == name:
            return entry
        with self._db.write() as db:
            db.execute("UPDATE kv_entries SET passage_hash = ? WHERE id = ?", (name, entry.id))
        return dataclasses.replace(entry, passage_hash=name)
