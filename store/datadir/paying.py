"""The writes the reserves pay for on a full disk (store.datadir.reserve): freeing space (`rm`,
`gc`, a stopped write's deletion) through the main reserve, a turn's text through its own
small one, and freed pages handed back to the file system (`reclaim`).

A mixin of `Connections` (store.datadir.db). It must never let a turn's text spend the main
reserve, nor a cache (megabytes, computed again when asked for) spend either.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import sqlite_utils

from ..errors import DiskFullError
from .reserve import Reserve, WordsReserve

T = TypeVar("T")

# Pages moved at once, at least, by a reclaim on a nearly full disk (4 KiB pages: 1 MiB)
MIN_VACUUM_STEP = 256
INCREMENTAL = 2  # PRAGMA auto_vacuum's value


class Paying:
    """`freeing`, `keeping_words` and `reclaim` for a `Connections`."""

    path: Path
    reserve: Reserve
    words: WordsReserve

    def get(self) -> sqlite_utils.Database:
        raise NotImplementedError

    def retake(self) -> None:
        """Take the reserves again as far as the disk has room: freeing space's first."""
        self.reserve.make()
        self.words.make()

    def freeing(self, work: Callable[[], T]) -> T:
        """Run `work`, a deletion, then hand back what it freed (`reclaim`). On a full disk
        the reserve (store.datadir.reserve) is given back first and `work` runs once more."""
        try:
            done = work()
        except DiskFullError:
            if not self.reserve.release():
                raise
            try:
                done = work()
            except BaseException:
                self.reserve.make()  # (nothing else may write into its room)
                raise
        self.reclaim()  # (which takes the reserves again)
        return done

    def keeping_words(self, work: Callable[[], T]) -> T:
        """Run `work`, the write of a turn's text (a question and its answer: a few pages);
        on a full disk again with a slice of the words' reserve given back, a slice more a
        try while there is one. What the log grew by is handed back, then what was not used
        taken back. The main reserve is never touched: `rm` and `gc` keep it whatever the
        turns. Never for a cache."""
        met_full = False
        try:
            try:
                return work()
            except DiskFullError as e:
                full, met_full = e, True
            while self.words.give():
                try:
                    return work()
                except DiskFullError as e:
                    full = e
            raise full
        finally:
            if met_full:
                with contextlib.suppress(DiskFullError):  # (what it cannot, a later one does)
                    self.get().conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self.reserve.grow()  # (both made again once the disk has room)
            self.words.make()

    def reclaim(self) -> None:
        """Hand freed pages back to the file system (the database uses incremental
        auto-vacuum), and take the reserves again where they were given. Moving the file's
        last pages into the free ones writes them to the log first: on a disk without room
        for all of them it goes a step at a time, the log emptied between steps, and on a
        disk without room for a step the pages stay free inside the file for the next
        writes."""
        conn = self.get().conn
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != INCREMENTAL:
            return  # (a file rebuilt by hand, say: its free pages stay inside it)
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        before = None
        while (pages := conn.execute("PRAGMA freelist_count").fetchone()[0]) not in (0, before):
            before = pages  # (a step that freed nothing ends it)
            step = self._vacuum_step(pages, page)
            # Moving pages frees room: the reserve pays for it (taken back below)
            if step < min(pages, MIN_VACUUM_STEP) and self.reserve.release():
                step = self._vacuum_step(pages, page)
            if step < min(pages, MIN_VACUUM_STEP):
                break
            try:
                # executescript() steps the pragma to the end; execute() frees a single page
                conn.executescript(f"PRAGMA incremental_vacuum({step})")
                # (where room is short, the log's room too goes back before the reserve
                # takes back its own)
                if step < pages or self.reserve.owed:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except DiskFullError:  # others write to that disk too
                break
        self.retake()

    def _vacuum_step(self, pages: int, page: int) -> int:
        """How many of `pages` free pages one step hands back, by the room on the disk:
        all where it holds them twice, else a quarter of the room (the log takes them)."""
        try:
            room = shutil.disk_usage(self.path.parent).free // page
        except OSError:
            return 0
        return pages if room > 2 * pages else room // 4
