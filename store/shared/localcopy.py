"""A remote entry being copied into the local store: invisible there until every chunk is in.

A pull (store.shared.sync) and a streaming restore fill a `LocalCopy` with the chunks they read; it
becomes an ordinary local entry only when complete. A document the copy brings is unfinished
until then, as an attach's is (store.schema m007): a kill leaves it listed so, the next pull
finishes it and `gc` removes it; a failed copy removes it. This module never reads the
remote tier itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..caches.kv import BackgroundWriter
from ..records import Document, Entry
from ..store import Store
from .manifest import Manifest


def add_document(store: Store, manifest: Manifest, *, attaching: bool = False) -> Document:
    """The manifest's document in the local store (the one there already if the same text);
    `attaching`: a new one is unfinished, as Store.add_document's."""
    doc = manifest.document
    return store.add_document(doc.content_hash, doc.title, doc.text, type=doc.type,
                              n_tokens=doc.n_tokens, attaching=attaching)


class LocalCopy:
    """A remote entry being copied into the local store, invisible there until complete.

    Chunks may arrive in any order from any thread (`add`); one writer thread stores them,
    so fetching never waits on the database. `finish()` makes the copy an ordinary local
    entry of `document_id`, by default the manifest's document (added to the store if new);
    `abort()` drops it, with the document if the copy added it. Finishing it never evicts
    the entries `keep` (store.write_entry).
    """

    def __init__(self, store: Store, manifest: Manifest, levels: Iterable[str] | None = None,
                 *, document_id: int | None = None, passage_hash: str | None = None,
                 evict: bool = True, keep: Iterable[int] = ()):
        self.manifest = manifest
        self.levels = tuple(levels or manifest.levels)
        if not set(self.levels) <= set(manifest.levels):
            raise ValueError(f"the remote entry has no level(s) "
                             f"{sorted(set(self.levels) - set(manifest.levels))}")
        if manifest.passage and document_id is None:
            raise ValueError("a passage's entry is copied only for a document of this store")
        self._store = store
        self._new_document = self._finishes = False
        if document_id is None:
            unfinished = store.attaching()  # {id: whether its attach is under way}
            doc = add_document(store, manifest, attaching=True)
            # Added just now (marked, and not before), or left by a killed attach or pull:
            # both are finished by this copy; only the new one goes with a failed copy.
            self._new_document = doc.attach_pid is not None and doc.id not in unfinished
            self._finishes = self._new_document or unfinished.get(doc.id) is False
            document_id = doc.id
        self.document_id = document_id
        try:
            self._writer = store.write_entry(
                manifest.fingerprint, manifest.tokens, levels=self.levels,
                chunk_size=manifest.chunk_size, document_id=document_id,
                window_start=manifest.window_start, calibration=manifest.calibration,
                passage=manifest.passage, passage_hash=passage_hash, evict=evict,
                keep=keep)
        except BaseException:
            self._drop_document()
            raise
        self.spans = self._writer.spans
        self.windows = self._writer.windows
        self._lock = threading.Lock()
        self._have: set[tuple[int, str]] = set()
        self._closed = False
        self._chunks = BackgroundWriter(self._writer)

    @property
    def nbytes(self) -> int:
        """What the finished copy holds: its levels' chunk objects, window parts included."""
        return sum(obj.nbytes for level in self.levels for obj in self.manifest.chunks[level])

    @property
    def evicted(self) -> list[dict]:
        """The caches finishing it evicted (store.gc's `evicted_caches`); the copy itself,
        "too_large", where it is larger than the whole storage budget: then not kept."""
        return self._writer.evicted

    def add(self, chunk_index: int, level: str, data: bytes) -> None:
        """Keep a chunk read from the remote tier (already checked); ignored once closed."""
        with self._lock:
            if self._closed or level not in self.levels or (chunk_index, level) in self._have:
                return
            self._have.add((chunk_index, level))
        self._chunks.put(chunk_index, level, data)

    def missing(self) -> list[tuple[int, str]]:
        with self._lock:
            return [(span.chunk_index, level) for span in self.spans + self.windows
                    for level in self.levels if (span.chunk_index, level) not in self._have]

    def finish(self) -> Entry:
        try:
            self._close(raise_failure=True)
            entry = self._writer.finish()
        except BaseException:
            self._writer.abort()
            self._drop_document()
            raise
        if self._finishes:
            self._store.finish_document(self.document_id)
        return entry

    def abort(self) -> None:
        self._close(raise_failure=False)
        self._writer.abort()
        self._drop_document()

    def _close(self, *, raise_failure: bool) -> None:
        with self._lock:
            self._closed = True
        self._chunks.close(raise_failure=raise_failure)

    def _drop_document(self) -> None:
        if self._new_document:
            self._new_document = self._finishes = False
            self._store.delete_document(self.document_id)
