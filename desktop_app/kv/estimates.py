"""What a restore would cost at each level, before it is asked for: the slider's tooltip.

From what the store holds of a prefix (sizes, never chunk bytes) and this machine's measured
speeds (`speeds`): bytes and seconds at each stored level, and from text. A chat over several
documents with no exact copy stored yet comes back blended (`blending`): its later documents
are read from their own caches and only their first tokens are computed again, so they are
counted so, not as recomputed whole.

This module reads the store's index only; it never reads a chunk, decodes or runs the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from store import Store

from ..model.runtime import Runtime
from ..results import RestoreEstimate
from .blending import Parts, leading
from .levels import EXACT
from .reading import TEXT
from .sources import LocalSource
from .speeds import Speeds
from .streaming import resume_points


def estimate(store: Store, rt: Runtime, tokens: Sequence[int], levels: Sequence[str],
             speeds: Speeds, blend: Parts | None = None,
             fraction: float = 0.0) -> RestoreEstimate:
    """Bytes and seconds a restore of `tokens` would take at each stored level (and from text);
    `blend`: the parts of a chat over several documents that come back blended, the first
    `fraction` of each later one computed again."""
    source = LocalSource(store, rt.fingerprint, tokens, touch=False)
    n, spans = source.n_tokens, list(source.spans)
    if rt.layout.swa_layers:  # up to the last entry end with a window, and that window
        ends = resume_points(source, rt.layout)
        n = ends[0] if ends else 0
        spans = [s for s in spans if s.token_end <= n] + list(source.windows.get(n, ()))
    later, blended, recomputed = [], 0, 0
    if blend is not None and blend.later and all(e is not None for e in blend.later):
        for entry, (start, end) in zip(blend.later, blend.layout.parts[1:], strict=False):
            later += store.spans(entry.id)
            blended += end - start
            recomputed += len(leading(fraction)(start, end - start))
    plain = store.level_bytes(spans)
    mixed = store.level_bytes([*spans, *later]) if later else plain
    per_level, seconds = {}, {}
    for lvl in levels:
        # (an exact restore never blends: it computes the later documents)
        sizes, covered, again = (plain, n, 0) if lvl == EXACT else (
            mixed, n + blended, recomputed)
        if lvl in sizes:
            per_level[lvl] = sizes[lvl]
            seconds[lvl] = round(sizes[lvl] / 1e6 / speeds.read_MBps
                                 + rt.layout.raw_bytes(covered) / 1e6 / speeds.decode(lvl)
                                 + (len(tokens) - covered + again) / speeds.prefill_tps, 4)
    seconds[TEXT] = round(len(tokens) / speeds.prefill_tps, 3)
    return RestoreEstimate(tokens=len(tokens), bytes=per_level, seconds=seconds)
