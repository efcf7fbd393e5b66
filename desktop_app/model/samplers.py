"""llama.cpp's sampler chain for a set of resolved generation options (`sampling.resolve`).

The stages in llama.cpp's own order: penalties, top-k, top-p, min-p, temperature, then the
draw (the most likely token at temperature 0). It only builds the chain: `Runtime.generate`
runs it, and `sampling` decides the values.
"""

from __future__ import annotations

import llama_cpp
from llama_cpp import _internals

from ..options import GenerationOptions


def chain(o: GenerationOptions, *, n_vocab: int, n_ctx: int) -> _internals.LlamaSampler:
    """A new sampler chain for `o` (every field resolved); the caller closes it."""
    sampler = _internals.LlamaSampler()
    last_n = n_ctx if o.repeat_last_n == -1 else o.repeat_last_n or 0
    penalized = last_n and (o.repeat_penalty or 1.0, o.presence_penalty or 0.0,
                            o.frequency_penalty or 0.0) != (1.0, 0.0, 0.0)
    if penalized:
        sampler.add_penalties(n_vocab, last_n, o.repeat_penalty or 1.0,
                              o.frequency_penalty or 0.0, o.presence_penalty or 0.0)
    if not o.temperature:
        sampler.add_greedy()
    else:
        if o.top_k:
            sampler.add_top_k(o.top_k)
        if o.top_p is not None and o.top_p < 1:
            sampler.add_top_p(o.top_p, 1)
        if o.min_p:
            sampler.add_min_p(o.min_p, 1)
        sampler.add_temp(o.temperature)
        sampler.add_dist(llama_cpp.LLAMA_DEFAULT_SEED if o.seed is None else o.seed)
    # The penalties look at the answer's own tokens only (the chain sees each token it
    # draws): an answer should be free to use the question's and the document's words,
    # and to end as the question's turn did (measured: benchmarks/RESULTS.md).
    return sampler
