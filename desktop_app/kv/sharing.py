"""The engine's use of the shared cache tier (store.shared): what it reads, keeps and shares.

With a bucket configured, a restore whose tokens the local store does not cover looks for a
longer document entry on the remote tier and, if there is one, streams it (`source`) through
the same adaptive pipeline as local chunks, keeping what it reads in a pending local copy;
`keep` completes that copy after the answer, so the next restore is local (a copy that cannot
be completed, damaged there, leaves the chat to store what it computed exactly instead, and
says how the bucket is mended). Attach looks there before prefilling (`pull_for_attach`) and
shares what it computed (`push_after_attach`) when automatic pushing is on; so does a passage
retrieved for the first time (`pull_passage`), and a chat's later document whose cache a
blend moves into place (`later_documents`).
`status`, `push` and `pull` are the `kvdesk remote` commands.

A tier that fails is reported in a message and skipped for a minute, never in the way of an
answer: every path falls back to the local store or to recomputing. Nothing here ever sees a
credential (boto3 reads them) nor writes one anywhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence

from store import (
    BudgetFullError,
    Document,
    Entry,
    RemoteError,
    RemoteTier,
    SharedObjectError,
    Store,
    StoreError,
    text_hash,
)
from store.shared import checking, sync

from ..model.prompts import Prompter, Template
from ..results import Progress, size_text
from .evictions import eviction_notes
from .sources import ChunkSource, LocalSource, RemoteSource

# What a damaged shared entry's note says of a context computed here exactly: a caller that
# does not store it after all (a full disk) says the note without it (`unstored`).
STORED_INSTEAD = "; the context computed here is stored here instead"

# After a failure the tier is left alone this long: each try costs its timeouts and retries.
RETRY_AFTER_S = 60.0


class Sharing:
    def __init__(self, store: Store, tier: RemoteTier | None, *, auto_push: bool = False,
                 auto_pull: bool = True):
        self.store = store
        self.tier = tier
        self.auto_push = auto_push and tier is not None
        self.auto_pull = auto_pull and tier is not None
        self._lock = threading.Lock()
        self._streamed: list[RemoteSource] = []  # copies not yet kept
        self._down_until = 0.0

    # -- automatic mode --------------------------------------------------------------------

    def source(self, fingerprint: str, tokens: Sequence[int]) -> tuple[ChunkSource, list[str]]:
        """Where a restore of `tokens` reads: the remote tier when it covers more of them."""
        local = LocalSource(self.store, fingerprint, tokens)
        if not self.auto_pull or local.n_tokens == len(tokens):
            return local, []
        found, notes = self._try(lambda: self._stream(fingerprint, tokens, local.n_tokens))
        if found is None:
            return local, notes
        return found, [f"streaming {found.n_tokens:,} cached tokens from the shared cache "
                       f"({self.tier.config.where}, bucket {self.tier.config.bucket!r})"]

    def keep(self, exact: bool = False) -> tuple[bool, list[str]]:
        """Complete the local copies of what restores streamed in; (may the context be stored
        here?, messages): yes when every copy was kept, or when one is damaged there (an
        object corrupt or missing) but the context holds its tokens `exact`ly (recomputed
        from text, or read back lossless): the chat then stores them as computed here."""
        with self._lock:
            streamed, self._streamed = self._streamed, []
        ok, notes = True, []
        budget = self.store.budget_bytes
        for source in streamed:
            tokens, size = source.copy.manifest.token_end, source.copy.nbytes
            if size > budget:  # (fetched, it would be evicted at once: not fetched)
                source.copy.abort()
                ok = False
                notes.append(self._too_large(tokens, size, budget))
                continue
            try:
                entry, fetched = sync.complete(source.tier, source.copy)
            except StoreError as e:
                # (the tier down, its entry is intact: the next question streams it again)
                # (damaged there only where the bucket's object was read: a copy removed
                # or a document deleted here is no damage of the bucket's)
                damaged = exact and isinstance(e, SharedObjectError)
                ok = ok and damaged
                notes.append(f"the shared cache's entry could not be kept here: {e}" + (
                    f"{STORED_INSTEAD} (the shared copy stays damaged until `kvdesk remote "
                    "verify --repair` runs on the machine that shared it)" if damaged else ""))
                continue
            if any(c.get("too_large") for c in source.copy.evicted):
                ok = False
                notes.append(self._too_large(tokens, size, budget))
                continue
            notes.append(f"kept the shared cache's {entry.token_end:,} tokens here "
                         f"({fetched / 1e6:.1f} MB fetched after the answer)")
            notes += eviction_notes(self.store, source.copy.evicted, entry.model)
        return ok, notes

    @staticmethod
    def unstored(notes: Sequence[str]) -> list[str]:
        """`keep`'s notes for a context that was not stored after all."""
        return [note.replace(STORED_INSTEAD, "") for note in notes]

    @staticmethod
    def _too_large(tokens: int, size: int, budget: int) -> str:
        return (f"the shared cache's {tokens:,} tokens were not kept here: their cache "
                f"({size_text(size)}) is larger than the whole storage budget of "
                f"{size_text(budget)} (the setting storage_budget_gb); a question streams "
                "them again")

    def pull_for_attach(self, fingerprint: str, tokens: Sequence[int], levels: Sequence[str],
                        document_id: int, progress: Callable[[int, int], None] | None = None
                        ) -> tuple[int | None, list[str]]:
        """Take a document's entry from the tier instead of prefilling it: (its local id,
        or None when the tier has no such entry at these levels; notes)."""
        if not self.auto_pull:
            return None, []
        left_out: dict[str, StoreError] = {}
        evicted: list[dict] = []

        def pull() -> int | None:
            manifest = sync.find(self.tier, fingerprint, list(tokens),
                                 longer_than=len(tokens) - 1)
            if manifest is None or not set(levels) <= set(manifest.levels):
                return None
            return sync.pull(self.store, self.tier, manifest, levels=levels,
                             document_id=document_id, progress=progress,
                             left_out=left_out, evicted=evicted).id

        entry_id, notes = self._try(pull)
        return entry_id, [f"{n}; computing it here instead" for n in notes] + eviction_notes(
            self.store, evicted, fingerprint) + [
            f"the shared cache's {level} level of this document failed ({e}): taken without "
            "it (a question reads another level); `kvdesk remote verify --repair` where it is "
            "held puts it back" for level, e in left_out.items()]

    def pull_passage(self, fingerprint: str, tokens: Sequence[int], level: str,
                     document_id: int, text: str, evict: bool = True, *,
                     keep: Collection[int] = (), evicted: list[dict] | None = None
                     ) -> tuple[int | None, list[str]]:
        """Take the entry of passage `text` from the tier instead of computing it: (its local
        id, or None when the tier has none at `level`; notes). Storing it never evicts the
        entries `keep` (the other passages the question reads); the caches it evicted are
        added to `evicted`, with the copy itself ("too_large", its id) where it did not fit
        beside them or the whole budget: then not kept, its id no entry's. Not to `evict`
        other KV, one that does not fit the storage budget is not kept (BudgetFullError)."""
        if not self.auto_pull:
            return None, []

        def pull() -> int | None:
            manifest = sync.find(self.tier, fingerprint, list(tokens),
                                 longer_than=len(tokens) - 1)
            if manifest is None or not manifest.passage or level not in manifest.levels:
                return None
            return sync.pull(self.store, self.tier, manifest, levels=[level],
                             document_id=document_id, passage_hash=text_hash(text),
                             evict=evict, keep=keep, evicted=evicted).id

        entry_id, notes = self._try(pull)
        return entry_id, [f"{n}; computing the passage here instead" for n in notes]

    def later_documents(self, tpl: Template, prompter: Prompter, docs: Sequence[Document],
                        levels: Sequence[str], progress: Callable[[Progress], None] | None = None
                        ) -> dict:
        """A blend's parts (kv.blending.Parts: `later`, `notes`, `pulled`) from the own
        entries under `tpl`'s model of a chat's later documents (`docs` after the first, the
        blend's head), whose KV it moves into place: each one's here, else its entry (its own
        prefix, as attach cached it) pulled from the tier at those of `levels` it has, and
        said; None where neither holds one, or the copy would not fit the storage budget.
        A copy never evicts the head's entry nor the later ones' the blend reads; what it
        evicted is said."""
        head = docs[0] if docs else None
        head_entry = head and self.store.document_entry(head.id, tpl.fingerprint)
        keep = {head_entry.id} if head_entry is not None else set()
        entries, notes, pulled = [], [], False
        for doc in docs[1:]:
            entry = self.store.document_entry(doc.id, tpl.fingerprint)
            if entry is None and self.auto_pull:
                entry, said = self._pull_document(tpl.fingerprint, doc,
                                                  list(prompter.prefix(tpl, doc).tokens),
                                                  levels, progress, keep)
                notes += said
                pulled = pulled or entry is not None
            if entry is not None:
                keep.add(entry.id)
            entries.append(entry)
        return {"later": entries, "notes": notes, "pulled": pulled}

    def _pull_document(self, fingerprint, doc, tokens, levels, progress, keep):
        what = f"document {doc.id} ({doc.title})"
        too_large: list[int] = []
        beside: list[int] = []
        evicted: list[dict] = []

        def pull() -> Entry | None:
            manifest = sync.find(self.tier, fingerprint, tokens, longer_than=len(tokens) - 1)
            wanted = [level for level in levels if manifest and level in manifest.levels]
            if not wanted:
                return None
            size = sum(c.nbytes for level in wanted for c in manifest.chunks[level])
            if size > self.store.budget_bytes:  # (fetched, it would be evicted at once)
                too_large.append(size)
                return None
            entry = sync.pull(self.store, self.tier, manifest, levels=wanted,
                              document_id=doc.id, evicted=evicted, keep=keep,
                              progress=progress and (lambda done, total: progress(
                                  Progress("pull", done, total, doc.title))))
            left = [c for c in evicted if c.get("too_large") and c["entry"] == entry.id]
            if left:
                (beside if "beside" in left[0] else too_large).append(entry.nbytes)
                return None
            return entry

        entry, notes = self._try(pull)
        notes = [f"{what}: {n}; its cache is computed in place" for n in notes]
        budget = size_text(self.store.budget_bytes)
        if too_large or beside:
            why = (f"is larger than the whole storage budget of {budget}" if too_large else
                   f"does not fit the storage budget of {budget} beside the caches this "
                   "answer reads")
            return None, [f"{what}: its shared cache ({size_text((too_large or beside)[0])}) "
                          f"{why} (the setting storage_budget_gb): not taken, its KV is "
                          "computed in place"]
        if entry is not None:
            notes.append(f"{what} taken from the shared cache ({entry.token_end:,} tokens, "
                         f"{size_text(entry.nbytes)}), kept here")
            notes += eviction_notes(self.store, evicted, fingerprint)  # (named, one note)
        return entry, notes

    def push_after_attach(self, entry_id: int, progress: Callable[[int, int], None] | None = None
                          ) -> tuple[bool, list[str]]:
        """Share a document's (or a passage's) entry when automatic pushing is on: (pushed?,
        warnings)."""
        if not self.auto_push:
            return False, []
        done, notes = self._try(lambda: sync.push(self.store, self.tier,
                                                  self.store.entry(entry_id), progress=progress))
        return done is not None, [f"{n}; it stays on this machine" for n in notes]

    def abandon(self) -> None:
        """Drop copies never kept (the engine is closing)."""
        with self._lock:
            streamed, self._streamed = self._streamed, []
        for source in streamed:
            source.copy.abort()

    def _stream(self, fingerprint: str, tokens: Sequence[int], local: int) -> RemoteSource | None:
        manifest = sync.find(self.tier, fingerprint, list(tokens), longer_than=local)
        if manifest is None or manifest.passage:  # (a passage's: `pull_passage`, for its
            return None  # document here, as the question's passages are made ready)
        source = RemoteSource(self.tier, sync.LocalCopy(self.store, manifest))
        with self._lock:
            self._streamed.append(source)
        return source

    def _try(self, work: Callable[[], object]) -> tuple[object | None, list[str]]:
        if time.monotonic() < self._down_until:
            return None, ["the shared cache failed less than a minute ago: not tried"]
        try:
            return work(), []
        except BudgetFullError:  # not the tier's failure: the caller's to handle
            raise
        except RemoteError as e:
            self._down_until = time.monotonic() + RETRY_AFTER_S
            return None, [f"the shared cache is unavailable ({e})"]
        except StoreError as e:  # a corrupt or vanished object: that entry only
            return None, [f"the shared cache's entry is unusable ({e})"]

    def recover_calibration(self, fingerprint: str, cal_id: str) -> tuple[bool, list[str]]:
        """Fetch again a calibration the local store lost or holds damaged, if the tier has
        it (pushed with an entry that needs it); (recovered?, messages)."""
        if self.tier is None:
            return False, []
        done, notes = self._try(lambda: sync.refetch_calibration(
            self.store, self.tier, fingerprint, cal_id) or True)
        return bool(done), notes

    # -- commands --------------------------------------------------------------------------

    def status(self, fingerprint: str) -> dict:
        """The tier's configuration, whether it answers, and the entries on each side."""
        config = self._configured().config
        return {"configured": True, "endpoint": config.where, "bucket": config.bucket,
                "prefix": self.tier.prefix, "auto_push": self.auto_push,
                "auto_pull": self.auto_pull, "fingerprint": fingerprint,
                **checking.status(self.store, self.tier, fingerprint)}

    # (`cancel`, an Event: Ctrl-C stops each before its next object, saying `not_done`.)
    def push(self, fingerprint: str, progress: Callable[[int, int], None] | None = None,
             cancel: threading.Event | None = None) -> dict:
        return sync.push_all(self.store, self._configured(), fingerprint, progress=progress,
                             cancel=cancel)

    def pull(self, fingerprint: str, *, lazy: bool = False,
             progress: Callable[[int, int], None] | None = None,
             cancel: threading.Event | None = None) -> dict:
        return sync.pull_all(self.store, self._configured(), fingerprint, lazy=lazy,
                             progress=progress, cancel=cancel)

    def verify(self, fingerprint: str, *, repair: bool = False,
               cancel: threading.Event | None = None) -> dict:
        """Every object of this model's shared entries that this store holds, read back and
        checked; with `repair`, those missing or damaged there put back (`checking.check`)."""
        return checking.check_all(self.store, self._configured(), fingerprint, repair=repair,
                                  cancel=cancel)

    def _configured(self) -> RemoteTier:
        if self.tier is None:
            raise RemoteError("no shared cache is configured: set remote_bucket (and "
                              "remote_endpoint_url for a server other than AWS S3) in the "
                              "settings, or KVDESK_REMOTE_BUCKET")
        return self.tier
