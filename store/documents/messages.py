"""A chat's messages: added one at a time or a turn (a question and its answer) at once, and
their exact tokens under each model kept beside them (a message's text is the truth).

Functions over a sqlite-utils Database inside the Store's transactions (`LibraryStore`
wraps them); this module never opens a transaction, and never touches KV entries.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlite_utils

from ..datadir.values import stored_json
from ..records import Message
from ..tokens import decode, encode
from .rows import get, update


def add_message(db: sqlite_utils.Database, chat_id: int, role: str, text: str,
                stats: dict[str, Any] | None, now: float) -> int:
    get(db["chats"], chat_id, "chat")
    record = {"chat_id": chat_id, "role": role, "text": text, "stats": _json(stats),
              "created": now, "updated": now}
    message_id = db["messages"].insert(record).last_pk
    update(db, "chats", chat_id, "chat", updated=now)
    return message_id


def add_turn(db: sqlite_utils.Database, chat_id: int, texts: tuple[str, str],
              stats: dict[str, Any] | None, model: str,
              tokens: tuple[Sequence[int], Sequence[int]], now: float) -> None:
    """A question and its answer (which carries the turn's stats), with their tokens."""
    for role, text, turn_tokens, extra in zip(("user", "assistant"), texts, tokens,
                                              (None, stats), strict=True):
        message_id = add_message(db, chat_id, role, text, extra, now)
        set_tokens(db, message_id, model, turn_tokens)


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
    return {message_id: decode(data) for message_id, data in rows if len(data) % 4 == 0}


def chats_holding(db: sqlite_utils.Database, text: str, width: int = 90) -> dict[int, str]:
    """{chat id: a line of its latest message around `text`, or "" where only its title holds
    it}, in any case and any script (casefolded: "STRASSE" finds "Straße"); the chats whose
    message came latest first."""
    needle = " ".join(text.split()).casefold()
    found: dict[int, str] = {}
    # (its words looked for first: folding a message costs a tenth of spacing it as the
    # needle is, and 200,000 messages, all spaced, took seconds)
    words = needle.split()
    for chat_id, message in db.execute("SELECT chat_id, text FROM messages ORDER BY id DESC"):
        if chat_id in found or message is None:
            continue
        folded = message.casefold()
        if not all(w in folded for w in words):
            continue
        line = " ".join(message.split())
        folded = line.casefold()
        if (at := folded.find(needle)) >= 0:
            start = max(0, at - width // 3) if len(folded) == len(line) else 0
            found[chat_id] = ("…" if start else "") + line[start:start + width] + (
                "…" if start + width < len(line) else "")
    for chat_id, title in db.execute("SELECT id, title FROM chats"):
        if chat_id not in found and title is not None and needle in " ".join(
                title.split()).casefold():
            found[chat_id] = ""
    return found


def get_message(db: sqlite_utils.Database, message_id: int) -> Message:
    return message_from_row(db, get(db["messages"], message_id, "message"))


def message_from_row(db: sqlite_utils.Database, row: dict) -> Message:
    return Message(**{**row, "stats": None if row["stats"] is None else stored_json(
        db.conn, row["stats"], f"the stats of message {row['id']}", or_none=True)})


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
