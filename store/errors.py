"""Errors the store raises on purpose, so callers can tell a recoverable cache problem from a bug.

Everything here derives from StoreError. The store must never let a raw sqlite3 error escape for a
condition a caller is expected to handle (a missing row, a corrupt chunk, a too-new database).
"""


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""


class SchemaVersionError(StoreError):
    """The database was written by a newer kvdesk (or is not a kvdesk store): refuse to touch it."""


class NotFoundError(StoreError, LookupError):
    """A document, chat, message or KV entry/chunk that does not exist (or was evicted)."""


class CorruptChunkError(StoreError):
    """A stored KV chunk failed its checksum; the engine recomputes that part and may repair it."""

    def __init__(self, entry: int, chunk: int, level: str):
        super().__init__(f"KV entry {entry}, chunk {chunk}, level {level!r}: checksum mismatch")
        self.entry = entry
        self.chunk = chunk
        self.level = level


class IncompleteEntryError(StoreError):
    """An entry writer finished without every (chunk, level) it declared."""


class BudgetFullError(StoreError):
    """An entry written not to evict others (`Store.write_entry(evict=False)`) did not fit the
    storage budget: it was removed again, and nothing else was."""


class RemoteError(StoreError):
    """The remote tier could not serve a request (unreachable, timed out, throttled, refused)
    after its bounded retries. The message names the endpoint and the failure, never a secret."""


class CorruptObjectError(StoreError):
    """A remote object (chunk or manifest) failed its checksum or is not what its key says."""

    def __init__(self, key: str, why: str):
        super().__init__(f"remote object {key}: {why}")
        self.key = key


class SharedObjectError(StoreError):
    """A shared entry's chunk object missing from the bucket or failing its check, as a local
    copy of it read it (`store.shared.sync.complete`): damage there, never a local failure."""


class ReadOnlyError(StoreError):
    """The data directory cannot be written: reading works, changing anything does not."""


class DamagedError(ReadOnlyError):
    """The database file itself is damaged (SQLite found a malformed page): what can still be
    read is, and nothing is written to it any more (a write could spread the damage)."""


class DiskFullError(ReadOnlyError):
    """The disk holding the data directory is full: reading works, a write failed (and was
    rolled back whole). Unlike a read-only directory it passes when space is freed."""


class DataDirError(StoreError):
    """The data directory cannot be used at all (a file in its place, no permission...)."""


class DataDirGoneError(DataDirError, ReadOnlyError):
    """The data directory (or its database file) was removed, moved or replaced while kvdesk
    ran: nothing more is written (it would go to a file no longer there); what is open still
    reads."""


class BackupError(StoreError):
    """A backup could not be made where it was asked (a folder not empty, a full disk...):
    nothing of it was left there."""


class StoppedError(Exception):
    """The caller's cancel event was set (Ctrl-C): a push, pull or check stopped between two
    objects, keeping only what was complete. Not a StoreError: nothing failed, and nothing
    that skips a failing entry may take it for one."""
