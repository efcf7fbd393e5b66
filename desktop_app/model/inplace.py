"""Computing runs of tokens in the middle of the sequence a context holds, in place.

A blend (`kv.blending`) assembles a prefix from KV computed elsewhere, then computes some of
its tokens again — runs in the middle, each attending to everything before it and to nothing
after. llama.cpp computes a sequence's tokens only after the last position it holds, so each
run is computed in a second sequence (`SCRATCH`) that shares the cells before the run with the
prefix's own (seq 0): in one unified cache (kv_unified) a copy between sequences is metadata
only, and a cell belongs to the sequences listed in it (the attention of a token sees only its
own sequence's cells, and none at later positions). For each run [a, b):

    seq_rm(0, a, b)            the prefix's cells at the run freed (its new KV goes there)
    seq_cp(0, SCRATCH, 0, a)   the scratch sequence shares the prefix's cells before the run
    decode tokens[a:b] at positions a..b-1 as SCRATCH
    seq_cp(SCRATCH, 0, a, b)   the run's new cells join the prefix
    seq_rm(SCRATCH, -1, -1)    the scratch sequence gone: every cell is seq 0's alone again

So the assembled prefix is restored once, not once per run. Checked against llama.cpp's
llama_kv_cache (seq_cp within one stream: "no data copy is necessary"; across streams, as
without kv_unified, only whole buffers) and against the restore-per-run way it replaces
(tests/test_inplace.py: the same KV, bit for bit here). llama_cpp.Llama makes its context with
one sequence; the first `restore` makes it again with two (`_add_scratch_sequence`).

It never leaves the scratch sequence behind (on failure or cancellation the context is reset),
never leaves a runtime without a context (a second sequence llama.cpp cannot make: the
one-sequence context made back, `Unavailable`, and the caller computes exactly), and never
serves a model with sliding-window layers: a restored window holds only the last positions,
not those before a run, and its cache would grow with the sequences (n_swa each); `blending`
restores such a model's prefix up to each run instead.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import llama_cpp
from llama_cpp import _internals

from ..errors import Cancelled, RuntimeStateError

if TYPE_CHECKING:
    import threading

    from .kvstate import SeqState
    from .runtime import Runtime

SCRATCH = 1  # the sequence runs are computed in; the context's own is 0


class Unavailable(RuntimeStateError):
    """This context cannot compute in place (no second sequence could be made); it holds
    nothing, and a caller computes exactly instead."""


# Runtimes whose context could not be made with a second sequence: not asked again.
_REFUSED: weakref.WeakSet[Runtime] = weakref.WeakSet()


def can_compute(rt: Runtime) -> bool:
    """Whether `restore` can compute in `rt`: a model without sliding-window layers, whose
    context llama.cpp could make with two sequences (or has not been asked to yet)."""
    return llama_cpp.llama_model_n_swa(rt.llm._model.model) == 0 and rt not in _REFUSED


def restore(rt: Runtime, state: SeqState, tokens: Sequence[int],
            runs: Sequence[tuple[int, int]], *, cancel: threading.Event | None = None) -> None:
    """Load `state` for `tokens` into `rt`, then compute the tokens of each [start, end) run
    again, in order, each attending to every position before it (earlier runs already
    computed again) and to nothing after; what `state` holds at the runs' positions is
    replaced (it must be finite: attention multiplies the masked cells it spans by zero).
    On failure or cancellation (`Cancelled`) the context is reset."""
    if any(not 0 <= a < b <= len(tokens) for a, b in runs):
        raise ValueError(f"runs {list(runs)} are not inside the {len(tokens)} tokens")
    _add_scratch_sequence(rt)
    rt.restore(state, tokens)
    tokens, ctx = list(tokens), rt.llm._ctx.ctx
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


def _add_scratch_sequence(rt: Runtime) -> None:
    """Make `rt`'s context again with two sequences in one unified cache, the first time it
    is needed (its KV is lost: call before a restore). llama_cpp.Llama takes neither setting,
    and a context made twice at every load would cost each process ~1 s at n_ctx 8192 on a
    busy machine (the cache allocated and cleared again), so only a blend pays it, once."""
    llm = rt.llm
    if llama_cpp.llama_n_seq_max(llm._ctx.ctx) > SCRATCH:
        return
    if llama_cpp.llama_model_n_swa(llm._model.model) != 0:
        raise RuntimeStateError("a sliding-window model's cache cannot compute tokens in place")
    if rt in _REFUSED:
        raise Unavailable("llama.cpp could not make this context with two sequences")
    params = llm.context_params
    before = params.n_seq_max, params.kv_unified
    rt.reset()
    llm._ctx.close()  # (its cache's memory back before the new one takes as much)
    try:
        params.n_seq_max, params.kv_unified = 2, True
        llm._ctx = _context(llm, params)
    except ValueError as e:
        # The one-sequence context back, as it was: the runtime must never be left without
        # one (its next call would use a freed context).
        params.n_seq_max, params.kv_unified = before
        llm._ctx = _context(llm, params)
        rt.reset()
        _REFUSED.add(rt)
        raise Unavailable(f"llama.cpp could not make a context of two sequences ({e})") from e
    rt.reset()


def _context(llm, params) -> _internals.LlamaContext:
    return llm._stack.enter_context(contextlib.closing(
        _internals.LlamaContext(model=llm._model, params=params, verbose=llm.verbose)))


def _decode(ctx, batch, tokens: Sequence[int], start: int) -> None:
    """Evaluate `tokens` at positions start.. as the scratch sequence, keeping no logits."""
    batch.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
        batch.seq_id[i][0], batch.logits[i] = SCRATCH, False
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeStateError(f"llama.cpp could not compute {len(tokens)} tokens at "
                                f"position {start} in place")
