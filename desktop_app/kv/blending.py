"""Chats over several documents from their cached KV, without reading them again (blending).

The same serves a chat over a long document's passages (`prompts.passage_layout`): each
passage's own prefix is the system prompt and the passage, as a document's is, so a later
passage's part is found in, and moved from, its own entry (`Parts.later`) the same way.

A chat over documents D1..Dn starts with D1's prefix (the system prompt and D1, as attach
cached it), then each further document as a system message of its own (`prompts.Layout`).
D1's prefix comes back as any cached prefix does. Each further document's part S holds the
same tokens as the prefix attach cached for it alone, P, but for P's own copy of the system
prompt: S opens with the message header P opens with (its first m tokens), goes on with the
document, which P holds from position h (after that copy), and ends with the template's
closing. So those runs of P's KV serve S: values as they are, keys turned to their new
positions (`rope.rerotate`, checked against llama.cpp for this model), the copy of the system
prompt dropped (as CacheBlend, EPIC, APE and Prompt Cache reuse separately computed modules).

What they cannot know is the documents before them: a token's KV in P was computed attending
to the system prompt and its own document only. A selected share of each later document's
tokens is recomputed in the combined context — its first tokens (EPIC: the document's
opening, computed with almost nothing before it, deviates the most once other documents
precede it) — together with whatever of S no cache holds. The assembled prefix is restored
once and the runs are computed in place, in order (`model.inplace`: llama.cpp computes a
sequence only after its last position, so each run goes through a second sequence).

A sliding-window (iSWA) model's window layers are assembled the same way, from each part's
stored window (a passage's covers all of it; a document's, its last positions). llama.cpp
keeps only the last window of those layers, so a run cannot be computed in the middle of the
restored prefix (`inplace` refuses such models): the prefix is restored up to each run, the
run computed after it as any prompt is, and its KV taken back (`_compute_windowed`). A
position no cache holds the window layers' KV of is computed too, when the final window or a
computed token attends to it there.

What follows the layout (the chat's turns, the question's turn) is computed, but for runs that
repeat a passage verbatim: the sentences a question's turn quotes from its passages
(`passages.evidence`) are taken from the KV the prefix already holds for them, keys turned
to their new positions (the assembly goes on to the end of the last such run; `repeats`).

Blended KV is approximate and is never stored: the engine computes the exact prefix in the
background (`exactness`) and stores that. This module never writes to the store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from store import Entry, NotFoundError, Store

from ..calibration.calibrations import Calibrations
from ..errors import Cancelled, RuntimeStateError
from ..model import inplace, rope
from ..model.kvstate import KVState, SeqState, in_position_order
from ..model.prompts import Layout
from ..model.runtime import Runtime
from ..options import RestoreOptions
from ..results import Progress, RestoreReport
from . import streaming
from .levels import Message, merged_level_notes, said
from .passagekv import head_in_words, unread
from .sources import ChunkSource, SpanSource
from .speeds import Speeds

ANCHOR = 8  # tokens of a document's opening that must match to find it inside its prefix
# The shortest run after the layout taken from the layout's KV: a quoted sentence, not a
# common phrase that happens to recur.
REPEAT = 8

Select = Callable[[int, int], Sequence[int]]  # (part start, part length) -> positions


def leading(fraction: float) -> Select:
    """EPIC's selection: each later document's first `fraction` of tokens (at least one)."""
    def select(start: int, length: int) -> range:
        return range(start, start + max(1, round(fraction * length)))
    return select


@dataclass(frozen=True)
class Blend:
    """How a chat prefix over several documents came into the model."""

    reused_tokens: int  # restored from the documents' own caches, moved into place
    recomputed_tokens: int  # of theirs, computed in the combined context
    mode: str  # "blended" (approximate: reused KV) | "exact" (a stored or computed prefix)
    exact_until: int = 0  # the prefix's first position whose KV is approximate
    assembled: int = 0  # tokens the context holds after it: the layout's, and a quote's
    repeated: int = 0  # of those after the layout, taken from the layout's KV (`repeats`)
    # Which assembled positions came from a cache (the rest were computed in place).
    held: np.ndarray | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict:
        return {"reused_tokens": self.reused_tokens, "recomputed_tokens":
                self.recomputed_tokens, "quoted_tokens_reused": self.repeated, "mode": self.mode}

    def computed_in(self, start: int, end: int) -> int:
        """Positions in [start, end) of the assembled prefix computed in place."""
        return int((~self.held[start:end]).sum())

    def assembled_in(self, start: int, end: int) -> int:
        """Positions in [start, end) of the assembled prefix taken from KV."""
        return int(self.held[start:end].sum())

    def note(self, parts: int, what: str, exact_later: bool, cached: int) -> str:
        """What the user is told of this blend of `parts` documents or passages (`what`), of
        which `cached` had a cache to read, whose exact context is computed in the background
        when `exact_later`."""
        quoted = (f"; {self.repeated:,} quoted tokens taken from the KV of the text they quote"
                  if self.repeated else "")
        whose = "from their own caches" if cached >= parts else \
            f"{cached} from their own caches and {parts - cached} computed in place"
        return (f"{parts} {what} blended{' ' if cached >= parts else ', '}{whose} "
                f"({self.reused_tokens:,} tokens "
                f"reused, {self.recomputed_tokens:,} computed in place{quoted}): answers from "
                "it are approximate" + ("; the exact context is computed in the background"
                                    if exact_later else ""))


@dataclass(frozen=True)
class Parts:
    """What a blend is asked to assemble: a prefix's layout and each later part's own entry
    (None: not cached here), with what making them ready took: notes, and the tokens of the
    prefix whose KV was computed for it (a passage with none stored yet: its part)."""

    layout: Layout
    later: Sequence[Entry | None]
    notes: Sequence[str] = ()
    computed_tokens: int = 0
    what: str = "documents"  # what the parts are, as the user is told: or "passages"
    pulled: bool = False  # a later part taken from the shared cache for it: source "remote"


def repeats(layout: Sequence[int], after: Sequence[int],
            minimum: int = REPEAT) -> list[tuple[int, int, int]]:
    """Runs (offset in `after`, position in `layout`, length) of at least `minimum` tokens of
    `after` that `layout` holds verbatim, left to right, each at its first occurrence."""
    first: dict[tuple[int, ...], int] = {}
    for p in range(len(layout) - minimum + 1):
        first.setdefault(tuple(layout[p:p + minimum]), p)
    runs, i = [], 0
    while i + minimum <= len(after):
        at = first.get(tuple(after[i:i + minimum]))
        if at is None:
            i += 1
            continue
        n = minimum + common_prefix(after[i + minimum:], layout[at + minimum:])
        runs.append((i, at, n))
        i += n
    return runs


def align(part: Sequence[int], stored: Sequence[int]) -> list[tuple[int, int, int]]:
    """Runs (offset in part, position in stored, length) of `part` that `stored` holds: its
    opening (the message header), then its document after the stored copy of what precedes."""
    m = common_prefix(part, stored)
    runs = [(0, 0, m)] if m else []
    anchor = list(part[m : m + ANCHOR])
    if len(anchor) < ANCHOR:
        return runs
    h = _find(stored, anchor, m)
    if h is not None:
        runs.append((m, h, common_prefix(part[m:], stored[h:])))
    return runs


class Blender:
    def __init__(self, store: Store, levels: Sequence[str], chunk_tokens: int,
                 calibrations: Calibrations):
        self.store = store
        self.calibrations = calibrations  # where stored chunks find their codec calibration
        self.levels = tuple(levels)
        self.chunk_tokens = chunk_tokens
        self._ropes: dict[str, list[rope.Rope] | None] = {}
        self.repeat = True  # False: all after the layout computed (benchmarks compare the two)
        self._lock = threading.Lock()

    def ropes(self, rt: Runtime) -> list[rope.Rope] | None:
        """This model's key rotations (probed once per model; None: not reproducible)."""
        with self._lock:
            if rt.fingerprint not in self._ropes:
                try:
                    self._ropes[rt.fingerprint] = rope.probe(rt)
                except Exception:  # noqa: BLE001 - any failure: this model is not blended
                    self._ropes[rt.fingerprint] = None
            return self._ropes[rt.fingerprint]

    def usable(self, rt: Runtime, later: Sequence[Entry | None]) -> bool:
        """Whether a blend would reuse anything: a later part's own entry (None: not cached
        here), and a model whose keys kvdesk can move and compute between (`inplace`; a
        sliding-window model's by restoring up to each run, unless its windows are chunked)."""
        lay = rt.layout
        between = not lay.swa_chunked if lay.swa_layers else inplace.can_compute(rt)
        return any(e is not None for e in later) and between and self.ropes(rt) is not None

    def restore(self, rt: Runtime, layout: Layout, later: Sequence[Entry | None],
                first: ChunkSource, *, options: RestoreOptions, speeds: Speeds, select: Select,
                after: Sequence[int] = (), progress: Callable[[Progress], None] | None = None,
                cancel: threading.Event | None = None, pulled: bool = False
                ) -> tuple[RestoreReport, Blend]:
        """Make `rt` hold the layout's prefix: its first part's cached prefix restored from
        `first`, each later part's own entry (`later`: a document's, or a passage's) moved
        after it, the selected tokens and what no cache holds computed in place; then the
        tokens `after` it up to the end of the last run that repeats the layout (none when
        no run does: `Blend.assembled` says how far). The report's `source` is "remote"
        where the first part streamed from the shared cache, or a later one was `pulled`
        from it for this blend."""
        t0 = time.perf_counter()
        prefix = list(layout.tokens)
        copies = repeats(prefix, after) if self.repeat else []
        if copies:
            prefix += after[:copies[-1][0] + copies[-1][2]]
        end0 = layout.parts[0][1]
        messages: list[Message] = []  # the head's and the parts', level notes summed at the end
        head = streaming.restore(rt, first, prefix[:end0], levels=self.levels, options=options,
                                 speeds=speeds, chunk_tokens=self.chunk_tokens,
                                 progress=progress, cancel=cancel, messages=messages,
                                 calibrations=self.calibrations.resolver(rt.fingerprint))
        head_in_words(self.store, first, messages)
        captured = [in_position_order(kv) for kv in rt.capture().sections]
        # One Assembly per cache section: the full-attention layers', then a sliding-window
        # model's window layers' (each position's KV, where some cache holds it).
        built = [Assembly.of(kv, len(prefix)) for kv in captured]
        built[0].take(captured[0], 0, end0)
        if len(built) > 1:
            built[1].take(captured[1], rt.layout.window_start(end0), end0)
        levels, n_bytes = list(head.chunk_levels), head.bytes_read
        ropes = self.ropes(rt)
        for entry, (start, end) in zip(later, layout.parts[1:], strict=False):
            got = self._reuse(rt, entry, prefix[start:end], start, ropes, options, speeds,
                              cancel, messages, levels)
            if got is None:
                continue
            parts, read = got
            for whole, (part_keys, part_values, held) in zip(built, parts, strict=True):
                whole.keys[:, start:end], whole.values[:, start:end] = part_keys, part_values
                whole.known[start:end] = held
            n_bytes += read
            for p in select(start, end - start):
                built[0].known[p] = False
        repeated = self._repeat(rt, built, copies, len(layout.tokens), ropes)
        known = built[0].known.copy()  # (computing a windowed model's runs marks them known)
        reused = int(known[end0:len(layout.tokens)].sum())
        approximate = np.flatnonzero(known[end0:])
        exact_until = end0 + int(approximate[0]) if len(approximate) else len(prefix)
        c0 = time.perf_counter()  # reading and moving ends here: computing is reported apart
        if len(built) > 1:
            computed = self._compute_windowed(rt, prefix, *built, end0, cancel)
        else:
            computed = self._compute(rt, prefix, built[0].keys, built[0].values, known, cancel)
        return RestoreReport(
            tokens=len(prefix), restore_s=c0 - t0 - head.recompute_s, bytes_read=n_bytes,
            chunk_levels=levels, recomputed_tokens=head.recomputed_tokens + computed,
            messages=said(merged_level_notes(messages, len(levels))),
            source="remote" if pulled else head.source,
            adapted_chunks=head.adapted_chunks,
            recompute_s=head.recompute_s + time.perf_counter() - c0), \
            Blend(reused, computed - (len(prefix) - len(layout.tokens) - repeated), "blended",
                  exact_until, len(prefix), repeated, known)

    def _repeat(self, rt, built, copies, start, ropes) -> int:
        """Each run after the layout (which ends at `start`) that repeats it: its KV where the
        layout holds it, keys turned to the run's place; tokens taken. (Its first tokens are
        not computed again as a moved part's are: they were computed after the text before
        them, not at a part's opening, and the tokens around a quote, which never match, are
        computed anyway.)"""
        lay = rt.layout
        section_ropes = [ropes[:lay.full_layers], ropes[lay.full_layers:]]
        for offset, at, n in copies:
            to = start + offset
            # Where every section holds the source (a window may not): else it is computed.
            held = np.logical_and.reduce([whole.known[at:at + n] for whole in built])
            for a, b in _runs(held):
                for whole, layer_ropes in zip(built, section_ropes, strict=False):
                    whole.keys[:, to + a:to + b] = rope.rerotate(
                        whole.keys[:, at + a:at + b], np.full(b - a, to - at), layer_ropes)
                    whole.values[:, to + a:to + b] = whole.values[:, at + a:at + b]
                    whole.known[to + a:to + b] = True
        return int(built[0].known[start:].sum())

    def _reuse(self, rt, entry, part, start, ropes, options, speeds, cancel, messages, levels):
        """([(keys, values, which tokens are held) per cache section], bytes read) of a
        later part from its own entry, moved into place (the part begins at position `start`
        of the prefix); None when there is nothing to reuse. (A passage's entry that extends
        the passages' head holds the part; the head's KV, before the part, is never read.)"""
        if entry is None or (entry.parent_id is not None and not entry.passage):
            return None
        try:
            stored = self.store.tokens(entry.id)
        except NotFoundError:  # evicted since it was found (by a passage stored meanwhile)
            return None
        runs = [r for r in align(part, stored) if r[2] > 0]
        if not runs:
            return None
        lay = rt.layout
        # (its chunks or window parts, layers, bytes a token, the layers' ropes) per section
        sections = [(self.store.spans(entry.id), lay.full_layers, lay.kv_bytes_per_token,
                     ropes[:lay.full_layers])]
        if lay.swa_layers:
            sections.append((self.store.windows([entry.id]).get(entry.id, ()), lay.swa_layers,
                             lay.window_bytes_per_token, ropes[lay.full_layers:]))
        out, n_bytes, notes = [], 0, []
        for i, (all_spans, n_layer, per_token, layer_ropes) in enumerate(sections):
            spans = [s for s in all_spans
                     if any(s.token_start < ss + n and ss < s.token_end for _, ss, n in runs)]
            k = np.empty((n_layer, entry.token_end, lay.channels), rt.cache_dtype)
            v = np.empty_like(k)
            read, got = (streaming.read_chunks(
                SpanSource(self.store, spans), stored, k, v, levels=self.levels,
                options=options, speeds=speeds, bytes_per_token=per_token, cancel=cancel,
                calibrations=self.calibrations.resolver(rt.fingerprint),
                chunk_levels=levels, messages=notes) if spans else (0, 0))
            n_bytes += got
            # Chunks cover the runs whole; a window may begin after a run does (then the
            # window layers' KV before it is not known).
            held_from = spans[0].token_start if spans else entry.token_end
            if (spans and read < spans[-1].token_end) or (i == 0 and not spans):
                messages += unread(self.store, entry, notes)
                return None
            keys = np.empty((n_layer, len(part), lay.channels), k.dtype)
            values = np.empty_like(keys)
            held = np.zeros(len(part), bool)
            for offset, at, n in runs:
                skip = min(n, max(0, held_from - at))
                at, offset, n = at + skip, offset + skip, n - skip
                if not n:  # (a run before the chunks read: the head a passage extends)
                    continue
                delta = np.full(n, start + offset - at)  # from its place in the entry
                keys[:, offset:offset + n] = rope.rerotate(k[:, at:at + n], delta, layer_ropes)
                values[:, offset:offset + n] = v[:, at:at + n]
                held[offset:offset + n] = True
            out.append((keys, values, held))
        messages += notes
        return out, n_bytes

    def _compute(self, rt: Runtime, prefix: list[int], keys: np.ndarray, values: np.ndarray,
                 known: np.ndarray, cancel) -> int:
        """Restore the assembled prefix once and compute every run of unknown tokens in place,
        in order (each attends to what is assembled before it); tokens computed."""
        runs = _runs(~known)
        # The cells of tokens not computed yet must hold numbers (`inplace.restore`), and
        # np.empty may hold NaNs.
        keys[:, ~known], values[:, ~known] = 0, 0
        seq = SeqState([KVState(keys, values, np.arange(len(prefix), dtype=np.int32),
                                v_trans=rt.layout.v_trans)])
        inplace.restore(rt, seq, prefix, runs, cancel=cancel)
        return int(sum(b - a for a, b in runs))


    def _compute_windowed(self, rt: Runtime, prefix: list[int], full: Assembly,
                          window: Assembly, end0: int, cancel) -> int:
        """A sliding-window model's `_compute`: each run computed after the prefix restored
        up to it, its KV taken back, then the whole prefix restored; tokens computed."""
        lay, n = rt.layout, len(prefix)
        todo = ~full.known
        # From the end back: a position is computed when its full-attention KV is unknown, or
        # its window KV is and a state restored (the final one, or one a token computed after
        # it is computed in) holds it in its window.
        reach = lay.window_start(n)
        for p in range(n - 1, end0 - 1, -1):
            if todo[p] or (p >= reach and not window.known[p]):
                todo[p] = True
                reach = min(reach, lay.window_start(p))
        runs = _runs(todo)
        try:
            for a, b in runs:
                if cancel is not None and cancel.is_set():
                    raise Cancelled("stopped while computing a blended prefix")
                self._restore_up_to(rt, prefix, full, window, a)
                rt.prefill(prefix[a:b], cancel=cancel, logits=False)
                back = [in_position_order(kv) for kv in rt.capture().sections]
                full.take(back[0], a, b)
                window.take(back[1], max(a, lay.window_start(b)), b)
            if not runs or runs[-1][1] < n:  # (else the context holds the prefix already)
                self._restore_up_to(rt, prefix, full, window, n)
        except BaseException:
            rt.reset()  # never a context holding part of an assembly
            raise
        return int(sum(b - a for a, b in runs))

    @staticmethod
    def _restore_up_to(rt: Runtime, prefix: list[int], full: Assembly, window: Assembly,
                       end: int) -> None:
        start = rt.layout.window_start(end)
        if not (full.known[:end].all() and window.known[start:end].all()):
            raise RuntimeStateError(f"a blended prefix of {end:,} tokens is not assembled whole")
        buf = rt.new_state_buffer(end)
        buf.keys[...], buf.values[...] = full.keys[:, :end], full.values[:, :end]
        if end > start:
            buf.window_keys[:, -(end - start):] = window.keys[:, start:end]
            buf.window_values[:, -(end - start):] = window.values[:, start:end]
        rt.restore_buffer(buf, prefix[:end])


@dataclass
class Assembly:
    """One cache section of a prefix being assembled: each position's KV and whether it is
    known (from a cache, or computed)."""

    keys: np.ndarray  # [layers, prefix tokens, channels]
    values: np.ndarray
    known: np.ndarray  # bool [prefix tokens]

    @classmethod
    def of(cls, like: KVState, n_tokens: int) -> Assembly:
        keys = np.empty((like.n_layer, n_tokens, like.channels), like.dtype)
        return cls(keys, np.empty_like(keys), np.zeros(n_tokens, bool))

    def take(self, kv: KVState, start: int, end: int) -> None:
        """Positions [start, end) from `kv` (in position order, holding them)."""
        if end <= start:
            return
        at = int(np.searchsorted(kv.positions, start))
        if at + end - start > kv.n_tokens or kv.positions[at + end - start - 1] != end - 1:
            raise RuntimeStateError(f"the context does not hold positions {start}..{end - 1}")
        self.keys[:, start:end] = kv.keys[:, at:at + end - start]
        self.values[:, start:end] = kv.values[:, at:at + end - start]
        self.known[start:end] = True


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) runs of True in `mask`."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first items `a` and `b` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _find(seq: Sequence[int], sub: list[int], start: int) -> int | None:
    first = sub[0]
    for i in range(start, len(seq) - len(sub) + 1):
        if seq[i] == first and list(seq[i:i + len(sub)]) == sub:
            return i
    return None
