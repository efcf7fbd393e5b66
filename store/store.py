"""Store: the one entry point to kvdesk's persistent state in a data directory.

Documents, chats, messages, settings and the KV caches of models, in one SQLite database
(kvdesk.sqlite) driven through sqlite-utils. The engine and the CLI wrap this class thinly. It is
safe to share one Store between the GUI thread and workers (each thread gets its own connection),
and to open the same data directory from several processes. It knows nothing of llama.cpp, Qt or
the codec: KV chunks are opaque bytes at named levels.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import sqlite_utils

from . import blobs, calibrations, kv, quota
from .db import Connections
from .errors import NotFoundError
from .records import CalibrationRecord, Chat, Document, Entry, Message, Model, PrefixMatch
from .schema import migrate, schema_version
from .tokens import decode

DB_NAME = "kvdesk.sqlite"
DEFAULT_CHUNK_SIZE = 256


class Store:
    """Persistent state of one data directory. Close it (or use `with`) when done."""

    def __init__(self, data_dir: str | Path, *, clock: Callable[[], float] = time.time):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / DB_NAME
        self._clock = clock
        self._db = Connections(self.path)
        try:
            migrate(self._db.get().conn)
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return schema_version(self._db.get().conn)

    # -- models --------------------------------------------------------------------------------

    def register_model(self, fingerprint: str, path: str, layout: dict[str, Any]) -> Model:
        """Record (or update the path and layout of) the model KV entries are keyed by."""
        with self._db.write() as db:
            db.execute(
                "INSERT INTO models VALUES (?, ?, ?, ?) ON CONFLICT (fingerprint)"
                " DO UPDATE SET path = excluded.path, layout = excluded.layout",
                (fingerprint, path, json.dumps(layout), self._clock()),
            )
        return self.model(fingerprint)

    def model(self, fingerprint: str) -> Model:
        row = _get(self._db.get()["models"], fingerprint, "model")
        return Model(**{**row, "layout": json.loads(row["layout"])})

    # -- documents -----------------------------------------------------------------------------

    def add_document(
        self,
        content_hash: str,
        title: str,
        text: str,
        *,
        type: str,
        source_path: str | None = None,
        n_tokens: int | None = None,
    ) -> Document:
        """Store a document, or return the one already stored with the same content hash."""
        with self._db.write() as db:
            existing = db.execute(
                "SELECT id FROM documents WHERE content_hash = ?", (content_hash,)
            ).fetchone()
            if existing is None:
                record = {
                    "content_hash": content_hash,
                    "title": title,
                    "source_path": source_path,
                    "type": type,
                    "text": text,
                    "n_tokens": n_tokens,
                    "created": self._clock(),
                }
                document_id = db["documents"].insert(record).last_pk
            else:
                document_id = existing[0]
        return self.document(document_id)

    def document(self, document_id: int) -> Document:
        return Document(**_get(self._db.get()["documents"], document_id, "document"))

    def documents(self) -> list[Document]:
        return [Document(**row) for row in self._db.get()["documents"].rows_where(order_by="id")]

    def delete_document(self, document_id: int) -> None:
        """Delete a document with its KV entries (and entries extending them) and chat links."""
        self._delete("documents", document_id, "document")

    # -- chats and messages --------------------------------------------------------------------

    def create_chat(self, title: str, document_ids: Sequence[int] = ()) -> Chat:
        now = self._clock()
        with self._db.write() as db:
            chat_id = db["chats"].insert({"title": title, "created": now, "updated": now}).last_pk
            for document_id in document_ids:
                _link(db, chat_id, document_id)
        return self.chat(chat_id)

    def chat(self, chat_id: int) -> Chat:
        return Chat(**_get(self._db.get()["chats"], chat_id, "chat"))

    def chats(self) -> list[Chat]:
        """All chats, the most recently updated first."""
        rows = self._db.get()["chats"].rows_where(order_by="updated DESC, id DESC")
        return [Chat(**row) for row in rows]

    def rename_chat(self, chat_id: int, title: str) -> Chat:
        with self._db.write() as db:
            _update(db, "chats", chat_id, "chat", title=title, updated=self._clock())
        return self.chat(chat_id)

    def delete_chat(self, chat_id: int) -> None:
        """Delete a chat with its messages, document links and KV entries."""
        self._delete("chats", chat_id, "chat")

    def attach_document(self, chat_id: int, document_id: int) -> None:
        with self._db.write() as db:
            _link(db, chat_id, document_id)

    def chat_documents(self, chat_id: int) -> list[Document]:
        """The documents attached to a chat, in the order they were attached."""
        rows = self._db.get().query(
            "SELECT d.* FROM documents d JOIN chat_documents l ON l.document_id = d.id"
            " WHERE l.chat_id = ? ORDER BY l.position",
            (chat_id,),
        )
        return [Document(**row) for row in rows]

    def add_message(
        self, chat_id: int, role: str, text: str, stats: dict[str, Any] | None = None
    ) -> Message:
        now = self._clock()
        with self._db.write() as db:
            _get(db["chats"], chat_id, "chat")
            record = {
                "chat_id": chat_id,
                "role": role,
                "text": text,
                "stats": _json(stats),
                "created": now,
                "updated": now,
            }
            message_id = db["messages"].insert(record).last_pk
            _update(db, "chats", chat_id, "chat", updated=now)
        return self.message(message_id)

    def update_message(
        self, message_id: int, *, text: str | None = None, stats: dict[str, Any] | None = None
    ) -> Message:
        """Replace a message's text and/or stats (e.g. as an answer streams in)."""
        changes: dict[str, Any] = {"updated": self._clock()}
        if text is not None:
            changes["text"] = text
        if stats is not None:
            changes["stats"] = _json(stats)
        with self._db.write() as db:
            _update(db, "messages", message_id, "message", **changes)
        return self.message(message_id)

    def delete_message(self, message_id: int) -> None:
        """Remove one message (e.g. an answer being regenerated)."""
        with self._db.write() as db:
            if not db.execute("DELETE FROM messages WHERE id = ?", (message_id,)).rowcount:
                raise NotFoundError(f"no message {message_id}")

    def message(self, message_id: int) -> Message:
        return _message(_get(self._db.get()["messages"], message_id, "message"))

    def messages(self, chat_id: int) -> list[Message]:
        rows = self._db.get()["messages"].rows_where("chat_id = ?", [chat_id], order_by="id")
        return [_message(row) for row in rows]

    # -- settings ------------------------------------------------------------------------------

    def setting(self, key: str, default: Any = None) -> Any:
        row = self._db.get().execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_setting(self, key: str, value: Any) -> None:
        with self._db.write() as db:
            db["settings"].upsert({"key": key, "value": json.dumps(value)}, pk="key")

    @property
    def budget_bytes(self) -> int:
        """The disk budget for KV caches (setting "store.budget_bytes", default 10 GB)."""
        return self.setting(quota.BUDGET_SETTING, quota.DEFAULT_BUDGET_BYTES)

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self.set_setting(quota.BUDGET_SETTING, int(value))

    # -- KV entries ----------------------------------------------------------------------------

    def write_entry(
        self,
        fingerprint: str,
        tokens: Iterable[int],
        *,
        levels: Sequence[str],
        parent_id: int | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        document_id: int | None = None,
        chat_id: int | None = None,
        calibration: str | None = None,
    ) -> kv.EntryWriter:
        """Start writing the KV entry for `tokens` (the whole prefix, parent's tokens included).

        The entry covers tokens [parent.token_end, len(tokens)), cut into chunks of chunk_size;
        `writer.spans` says which. Put every chunk at every level, then leave the `with` block
        (or call finish()). Deleting its document or chat deletes the entry. `calibration`:
        the id of the stored codec calibration its chunks need (put_calibration), if any.
        """
        levels = tuple(levels)
        with self._db.write() as db:
            entry_id = kv.create_pending(
                db.conn,
                fingerprint=fingerprint,
                tokens=tokens,
                parent_id=parent_id,
                chunk_size=chunk_size,
                levels=levels,
                document_id=document_id,
                chat_id=chat_id,
                now=self._clock(),
                calibration=calibration,
            )
        return kv.EntryWriter(self._db, entry_id, levels, self._clock, self._enforce_budget)

    def longest_prefix(
        self, fingerprint: str, tokens: Iterable[int], *, touch: bool = True
    ) -> PrefixMatch:
        """The stored chain covering the longest prefix of `tokens`; marks its entries used."""
        with self._db.read() as db:
            match = kv.longest_prefix(db.conn, fingerprint, tokens)
        if touch and match.entries:
            self.touch(entry.id for entry in match.entries)
        return match

    def document_entry(self, document_id: int, fingerprint: str) -> Entry | None:
        """The root KV entry of a document under a model, if stored; marks it used."""
        row = (
            self._db.get()
            .execute(
                "SELECT id FROM kv_entries WHERE document_id = ? AND model = ? AND complete"
                " AND parent_id IS NULL ORDER BY last_used DESC LIMIT 1",
                (document_id, fingerprint),
            )
            .fetchone()
        )
        if row is None:
            return None
        self.touch([row[0]])
        return self.entry(row[0])

    def entry(self, entry_id: int) -> Entry:
        return kv.get_entry(self._db.get().conn, entry_id)

    def entries(self) -> list[Entry]:
        """Every complete entry, least recently used first."""
        rows = self._db.get().execute(
            f"SELECT {kv.ENTRY_COLUMNS} FROM kv_entries WHERE complete ORDER BY last_used, id"
        )
        return [kv.entry_from_row(row) for row in rows]

    def tokens(self, entry_id: int) -> list[int]:
        """The whole token prefix an entry caches: its ancestors' tokens, then its own."""
        with self._db.read() as db:
            match = kv.chain(db.conn, entry_id)
            parts = [
                db.execute("SELECT tokens FROM kv_entries WHERE id = ?", (entry.id,)).fetchone()[0]
                for entry in match
            ]
        return decode(b"".join(parts))

    def chunk_sizes(self, entry_ids: Iterable[int]) -> dict[tuple[int, int, str], int]:
        """{(entry, chunk, level): bytes} for the entries' chunks, without reading any of them.

        What a streaming restore plans with: the cost of each level of each chunk.
        """
        ids = list(entry_ids)
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        with self._db.read() as db:
            rows = db.execute(
                "SELECT entry_id, chunk_index, level, nbytes FROM kv_chunks"
                f" WHERE entry_id IN ({marks})",
                ids,
            ).fetchall()
        return {(e, c, lvl): n for e, c, lvl, n in rows}

    def read_chunk(self, entry_id: int, chunk_index: int, level: str) -> bytes:
        """One chunk's bytes, checksum verified (CorruptChunkError); reads nothing else."""
        with self._db.read() as db:
            return blobs.read(db.conn, entry_id, chunk_index, level)

    def repair_chunk(self, entry_id: int, chunk_index: int, level: str, data: bytes) -> None:
        """Replace a chunk's bytes, e.g. recomputed after a CorruptChunkError."""
        with self._db.write() as db:
            kv.get_entry(db.conn, entry_id)
            if not db.execute(
                "SELECT 1 FROM kv_chunks WHERE entry_id = ? AND chunk_index = ? AND level = ?",
                (entry_id, chunk_index, level),
            ).fetchone():
                raise NotFoundError(f"no chunk {chunk_index} at level {level!r} in {entry_id}")
            blobs.put(db.conn, entry_id, chunk_index, level, data)

    def touch(self, entry_ids: Iterable[int]) -> None:
        """Mark entries used now (the LRU order eviction follows)."""
        with self._db.write() as db:
            kv.touch(db.conn, entry_ids, self._clock())

    def delete_entry(self, entry_id: int) -> list[int]:
        """Delete an entry and every entry extending it; return their ids."""
        with self._db.write() as db:
            tree = kv.subtree(db.conn, entry_id)
            db.execute("DELETE FROM kv_entries WHERE id = ?", (entry_id,))
        self._reclaim()
        return [deleted for deleted, _, _ in tree]

    # -- codec calibrations ----------------------------------------------------------------------

    def put_calibration(self, model: str, data: bytes, meta: dict | None = None) -> str:
        """Keep a codec calibration made for `model` (content-addressed); returns its id."""
        with self._db.write() as db:
            return calibrations.put(db.conn, model, data, meta or {}, self._clock())

    def calibration(self, cal_id: str) -> bytes:
        """A calibration's bytes, checked against its id (NotFoundError, CorruptObjectError)."""
        with self._db.read() as db:
            return calibrations.read(db.conn, cal_id)

    def calibrations(self, model: str | None = None) -> list[CalibrationRecord]:
        """Stored calibrations (of one model), the newest first."""
        with self._db.read() as db:
            return calibrations.records(db.conn, model)

    def delete_calibration(self, cal_id: str) -> None:
        """Remove a calibration that no KV entry needs."""
        with self._db.write() as db:
            calibrations.delete(db.conn, cal_id)

    # -- quota and integrity -------------------------------------------------------------------

    def usage_bytes(self) -> int:
        """Bytes of all stored KV chunks."""
        return quota.usage(self._db)

    def gc(self, budget_bytes: int | None = None) -> dict:
        """Evict least-recently-used KV entries until they fit the budget (default: the setting).

        Returns {"evicted_entries": [ids], "abandoned_entries": [ids], "freed_bytes": n,
        "bytes_after": n, "budget_bytes": n}.
        """
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        report = quota.collect(self._db, budget, self._clock())
        if report["freed_bytes"]:
            self._reclaim()
        return report

    def verify(self) -> dict:
        """Check every chunk of every complete entry against its checksum.

        Returns {"entries": n, "chunks": n, "bytes": n,
        "corrupt": [{"entry": id, "chunk": i, "level": name}]}.
        """
        with self._db.read() as db:
            rows = blobs.chunk_rows(db.conn)
            (n_entries,) = db.execute("SELECT count(*) FROM kv_entries WHERE complete").fetchone()
        n_chunks = n_bytes = 0
        corrupt = []
        for rowid, entry_id, chunk_index, level, nbytes in rows:
            # One short read transaction per chunk: a scan of many GB must not pin the WAL.
            with self._db.read() as db:
                intact = blobs.is_intact(db.conn, rowid)
            if intact is None:
                continue
            n_chunks += 1
            n_bytes += nbytes
            if not intact:
                corrupt.append({"entry": entry_id, "chunk": chunk_index, "level": level})
        return {"entries": n_entries, "chunks": n_chunks, "bytes": n_bytes, "corrupt": corrupt}

    # -- internals -----------------------------------------------------------------------------

    def _enforce_budget(self) -> None:
        if self.usage_bytes() > self.budget_bytes:
            self.gc()

    def _delete(self, table: str, row_id: int, what: str) -> None:
        # Foreign keys cascade: documents/chats -> their KV entries -> entries extending those
        # -> spans -> chunks; chats -> messages; either -> chat_documents. Nothing is left over.
        with self._db.write() as db:
            if not db.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,)).rowcount:
                raise NotFoundError(f"no {what} {row_id}")
        self._reclaim()

    def _reclaim(self) -> None:
        # The database uses incremental auto-vacuum: hand freed chunk pages back to the file
        # system. executescript() steps the pragma to the end; execute() frees a single page.
        self._db.get().conn.executescript("PRAGMA incremental_vacuum")


def _get(table: sqlite_utils.db.Table, key: Any, what: str) -> dict:
    try:
        return table.get(key)
    except sqlite_utils.db.NotFoundError:
        raise NotFoundError(f"no {what} {key!r}") from None


def _update(db: sqlite_utils.Database, table: str, row_id: int, what: str, **changes) -> None:
    _get(db[table], row_id, what)
    db[table].update(row_id, changes)


def _link(db: sqlite_utils.Database, chat_id: int, document_id: int) -> None:
    _get(db["documents"], document_id, "document")
    (position,) = db.execute(
        "SELECT count(*) FROM chat_documents WHERE chat_id = ?", (chat_id,)
    ).fetchone()
    db.execute(
        "INSERT OR IGNORE INTO chat_documents VALUES (?, ?, ?)", (chat_id, document_id, position)
    )


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _message(row: dict) -> Message:
    return Message(**{**row, "stats": None if row["stats"] is None else json.loads(row["stats"])})
