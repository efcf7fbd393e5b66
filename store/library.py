"""Documents, chats and messages: the rows a user sees, and the tokens of each message.

Functions over a sqlite-utils Database inside the Store's transactions (`Store` wraps them).
A message's text is the truth; its exact tokens are kept per model fingerprint beside it, so a
chat continued under another model is tokenized again from its text, never fed another
model's ids. Listings aggregate in SQL (message counts, document ids per chat), so listing
chats never loads their messages.

This module never touches KV entries or chunks beyond the cascades the schema declares.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlite_utils

from .errors import NotFoundError
from .records import Chat, Document, Message
from .tokens import decode, encode


def get(table: sqlite_utils.db.Table, key: Any, what: str) -> dict:
    try:
        return table.get(key)
    except sqlite_utils.db.NotFoundError:
        raise NotFoundError(f"no {what} {key!r}") from None


def update(db: sqlite_utils.Database, table: str, row_id: int, what: str, **changes) -> None:
    get(db[table], row_id, what)
    db[table].update(row_id, changes)


def delete(db: sqlite_utils.Database, table: str, row_id: int, what: str) -> None:
    # Foreign keys cascade: documents/chats -> their KV entries -> entries extending those
    # -> spans -> chunks; chats -> messages -> their tokens; either -> chat_documents.
    if not db.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,)).rowcount:
        raise NotFoundError(f"no {what} {row_id}")


# -- documents ----------------------------------------------------------------------------------


def add_document(db: sqlite_utils.Database, record: dict) -> int:
    """The id of the document with record's content hash: the stored one, or `record` added."""
    existing = db.execute(
        "SELECT id FROM documents WHERE content_hash = ?", (record["content_hash"],)
    ).fetchone()
    return existing[0] if existing is not None else db["documents"].insert(record).last_pk


def document(db: sqlite_utils.Database, document_id: int) -> Document:
    return Document(**get(db["documents"], document_id, "document"))


def set_document_tokens(db: sqlite_utils.Database, document_id: int, model: str, tokens: int,
                        kept: int) -> None:
    get(db["documents"], document_id, "document")
    db.execute("INSERT OR REPLACE INTO document_tokens VALUES (?, ?, ?, ?)",
               (document_id, model, tokens, kept))


def document_tokens(db: sqlite_utils.Database, model: str) -> dict[int, tuple[int, int]]:
    """{document id: (its tokens, how many fit its context)} under `model`."""
    rows = db.execute("SELECT document_id, tokens, kept_tokens FROM document_tokens"
                      " WHERE model = ?", (model,))
    return {doc: (tokens, kept) for doc, tokens, kept in rows}


# -- chats --------------------------------------------------------------------------------------


def link(db: sqlite_utils.Database, chat_id: int, document_id: int) -> None:
    get(db["documents"], document_id, "document")
    (position,) = db.execute(
        "SELECT count(*) FROM chat_documents WHERE chat_id = ?", (chat_id,)
    ).fetchone()
    db.execute(
        "INSERT OR IGNORE INTO chat_documents VALUES (?, ?, ?)", (chat_id, document_id, position)
    )


def chat(db: sqlite_utils.Database, chat_id: int) -> Chat:
    return Chat(**get(db["chats"], chat_id, "chat"))


def message_counts(db: sqlite_utils.Database) -> dict[int, int]:
    """{chat id: number of messages} of every chat that has any."""
    return dict(db.execute("SELECT chat_id, count(*) FROM messages GROUP BY chat_id").fetchall())


def chat_document_ids(db: sqlite_utils.Database) -> dict[int, list[int]]:
    """{chat id: its documents' ids in the order attached} of every chat that has any."""
    out: dict[int, list[int]] = {}
    for chat_id, document_id in db.execute(
        "SELECT chat_id, document_id FROM chat_documents ORDER BY chat_id, position"
    ):
        out.setdefault(chat_id, []).append(document_id)
    return out


# -- messages -----------------------------------------------------------------------------------


def add_message(db: sqlite_utils.Database, chat_id: int, role: str, text: str,
                stats: dict[str, Any] | None, now: float) -> int:
    get(db["chats"], chat_id, "chat")
    record = {"chat_id": chat_id, "role": role, "text": text, "stats": _json(stats),
              "created": now, "updated": now}
    message_id = db["messages"].insert(record).last_pk
    update(db, "chats", chat_id, "chat", updated=now)
    return message_id


def set_tokens(db: sqlite_utils.Database, message_id: int, model: str,
               tokens: Sequence[int]) -> None:
    get(db["messages"], message_id, "message")
    get(db["models"], model, "model")
    db.execute("INSERT OR REPLACE INTO message_tokens VALUES (?, ?, ?)",
               (message_id, model, encode(tokens)))


def tokens_of_chat(db: sqlite_utils.Database, chat_id: int, model: str) -> dict[int, list[int]]:
    """{message id: tokens} of a chat's messages whose tokens under `model` are known."""
    rows = db.execute(
        "SELECT t.message_id, t.tokens FROM message_tokens t JOIN messages m"
        " ON m.id = t.message_id WHERE m.chat_id = ? AND t.model = ?",
        (chat_id, model),
    )
    return {message_id: decode(data) for message_id, data in rows}


def message(db: sqlite_utils.Database, message_id: int) -> Message:
    return message_from_row(get(db["messages"], message_id, "message"))


def message_from_row(row: dict) -> Message:
    return Message(**{**row, "stats": None if row["stats"] is None else json.loads(row["stats"])})


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
