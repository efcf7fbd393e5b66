"""A long document's passages, each with a KV entry of its own, computed when first needed.

A passage's KV is computed on its own, after the shared passage system prompt, as attach does
for a document (`prompts.passage_prefix`), and stored as an entry marked as a passage's
(store: `passage`) that extends one entry holding the system prompt's KV alone, the
passages' head (`prompts.passage_head`), stored once per model: otherwise each passage would
store those ~50 tokens again, a quarter of its bytes. (A sliding-window model's passage is a
root entry: its window holds the head anyway; so is one stored by an older kvdesk.) Its
tokens say nothing of the document it came from, so the entry is keyed by content through
the store's prefix hashes: the same text under the same model is one entry, found by the
same longest-prefix lookup a document's is, whichever document holds it. It is stored at one
level (the setting `passage_level`, `balanced` by default), not every level: a book has
thousands of passages.

`ensure` computes the missing ones (the first time they are retrieved) in the context it is
given — unless the shared cache (S3 tier) has them: they travel like documents' entries, and
are shared after computing when automatic pushing is on — and stores each before the next,
so a one-shot command keeps what it computed and an interrupted question keeps the passages
finished before it; the others are found, marked used (the storage budget evicts passage KV
least recently used first, like any entry) and read back by `blending`. It never decides
which passages a chat uses: `chat.longdoc` does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from store import BudgetFullError, Entry, NotFoundError, Store, StoreError
from store.shared.heads import held_head, is_head

from ..errors import RuntimeStateError
from ..model.prompts import passage_head, passage_prefix
from ..model.runtime import Runtime
from ..results import Progress, location, size_text
from . import repair
from .kvcache import KVCache
from .levels import EXACT, Message
from .sharing import Sharing
from .sources import ChunkSource
from .streaming import FAILED

DEFAULT_PASSAGE_LEVEL = "balanced"
MEMO = 8192  # passages' tokens kept (tokenizing one costs ~1 ms; a 3 MB text has ~7,000)
MEASURED_TOKENS = 1000  # passage tokens stored before their size is taken as measured

log = logging.getLogger(__name__)


@dataclass
class Ready:
    """A question's passages made ready: each one's entry, and what that took."""

    entries: list[Entry | None]  # None where a sliding-window context could not store it, or
    # the model keeps no passage KV (`PassageKV.kept`)
    computed: int = 0  # passages computed here
    computed_at: list[int] = field(default_factory=list)  # which, by their place in the list
    pulled: int = 0  # passages taken from the shared cache
    notes: list[str] = field(default_factory=list)


class PassageKV:
    def __init__(self, store: Store, kv: KVCache, sharing: Sharing,
                 level: str = DEFAULT_PASSAGE_LEVEL):
        self.store = store
        self.kv = kv
        self.sharing = sharing  # the shared cache: looked at before computing, fed after
        self.level = level
        self._tokens: dict[tuple[str, str], tuple[int, ...]] = {}  # (model, text): its prefix
        self._heads: dict[str, tuple[int, ...]] = {}  # model: the passages' head

    def tokens(self, rt: Runtime, text: str) -> tuple[int, ...]:
        """The passage's own prefix: what its KV is computed after and keyed by."""
        key = (rt.fingerprint, text)
        if key not in self._tokens:
            if len(self._tokens) >= MEMO:  # a long-running engine over many books
                self._tokens.clear()
            self._tokens[key] = passage_prefix(rt, text).tokens
        return self._tokens[key]

    def head(self, rt: Runtime) -> tuple[int, ...]:
        """The tokens every passage's prefix under `rt`'s model begins with (its entry
        extends theirs)."""
        if rt.fingerprint not in self._heads:
            self._heads[rt.fingerprint] = passage_head(rt)
        return self._heads[rt.fingerprint]

    def entry(self, rt: Runtime, text: str, *, touch: bool = False) -> Entry | None:
        """The stored entry holding exactly this passage's prefix (a root, or extending the
        passages' head), if any."""
        tokens = self.tokens(rt, text)
        match = self.store.longest_prefix(rt.fingerprint, tokens, touch=touch)
        if match.n_tokens != len(tokens) or not match.entries:
            return None
        last = match.entries[-1]
        if last.token_end != len(tokens) or (last.parent_id is not None and not (
                last.passage and len(match.entries) == 2 and is_head(match.entries[0]))):
            return None
        return self.store.name_passage(last, text)  # (one stored by a kvdesk before names)

    def kept(self, rt: Runtime) -> bool:
        """Whether `rt`'s model keeps passage KV. At a lossy level a sliding-window model
        does only once its levels are calibrated: on Gemma 3 270M the model-independent levels
        lost 18 of the 21 answers the model gives from the exact passages (RESULTS.md, "A
        sliding-window model's passages blended"), so its passages are read as text until
        then."""
        return (self.level == EXACT or not rt.layout.swa_layers
                or self.kv.calibrations.current(rt.fingerprint) is not None)

    def bytes_per_token(self, rt: Runtime) -> tuple[float, str] | None:
        """The bytes per token of passage KV at `level` under `rt`'s model, and whence: as
        the passages stored at it take, else by the codec's calibration (its bits per element
        at that level, measured on its text); None where neither says."""
        nbytes, tokens = self.store.passage_sizes(rt.fingerprint).get((self.level,), (0, 0))
        if tokens >= MEASURED_TOKENS:
            return nbytes / tokens, "as the passages stored take"
        cal = self.kv.calibrations.current(rt.fingerprint)
        bits = cal and cal.meta.get("levels", {}).get(self.level, {}).get("bits_per_element")
        if not bits:
            return None
        layout = rt.layout  # (a passage is shorter than a sliding window: all its layers)
        per_token = (layout.kv_bytes_per_token + layout.window_bytes_per_token) / layout.itemsize
        return bits / 8 * per_token, "by the codec's calibration"

    def ensure(self, rt: Runtime, passages: Sequence[tuple[int, str]], *,
               cancel: threading.Event | None = None, evict: bool = True,
               progress: Callable[[Progress], None] | None = None) -> Ready:
        """The entry of each (document id, text) passage: stored here, else taken from the
        shared cache, else computed in `rt` (whose content is replaced) and stored (and
        shared, when automatic pushing is on); none where the model keeps none (`kept`). One
        stored whose chunks are damaged (set aside when read, or missing) is computed again
        and stored in place. Storing one never evicts the others the question reads: one that
        fits only without them is not kept (nor computed here, nor a longer one after it:
        None, computed where it is read), said in the notes. Not to `evict` other KV, a
        passage that does not fit the storage budget (pulled or computed) is not kept, and
        stops it: store.BudgetFullError. `progress`: before each passage computed,
        ("passages", those done, all of them)."""
        if not self.kept(rt):
            return Ready([None] * len(passages), notes=[
                "the passages were read from their text, not from a cache: this model keeps "
                "none until its codec is calibrated (its uncalibrated levels lose answers), so "
                "each question computes its passages again and its answer starts later; "
                "calibrate it with `kvdesk calibrate` (a few minutes, once)"])
        ready, evicted = Ready([]), []
        # All found first: the question reads every one, so storing another evicts none.
        found = [self.entry(rt, text, touch=True) for _, text in passages]
        keep = {e.id for e in found if e is not None}
        damaged = self.store.damaged(keep) if keep else {}
        healed = self._heal_heads(rt, found, cancel)
        unstored = _Unstored(self.store)
        for i, ((document_id, text), entry) in enumerate(zip(passages, found, strict=True)):
            if entry is not None and entry.id in damaged:
                if progress:
                    progress(Progress("passages", i, len(passages)))
                if self._heal(rt, entry, cancel):
                    healed.append(described(self.store, entry.document_id, entry.passage_hash))
            if entry is None and not unstored.skips(len(self.tokens(rt, text))):
                tried = unstored.count
                entry = self._pull(rt, text, document_id, ready, evict, keep, evicted, unstored)
                if entry is None and unstored.count == tried:  # (not one pulled, unstored)
                    entry = self._compute(rt, i, len(passages), document_id, text, ready,
                                          evict, keep, evicted, unstored, cancel, progress)
            ready.entries.append(entry)
        # (what storing them pushed out)
        ready.notes.extend(self.kv.eviction_notes(evicted, rt.fingerprint))
        if healed:
            ready.notes.append(f"the stored KV of {', '.join(healed)} was damaged (set aside "
                               "when read): computed again and stored")
        ready.notes.extend(unstored.notes(len(keep)))
        return ready

    def _compute(self, rt: Runtime, i: int, n: int, document_id: int, text: str, ready: Ready,
                 evict: bool, keep: set[int], evicted: list[dict], unstored: _Unstored,
                 cancel: threading.Event | None,
                 progress: Callable[[Progress], None] | None) -> Entry | None:
        """Passage `text`'s KV computed in `rt` and stored (`ensure`); its entry, or None."""
        if progress:
            progress(Progress("passages", i, n))
        tokens = self.tokens(rt, text)
        rt.reset()
        rt.prefill(list(tokens), cancel=cancel, logits=False)
        made: list[dict] = []
        head = self._head_entry(rt, tokens, evict, keep, made, cancel)
        entry_id = self.kv.store_prefix(rt, tokens, (self.level,), document_id=document_id,
                                        cancel=cancel, passage=text, evict=evict,
                                        evicted=made, keep=keep, extends=head)
        left = [c for c in made if c.get("too_large") and c["entry"] == entry_id]
        evicted += [c for c in made if c not in left]
        entry = None
        if entry_id is not None and not left:
            with contextlib.suppress(NotFoundError):  # (never: kept, whatever else goes)
                entry = self.store.entry(entry_id)
        if entry_id is not None and entry is None:
            unstored.add(len(tokens), left[0] if left else None)
            return None
        ready.computed += 1
        ready.computed_at.append(i)
        if entry is not None:
            keep.add(entry.id)
            ready.notes.extend(self.sharing.push_after_attach(entry.id)[1])
        return entry

    def _head_entry(self, rt: Runtime, tokens: Sequence[int], evict: bool, keep: set[int],
                    evicted: list[dict], cancel: threading.Event | None) -> int | None:
        """The id of the passages' head entry that passage `tokens`, in `rt`'s context now,
        extends: stored from that context, at the passage level, where there is none. None
        where the passage shares no head: a sliding-window model, tokens that do not begin
        with it, or none stored (the storage budget), or one stored at another chunk size.
        One stored at another level (before `passage_level` was changed) is encoded at this
        one too: else every passage stored since would hold its own copy of the head."""
        head = self.head(rt)
        if rt.layout.swa_layers or not 0 < len(head) < len(tokens) or \
                tuple(tokens[:len(head)]) != head:
            return None
        found = held_head(self.store, rt.fingerprint, head, (self.level,))
        other = None if found else held_head(self.store, rt.fingerprint, head, ())
        if other is not None and other.chunk_size == self.kv.chunk_tokens:
            try:
                self.kv.add_level(rt, other, self.level)
            except (StoreError, RuntimeStateError) as e:  # (read only, a full disk: a root)
                log.info("the passages' head is not stored at %s: %s", self.level, e)
            found = held_head(self.store, rt.fingerprint, head, (self.level,))
        elif found is None and other is None:
            try:
                if self.kv.store_prefix(rt, head, (self.level,), cancel=cancel, evict=evict,
                                        evicted=evicted, keep=keep) is None:
                    return None
            except (BudgetFullError, NotFoundError):  # (evicted at once: too large for it)
                return None
            found = held_head(self.store, rt.fingerprint, head, (self.level,))
        # (one chunk grid for the head and its passages: the tier's manifest)
        return found.id if found is not None and found.chunk_size == self.kv.chunk_tokens \
            else None

    def _heal_heads(self, rt: Runtime, found: Sequence[Entry | None],
                    cancel: threading.Event | None) -> list[str]:
        """The passages' head entries healed (`_heal`) where damaged: those the `found`
        passages extend, and the one new passages would (each chain read from its head would
        be recomputed from token 0 at every question, and new passages stored on it);
        ["the passages' system prompt"] if one was."""
        heads = {e.parent_id for e in found if e is not None and e.parent_id is not None}
        if not rt.layout.swa_layers and (
                held := held_head(self.store, rt.fingerprint, self.head(rt), (self.level,))):
            heads.add(held.id)
        damaged = self.store.damaged(heads) if heads else {}
        healed = []
        for i in sorted(damaged):
            with contextlib.suppress(NotFoundError):  # (evicted meanwhile: nothing to mend)
                healed.append(self._heal(rt, self.store.entry(i), cancel))
        return ["the passages' system prompt"] if any(healed) else []

    def _heal(self, rt: Runtime, entry: Entry, cancel: threading.Event | None) -> bool:
        """Entry `entry`'s damaged chunks computed again in `rt` and stored in place (as
        `kvdesk verify --repair` does); whether it is whole again."""
        try:
            repair.heal(self.store, rt, self.kv.calibrations, entry.id, cancel=cancel)
        except StoreError as e:  # (a full disk, say): read where it can be, computed elsewhere
            log.info("the damaged KV of passage entry %s is not repaired: %s", entry.id, e)
            return False
        finally:
            rt.reset()
        return not self.store.damaged([entry.id])

    def _pull(self, rt: Runtime, text: str, document_id: int, ready: Ready, evict: bool,
              keep: set[int], evicted: list[dict], unstored: _Unstored) -> Entry | None:
        """Passage `text`'s entry taken from the shared cache (`ensure`), never evicting those
        `keep`; None where the tier has none, or the copy was not kept (`unstored`: computed
        in place)."""
        made: list[dict] = []
        entry_id, notes = self.sharing.pull_passage(
            rt.fingerprint, self.tokens(rt, text), self.level, document_id, text, evict,
            keep=keep, evicted=made)
        ready.notes.extend(notes)
        left = [c for c in made if c.get("too_large") and c["entry"] == entry_id]
        evicted += [c for c in made if c not in left]
        if entry_id is None:
            return None
        entry = None
        if not left:
            with contextlib.suppress(NotFoundError):  # (never: kept, whatever else goes)
                entry = self.store.entry(entry_id)
        if entry is None:
            unstored.add(len(self.tokens(rt, text)), left[0] if left else None)
            return None
        ready.pulled += 1
        keep.add(entry.id)
        return entry


class _Unstored:
    """The passages of one `ensure` whose KV did not fit the storage budget: what the user is
    told, and which later ones are not computed (at one level a passage's KV grows with its
    tokens: one at least as long as one that did not fit would not either)."""

    def __init__(self, store: Store):
        self.store = store
        self.count = 0
        self.shortest: int | None = None  # the fewest tokens of one that did not fit
        self.too_large = 0  # bytes of one larger than the whole budget
        self.beside = 0  # bytes of one that fits only without the others the question reads

    def skips(self, n_tokens: int) -> bool:
        """Whether a passage of `n_tokens` is not computed here (not kept, as a longer one
        was not): counted."""
        if self.shortest is None or n_tokens < self.shortest:
            return False
        self.count += 1
        return True

    def add(self, n_tokens: int, record: dict | None) -> None:
        self.count += 1
        self.shortest = n_tokens if self.shortest is None else min(self.shortest, n_tokens)
        if record is not None and "beside" in record:
            self.beside = max(self.beside, record["bytes"])
        elif record is not None:
            self.too_large = max(self.too_large, record["bytes"])

    def notes(self, held: int) -> list[str]:
        """What the user is told, `held`: the passages the question reads that are stored."""
        if not self.count:
            return []
        budget = size_text(self.store.budget_bytes)
        why = (f"a passage's KV ({size_text(self.too_large)}) is larger than the whole storage "
               f"budget of {budget}" if self.too_large else
               f"the storage budget of {budget} holds no more beside the passages this "
               f"question reads from it ({held} of them)" if self.beside else
               f"they do not fit the storage budget of {budget}")
        return [f"{self.count} passage(s) not stored: {why}; nothing else was evicted for them, "
                "and they are computed where this question reads them (and again at the next "
                "question; the setting storage_budget_gb)"]


def described(store: Store, document_id: int | None, name: str | None) -> str:
    """A passage entry's passage as the user knows it ("passage #12 [lines 120-141] of
    document 1 (manual.md)"), or the document read whole beside passages it holds, from the
    entry's document and `passage_hash`."""
    passage = store.passage_named(document_id, name)
    doc = passage.document_id if passage is not None else document_id
    if doc is None:
        return "a passage"
    try:
        title = store.document(doc).title
    except NotFoundError:  # deleted meanwhile
        title = "deleted"
    if passage is None:
        return f"document {doc} ({title}), read whole beside the passages"
    return (f"passage #{passage.index} [{location(passage.page, passage.lines)}] of document "
            f"{doc} ({title})")


def unread(store: Store, entry: Entry, notes: list[Message]) -> list[Message]:
    """`notes` of a blend's read of `entry` that failed, its own sentences (which name chunks
    by the store's ids, and a token of the entry's, not of the blend) said in words."""
    levels = [m for m in notes if not isinstance(m, str)]
    if not entry.passage:
        what = f"document {entry.document_id}"
        with contextlib.suppress(NotFoundError):
            what += f" ({store.document(entry.document_id).title})"
        return [*levels, f"the cache of {what} could not be read whole: computing it"]
    what = described(store, entry.document_id, entry.passage_hash)
    return [*levels, f"the stored KV of {what} could not be read (a chunk failed its check, "
            "or was set aside after one did): it is computed in place, and computed again and "
            "stored when a question next reads it"]


def head_in_words(store: Store, first: ChunkSource | None, messages: list[Message]) -> None:
    """A blend's first part read from a passage's entry `first` that failed: said in words."""
    failed = [m for m in messages if isinstance(m, str) and m.startswith(FAILED)]
    if not failed or first is None or not first.spans:
        return
    with contextlib.suppress(NotFoundError):
        entry = store.entry(first.spans[0].entry_id)
        if entry.passage:
            messages[messages.index(failed[0])] = unread(store, entry, [])[0]
