"""Deleting stored KV entries: one with every entry extending it, or a chat's old entries only
where nothing extends them.

A chat's turn drops its earlier entries that no turn can resume from any more
(`desktop_app.kv.kvcache`); another writer may be extending one of them at that moment (another
chat sharing its start, a local-API conversation, another process), so such an entry is deleted
only where no entry, complete or still being written, has it as parent, checked in the
deleting transaction itself. It never deletes a document's or a passage's entry for a chat.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..datadir.db import Connections
from ..records import Entry
from . import kv


class DeletingStore:
    _db: Connections

    def delete_entry(self, entry_id: int) -> list[int]:
        """Delete an entry and every entry extending it; return their ids."""
        def work() -> list:
            with self._db.write() as db:
                tree = kv.subtree(db.conn, entry_id)
                db.execute("DELETE FROM kv_entries WHERE id = ?", (entry_id,))
            return tree
        return [deleted for deleted, _, _ in self._db.freeing(work)]

    def chat_leaves(self, chat_id: int, fingerprint: str, created: float) -> list[Entry]:
        """Chat `chat_id`'s own complete entries under a model, created no later than
        `created`, that no entry (complete or not) extends as it is read."""
        conn = self._db.get().conn
        rows = conn.execute(
            f"SELECT {kv.ENTRY_COLUMNS} FROM kv_entries k WHERE chat_id = ? AND model = ?"
            " AND complete AND document_id IS NULL AND NOT passage AND created <= ?"
            " AND NOT EXISTS (SELECT 1 FROM kv_entries c WHERE c.parent_id = k.id)"
            " ORDER BY id", (chat_id, fingerprint, created))
        return [kv.entry_from_row(conn, row) for row in rows]

    def delete_unextended(self, entry_ids: Iterable[int]) -> list[int]:
        """Delete those of the entries that no entry, complete or still being written,
        extends, each checked in its deleting transaction; return the ids deleted."""
        ids, gone = list(entry_ids), []

        def work() -> list[int]:
            for entry_id in ids:  # (again after a full disk: those deleted are gone)
                with self._db.write() as db:
                    if db.execute(
                            "DELETE FROM kv_entries WHERE id = ? AND NOT EXISTS"
                            " (SELECT 1 FROM kv_entries WHERE parent_id = ?)",
                            (entry_id, entry_id)).rowcount:
                        gone.append(entry_id)
            return gone
        return self._db.freeing(work) if ids else []
