"""What the user is told of the caches a store evicted to keep within the storage budget, and
of where the budget goes (`storage_line`: the end of `kvdesk docs`).

Every path that stores KV with eviction (an attach, a question's passages, a turn's chat cache,
a blended chat's exact pass, a local API conversation) says it in these words, one note per
store, naming every cache that went. One store holds every model's caches under one budget, so
a cache of a model other than the loaded one is named with its model: a user who switches
models learns that the switch pushed the other model's caches out.

It only words records (store.gc's `evicted_caches`); it never evicts nor stores.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path

from store import NotFoundError, Store
from store.datadir import reserve

from ..results import size_text

NAMED = 5  # the documents named in a note of what was evicted; the rest counted


def eviction_notes(store: Store, evicted: Sequence[dict], fingerprint: str | None = None, *,
                   stored: str = "this") -> list[str]:
    """The notes for `evicted` (nothing when it evicted none), the caches of a model other
    than `fingerprint`'s (the loaded one) named with that model; None: all taken as its.
    `stored`: what storing evicted them ("chat 3's exact context", said after its answer)."""
    budget = size_text(store.budget_bytes)
    said = [f"this cache ({size_text(c['bytes'])} with the cache it extends) is larger than "
            f"the whole storage budget of {budget}: it is not stored, and nothing else was "
            "evicted for it (the setting storage_budget_gb)"
            for c in evicted if c.get("too_large")]
    evicted = [c for c in evicted if not c.get("too_large")]
    if not evicted:
        return said
    by_model = _by_model(evicted, fingerprint) if fingerprint is not None else {None: evicted}
    groups = [", ".join(_kinds(store, by_model[None]))] if None in by_model else []
    groups += [f"{'and ' if groups else ''}model {_model_name(store, model)}'s (not the one "
               f"loaded): {', '.join(_kinds(store, caches))}"
               for model, caches in by_model.items() if model is not None]
    return [*said, f"storing {stored} evicted the least recently used caches to keep within the "
            f"storage budget of {budget}: {'; '.join(groups)} "
            f"({size_text(sum(c['bytes'] for c in evicted))}); they are computed again when "
            "next used"]


def evicted_line(store: Store, evicted: Sequence[dict]) -> list[str]:
    """`kvdesk gc`'s line of the caches it evicted (its report's `evicted_caches`), each
    model's named with it: gc loads no model, so none is "the one loaded"."""
    if not evicted:
        return []
    by_model = _by_model(evicted)
    groups = [", ".join(_kinds(store, caches)) + (
        f" (model {_model_name(store, model)}'s)" if model and len(by_model) > 1 else "")
        for model, caches in by_model.items()]
    return [f"evicted {'; '.join(groups)} ({size_text(sum(c['bytes'] for c in evicted))}): "
            "they are computed again when next used"]


def fitting(evicted: Sequence[dict], budget_bytes: int) -> list[str]:
    """For a document's cache larger than the whole storage budget (its record, "too_large",
    with the bytes each level measured: `KVCache.store_prefix`), what the user can do: the
    levels that fit, most of them and then the largest, or else the budget that would hold
    its smallest level. Nothing for any other record."""
    for c in evicted:
        sizes = c.get("level_bytes")
        if not c.get("too_large") or "beside" in c or not sizes:
            continue
        extends = c["bytes"] - sum(sizes.values())  # (the entry it extends, kept with it)
        fit = [s for n in range(len(sizes) - 1, 0, -1) for s in combinations(sizes, n)
               if extends + sum(sizes[lv] for lv in s) <= budget_bytes]
        said = ("the document is attached all the same: a question about it computes its "
                "KV from its text (exit status 0)")
        if fit:
            best = max(fit, key=lambda s: (len(s), sum(sizes[lv] for lv in s)))
            size = size_text(extends + sum(sizes[lv] for lv in best))
            return [f"{said}; stored at {', '.join(best)} alone it fits ({size}): attach it "
                    f"again with `--levels {','.join(best)}`, or raise the setting "
                    "storage_budget_gb"]
        least = min(sizes, key=sizes.get)
        need = math.ceil((extends + sizes[least]) / 1e6) / 1e3  # (in GB, rounded up to a MB)
        return [f"{said}; not even its smallest level fits ({least}, "
                f"{size_text(extends + sizes[least])}): a setting storage_budget_gb of at "
                f"least {need:g} stores it at `--levels {least}`"]
    return []


def storage_line(store: Store, fingerprint: str) -> str:
    """Where the stored KV's bytes go, against the budget: the loaded model's (`fingerprint`)
    by what they are for, then each other model's, then the data directory on disk (the
    database, its journal and the reserve kept for a full disk), so that every byte a user
    finds there is accounted for."""
    usage = store.usage_by_kind()
    used = sum(sum(kinds.values()) for kinds in usage.values())
    ours = usage.pop(fingerprint, {})
    words = {"documents": "documents", "passages": "passages", "chats": "chats",
             "prompts": "shared prompts"}
    parts = [f"{words[k]} {size_text(ours[k])}" for k in words if ours.get(k)]
    parts += [f"model {_model_name(store, m)}'s caches {size_text(sum(k.values()))}"
              for m, k in usage.items()]
    disk = 0
    for p in store.data_dir.iterdir():
        with contextlib.suppress(OSError):  # (SQLite's -wal, -shm go as a process closes)
            disk += p.stat().st_size if p.is_file() else 0
    # (the turns' reserve beside it: named with it; one spent on a full disk: not there)
    held = ("the database and the reserves kept for a full disk"
            if reserve.held(store.data_dir)
            else "the database; no reserve for a full disk: its disk has too little room now")
    cap = store.budget_cap()
    capped = f" (kept so: {cap[1]})" if cap and cap[0] == store.budget_bytes else ""
    return (f"storage: {size_text(used)} of the {size_text(store.budget_bytes)} budget{capped}"
            + (f" ({', '.join(parts)})" if parts else "") + f"; the data directory takes "
            f"{size_text(disk)} on disk ({held})")


def budget_room(store: Store) -> str | None:
    """What to know where the disk has less room than the budget leaves the caches (a small
    drive, a default of 10 GB): the disk fills first, and the budget never evicts."""
    try:
        free = shutil.disk_usage(store.data_dir).free
    except OSError:
        return None
    left = store.budget_bytes - store.usage_bytes()
    if left <= free:
        return None
    return (f"the storage budget leaves the caches {size_text(left)} more, and the data "
            f"directory's disk has {size_text(free)} free: it fills first (a smaller setting "
            "storage_budget_gb keeps room on it, evicting least recently used caches)")


def _by_model(evicted: Sequence[dict], loaded: str | None = None) -> dict[str | None, list[dict]]:
    """The caches by their model's fingerprint, the `loaded` model's under None."""
    out: dict[str | None, list[dict]] = {}
    for c in evicted:
        out.setdefault(None if c.get("model") == loaded else c.get("model"), []).append(c)
    return out


def _kinds(store: Store, evicted: Sequence[dict]) -> list[str]:
    docs = dict.fromkeys(c["document_id"] for c in evicted
                         if c["document_id"] is not None and not c["passage"])
    chats = {c["chat_id"] for c in evicted if c["chat_id"] is not None}
    passages = sum(c["passage"] for c in evicted)
    prompts = sum(c["document_id"] is None and c["chat_id"] is None and not c["passage"]
                  for c in evicted)
    named = list(docs)[:NAMED]  # (all of them in the report's JSON: `evicted_caches`)
    return [f"document {d} ({_title(store, d)})" for d in named] + [
        f"{n} {what}" for n, what in (
            (len(docs) - len(named), "more documents' caches"),
            (len(chats), "chat cache(s)"), (passages, "passage(s)"),
            # (a root of no document or chat: the local API's shared prompt, or the passages')
            (prompts, "shared prompt cache(s)")) if n]


def _title(store: Store, doc_id: int) -> str:
    try:
        return store.document(doc_id).title
    except NotFoundError:  # deleted meanwhile
        return "deleted"


def _model_name(store: Store, fingerprint: str) -> str:
    try:
        return Path(store.model(fingerprint).path).name
    except NotFoundError:  # (a model's row goes with its last entry: never here, but said)
        return fingerprint[:12]
