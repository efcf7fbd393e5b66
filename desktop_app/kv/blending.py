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

Blended KV is approximate and is never stored: the engine computes the exact prefix in the
background (`exactness`) and stores that. This module never writes to the store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from store import Entry, Store

from ..calibration.calibrations import Calibrations
from ..model import inplace, rope
from ..model.kvstate import KVState, SeqState, in_position_order
from ..model.prompts import Layout
from ..model.runtime import Runtime
from ..options import RestoreOptions
from ..results import Progress, RestoreReport
from . import streaming
from .sources import ChunkSource, SpanSource
from .speeds import Speeds

ANCHOR = 8  # tokens of a document's opening that must match to find it inside its prefix

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
    recomputed_tokens: int  # computed in the combined context
    mode: str  # "blended" (approximate: reused KV) | "exact" (a stored or computed prefix)
    exact_until: int = 0  # the prefix's first position whose KV is approximate

    def as_dict(self) -> dict:
        return {"reused_tokens": self.reused_tokens, "recomputed_tokens":
                self.recomputed_tokens, "mode": self.mode}


@dataclass(frozen=True)
class Parts:
    """What a blend is asked to assemble: a prefix's layout and each later part's own entry
    (None: not cached here), with what making them ready took (notes, tokens computed)."""

    layout: Layout
    later: Sequence[Entry | None]
    notes: Sequence[str] = ()
    computed_tokens: int = 0


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
        here), and a model whose keys kvdesk can move and compute between (`inplace`)."""
        return any(e is not None for e in later) and inplace.can_compute(rt) \
            and self.ropes(rt) is not None

    def restore(self, rt: Runtime, layout: Layout, later: Sequence[Entry | None],
                first: ChunkSource, *, options: RestoreOptions, speeds: Speeds, select: Select,
                progress: Callable[[Progress], None] | None = None,
                cancel: threading.Event | None = None) -> tuple[RestoreReport, Blend]:
        """Make `rt` hold the layout's prefix: its first part's cached prefix restored from
        `first`, each later part's own entry (`later`: a document's, or a passage's) moved
        after it, the selected tokens and what no cache holds computed in place."""
        t0 = time.perf_counter()
        prefix = list(layout.tokens)
        end0 = layout.parts[0][1]
        head = streaming.restore(rt, first, prefix[:end0], levels=self.levels, options=options,
                                 speeds=speeds, chunk_tokens=self.chunk_tokens,
                                 progress=progress, cancel=cancel,
                                 calibrations=self.calibrations.resolver(rt.fingerprint))
        kv = in_position_order(rt.capture().sections[0])
        keys = np.empty((kv.n_layer, len(prefix), kv.channels), kv.dtype)
        values = np.empty_like(keys)
        keys[:, :end0], values[:, :end0] = kv.keys[:, :end0], kv.values[:, :end0]
        known = np.zeros(len(prefix), bool)
        known[:end0] = True
        messages, levels, n_bytes = list(head.messages), list(head.chunk_levels), head.bytes_read
        ropes = self.ropes(rt)
        for entry, (start, end) in zip(later, layout.parts[1:], strict=False):
            got = self._reuse(rt, entry, prefix[start:end], ropes, options, speeds, cancel,
                              messages, levels)
            if got is None:
                continue
            part_keys, part_values, held, read = got
            keys[:, start:end], values[:, start:end] = part_keys, part_values
            known[start:end] = held
            n_bytes += read
            for p in select(start, end - start):
                known[p] = False
        reused = int(known[end0:].sum())
        approximate = np.flatnonzero(known[end0:])
        exact_until = end0 + int(approximate[0]) if len(approximate) else len(prefix)
        computed = self._compute(rt, prefix, keys, values, known, cancel)
        return RestoreReport(
            tokens=len(prefix), restore_s=time.perf_counter() - t0, bytes_read=n_bytes,
            chunk_levels=levels, recomputed_tokens=head.recomputed_tokens + computed,
            messages=messages, source=head.source, adapted_chunks=head.adapted_chunks), \
            Blend(reused, computed, "blended", exact_until)

    def _reuse(self, rt, entry, part, ropes, options, speeds, cancel, messages, levels):
        """(keys, values, which tokens are held, bytes read) of a later part from its own
        entry, moved into place; None when there is nothing to reuse."""
        if entry is None or entry.parent_id is not None:
            return None
        stored = self.store.tokens(entry.id)
        runs = [r for r in align(part, stored) if r[2] > 0]
        if not runs:
            return None
        spans = [s for s in self.store.spans(entry.id)
                 if any(s.token_start < ss + n and ss < s.token_end for _, ss, n in runs)]
        lay = rt.layout
        k = np.empty((lay.n_layer, entry.token_end, lay.channels), rt.cache_dtype)
        v = np.empty_like(k)
        read, n_bytes = streaming.read_chunks(
            SpanSource(self.store, spans), stored, k, v, levels=self.levels, options=options,
            speeds=speeds, bytes_per_token=lay.kv_bytes_per_token, cancel=cancel,
            calibrations=self.calibrations.resolver(rt.fingerprint),
            chunk_levels=levels, messages=messages)
        if read < spans[-1].token_end:
            what = f"document {entry.document_id}" if not entry.passage else "a passage"
            messages.append(f"the cache of {what} could not be read whole: computing it")
            return None
        keys = np.empty((lay.n_layer, len(part), lay.channels), k.dtype)
        values = np.empty_like(keys)
        held = np.zeros(len(part), bool)
        for offset, at, n in runs:
            delta = np.full(n, offset - at)
            keys[:, offset:offset + n] = rope.rerotate(k[:, at:at + n], delta, ropes)
            values[:, offset:offset + n] = v[:, at:at + n]
            held[offset:offset + n] = True
        return keys, values, held, n_bytes

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
