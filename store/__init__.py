"""kvdesk's persistent store: documents, chats, messages, settings and compressed KV caches.

One data directory, one SQLite database (WAL) driven through sqlite-utils; KV chunks are stored as
BLOBs in it (the measured choice: see store.blobs and benchmarks/RESULTS.md). `Store` is the whole
public API; the engine and the CLI wrap it thinly. The store must never import llama.cpp, Qt, the
codec or the app: chunks are opaque bytes at named quality levels.
"""

from .errors import (
    CorruptChunkError,
    IncompleteEntryError,
    NotFoundError,
    SchemaVersionError,
    StoreError,
)
from .kv import EntryWriter
from .records import Chat, Document, Entry, Message, Model, PrefixMatch, Span
from .store import Store

__all__ = [
    "Chat",
    "CorruptChunkError",
    "Document",
    "Entry",
    "EntryWriter",
    "IncompleteEntryError",
    "Message",
    "Model",
    "NotFoundError",
    "PrefixMatch",
    "SchemaVersionError",
    "Span",
    "Store",
    "StoreError",
]
