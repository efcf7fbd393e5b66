"""The passages' head on the shared tier: a passage's entry that extends it travels whole.

Locally a passage's entry may extend one root entry holding only the passages' head (the
system prompt every passage starts with; store.caches.kv), instead of holding the head again
itself. Its manifest (version 5, store.shared.manifest) then carries the head's chunks, cut
from token 0, before the passage's own, cut from the head's end; its tokens and key are the
whole chain's, those of a root passage's entry of the same tokens. The other machine keeps
the head as a root entry of its own (one it holds already, else one made from those chunks)
and the passage as an entry extending it (store.shared.sync's `pull`).

Only such a chain travels: a passage's entry extending anything else, one with a window
(sliding-window models keep root passages), or one whose head lacks one of its levels or was
cut into chunks of another size is refused (`PassageHeadError`). A head encoded under another
codec calibration than the passage's travels (the common case: a head stored before the model
was calibrated, passages after), its calibration named apart (`Manifest.head_calibration`).
Pure lookups here: no I/O to the tier.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import StoreError
from ..records import Entry
from ..store import Store
from .manifest import Manifest


class PassageHeadError(StoreError):
    """A passage's entry extending the passages' head that cannot travel as one (pushed), or
    whose head cannot be held here at the levels asked for (pulled)."""


def is_head(entry: Entry) -> bool:
    """Whether `entry` can be the passages' head: a root holding no document, chat or
    passage of its own."""
    return (entry.parent_id is None and not entry.passage and entry.document_id is None
            and entry.chat_id is None)


def travels(entry: Entry, entries: dict[int, Entry]) -> bool:
    """Whether a local entry goes to the tier: a document's or a passage's root entry, or a
    passage's extending a head (`entries`: every complete entry, by id)."""
    if entry.document_id is None:
        return False
    if entry.parent_id is None:
        return True
    parent = entries.get(entry.parent_id)
    return entry.passage and parent is not None and is_head(parent)


def sources(store: Store, entry: Entry) -> tuple[Entry | None, list[tuple[int, int]]]:
    """(the head `entry` extends, or None for a root; where each of its manifest's chunks
    is read here: (local entry id, chunk index), in manifest order, window parts last).
    PassageHeadError: an entry extending another that cannot travel as one."""
    window = store.windows([entry.id]).get(entry.id, ())
    own = [(entry.id, i) for i in range(entry.n_chunks + len(window))]
    if entry.parent_id is None:
        return None, own
    head = store.entry(entry.parent_id)
    why = None
    if not entry.passage or not is_head(head):
        why = "it extends an entry that is not the passages' head (only a root entry, or a "\
              "passage's extending that head, is shared)"
    elif not set(entry.levels) <= set(head.levels):
        why = (f"its head (entry {head.id}) lacks the level(s) "
               f"{sorted(set(entry.levels) - set(head.levels))}")
    elif window or store.windows([head.id]):
        why = "it has a window (a sliding-window model's passages are shared as root entries)"
    elif head.chunk_size != entry.chunk_size:
        why = f"its head (entry {head.id}) was stored with another chunk size"
    if why is not None:
        raise PassageHeadError(f"KV entry {entry.id} cannot be shared: {why}")
    return head, [(head.id, i) for i in range(head.n_chunks)] + own


def calibrations(entry: Entry, head: Entry | None) -> list[str]:
    """The codec calibrations an entry's manifest names (its own, then its head's if another):
    those its chunks need, uploaded with it."""
    return list(dict.fromkeys(c for c in (entry.calibration, head and head.calibration) if c))


def held_head(store: Store, fingerprint: str, tokens: Sequence[int],
              levels: Iterable[str]) -> Entry | None:
    """The local entry that can be the passages' head of `tokens` at `levels`: a complete root
    of no document, chat or passage whose tokens are exactly those, holding every one of
    `levels`; None where there is none."""
    match = store.longest_prefix(fingerprint, tokens, touch=False)
    found = match.entries[-1] if match.n_tokens == len(tokens) and match.entries else None
    usable = found is not None and found.token_end == len(tokens) and is_head(found) and \
        set(levels) <= set(found.levels)
    return found if usable else None


def local_head(store: Store, manifest: Manifest, levels: Iterable[str]) -> Entry | None:
    """The local entry that can be the head of a v5 manifest's passage at `levels`
    (`held_head` of its first `head_end` tokens); None where there is none.

    Its codec calibration may be another than the manifest's head's: each chunk names the
    one it needs, and a restore resolves it per chunk; it must only be held here intact
    (PassageHeadError where it is not: another head of the same tokens cannot be made, and
    the store's repair encodes this one again)."""
    found = held_head(store, manifest.fingerprint, manifest.tokens[:manifest.head_end], levels)
    if found is not None and found.calibration is not None:
        try:
            store.calibration(found.calibration)
        except StoreError as e:
            raise PassageHeadError(f"the passages' head held here (entry {found.id}) needs a "
                                   f"codec calibration this store cannot read ({e})") from None
    return found
