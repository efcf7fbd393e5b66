"""Reading back what is shared: `remote verify`'s check of the shared copies of local entries,
and `remote status`'s look at both sides (the manifests a pull would read, read).

A push never reads back what is there (store.shared.sync): an object damaged or deleted in the
bucket is found here, by reading back every object of the shared copy of an entry this
machine holds (manifest, chunks, calibration), and with `repair` put back from this store's
copy (the keys are content-addressed: the rewrite is what every reader expects). This module
never writes an object whose bytes do not match its key, nor anything this store does not
hold intact.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from ..errors import (
    CorruptChunkError,
    CorruptObjectError,
    NotFoundError,
    RemoteError,
    StoppedError,
    StoreError,
)
from ..records import Entry
from ..store import Store
from .heads import PassageHeadError, sources
from .manifest import NewerManifestError
from .remote import RemoteTier, sha256
from .sync import (
    document_entries,
    entry_id_of,
    push,
    read_chunk,
    read_manifest,
    remote_index,
    stop_if,
)
from .titles import entry_title


def check(store: Store, tier: RemoteTier, entry: Entry, *, repair: bool = False,
          cancel: threading.Event | None = None) -> dict:
    """Every object of a local entry's shared copy (manifest, chunks, calibration) read back
    and checked: those missing or damaged there, with `repair` put back from this store's
    copy where it holds those bytes (content-addressed keys: what every reader expects; a
    damaged manifest by pushing again). {"shared": False}: the tier has no copy of it. A
    passage's entry extending the passages' head is checked with the head's chunks its
    manifest names (store.shared.heads), and repaired from both local entries. `cancel`
    stops it before the next object read (StoppedError)."""
    fingerprint = entry.model
    token_end, prefix_hash = entry_id_of(entry)
    document = store.document(entry.document_id)
    report = {"entry": entry.id, "title": entry_title(store, entry, document),
              "shared": True, "objects": 0, "damaged": [], "repaired": 0}
    try:
        manifest = read_manifest(tier, fingerprint, token_end, prefix_hash)
    except NotFoundError:
        return {**report, "shared": False}
    except CorruptObjectError as e:
        report["damaged"].append({"key": e.key, "error": str(e)})
        if not repair:
            return report
        push(store, tier, entry)  # (a damaged manifest counts as none: written again)
        manifest = read_manifest(tier, fingerprint, token_end, prefix_hash)
        report["repaired"] += 1
    work = [(i, level, obj) for level, objs in manifest.chunks.items()
            for i, obj in enumerate(objs)]

    def damage(item) -> dict | None:
        i, level, obj = item
        stop_if(cancel)
        try:
            read_chunk(tier, manifest, i, level)
        except (NotFoundError, CorruptObjectError) as e:
            return {"key": tier.chunk_key(fingerprint, prefix_hash, level, i, obj.sha256),
                    "error": str(e), "chunk": i, "level": level, "sha256": obj.sha256}
        return None

    with ThreadPoolExecutor(tier.config.parallel, thread_name_prefix="kv-check") as pool:
        chunks = [d for d in pool.map(damage, work) if d is not None]
    report["objects"] = len(work) + len(manifest.calibrations)
    report["damaged"] += chunks
    held = sources(store, entry)[1] if repair and chunks else []
    for bad in chunks if repair else ():
        if bad["chunk"] >= len(held):  # (another layout of the same tokens: not from here)
            continue
        try:
            data = store.read_chunk(*held[bad["chunk"]], bad["level"])
        except (NotFoundError, CorruptChunkError):
            continue  # not held here: another machine that holds it can repair it
        if sha256(data) == bad["sha256"]:
            tier.put(bad["key"], data)
            report["repaired"] += 1
    for cal_id in manifest.calibrations:  # (the entry's, and its head's if another)
        key = tier.calibration_key(fingerprint, cal_id)
        try:
            tier.get(key, digest=cal_id)
        except (NotFoundError, CorruptObjectError) as e:
            report["damaged"].append({"key": key, "error": str(e)})
            try:  # (this store's own copy, where it has one intact: read, checked)
                data = store.calibration(cal_id) if repair else None
            except StoreError:  # (missing or damaged here too)
                data = None
            if data is not None:
                tier.put(key, data)
                report["repaired"] += 1
    return report


def check_all(store: Store, tier: RemoteTier, fingerprint: str, *,
              repair: bool = False, cancel: threading.Event | None = None) -> dict:
    """`check` every local entry of this model that travels (one failing its own check here
    is named); `cancel` stops it before the next object, the entries not checked whole
    counted `not_done` (a repair made is kept: each object put back is whole)."""
    reports, failed, not_done = [], [], 0
    entries = document_entries(store, fingerprint)
    for n, e in enumerate(entries):
        try:
            stop_if(cancel)
            reports.append(check(store, tier, e, repair=repair, cancel=cancel))
        except (CorruptChunkError, PassageHeadError) as error:
            failed.append({"entry": e.id, "error": str(error)})
        except StoppedError:
            not_done = len(entries) - n
            break
    shared = [r for r in reports if r["shared"]]
    return {"checked": len(shared), "not_shared": len(reports) - len(shared),
            "objects": sum(r["objects"] for r in shared),
            "damaged": [{**d, "title": r["title"]} for r in shared for d in r["damaged"]],
            "repaired": sum(r["repaired"] for r in shared), "failed": failed,
            "not_done": not_done}


def status(store: Store, tier: RemoteTier, fingerprint: str) -> dict:
    """Whether the bucket answers, and this model's document entries on each side. The
    manifests of those only there, which a pull would read, are read (in parallel): one that
    fails its check is named in `damaged` ({"key", "error"}), not taken for a shared cache."""
    local = {entry_id_of(e) for e in document_entries(store, fingerprint)}

    def damage(named: tuple[int, bytes]) -> dict | None:
        try:
            read_manifest(tier, fingerprint, *named)
        except (NewerManifestError, NotFoundError):  # (a newer kvdesk's; one gone since)
            return None
        except CorruptObjectError as e:
            return {"key": e.key, "error": str(e)}
        return None

    try:
        tier.check()
        remote = set(remote_index(tier, fingerprint))
        with ThreadPoolExecutor(tier.config.parallel, thread_name_prefix="kv-status") as pool:
            damaged = [d for d in pool.map(damage, sorted(remote - local)) if d is not None]
    except RemoteError as e:
        return {"reachable": False, "error": str(e), "local_entries": len(local)}
    return {"reachable": True, "local_entries": len(local), "remote_entries": len(remote),
            "only_local": len(local - remote), "only_remote": len(remote - local),
            "damaged": damaged}
