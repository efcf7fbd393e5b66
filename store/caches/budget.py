"""The storage budget of a data directory's KV caches: its setting, what the caches take, and
evicting least-recently-used ones to fit it (`gc`, and after each cache stored).

`BudgetStore`, a mixin of `store.Store`: the work is `quota`'s; this says it to the Store's
callers, with progress and a way to stop between evictions. It never reads chunks' bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..datadir.db import Connections
from ..datadir.filesize import BUDGET_SHARE, file_limit
from ..records import Entry
from . import quota


class BudgetStore:
    _db: Connections
    _clock: Callable[[], float]
    setting: Callable[..., Any]
    set_setting: Callable[[str, Any], None]

    @property
    def budget_bytes(self) -> int:
        """The disk budget for KV caches (setting "store.budget_bytes", default 10 GB), kept
        within the largest file the data directory's file system takes (`budget_cap`)."""
        setting, cap = self.budget_setting, self.budget_cap()
        return setting if cap is None else min(setting, cap[0])

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self.set_setting(quota.BUDGET_SETTING, int(value))

    @property
    def budget_setting(self) -> int:
        """The budget as set, before any cap (`budget_bytes`)."""
        return self.setting(quota.BUDGET_SETTING, quota.DEFAULT_BUDGET_BYTES)

    def budget_cap(self) -> tuple[int, str] | None:
        """(the most the budget can be here, why) where the file system takes no file as large
        as kvdesk may store (every cache is a row of one file: FAT32's 4 GB), else None."""
        limit = file_limit(self._db.path.parent)
        return None if limit is None else (int(limit[0] * BUDGET_SHARE), limit[1])

    def usage_bytes(self) -> int:
        """Bytes of all stored KV chunks."""
        return quota.usage(self._db)

    def gc(self, budget_bytes: int | None = None, *,
           progress: Callable[[int, int], None] | None = None,
           cancel: threading.Event | None = None) -> dict:
        """Evict least-recently-used KV entries until they fit the budget (default: the setting).

        Entries and documents whose writer was killed go first (store.caches.quota). Each
        eviction is its own transaction: `progress(bytes freed, bytes to free)` after each,
        and `cancel` stops before the next ("stopped": true), what was evicted staying so.
        Returns {"evicted_entries": [ids], "evicted_caches": [{"entry", "document_id",
        "chat_id", "passage", "bytes", "model"} of each], "abandoned_entries": [ids],
        "abandoned_documents": [ids], "freed_bytes": n, "bytes_after": n, "budget_bytes": n,
        "stopped": bool}.
        """
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        done: dict = {}  # (a second run after a full disk adds to the first one's work)
        return self._db.freeing(lambda: quota.collect(
            self._db, budget, self._clock(), done, progress=progress, cancel=cancel))

    def attaching(self) -> dict[int, bool]:
        """{document id: whether its attach is under way (else it was killed: unfinished)}
        of the documents not attached whole yet."""
        return quota.attaching(self._db)

    def _enforce_budget(self, entry: Entry, keep: Iterable[int] = ()) -> list[dict]:
        done: dict = {}  # (a second run after a full disk adds to the first one's work)
        return self._db.freeing(lambda: quota.make_room(
            self._db, self.budget_bytes, entry, self._clock(), set(keep), done))
