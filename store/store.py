"""Store: the one entry point to kvdesk's persistent state in a data directory.

Documents, chats, messages, settings and the KV caches of models, in one SQLite database
(kvdesk.sqlite) driven through sqlite-utils. The engine and the CLI wrap this class thinly. It is
safe to share one Store between the GUI thread and workers (each thread gets its own connection),
and to open the same data directory from several processes. It knows nothing of llama.cpp, Qt or
the codec: KV chunks are opaque bytes at named levels.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .caches import blobs, calibrations, integrity, kv, quota, writers
from .caches.budget import BudgetStore
from .caches.deleting import DeletingStore
from .caches.splitting import SplitStore
from .caches.usage import UsageStore
from .datadir import wal
from .datadir.db import Connections, prepare_data_dir, quick_check
from .datadir.locks import ChatLocks
from .datadir.values import malformed_json, stored_json
from .documents import library
from .documents.library import LibraryStore
from .documents.passagekv import PassageKVStore
from .documents.passages import PassageStore
from .errors import (
    CorruptChunkError,
    DamagedError,
    DataDirError,
    DiskFullError,
    NotFoundError,
)
from .records import CalibrationRecord, Entry, PrefixMatch, Span
from .schema import schema_version
from .tokens import decode
from .upgrade import check_current, migrate_taking_notes

DB_NAME = "kvdesk.sqlite"
DEFAULT_CHUNK_SIZE = 256
# Where the file holds JSON: (table, key column, JSON column), checked by `verify`
JSON_COLUMNS = (("kv_entries", "id", "levels"), ("settings", "key", "value"),
                ("messages", "id", "stats"), ("models", "fingerprint", "layout"),
                ("calibrations", "id", "meta"), ("passages", "id", "heading"))


class Store(LibraryStore, PassageStore, PassageKVStore, SplitStore, UsageStore, BudgetStore,
            DeletingStore):
    """Persistent state of one data directory. Close it (or use `with`) when done.

    `LibraryStore`, `PassageStore`, `PassageKVStore` (store.documents): documents, chats,
    messages, passages, their KV; `SplitStore`, `UsageStore`, `BudgetStore`, `DeletingStore`
    (store.caches): caches split, their bytes, their budget, deletion; the rest: here.
    """

    def __init__(self, data_dir: str | Path, *, clock: Callable[[], float] = time.time):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_NAME
        self._clock = clock
        # (os.path's: False for a name too long, where Path's raises)
        folder_made, new = not os.path.exists(self.data_dir), not os.path.exists(self.path)
        self._db = Connections(self.path, read_only=prepare_data_dir(self.data_dir, self.path))
        self.locks = ChatLocks(self.data_dir / "locks")  # turns, attaches, calibrations
        self._unrecorded: dict[str, tuple[str, dict]] = {}
        # What this open's upgrade dropped that users had: a sentence each, for the app to say
        self.upgrade_notes: list[str] = []
        try:
            self._db.opened(lambda conn: check_current(conn, self.data_dir) if self.read_only
                            else self.upgrade_notes.extend(migrate_taking_notes(conn)))
        except (sqlite3.DatabaseError, DamagedError) as e:
            self._db.close()
            # Not a database, a damaged one, or one the file system will not let SQLite open;
            # any other error (a bad statement) is a bug and keeps its traceback.
            if isinstance(e, sqlite3.OperationalError) and not any(
                    why in str(e) for why in ("unable to open", "readonly", "disk I/O")):
                raise
            if "disk I/O" in str(e) and wal.wal_unsupported(self.path):
                if new:  # (nothing of it is the user's: no stray files on their drive)
                    # (the failed statement, held by the frames of its traceback, keeps the
                    # files open: on a FUSE file system they could not be removed)
                    e.__traceback__ = None
                    wal.remove_new(self.path, folder_made=folder_made)
                raise wal.wal_error(self.path) from e
            why = e.__cause__ if isinstance(e, DamagedError) else e
            hint = (". Restore it from a backup, or move it aside: kvdesk then starts an empty "
                    "store, without the chats and document list it held (caches are computed "
                    "again)" if not isinstance(why, sqlite3.OperationalError) else "")
            raise DataDirError(f"{self.path} cannot be opened as a kvdesk store ({why}){hint}"
                               ) from e
        except BaseException:
            self._db.close()
            raise

    @property
    def read_only(self) -> bool:
        """True for a data directory this process cannot write, or a damaged database file
        (`damage`): reads work, writes raise."""
        return self._db.read_only

    @property
    def damage(self) -> str | None:
        """What SQLite found damaged in the file (when opened, or by a later read), or None."""
        return self._db.damage

    def check_writable(self) -> None:
        """Refuse work whose result could not be stored, before it is done: DamagedError,
        DiskFullError or ReadOnlyError, as a write would raise."""
        self._db.check_writable()

    def on_damage(self, call: Callable[[DamagedError], None]) -> None:
        """Have `call` told, once, of damage a read finds from now on (with its error)."""
        self._db.on_damage = call

    def damage_error(self) -> DamagedError:
        """What a damaged file means for the user, and what to do (`damage` set)."""
        return self._db.damaged_error()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return schema_version(self._db.get().conn)

    # -- settings ------------------------------------------------------------------------------

    def setting(self, key: str, default: Any = None) -> Any:
        conn = self._db.get().conn
        row = conn.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return default if row is None else stored_json(conn, row[0], f"the setting {key!r}")

    def set_setting(self, key: str, value: Any) -> None:
        with self._db.write() as db:
            db["settings"].upsert({"key": key, "value": json.dumps(value)}, pk="key")

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
        window_start: int | None = None,
        calibration: str | None = None,
        passage: bool = False,
        passage_hash: str | None = None,
        evict: bool = True,
        holds: Iterable[int] = (),
        keep: Iterable[int] = (),
    ) -> writers.EntryWriter:
        """Start writing the KV entry for `tokens` (the whole prefix, parent's tokens included).

        The entry covers tokens [parent.token_end, len(tokens)), cut into chunks of chunk_size;
        `writer.spans` says which. With `window_start`, it also has a window of the positions
        [window_start, len(tokens)), cut the same way (`writer.windows`). Put every chunk and
        window part at every level, then leave the `with` block (or call finish()). Deleting
        its document or chat deletes the entry. `calibration`: the id of the stored codec
        calibration its chunks need (put_calibration), if any. `passage`: the KV of a passage
        of `document_id` (never taken for the document's own entry), whose text has the
        `passage_hash` (`text_hash`: what its document's count finds it by). `holds`: the
        documents whose KV it holds beyond its parent's, deleted with any of them (NotFoundError
        when one is deleted already: kv.create_pending). A finished entry that takes the store
        past its storage budget evicts the least recently used others (one larger than the
        budget with its parents goes alone, `writer.evicted` says "too_large"), never those
        `keep` (it goes alone where they leave it no room); with `evict=False` it is removed
        itself instead (`finish` raises BudgetFullError), and kept as least recently used:
        work done ahead of need never pushes out what was used (store.caches.quota).
        """
        levels = tuple(levels)
        self.record_models()  # one a full disk kept from being recorded (DiskFullError)
        with self._db.write() as db:
            entry_id = kv.create_pending(
                db.conn, fingerprint=fingerprint, tokens=tokens, parent_id=parent_id,
                chunk_size=chunk_size, levels=levels, document_id=document_id,
                chat_id=chat_id, now=self._clock(), window_start=window_start,
                calibration=calibration, passage=passage, passage_hash=passage_hash,
                holds=holds)
        return writers.EntryWriter(self._db, entry_id, levels, self._clock,
                              (lambda entry: self._enforce_budget(entry, keep)) if evict else
                              lambda entry: quota.fits(self._db, self.budget_bytes, entry,
                                                       entry_id))

    def longest_prefix(
        self, fingerprint: str, tokens: Iterable[int], *, touch: bool = True,
        tail_minimum: int | None = None,
    ) -> PrefixMatch:
        """The stored chain covering the longest prefix of `tokens`; marks its entries used.

        With `tail_minimum`, also the chunk that continues the match for at least that many
        more tokens, if one does (PrefixMatch.tail): a restore reads it and cuts it back.
        """
        tokens = list(tokens)
        with self._db.read() as db:
            match = kv.longest_prefix(db.conn, fingerprint, tokens)
            if tail_minimum is not None:
                match = kv.with_tail(db.conn, fingerprint, tokens, match, tail_minimum)
        if touch and match.entries:
            self.touch(entry.id for entry in match.entries)
        return match

    def document_entry(self, document_id: int, fingerprint: str) -> Entry | None:
        """The root KV entry of a document under a model, if stored; marks it used."""
        row = (
            self._db.get()
            .execute(
                "SELECT id FROM kv_entries WHERE document_id = ? AND model = ? AND complete"
                " AND parent_id IS NULL AND NOT passage ORDER BY last_used DESC LIMIT 1",
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
        conn = self._db.get().conn
        rows = conn.execute(
            f"SELECT {kv.ENTRY_COLUMNS} FROM kv_entries WHERE complete ORDER BY last_used, id")
        return [kv.entry_from_row(conn, row) for row in rows]

    def spans(self, entry_id: int) -> tuple[Span, ...]:
        """An entry's chunks: which tokens each covers."""
        with self._db.read() as db:
            return kv.entry_spans(db.conn, entry_id)

    def windows(self, entry_ids: Iterable[int]) -> dict[int, tuple[Span, ...]]:
        """{entry id: the parts of its window}, for those of the entries that have one."""
        with self._db.read() as db:
            found = {i: kv.entry_spans(db.conn, i, window=True) for i in set(entry_ids)}
        return {i: parts for i, parts in found.items() if parts}

    def tokens(self, entry_id: int) -> list[int]:
        """The whole token prefix an entry caches: its ancestors' tokens, then its own."""
        with self._db.read() as db:
            return decode(kv.prefix_tokens(db.conn, entry_id))

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
                f" WHERE entry_id IN ({marks}) AND NOT quarantined",
                ids,
            ).fetchall()
        return {(e, c, lvl): n for e, c, lvl, n in rows}

    def level_bytes(self, spans: Iterable[Span]) -> dict[str, int]:
        """{level: bytes} of these chunks in all (e.g. a prefix match's): sizes, not data."""
        with self._db.read() as db:
            return kv.level_bytes(db.conn, [(s.entry_id, s.chunk_index) for s in spans])

    def entry_level_bytes(self, entry_ids: Iterable[int]) -> dict[int, dict[str, int]]:
        """{entry id: {level: bytes}} of whole entries."""
        with self._db.read() as db:
            return kv.entry_level_bytes(db.conn, list(entry_ids))

    def read_chunk(self, entry_id: int, chunk_index: int, level: str) -> bytes:
        """One chunk's bytes, checked; reads nothing else. A chunk that fails its check is
        quarantined (never read again) and CorruptChunkError raised."""
        try:
            with self._db.read() as db:
                return blobs.read(db.conn, entry_id, chunk_index, level)
        except CorruptChunkError:
            integrity.quarantine(self._db, entry_id, chunk_index, level)
            raise

    def repair_chunk(self, entry_id: int, chunk_index: int, level: str, data: bytes) -> None:
        """Replace a chunk's bytes, or put back one whose row is gone, e.g. recomputed after a
        CorruptChunkError or a `verify` that found it missing (its quarantine ends)."""
        with self._db.write() as db:
            entry = kv.get_entry(db.conn, entry_id)
            if level not in entry.levels or not db.execute(
                "SELECT 1 FROM kv_spans WHERE entry_id = ? AND chunk_index = ?",
                (entry_id, chunk_index),
            ).fetchone():
                raise NotFoundError(f"no chunk {chunk_index} at level {level!r} in {entry_id}")
            blobs.put(db.conn, entry_id, chunk_index, level, data)
            blobs.recount(db.conn, entry_id)

    def replace_levels(self, entry_id: int, levels: Sequence[str],
                       chunks: dict[tuple[int, str], bytes], cal_id: str | None) -> None:
        """An entry encoded again at `levels` (`chunks`: {(chunk index, level): bytes}, every
        chunk at each), with calibration `cal_id`: put in place of its chunks at once."""
        integrity.replace_levels(self._db, entry_id, levels, chunks, cal_id)

    def set_entry_calibration(self, entry_id: int, cal_id: str | None) -> None:
        """Record that an entry's chunks are now all encoded with calibration `cal_id` (None:
        the model-independent levels), once every one of them has been encoded again."""
        with self._db.write() as db:
            kv.get_entry(db.conn, entry_id)
            if cal_id is not None:
                calibrations.read(db.conn, cal_id)  # stored and sound, or NotFoundError
            db.execute("UPDATE kv_entries SET calibration = ? WHERE id = ?", (cal_id, entry_id))

    def touch(self, entry_ids: Iterable[int]) -> None:
        """Mark entries used now (the LRU order eviction follows); not in a read-only store,
        nor on a full disk (reading goes on)."""
        if self.read_only:
            return
        with contextlib.suppress(DiskFullError), self._db.write() as db:
            kv.touch(db.conn, entry_ids, self._clock())

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

    def verify(self) -> dict:
        """Check the database file (SQLite's quick_check, then that its JSON values decode),
        then every chunk of every complete entry; quarantine what fails
        (store.caches.integrity), in a file that is not damaged.

        Returns {"database": [what SQLite found wrong], "entries": n, "chunks": n, "bytes": n,
        "corrupt": [{"entry": id, "chunk": i, "level": name, "new": bool}],
        "missing": [{"entry": id, "chunk": i, "level": name}],
        "calibrations": [{"id", "model", "state": "ok" | "damaged" | "missing", "entries"}],
        "abandoned": [{"entry": id, "bytes": n}] (writes a process gone left: `gc` removes them)}.
        """
        found = quick_check(self._db.get().conn)
        found = found or malformed_json(self._db.get().conn, JSON_COLUMNS)
        if found:
            self._db.found_damage(found[0])
        try:
            chunks = integrity.verify(self._db)
        except DamagedError:  # too damaged to list its chunks
            chunks = {"entries": 0, "chunks": 0, "bytes": 0, "corrupt": [], "missing": [],
                      "calibrations": []}
        # (a damaged file's rows are not to be trusted: its writes wait for it to be fixed)
        left = [] if found or self.damage else quota.abandoned_writes(self._db.get().conn,
                                                                      self._clock())
        return {"database": found or ([self.damage] if self.damage else []), **chunks,
                "abandoned": [{"entry": i, "bytes": n} for i, n in left]}

    def quarantined(self, entry_ids: Iterable[int] | None = None) -> list[tuple[int, int, str]]:
        """(entry, chunk, level) of every chunk set aside after a failed check (of those
        entries only, if given)."""
        return integrity.quarantined(self._db, entry_ids)

    def missing(self, entry_ids: Iterable[int] | None = None) -> list[tuple[int, int, str]]:
        """(entry, chunk, level) of every chunk a complete entry lists but no longer holds (of
        those entries only, if given)."""
        return integrity.missing(self._db, entry_ids)

    def restore_spans(self, entry_id: int) -> list[int]:
        """Put back the span rows of an entry's own chunks that are gone (their token ranges
        follow from the entry's), so its chunks can be stored again; their indexes."""
        return integrity.restore_spans(self._db, entry_id)

    def calibration_states(self) -> list[dict]:
        """[{"id", "model", "state": "ok" | "damaged" | "missing", "entries"}] of every codec
        calibration stored or needed by an entry."""
        return integrity.calibration_states(self._db)

    def unusable_calibrations(self) -> set[str]:
        """Ids of the codec calibrations entries need that are missing or damaged."""
        return integrity.unusable_calibrations(self._db)

    def damaged(self, entry_ids: Iterable[int]) -> dict[int, int]:
        """{entry id: chunks that cannot be read (quarantined, missing, or needing an unusable
        calibration)}, for the entries that have any."""
        return integrity.damaged(self._db, entry_ids)

    def drop_level(self, entry_id: int, level: str) -> list[int]:
        """Remove an entry's chunks at a level that cannot be repaired (an entry left with no
        level goes, with the entries extending it); returns the ids of the entries deleted."""
        return self._db.freeing(lambda: integrity.drop_level(self._db, entry_id, level))

    # -- internals -----------------------------------------------------------------------------

    def _delete(self, table: str, row_id: int, what: str) -> None:
        def work() -> None:
            with self._db.write() as db:
                passages = library.delete(db, table, row_id, what)
            if passages:  # (its words merged out of the index, where there is room for it)
                with contextlib.suppress(DiskFullError), self._db.write() as db:
                    library.forget_words(db)
        self._db.freeing(work)
