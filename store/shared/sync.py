"""Moving document entries between the local store and the remote tier: push and pull.

The local store stays the index and the cache: a push uploads a local entry's chunk objects
(those not there yet, in parallel) and then its manifest; a pull finds an entry by the
manifest keys alone (token count and prefix hash, store.shared.remote), reads its manifest,
and copies it into a pending local entry (store.shared.localcopy) that becomes an ordinary
entry only once every chunk is in: a partial copy is never visible locally, whatever
interrupts it. A streaming restore feeds the same LocalCopy with the chunks it reads, so what
it read is kept.

An entry takes the codec calibrations its chunks need along (its head's too): push uploads them
(content-addressed, immutable) before the manifest, and a pull fetches them into the local store
(`fetch_calibration`) before anything decodes.

Only documents' and passages' root entries travel, with their windows (store.caches.kv), and
passages' entries extending the passages' head, with the head's chunks (store.shared.heads);
chats never leave the machine. A passage's entry is pulled only for a local document holding
the same passage, when a question needs it (`pull` with its document id), never by `pull_all`.
What a push never does, reading back a shared entry's objects, is store.shared.checking's.
This module must never load an object under another fingerprint than the one asked for, and
never write a manifest before every object it names (chunks, calibration) is stored.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from ..errors import (
    CorruptChunkError,
    CorruptObjectError,
    NotFoundError,
    SharedObjectError,
    StoppedError,
    StoreError,
)
from ..records import Entry
from ..store import Store
from ..tokens import encode, prefix_hashes
from .heads import PassageHeadError, calibrations, local_head, sources, travels
from .localcopy import LocalCopy, add_document
from .manifest import ChunkObject, Manifest, NewerManifestError, RemoteDocument
from .remote import RemoteTier, sha256
from .titles import entry_title, evicted_named

ProgressFn = Callable[[int, int], None]  # (objects done, objects in all)


def stop_if(cancel: threading.Event | None) -> None:
    """StoppedError where the caller's `cancel` is set: checked before each object moves."""
    if cancel is not None and cancel.is_set():
        raise StoppedError


@dataclass(frozen=True)
class Transfer:
    """One entry pushed or pulled (or found already there: skipped)."""

    title: str
    tokens: int
    objects: int  # objects actually sent or received
    bytes: int
    skipped: bool = False


def document_entries(store: Store, fingerprint: str) -> list[Entry]:
    """The local entries that travel under this model: documents' and passages' root entries,
    and passages' entries extending the passages' head (store.shared.heads)."""
    entries = {e.id: e for e in store.entries()}
    return [e for e in entries.values() if e.model == fingerprint and travels(e, entries)]


def entry_id_of(entry: Entry) -> tuple[int, bytes]:
    """(token_end, prefix hash): how the remote tier names an entry."""
    return entry.token_end, entry.prefix_hash


def remote_index(tier: RemoteTier, fingerprint: str, *,
                 lookup: bool = False) -> dict[tuple[int, bytes], str]:
    """{(token_end, prefix hash): manifest key} of this model's entries, from one listing
    (`lookup`: on an answer's way, tried once and briefly)."""
    index = {}
    for key in tier.list_folder(tier.manifest_folder(fingerprint), lookup=lookup):
        named = tier.parse_manifest_key(key)
        if named is not None:
            index[named] = key
    return index


def read_manifest(tier: RemoteTier, fingerprint: str, token_end: int,
                  prefix_hash: bytes) -> Manifest:
    key = tier.manifest_key(fingerprint, token_end, prefix_hash)
    return Manifest.from_json(tier.get(key), key=key, fingerprint=fingerprint,
                              prefix_hash=prefix_hash)


def find(tier: RemoteTier, fingerprint: str, tokens: list[int], *,
         longer_than: int = 0) -> Manifest | None:
    """The remote entry covering the longest prefix of `tokens` beyond `longer_than` tokens.

    One listing and one read: the query is hashed once, only at the token counts some
    manifest key names (as the local lookup does, store.caches.kv).
    """
    index = remote_index(tier, fingerprint, lookup=True)
    positions = sorted({end for end, _ in index if longer_than < end <= len(tokens)})
    hashes = prefix_hashes(fingerprint, encode(tokens), positions)
    for end, digest in reversed(list(zip(positions, hashes, strict=True))):
        if (end, digest) in index:
            return read_manifest(tier, fingerprint, end, digest)
    return None


def read_chunk(tier: RemoteTier, manifest: Manifest, chunk_index: int, level: str) -> bytes:
    """One chunk object of a manifest's entry, checked against its size and SHA-256."""
    obj = manifest.chunks[level][chunk_index]
    key = tier.chunk_key(manifest.fingerprint, manifest.prefix_hash, level, chunk_index,
                         obj.sha256)
    return tier.get(key, nbytes=obj.nbytes, digest=obj.sha256)


# -- push ------------------------------------------------------------------------------------


def push(store: Store, tier: RemoteTier, entry: Entry, *,
         progress: ProgressFn | None = None, cancel: threading.Event | None = None) -> Transfer:
    """Upload a document's or a passage's entry: its missing chunk objects, then its manifest
    (idempotent; `cancel` stops it before that). A passage's entry extending the passages'
    head goes with the head's chunks (a version 5 manifest, store.shared.heads); one extending
    anything else, or that cannot go so, is refused (PassageHeadError)."""
    fingerprint = entry.model
    token_end, prefix_hash = entry_id_of(entry)
    document = store.document(entry.document_id)
    if _has_manifest(tier, fingerprint, token_end, prefix_hash):
        return Transfer(entry_title(store, entry, document), token_end, 0, 0, skipped=True)
    head, chunks = sources(store, entry)  # (raises before anything is sent)
    present = tier.list_folder(tier.entry_folder(fingerprint, prefix_hash))
    for cal_id in calibrations(entry, head):  # (content-addressed: one there is the same)
        if not tier.exists(key := tier.calibration_key(fingerprint, cal_id)):
            tier.put(key, store.calibration(cal_id))
    window = store.windows([entry.id]).get(entry.id, ())
    n_chunks = len(chunks)  # (the window's parts are numbered after the chunks)
    work = [(i, level) for i in range(n_chunks) for level in entry.levels]
    done = itertools.count(1)

    def upload(item: tuple[int, str]) -> tuple[ChunkObject, int]:
        chunk_index, level = item
        stop_if(cancel)
        data = store.read_chunk(*chunks[chunk_index], level)
        obj = ChunkObject(len(data), sha256(data))
        key = tier.chunk_key(fingerprint, prefix_hash, level, chunk_index, obj.sha256)
        sent = 0
        if present.get(key) != obj.nbytes:  # content-addressed: already there means the same
            tier.put(key, data)
            sent = obj.nbytes
        if progress:
            progress(next(done), len(work))
        return obj, sent

    with ThreadPoolExecutor(tier.config.parallel, thread_name_prefix="kv-push") as pool:
        uploaded = dict(zip(work, pool.map(upload, work), strict=True))
    manifest = Manifest(
        fingerprint=fingerprint,
        tokens=tuple(store.tokens(entry.id)),
        chunk_size=entry.chunk_size,
        levels=entry.levels,
        chunks={level: tuple(uploaded[(i, level)][0] for i in range(n_chunks))
                for level in entry.levels},
        # A passage's names only its document: the text is the other machine's own.
        document=RemoteDocument("", document.title, "passage", None, "") if entry.passage
        else RemoteDocument(document.content_hash, document.title, document.type,
                            document.n_tokens, document.text),
        created=time.time(),
        window_start=window[0].token_start if window else None,
        calibration=entry.calibration,
        passage=entry.passage,
        head_end=None if head is None else head.token_end,
        head_calibration=None if head is None else head.calibration,
    )
    # Last: until this object exists the entry is invisible to every other machine.
    tier.put(tier.manifest_key(fingerprint, token_end, prefix_hash), manifest.to_json())
    sent = [n for _, n in uploaded.values() if n]
    return Transfer(entry_title(store, entry, document), token_end, len(sent), sum(sent))


def _has_manifest(tier: RemoteTier, fingerprint: str, token_end: int, prefix_hash: bytes) -> bool:
    """Whether a readable manifest is there already (a corrupt one is written again; one a
    newer kvdesk wrote is left as it is)."""
    try:
        read_manifest(tier, fingerprint, token_end, prefix_hash)
    except NewerManifestError:
        return True
    except (NotFoundError, CorruptObjectError):
        return False
    return True


# -- pull ------------------------------------------------------------------------------------


def fetch_calibration(store: Store, tier: RemoteTier, manifest: Manifest, *,
                      head: bool = False) -> str | None:
    """Make the calibration a manifest's chunks need (`head`: a v5 manifest's head's chunks)
    a local one (fetched, checked against its SHA-256, stored) and return its id; None if
    they need none."""
    cal_id = manifest.head_calibration if head else manifest.calibration
    if cal_id is None:
        return None
    try:
        store.calibration(cal_id)
    except NotFoundError:
        refetch_calibration(store, tier, manifest.fingerprint, cal_id)
    return cal_id


def refetch_calibration(store: Store, tier: RemoteTier, fingerprint: str, cal_id: str) -> None:
    """Fetch a calibration of `fingerprint` from the tier (checked against its SHA-256) and
    store it, in place of a damaged local copy too; NotFoundError if the tier has none."""
    data = tier.get(tier.calibration_key(fingerprint, cal_id), digest=cal_id)
    store.put_calibration(fingerprint, data, {"from": "remote"})


def complete(tier: RemoteTier, copy: LocalCopy, *, progress: ProgressFn | None = None,
             failed: dict[str, StoreError] | None = None,
             cancel: threading.Event | None = None) -> tuple[Entry | None, int]:
    """Fetch every chunk the copy lacks, in parallel, and finish it; abort it on any failure
    (StoppedError too, where `cancel` is set).

    Returns the local entry and the bytes fetched here. A chunk object missing or failing its
    check raises SharedObjectError (a local failure, the copy's entry or a document removed
    here, raises its own error). With `failed`, it does not stop the other levels' reads: its
    level and error go into `failed` (that level's other chunks are not read), and the copy is
    aborted (None).
    """
    work = copy.missing()
    done = itertools.count(1)

    def fetch(item: tuple[int, str]) -> int:
        if failed is not None and item[1] in failed:
            return 0
        stop_if(cancel)
        try:
            data = read_chunk(tier, copy.manifest, *item)
        except (CorruptObjectError, NotFoundError) as e:
            if failed is None:
                raise SharedObjectError(str(e)) from e
            failed.setdefault(item[1], e)
            return 0
        copy.add(*item, data)
        if progress:
            progress(next(done), len(work))
        return len(data)

    try:
        with ThreadPoolExecutor(tier.config.parallel, thread_name_prefix="kv-pull") as pool:
            fetched = sum(pool.map(fetch, work))
    except BaseException:
        copy.abort()
        raise
    if failed:
        copy.abort()
        return None, fetched
    return copy.finish(), fetched


def pull(store: Store, tier: RemoteTier, manifest: Manifest, *,
         levels: Iterable[str] | None = None, document_id: int | None = None,
         passage_hash: str | None = None, progress: ProgressFn | None = None,
         evict: bool = True, evicted: list[dict] | None = None,
         left_out: dict[str, StoreError] | None = None, keep: Iterable[int] = (),
         cancel: threading.Event | None = None) -> Entry:
    """Copy a remote entry (at `levels`, default all of its levels) into the local store,
    with the calibration its chunks need (a passage's: of `document_id`, named by the local
    text's `passage_hash`). Not to `evict` other KV, a copy that does not fit the storage
    budget is dropped (BudgetFullError); else the caches storing it evicted are added to
    `evicted` (store.gc's `evicted_caches`; the copy itself, "too_large", where it is larger
    than the whole budget, or than the room the entries `keep` leave: then not kept; those are
    never evicted for it). `cancel` stops it as `complete` does. A level with a chunk object
    missing or damaged there is left out, the others kept (`left_out`: {level: error}); with
    none intact, the first error is raised.

    A passage's entry extending the passages' head (a version 5 manifest, store.shared.heads)
    becomes a local entry extending the local head: the complete root of no document holding
    exactly the head's tokens at every level copied, of any calibration held here, else one
    made first from the manifest's head chunks, with its calibration (never evicted for the
    passage). The passage's entry is returned, extending the head. A head made so stays when
    the passage's copy then fails: a valid entry, the head of the next passage pulled or
    computed here. A head that cannot be had at those levels (one too large for the budget,
    an identical one held already at other levels, or one whose calibration is unreadable
    here) fails the pull: PassageHeadError.
    """
    fetch_calibration(store, tier, manifest)
    levels, keep = tuple(levels or manifest.levels), set(keep)
    made: list[dict] = []
    failed: dict[str, StoreError] = {}
    parent_id = None
    try:
        if manifest.head_end is not None:
            head = local_head(store, manifest, levels)
            if head is None:
                fetch_calibration(store, tier, manifest, head=True)
                head = _copy(tier, lambda lv: LocalCopy(store, manifest, lv, head=True,
                                                        evict=evict, keep=keep),
                             levels, progress, made, failed, cancel)
                levels = tuple(level for level in levels if level not in failed)
                if any(c.get("too_large") for c in made):  # (then removed, nothing evicted)
                    made.clear()
                    raise PassageHeadError("the passages' head of the shared passage's entry "
                                           "does not fit the storage budget: not taken")
                if lacks := sorted(set(levels) - set(head.levels)):  # (an identical one)
                    raise PassageHeadError(f"the passages' head is held here (entry {head.id}) "
                                           f"without the level(s) {lacks}")
            keep.add(head.id)
            parent_id = head.id
        entry = _copy(tier, lambda lv: LocalCopy(
            store, manifest, lv, document_id=document_id, passage_hash=passage_hash,
            evict=evict, keep=keep, parent_id=parent_id), levels, progress, made, failed,
            cancel)
    finally:
        if evicted is not None:  # (a head's evictions too, were the passage's copy to fail)
            evicted += made
    if left_out is not None:
        left_out.update(failed)
    return entry


def _copy(tier: RemoteTier, make: Callable[[Iterable[str]], LocalCopy], levels: Iterable[str],
          progress: ProgressFn | None, evicted: list[dict],
          failed: dict[str, StoreError], cancel: threading.Event | None) -> Entry:
    """`pull`'s copy `make(levels)` completed; a level with a chunk object missing or damaged
    left out (into `failed`), the copy made again without it; none intact: the first error."""
    copy = make(levels)
    tried: dict[str, StoreError] = {}
    entry, _ = complete(tier, copy, progress=progress, failed=tried, cancel=cancel)
    if entry is None:
        intact = [level for level in copy.levels if level not in tried]
        if not intact:
            raise next(iter(tried.values()))
        # (Read again: a pending entry's levels are fixed when it is made.)
        copy = make(intact)
        entry, _ = complete(tier, copy, progress=progress, cancel=cancel)
        failed.update(tried)
    evicted += copy.evicted
    return entry


# -- whole stores ----------------------------------------------------------------------------


def push_all(store: Store, tier: RemoteTier, fingerprint: str, *,
             progress: ProgressFn | None = None, cancel: threading.Event | None = None) -> dict:
    """Push every local document entry of this model the tier lacks.

    An unreachable tier stops it (RemoteError); a corrupt local chunk skips that entry, and
    so does a passage's entry whose head cannot go with it (PassageHeadError). `cancel` stops
    it before the next object: the entry under way is not shared (no manifest) and, with
    those after it, counted `not_done`, for the next push.
    """
    pushed, failed, there, not_done = [], [], 0, 0
    entries = document_entries(store, fingerprint)
    for n, entry in enumerate(entries):
        try:
            stop_if(cancel)
            transfer = push(store, tier, entry, progress=progress, cancel=cancel)
        except (CorruptChunkError, PassageHeadError) as e:
            failed.append({"entry": entry.id, "error": str(e)})
            continue
        except StoppedError:
            not_done = len(entries) - n
            break
        if transfer.skipped:
            there += 1
        else:
            pushed.append(asdict(transfer))
    return {"pushed": pushed, "already_remote": there, "failed": failed, "not_done": not_done}


def pull_all(store: Store, tier: RemoteTier, fingerprint: str, *, lazy: bool = False,
             progress: ProgressFn | None = None, cancel: threading.Event | None = None) -> dict:
    """Pull every remote document entry of this model the local store lacks.

    `lazy`: only add the documents, so that they can be asked about; their KV then streams
    from the tier on first use. A missing or corrupt object skips that entry. Passages' entries
    stay there (`passages_left`): a question takes those it needs. A cache larger than the
    whole storage budget is not fetched (its document is added, as `lazy` adds it:
    `not_kept`); the caches storing the others evicted, those pulled before included, are
    named (`evicted`). `cancel` stops it before the next object: the copy under way is dropped
    and, with the shared entries after it, counted `not_done`, for the next pull.
    """
    local = {entry_id_of(e) for e in document_entries(store, fingerprint)}
    index = remote_index(tier, fingerprint)
    todo = sorted((named, key) for named, key in index.items() if named not in local)
    pulled, failed, here, passages, not_done = [], [], len(index) - len(todo), 0, 0
    not_kept: list[dict] = []
    evicted: list[dict] = []
    partial: list[dict] = []
    for n, ((token_end, digest), key) in enumerate(todo):
        title = None
        try:
            stop_if(cancel)
            manifest = read_manifest(tier, fingerprint, token_end, digest)
            if manifest.passage:  # pulled when a question retrieves it, for its document
                passages += 1
                continue
            title = manifest.document.title
            if lazy:
                add_document(store, manifest)
                pulled.append(asdict(Transfer(title, token_end, 1, 0)))
                continue
            if manifest.nbytes > store.budget_bytes:  # (fetched, it would go at once)
                add_document(store, manifest)
                not_kept.append({"title": title, "tokens": token_end, "bytes": manifest.nbytes,
                                 "budget_bytes": store.budget_bytes})
                continue
            made_room: list[dict] = []
            left_out: dict[str, StoreError] = {}
            entry = pull(store, tier, manifest, progress=progress, evicted=made_room,
                         left_out=left_out, cancel=cancel)
            if left_out:
                partial.append({"title": title, "tokens": token_end, "levels": entry.levels,
                                "left_out": {lvl: str(e) for lvl, e in left_out.items()}})
            if any(c.get("too_large") for c in made_room):  # (larger once stored)
                not_kept.append({"title": title, "tokens": token_end, "bytes": entry.nbytes,
                                 "budget_bytes": store.budget_bytes})
                continue
            evicted += made_room
            n_chunks = len(manifest.spans) + len(manifest.window_spans)
            pulled.append(asdict(Transfer(title, token_end, n_chunks * len(entry.levels),
                                          entry.nbytes)))
        except (CorruptObjectError, NotFoundError) as e:
            failed.append({"key": key, "title": title, "error": str(e)})
        except StoppedError:
            not_done = len(todo) - n
            break
    return {"pulled": pulled, "already_local": here, "passages_left": passages,
            "not_kept": not_kept, "evicted": evicted_named(store, evicted),
            "levels_left_out": partial, "failed": failed, "not_done": not_done}
