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

from ..caches.writers import BackgroundWriter
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
    the entries `keep` (store.write_entry), nor the entries it extends.

    A v5 manifest's entry (a passage's extending the passages' head) is copied in two: `head`,
    its first chunks as a root entry of no document (tokens [0, head_end), of the manifest's
    `head_calibration`); then, with `parent_id` a local such head, the passage's own chunks as
    an entry extending it. `add` and `missing` name chunks by their index in the manifest
    either way.
    """

    def __init__(self, store: Store, manifest: Manifest, levels: Iterable[str] | None = None,
                 *, document_id: int | None = None, passage_hash: str | None = None,
                 evict: bool = True, keep: Iterable[int] = (), parent_id: int | None = None,
                 head: bool = False):
        self.manifest = manifest
        self.levels = tuple(levels or manifest.levels)
        if not set(self.levels) <= set(manifest.levels):
            raise ValueError(f"the remote entry has no level(s) "
                             f"{sorted(set(self.levels) - set(manifest.levels))}")
        chained = manifest.head_end is not None
        if head and not chained or parent_id is not None and (head or not chained) or \
                chained and not head and parent_id is None:
            raise ValueError("a passage's entry extending the passages' head is copied as "
                             "that head (`head`) or onto a local one (`parent_id`), and only it")
        if manifest.passage and not head and document_id is None:
            raise ValueError("a passage's entry is copied only for a document of this store")
        if parent_id is not None and store.entry(parent_id).token_end != manifest.head_end:
            raise ValueError(f"entry {parent_id} does not end where the remote entry's head does")
        self._store = store
        self._new_document = self._finishes = False
        if document_id is None and not head:
            unfinished = store.attaching()  # {id: whether its attach is under way}
            doc = add_document(store, manifest, attaching=True)
            # Added just now (marked, and not before), or left by a killed attach or pull:
            # both are finished by this copy; only the new one goes with a failed copy.
            self._new_document = doc.attach_pid is not None and doc.id not in unfinished
            self._finishes = self._new_document or unfinished.get(doc.id) is False
            document_id = doc.id
        self.document_id = document_id
        # The manifest's chunks this copy takes: the head's (first), the passage's after them.
        self.first = len(manifest.head_spans) if parent_id is not None else 0
        try:
            self._writer = store.write_entry(
                manifest.fingerprint, manifest.tokens[:manifest.head_end] if head
                else manifest.tokens, levels=self.levels, parent_id=parent_id,
                chunk_size=manifest.chunk_size, document_id=document_id,
                window_start=manifest.window_start,
                calibration=manifest.head_calibration if head else manifest.calibration,
                passage=manifest.passage and not head,
                passage_hash=None if head else passage_hash, evict=evict, keep=keep)
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
        end = self.first + len(self.spans) + len(self.windows)
        return sum(obj.nbytes for level in self.levels
                   for obj in self.manifest.chunks[level][self.first:end])

    @property
    def evicted(self) -> list[dict]:
        """The caches finishing it evicted (store.gc's `evicted_caches`); the copy itself,
        "too_large", where it is larger than the whole storage budget: then not kept."""
        return self._writer.evicted

    def add(self, chunk_index: int, level: str, data: bytes) -> None:
        """Keep the manifest's chunk `chunk_index` read from the remote tier (already checked);
        ignored once closed, or if not this copy's."""
        local = chunk_index - self.first
        with self._lock:
            if self._closed or level not in self.levels or (local, level) in self._have or \
                    not 0 <= local < len(self.spans) + len(self.windows):
                return
            self._have.add((local, level))
        self._chunks.put(local, level, data)

    def missing(self) -> list[tuple[int, str]]:
        """(manifest chunk index, level) of each chunk the copy still lacks."""
        with self._lock:
            return [(self.first + span.chunk_index, level) for span in self.spans + self.windows
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
