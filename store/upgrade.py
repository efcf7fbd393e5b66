"""Bringing a store's database to this kvdesk's schema (store.schema's migrations), or refusing it.

Each migration runs in one IMMEDIATE transaction together with its row in `migrations` and the
new PRAGMA user_version, so a database is always exactly at a named version, and two processes
opening a fresh store at once apply each migration once. A history of ours with gaps is
completed only where the migrations missing are declared safe to apply late
(schema.APPLIED_LATE). A database at a version or history this code does not know is refused
untouched, never "repaired".
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ReadOnlyError, SchemaVersionError
from .schema import APPLIED_LATE, MIGRATIONS, SCHEMA_VERSION, Migration, schema_version

KNOWN = [name for name, _ in MIGRATIONS]
NOTES = "upgrade_notes"  # the settings row keeping what an upgrade dropped until it is said


@dataclass
class Upgrade:
    """What `migrate` did: the migrations applied, and what they dropped that users had (a
    sentence each, for the user: said once, as the store opens)."""

    applied: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> Upgrade:
    """Bring the database up to `target` (default: the latest)."""
    upgrade = Upgrade()
    # Off while migrating (it can only change outside a transaction): rebuilding a table
    # would otherwise cascade its DROP to every row referring to it. Each migration ends
    # with a full foreign key check instead.
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        while True:
            conn.execute("BEGIN IMMEDIATE")
            try:
                version, missing = _check_known(conn)
                if missing:
                    _apply_late(conn, missing, upgrade)
                elif version >= target:
                    conn.execute("COMMIT")
                    return upgrade
                else:
                    conn.execute("CREATE TABLE IF NOT EXISTS migrations"
                                 " (name TEXT PRIMARY KEY, applied REAL)")
                    _apply(conn, *MIGRATIONS[version], upgrade)
                    conn.execute("INSERT INTO migrations VALUES (?, ?)",
                                 (KNOWN[version], time.time()))
                    conn.execute(f"PRAGMA user_version = {version + 1}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
    finally:
        conn.execute("PRAGMA foreign_keys = ON")


def _apply(conn: sqlite3.Connection, name: str, apply: Migration, upgrade: Upgrade) -> None:
    dropped = apply(conn)
    broken = conn.execute("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise SchemaVersionError(f"migration {name} broke foreign keys: {broken[:3]}")
    upgrade.applied.append(name)
    if dropped:
        upgrade.dropped.append(dropped)
        # In the migration's own transaction: an upgrade that stops after it (a later
        # migration failing, a crash, Ctrl-C) leaves its note for the next open to say.
        row = conn.execute("SELECT value FROM settings WHERE key = ?", (NOTES,)).fetchone()
        conn.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)",
                     (NOTES, json.dumps(_notes(row) + [dropped])))


def migrate_taking_notes(conn: sqlite3.Connection) -> list[str]:
    """`migrate`, then what this upgrade, or one stopped before it finished, dropped that
    users had (a sentence each): taken from the store, so said once."""
    migrate(conn)
    if conn.execute("SELECT 1 FROM settings WHERE key = ?", (NOTES,)).fetchone() is None:
        return []  # (every open but an upgrade's: no write)
    conn.execute("BEGIN IMMEDIATE")  # (another process opening it too takes them, or this one)
    try:
        row = conn.execute("SELECT value FROM settings WHERE key = ?", (NOTES,)).fetchone()
        conn.execute("DELETE FROM settings WHERE key = ?", (NOTES,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return _notes(row)


def _notes(row: tuple[str] | None) -> list[str]:
    try:
        notes = json.loads(row[0]) if row else []
    except ValueError:
        return []  # (a value rotten in the file: `verify` names it)
    return [n for n in notes if isinstance(n, str)] if isinstance(notes, list) else []


def _apply_late(conn: sqlite3.Connection, missing: list[str], upgrade: Upgrade) -> None:
    """Apply the migrations missing from a history of ours, then record the history in our
    order (their rows dated now), so that from here on it is ours."""
    for name in missing:
        _apply(conn, name, MIGRATIONS[KNOWN.index(name)][1], upgrade)
    applied = dict(conn.execute("SELECT name, applied FROM migrations").fetchall())
    names = KNOWN[:len(applied) + len(missing)]
    conn.execute("DELETE FROM migrations")
    conn.executemany("INSERT INTO migrations VALUES (?, ?)",
                     [(name, applied.get(name, time.time())) for name in names])
    conn.execute(f"PRAGMA user_version = {len(names)}")


def _check_known(conn: sqlite3.Connection) -> tuple[int, list[str]]:
    """The database's version, after checking its migration history is a prefix of ours; and
    the migrations to apply late where it is one with gaps that may be (`_gaps`)."""
    version = schema_version(conn)
    has_history = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'"
    ).fetchone()
    history = (
        [row[0] for row in conn.execute("SELECT name FROM migrations ORDER BY rowid")]
        if has_history
        else []
    )
    if version and not history:  # every kvdesk records each step it applies
        raise SchemaVersionError(_not_ours(conn))
    if version > len(KNOWN):
        raise SchemaVersionError(
            f"store schema version {version} is newer than this kvdesk understands "
            f"(up to {len(KNOWN)}); upgrade kvdesk or use another data directory"
        )
    if history != KNOWN[:version]:
        missing = _gaps(history, version)
        if missing is None:
            raise SchemaVersionError(_foreign(conn, history))
        return version, missing
    if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise SchemaVersionError("the database is not an empty file nor a kvdesk store")
    return version, []


def _gaps(history: list[str], version: int) -> list[str] | None:
    """The migrations missing from `history`, if it is ours with gaps (every name known, in
    our order, the version its length) and each one missing may be applied late; else None."""
    if version != len(history) or not set(history) <= set(KNOWN):
        return None
    positions = [KNOWN.index(name) for name in history]
    if positions != sorted(set(positions)):
        return None
    missing = [name for name in KNOWN[:positions[-1]] if name not in history]
    return missing if set(missing) <= APPLIED_LATE else None


def _path(conn: sqlite3.Connection) -> str:
    return next((file for _, name, file in conn.execute("PRAGMA database_list")
                 if name == "main"), "") or "this data directory's store"


def _not_ours(conn: sqlite3.Connection) -> str:
    """A database with a schema version but no history of steps: another program's."""
    return (f"{_path(conn)} is not a kvdesk store (another program's database: it has a schema "
            "version but no kvdesk history). Nothing in it was changed. Move it out of the data "
            "directory, or choose another data directory for kvdesk")


def _foreign(conn: sqlite3.Connection, history: list[str]) -> str:
    """Why a history is not one this kvdesk can continue, in plain words, and what to do."""
    path = _path(conn)
    unknown = [name for name in history if name not in KNOWN]
    why = (f"its schema has steps this kvdesk does not know ({', '.join(unknown)})" if unknown
           else "its schema's steps are this kvdesk's, but in another order, or with some "
           "missing that cannot be added after the later ones")
    return (f"{path} was written by a kvdesk build this one cannot read: {why}. Nothing in it "
            "was changed. Open it with the kvdesk that last used it (`kvdesk export` there saves "
            "a chat as a file), or choose another data directory")


def check_current(conn: sqlite3.Connection, data_dir: Path) -> None:
    """A read-only store is read as it is: only at this version's schema."""
    if schema_version(conn) != SCHEMA_VERSION:
        raise ReadOnlyError(f"the data directory {data_dir} is read-only and its store needs an "
                            "upgrade: open it once where it can be written")
