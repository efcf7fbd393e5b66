"""Codec calibrations: immutable, content-addressed blobs keyed by the model they were made for.

A calibration is opaque bytes here (the codec's), named by their SHA-256, which every read
checks. A model may have several over time (a re-calibration, or one pulled from the shared
tier); `latest` is the newest made for a model. KV entries name the calibration their chunks
need (kv_entries.calibration), so none is deleted while an entry names it. This module must
never interpret the bytes, and never return bytes that fail their hash.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3

from ..datadir.values import stored_json
from ..errors import NotFoundError, StoreError
from ..records import CalibrationRecord

_COLUMNS = "id, model, length(data), meta, created"


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def put(conn: sqlite3.Connection, model: str, data: bytes, meta: dict, now: float) -> str:
    """Store a calibration (a no-op if stored already, except that the bytes of a damaged copy
    are replaced: they are named by their hash, so nothing else can take their place)."""
    cal_id = digest(data)
    conn.execute("INSERT INTO calibrations VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE"
                 " SET data = excluded.data WHERE data IS NOT excluded.data",
                 (cal_id, model, bytes(data), json.dumps(meta), now))
    return cal_id


def read(conn: sqlite3.Connection, cal_id: str) -> bytes:
    row = conn.execute("SELECT data FROM calibrations WHERE id = ?", (cal_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no codec calibration {cal_id[:12]}")
    if digest(row[0]) != cal_id:
        raise StoreError(f"stored codec calibration {cal_id[:12]} is corrupt (SHA-256 mismatch)")
    return row[0]


def intact(conn: sqlite3.Connection, cal_id: str) -> bool:
    """Whether a calibration is stored and its bytes still hash to its id."""
    row = conn.execute("SELECT data FROM calibrations WHERE id = ?", (cal_id,)).fetchone()
    return row is not None and digest(row[0]) == cal_id


def records(conn: sqlite3.Connection, model: str | None = None) -> list[CalibrationRecord]:
    """Calibrations (of one model), the newest first."""
    where, args = ("WHERE model = ?", (model,)) if model is not None else ("", ())
    rows = conn.execute(f"SELECT {_COLUMNS} FROM calibrations {where}"
                        " ORDER BY created DESC, rowid DESC", args).fetchall()
    return [CalibrationRecord(i, m, n, stored_json(conn, meta, f"the meta of calibration {i}"),
                              c) for i, m, n, meta, c in rows]


def delete(conn: sqlite3.Connection, cal_id: str) -> None:
    """Remove a calibration no KV entry needs (StoreError if one does)."""
    (users,) = conn.execute("SELECT count(*) FROM kv_entries WHERE calibration = ?",
                            (cal_id,)).fetchone()
    if users:
        raise StoreError(f"calibration {cal_id[:12]} is needed by {users} KV entries")
    if not conn.execute("DELETE FROM calibrations WHERE id = ?", (cal_id,)).rowcount:
        raise NotFoundError(f"no codec calibration {cal_id[:12]}")
