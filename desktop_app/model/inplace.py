"""Computing runs of tokens in the middle of the sequence a context holds, in place.

A blend (`kv.blending`) assembles a prefix from KV computed elsewhere, then computes some of
its tokens again — runs in the middle, each attending to everything before it and to nothing
after. llama.cpp computes a sequence's tokens only after the last position it holds, so each
run is computed in a second sequence (`SCRATCH`) that shares the cells before the run with the
prefix's own (seq 0): in one unified cache (kv_unified) a copy between sequences is metadata
only, and a cell belongs to the sequences listed in it (the attention of a token sees only its
own sequence's cells, and none at later positions). For each run [a, b):

    seq_rm(0, a, b)         the prefix's cells at the run are freed (the run's new KV goes there)
    seq_cp(0, SCRATCH, 0, a)  the scratch sequence shares the prefix's cells before the run
    decode tokens[a:b] at positions a..b-1 as SCRATCH
    seq_cp(SCRATCH, 0, a, b)  the run's new cells join the prefix
    seq_rm(SCRATCH, -1, -1)  the scratch sequence is gone: every cell is seq 0's alone again

So the assembled prefix is restored once, not once per run. Checked against llama.cpp's
llama_kv_cache (seq_cp within one stream: "no data copy is necessary"; across streams, as
without kv_unified, a whole-buffer copy only) and against the restore-per-run way it replaces
(tests/test_inplace.py).

It never leaves the scratch sequence behind (on failure or cancellation the context is reset)
and never touches a model with sliding-window layers: their window cache would grow with the
sequences (n_swa per sequence) and blending is off for them (`chat.sessions`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import llama_cpp
from llama_cpp import _internals

from ..errors import Cancelled, RuntimeStateError

if TYPE_CHECKING:
    import threading

    from .runtime import Runtime

SCRATCH = 1  # the sequence runs are computed in; the context's own is 0


def add_scratch_sequence(llm: llama_cpp.Llama) -> None:
    """Give `llm` a context of two sequences in one unified cache (what `compute` needs),
    unless its model has sliding-window layers. llama_cpp.Llama takes neither setting, so
    its context is made again with them (the first one freed before: the cache's memory)."""
    if llama_cpp.llama_model_n_swa(llm._model.model) > 0:
        return
    params = llm.context_params
    params.n_seq_max, params.kv_unified = 2, True
    llm._ctx.close()
    llm._ctx = llm._stack.enter_context(contextlib.closing(
        _internals.LlamaContext(model=llm._model, params=params, verbose=llm.verbose)))


def can_compute(rt: Runtime) -> bool:
    """Whether `rt`'s context has the scratch sequence `compute` needs."""
    return llama_cpp.llama_n_seq_max(rt.llm._ctx.ctx) > SCRATCH


def compute(rt: Runtime, runs: Sequence[tuple[int, int]], *,
            cancel: threading.Event | None = None) -> None:
    """Compute the tokens of each [start, end) run of the sequence `rt` holds again, in order,
    each attending to every position before it (earlier runs already computed again) and to
    nothing after; what the context held at the runs' positions is replaced. On failure or
    cancellation (`Cancelled`) the context is reset."""
    if not can_compute(rt):
        raise RuntimeStateError("this context has no second sequence to compute tokens in")
    tokens, ctx = rt.tokens, rt.llm._ctx.ctx
    if any(not 0 <= a < b <= len(tokens) for a, b in runs):
        raise ValueError(f"runs {list(runs)} are not inside the {len(tokens)} tokens held")
    memory = llama_cpp.llama_get_memory(ctx)
    piece = rt.llm.n_batch  # tokens one decode takes; a run is a few % of a part
    batch = llama_cpp.llama_batch_init(piece, 0, 1)
    try:
        for a, b in runs:
            llama_cpp.llama_memory_seq_rm(memory, 0, a, b)
            llama_cpp.llama_memory_seq_cp(memory, 0, SCRATCH, 0, a)
            for start in range(a, b, piece):
                if cancel is not None and cancel.is_set():
                    raise Cancelled("stopped while computing a blended prefix")
                _decode(ctx, batch, tokens[start:min(b, start + piece)], start)
            llama_cpp.llama_memory_seq_cp(memory, SCRATCH, 0, a, b)
            llama_cpp.llama_memory_seq_rm(memory, SCRATCH, -1, -1)
    except BaseException:
        rt.reset()
        raise
    finally:
        llama_cpp.llama_batch_free(batch)


def _decode(ctx, batch, tokens: Sequence[int], start: int) -> None:
    """Evaluate `tokens` at positions start.. as the scratch sequence, keeping no logits."""
    batch.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
        batch.seq_id[i][0], batch.logits[i] = SCRATCH, False
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeStateError(f"llama.cpp could not compute {len(tokens)} tokens at "
                                f"position {start} in place")
