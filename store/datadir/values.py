"""Stored JSON values read back: one that no longer decodes is damage of the database file.

A rotten byte inside a value's text (a list of levels, a setting, a message's stats) passes
SQLite's page checks (`db.quick_check`) and reads as a string; it is found where the value is
decoded (`stored_json`), or by `verify` (`malformed_json`), and marks the file damaged as a
rotten page does (`Connections.found_damage`): every command warns, writes nothing more there,
and reads what is intact. Which columns hold JSON is the schema's to say, not this module's.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from ..errors import DamagedError


def stored_json(conn: sqlite3.Connection, text: str | bytes, where: str, *,
                or_none: bool = False) -> Any:
    """The JSON value `text` read from the store's file at `where` ("the levels of KV entry
    3"); one that no longer decodes marks the file damaged: DamagedError, as a rotten page
    (or_none: None instead, for a value its row reads without, a message's stats)."""
    try:
        return json.loads(text)
    except (ValueError, TypeError) as e:  # (JSONDecodeError and UnicodeDecodeError among them)
        why = f"{where} is malformed JSON ({e})"
        owner = getattr(conn, "owner", None)  # (the `Connections` it came from)
        error = DamagedError(why) if owner is None else owner.found_damage(why)
        if or_none:
            return None
        raise error from e


def malformed_json(conn: sqlite3.Connection,
                   columns: Iterable[tuple[str, str, str]]) -> list[str]:
    """Where a stored JSON value no longer decodes, of `columns` ((table, key column, JSON
    column)); empty where none. Decoded as they are read (Python's decoder: SQLite's
    json_valid would refuse the NaN that json.dumps writes)."""
    found = []
    for table, key, column in columns:
        for row_key, text in conn.execute(
                f"SELECT {key}, {column} FROM {table} WHERE {column} IS NOT NULL"):
            try:
                json.loads(text)
            except (ValueError, TypeError) as e:
                found.append(f"table {table}: the {column} of {row_key!r} is malformed JSON "
                             f"({e})")
    return found
