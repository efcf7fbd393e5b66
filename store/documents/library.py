"""Documents, chats and messages: the rows a user sees, and the tokens of each message.

Functions over a sqlite-utils Database inside the Store's transactions (`Store` wraps them).
A message's text is the truth; its exact tokens are kept per model fingerprint beside it, so a
chat continued under another model is tokenized again from its text, never fed another
model's ids. Listings aggregate in SQL (message counts, document ids per chat), so listing
chats never loads their messages.

This module never touches KV entries or chunks beyond the cascades and the trigger the schema
declares (an entry holding a deleted document goes with it), a passage entry shared with
another document (which `passagekv.hand_over` keeps), and the entries of the chats about a
deleted document (`_drop_chat_caches`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlite_utils

from ..datadir.db import Connections
from ..datadir.locks import ChatLocks
from ..datadir.values import stored_json
from ..errors import DiskFullError, NotFoundError
from ..records import Chat, Document, Message, Model
from . import passagekv
from .messages import (
    add_message,
    add_turn,
    chats_holding,
    get_message,
    message_from_row,
    set_tokens,
    tokens_of_chat,
)
from .rows import get, update


def delete(db: sqlite_utils.Database, table: str, row_id: int, what: str) -> bool:
    """Delete a document or chat; whether it was a document with passages (`forget_words`)."""
    # Foreign keys cascade: documents/chats -> their KV entries -> entries extending those
    # -> spans -> chunks; chats -> messages -> their tokens; either -> chat_documents.
    passages = None
    try:
        if table == "documents":
            passagekv.hand_over(db, row_id)
            _drop_chat_caches(db, row_id)
            passages = db.execute("SELECT 1 FROM passages WHERE document_id = ? LIMIT 1",
                                  (row_id,)).fetchone()
        deleted = db.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,)).rowcount
    except OverflowError:
        deleted = 0
    if not deleted:
        raise NotFoundError(f"no {what} {row_id}")
    return passages is not None


def forget_words(db: sqlite_utils.Database) -> None:
    """After a document with passages is deleted: FTS5 records a deletion as a mark in a new
    segment, and the passages' words stay in the old ones, on disk, until they are merged.
    Merged now (the store's secure_delete overwriting the rows dropped), they are gone."""
    db.execute("INSERT INTO passages_fts(passages_fts) VALUES ('optimize')")


def _drop_chat_caches(db: sqlite_utils.Database, document_id: int) -> None:
    """Before document `document_id` is deleted: the KV entries of the chats about it go, with
    the entries extending them (by the cascade), written or still being written (those written
    saying they hold it go by the schema's trigger, whatever deletes it: m012). A chat's entry
    extends its first document's only: the KV of its other documents is in the chat's own
    entries, which no context starts with once the chat goes on without the document. (A chat
    over passages whose context held none of the document's passages loses its entries too:
    blended again from its passages' own KV, which stay, at its next question.)"""
    db.execute("DELETE FROM kv_entries WHERE chat_id IN (SELECT chat_id FROM chat_documents"
               " WHERE document_id = ?)", (document_id,))


# -- documents ----------------------------------------------------------------------------------


def _add_document(db: sqlite_utils.Database, record: dict) -> int:
    """The id of the document with record's content hash: the stored one, or `record` added."""
    existing = db.execute("SELECT id FROM documents WHERE content_hash = ?",
                          (record["content_hash"],)).fetchone()
    return existing[0] if existing is not None else db["documents"].insert(record).last_pk


def _document(db: sqlite_utils.Database, document_id: int) -> Document:
    return Document(**get(db["documents"], document_id, "document"))


def _set_document_tokens(db: sqlite_utils.Database, document_id: int, model: str, tokens: int,
                        kept: int) -> None:
    get(db["documents"], document_id, "document")
    db.execute("INSERT OR REPLACE INTO document_tokens VALUES (?, ?, ?, ?)",
               (document_id, model, tokens, kept))


def _document_tokens(db: sqlite_utils.Database, model: str) -> dict[int, tuple[int, int]]:
    """{document id: (its tokens, how many fit its context)} under `model`."""
    rows = db.execute("SELECT document_id, tokens, kept_tokens FROM document_tokens"
                      " WHERE model = ?", (model,))
    return {doc: (tokens, kept) for doc, tokens, kept in rows}


# -- chats --------------------------------------------------------------------------------------


def _link(db: sqlite_utils.Database, chat_id: int, document_id: int) -> None:
    get(db["documents"], document_id, "document")
    (position,) = db.execute("SELECT count(*) FROM chat_documents WHERE chat_id = ?",
                             (chat_id,)).fetchone()
    db.execute("INSERT OR IGNORE INTO chat_documents VALUES (?, ?, ?)",
               (chat_id, document_id, position))


def _new_chat(db: sqlite_utils.Database, title: str, document_ids: Sequence[int],
              now: float) -> int:
    chat_id = db["chats"].insert({"title": title, "created": now, "updated": now}).last_pk
    for document_id in document_ids:
        _link(db, chat_id, document_id)
    return chat_id


def _chat(db: sqlite_utils.Database, chat_id: int) -> Chat:
    row = get(db["chats"], chat_id, "chat")
    if row["title"] is None or row["updated"] is None:  # (`chats`: a damaged page's)
        raise NotFoundError(f"no chat {chat_id!r}")
    return Chat(**row)


def _message_counts(db: sqlite_utils.Database) -> dict[int, int]:
    """{chat id: number of messages} of every chat that has any."""
    return dict(db.execute("SELECT chat_id, count(*) FROM messages GROUP BY chat_id").fetchall())


def _chat_document_ids(db: sqlite_utils.Database) -> dict[int, list[int]]:
    """{chat id: its documents' ids in the order attached} of every chat that has any."""
    out: dict[int, list[int]] = {}
    for chat_id, document_id in db.execute("SELECT chat_id, document_id FROM chat_documents"
                                           " ORDER BY chat_id, position"):
        out.setdefault(chat_id, []).append(document_id)
    return out


class LibraryStore:
    """The Store's documents, chats and messages (a base class of `store.Store`, which owns
    the connections `_db`, the clock `_clock`, the chat locks and `_delete`)."""

    _db: Connections
    _clock: Callable[[], float]
    locks: ChatLocks
    _unrecorded: dict[str, tuple[str, dict]]  # models registered, not yet recorded
    read_only: bool

    def _delete(self, table: str, row_id: int, what: str) -> None: ...

    # -- models --------------------------------------------------------------------------------

    def register_model(self, fingerprint: str, path: str, layout: dict[str, Any]) -> Model | None:
        """Record (or update the path and layout of) the model KV entries are keyed by.

        A read-only store records nothing (nothing can be stored under the model either).
        Recorded as it is already, it is not written again: a full disk still reads. On a
        full disk it is recorded before the first entry under it (`record_models`)."""
        known = self._db.get().execute("SELECT path, layout FROM models WHERE fingerprint = ?",
                                       (fingerprint,)).fetchone()
        if self.read_only or known == (path, json.dumps(layout)):
            return None if self.read_only else self.model(fingerprint)
        self._unrecorded[fingerprint] = (path, layout)
        with contextlib.suppress(DiskFullError):
            self.record_models()
        return self.model(fingerprint) if fingerprint not in self._unrecorded else None

    def record_models(self) -> None:
        """Record the models registered while the disk was full (raises DiskFullError while
        it still is)."""
        for fingerprint, (path, layout) in list(self._unrecorded.items()):
            with self._db.write() as db:
                db.execute("INSERT INTO models VALUES (?, ?, ?, ?) ON CONFLICT (fingerprint)"
                           " DO UPDATE SET path = excluded.path, layout = excluded.layout",
                           (fingerprint, path, json.dumps(layout), self._clock()))
            del self._unrecorded[fingerprint]

    def model(self, fingerprint: str) -> Model:
        row = get((db := self._db.get())["models"], fingerprint, "model")
        layout = stored_json(db.conn, row["layout"], f"the layout of model {fingerprint}")
        return Model(**{**row, "layout": layout})

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
        attaching: bool = False,
        created: float | None = None,
    ) -> Document:
        """Store a document, or return the one already stored with the same content hash.

        `attaching`: a new document is unfinished, attached by this process, until
        finish_document(); killed before, `gc` removes it (store.caches.quota). `created`:
        when its text was read (`now()` then; default: now), what a later change of its
        file is measured from.
        """
        record = {"content_hash": content_hash, "title": title, "source_path": source_path,
                  "type": type, "text": text, "n_tokens": n_tokens,
                  "created": self._clock() if created is None else created}
        if attaching:
            record.update(attach_pid=os.getpid(), attach_host=socket.gethostname())
        with self._db.write() as db:
            document_id = _add_document(db, record)
        return self.document(document_id)

    def document(self, document_id: int) -> Document:
        return _document(self._db.get(), document_id)

    def now(self) -> float:
        """The store's clock (a document's `created`)."""
        return self._clock()

    def documents(self) -> list[Document]:
        return [Document(**row) for row in self._db.get()["documents"].rows_where(order_by="id")
                if row["title"] is not None and row["text"] is not None]  # (as `chats`)

    def document_titles(self) -> dict[int, str]:
        """{document id: title} of every document, none of their texts read."""
        return dict(self._db.get().execute(
            "SELECT id, title FROM documents WHERE title IS NOT NULL AND text IS NOT NULL"))

    def deleted_titles(self) -> dict[int, str]:
        """{document id: title} of the deleted documents that chats were about."""
        return dict(self._db.get().execute(
            "SELECT DISTINCT document_id, title FROM deleted_documents"))

    def claim_document(self, document_id: int) -> None:
        """Take over an unfinished document (its attach was killed): attached by this process
        now, until finish_document()."""
        with self._db.write() as db:
            update(db, "documents", document_id, "document", attach_pid=os.getpid(),
                    attach_host=socket.gethostname())

    def finish_document(self, document_id: int) -> None:
        """A document's attach is done: it is no longer unfinished."""
        with self._db.write() as db:
            update(db, "documents", document_id, "document", attach_pid=None, attach_host=None)

    def attach_turn(self, content_hash: str, *, cancel: threading.Event | None = None,
                    on_wait: Callable[[], None] | None = None
                    ) -> contextlib.AbstractContextManager:
        """Hold the attach of the document with this content hash against other processes
        (store.datadir.locks), as chat_turn does a chat's turn."""
        if self.read_only:
            return contextlib.nullcontext()
        return self.locks.attach(content_hash, cancel=cancel, on_wait=on_wait)

    def set_document_tokens(self, document_id: int, model: str, tokens: int, kept: int) -> None:
        """Record a document's token count under a model, and how many fit its context."""
        with self._db.write() as db:
            _set_document_tokens(db, document_id, model, tokens, kept)

    def document_tokens(self, model: str) -> dict[int, tuple[int, int]]:
        """{document id: (tokens, tokens kept)} under `model`."""
        return _document_tokens(self._db.get(), model)

    def delete_document(self, document_id: int) -> None:
        """Delete a document with its KV entries (and entries extending them), its chat links,
        and the KV entries of the chats about it (`_drop_chat_caches`): their messages stay."""
        self._delete("documents", document_id, "document")

    # -- chats and messages --------------------------------------------------------------------

    def create_chat(self, title: str, document_ids: Sequence[int] = ()) -> Chat:
        with self._db.write() as db:
            chat_id = _new_chat(db, title, document_ids, self._clock())
        return self.chat(chat_id)

    def chat(self, chat_id: int) -> Chat:
        return _chat(self._db.get(), chat_id)

    def chats(self) -> list[Chat]:
        """All chats, the most recently updated first."""
        rows = self._db.get()["chats"].rows_where(order_by="updated DESC, id DESC")
        # (NOT NULL columns read as null: the rows of nonsense a damaged page gives, which
        # SQLite's own WHERE does not always see)
        return [Chat(**row) for row in rows if row["title"] is not None
                and row["updated"] is not None]

    def message_counts(self) -> dict[int, int]:
        """{chat id: number of messages}, for chats with any: one query, no message loaded."""
        return _message_counts(self._db.get())

    def chats_holding(self, text: str) -> dict[int, str]:
        """The chats whose title or messages hold `text` (`messages.chats_holding`)."""
        return chats_holding(self._db.get(), text)

    def chat_document_ids(self) -> dict[int, list[int]]:
        """{chat id: document ids in the order attached}, for chats with documents."""
        return _chat_document_ids(self._db.get())

    def rename_chat(self, chat_id: int, title: str) -> Chat:
        with self._db.write() as db:
            update(db, "chats", chat_id, "chat", title=title, updated=self._clock())
        return self.chat(chat_id)

    def delete_chat(self, chat_id: int) -> None:
        """Delete a chat with its messages, document links and KV entries."""
        self._delete("chats", chat_id, "chat")

    def chat_turn(self, chat_id: int | None, *, cancel: threading.Event | None = None,
                  on_wait: Callable[[], None] | None = None) -> contextlib.AbstractContextManager:
        """Hold a chat's turn against other processes sharing this data directory
        (store.datadir.locks); a read-only store, where no turn can be stored, takes none, nor
        does a chat not created yet (None: no other process can know it)."""
        if self.read_only or chat_id is None:
            return contextlib.nullcontext()
        return self.locks.turn(chat_id, cancel=cancel, on_wait=on_wait)

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
        self,
        chat_id: int,
        role: str,
        text: str,
        stats: dict[str, Any] | None = None,
        *,
        tokens: Sequence[int] | None = None,
        model: str | None = None,
    ) -> Message:
        """Add a message; `tokens`, if given, are its exact tokens under the `model` fingerprint."""
        if (tokens is None) != (model is None):
            raise ValueError("a message's tokens need the model they belong to, and only them")
        with self._db.write() as db:
            message_id = add_message(db, chat_id, role, text, stats, self._clock())
            if tokens is not None:
                set_tokens(db, message_id, model, tokens)
        return self.message(message_id)

    def add_turn(self, chat_id: int, question: str, answer: str, *,
                 stats: dict[str, Any] | None = None, model: str,
                 question_tokens: Sequence[int], answer_tokens: Sequence[int],
                 replacing: Sequence[int] = ()) -> None:
        """A question and its answer, with their tokens under `model`, in one transaction:
        a chat never holds a question without its answer, whatever interrupts the write. The
        messages `replacing` names (a regenerated turn) go in the same transaction: until the
        new turn is stored, the old one stays. On a full disk the reserve pays for it
        (Connections.keeping_words)."""
        def work() -> None:
            with self._db.write() as db:
                for message_id in replacing:
                    delete(db, "messages", message_id, "message")
                add_turn(db, chat_id, (question, answer), stats, model,
                         (question_tokens, answer_tokens), self._clock())
        self._db.keeping_words(work)

    def start_chat(self, title: str, document_ids: Sequence[int], question: str, answer: str,
                   *, stats: dict[str, Any] | None = None, model: str,
                   question_tokens: Sequence[int], answer_tokens: Sequence[int],
                   deleted: Mapping[int, str] | None = None) -> Chat:
        """A new chat about `document_ids` with its first turn, in one transaction: a chat is
        stored with its first answer or not at all (a question refused, stopped or killed
        before it was answered leaves no empty chat behind). On a full disk the reserve
        pays for it, as for `add_turn`. `deleted`: {id: title} of documents its answer was
        given that were deleted meanwhile, kept as a deleted document's title is."""
        now = self._clock()

        def work() -> int:
            with self._db.write() as db:
                chat_id = _new_chat(db, title, document_ids, now)
                db.conn.executemany("INSERT OR REPLACE INTO deleted_documents VALUES (?, ?, ?)",
                                    [(chat_id, *d) for d in (deleted or {}).items()])
                add_turn(db, chat_id, (question, answer), stats, model,
                         (question_tokens, answer_tokens), now)
            return chat_id
        return self.chat(self._db.keeping_words(work))

    def set_message_tokens(self, message_id: int, model: str, tokens: Sequence[int]) -> None:
        """Record a message's exact tokens under a model (e.g. after tokenizing its text again)."""
        with self._db.write() as db:
            set_tokens(db, message_id, model, tokens)

    def message_tokens(self, chat_id: int, model: str) -> dict[int, list[int]]:
        """{message id: tokens} of a chat's messages whose tokens under `model` are known."""
        return tokens_of_chat(self._db.get(), chat_id, model)

    def update_message(
        self, message_id: int, *, text: str | None = None, stats: dict[str, Any] | None = None
    ) -> Message:
        """Replace a message's text and/or stats (e.g. as an answer streams in)."""
        changes: dict[str, Any] = {"updated": self._clock()}
        if text is not None:
            changes["text"] = text
        if stats is not None:
            changes["stats"] = json.dumps(stats)
        with self._db.write() as db:
            update(db, "messages", message_id, "message", **changes)
        return self.message(message_id)

    def message(self, message_id: int) -> Message:
        return get_message(self._db.get(), message_id)

    def messages(self, chat_id: int) -> list[Message]:
        db = self._db.get()
        return [message_from_row(db, row) for row in db["messages"].rows_where(
            "chat_id = ?", [chat_id], order_by="id")]

