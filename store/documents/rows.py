"""A row of the library's tables read or changed by its id, a missing one raised as
NotFoundError naming what it is (a "chat", a "message"), never as sqlite-utils' own error.

Functions over a sqlite-utils Database inside the Store's transactions; this module never
opens a transaction or knows what a table holds.
"""

from __future__ import annotations

from typing import Any

import sqlite_utils

from ..errors import NotFoundError


def get(table: sqlite_utils.db.Table, key: Any, what: str) -> dict:
    try:
        return table.get(key)
    except (sqlite_utils.db.NotFoundError, OverflowError):  # (no row id is past 64 bits)
        raise NotFoundError(f"no {what} {key!r}") from None


def update(db: sqlite_utils.Database, table: str, row_id: int, what: str, **changes) -> None:
    get(db[table], row_id, what)
    db[table].update(row_id, changes)
