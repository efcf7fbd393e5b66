"""Runs of tokens computed in place in the middle of a held sequence (`model.inplace`): the
same KV and the same next-token logits as restoring the assembled prefix before each run and
prefilling it (the way blending computed them before, kept as the reference in
benchmarks/bench_blend_compute.py), with flash attention off and on; the scratch sequence gone
afterwards; a cancelled or bad call leaves nothing half-done; a sliding-window model refused."""

from __future__ import annotations

import threading

import llama_cpp
import numpy as np
import pytest

from benchmarks.bench_blend_compute import restore_per_run, state
from desktop_app.errors import Cancelled, RuntimeStateError
from desktop_app.model import inplace
from desktop_app.model.kvstate import in_position_order
from desktop_app.model.runtime import Runtime

TEXT = ("The ferry to Cape Morrow leaves at 07:15 and 16:40 on weekdays. On Saturdays it sails "
        "once, at 10:00. The keeper's cottage became a museum in 1979; it keeps the logbooks, a "
        "brass telescope and a barometer that still works. The tower is 31 metres tall. " * 3)
# Relative to the keys' and values' largest magnitude: f16 cache cells are ~1e-3 apart there.
KV_TOLERANCE = 2e-3
LOGIT_TOLERANCE = 1e-2  # of the logits' range


def assembled(rt, tokens):
    """An assembled prefix as a blend makes one: every position's KV approximate (the exact
    KV, perturbed), as if computed elsewhere."""
    rt.reset()
    rt.prefill(tokens)
    kv = in_position_order(rt.capture().sections[0])
    rng = np.random.default_rng(7)
    keys = (kv.keys * (1 + 0.05 * rng.standard_normal(kv.keys.shape))).astype(kv.dtype)
    values = (kv.values * (1 + 0.05 * rng.standard_normal(kv.values.shape))).astype(kv.dtype)
    return keys, values


def in_place(rt, tokens, keys, values, runs, cancel=None):
    keys, values = keys.copy(), values.copy()
    for a, b in runs:  # what a blend holds there: nothing computed yet
        keys[:, a:b], values[:, a:b] = 0, 0
    inplace.restore(rt, state(rt, keys, values), tokens, runs, cancel=cancel)


def held(rt):
    kv = in_position_order(rt.capture().sections[0])
    return kv.keys.astype(np.float32), kv.values.astype(np.float32)


def next_logits(rt, token):
    rt.prefill([token])
    return rt.logits()


def scratch_empty(rt) -> bool:
    memory = llama_cpp.llama_get_memory(rt.llm._ctx.ctx)
    return llama_cpp.llama_memory_seq_pos_max(memory, inplace.SCRATCH) == -1


def test_runs_computed_in_place_equal_a_restore_per_run(any_runtime):
    rt = any_runtime
    assert inplace.can_compute(rt)
    tokens = rt.tokenize(TEXT, add_bos=rt.adds_bos)
    n = len(tokens)
    runs = [(20, 31), (n // 3, n // 3 + 7), (n // 2, n // 2 + n // 4), (n - 9, n)]
    keys, values = assembled(rt, tokens)
    probe = rt.tokenize(" The")[0]

    restore_per_run(rt, tokens, keys, values, runs)
    want_k, want_v = held(rt)
    want_logits = next_logits(rt, probe)

    in_place(rt, tokens, keys, values, runs)
    assert scratch_empty(rt) and rt.tokens == tokens
    got_k, got_v = held(rt)
    assert got_k.shape == want_k.shape
    assert np.abs(got_k - want_k).max() <= KV_TOLERANCE * np.abs(want_k).max()
    assert np.abs(got_v - want_v).max() <= KV_TOLERANCE * np.abs(want_v).max()
    # The runs really were computed again: their KV is no longer the assembled one.
    a, b = runs[1]
    assert np.abs(got_k[:, a:b] - keys[:, a:b].astype(np.float32)).max() > \
        10 * KV_TOLERANCE * np.abs(want_k).max()
    got_logits = next_logits(rt, probe)
    spread = float(want_logits.max() - want_logits.min())
    assert np.abs(got_logits - want_logits).max() <= LOGIT_TOLERANCE * spread
    assert int(got_logits.argmax()) == int(want_logits.argmax())


def test_a_cancelled_or_bad_call_leaves_nothing_half_done(runtime):
    rt = runtime
    tokens = rt.tokenize(TEXT, add_bos=rt.adds_bos)
    keys, values = assembled(rt, tokens)
    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled):
        in_place(rt, tokens, keys, values, [(10, 20)], cancel=stop)
    assert rt.n_tokens == 0 and scratch_empty(rt)  # reset: no prefix with a hole in it
    rt.restore(state(rt, keys, values), tokens)
    with pytest.raises(ValueError, match="not inside"):
        inplace.restore(rt, state(rt, keys, values), tokens, [(10, len(tokens) + 1)])
    assert rt.tokens == tokens and scratch_empty(rt)  # refused before anything changed


def test_a_sliding_window_model_is_refused_and_keeps_its_one_sequence(gemma_path):
    rt = Runtime(gemma_path, model_hash="gemma3-270m", n_ctx=512)
    try:
        assert not inplace.can_compute(rt)
        tokens = rt.tokenize(TEXT, add_bos=rt.adds_bos)[:64]
        rt.prefill(tokens)
        with pytest.raises(RuntimeStateError, match="sliding-window"):
            inplace.restore(rt, rt.capture(), tokens, [(10, 20)])
        assert llama_cpp.llama_n_seq_max(rt.llm._ctx.ctx) == 1 and rt.tokens == tokens
    finally:
        rt.close()


def test_a_context_llama_cpp_cannot_make_again_leaves_the_old_one(model_path,
                                                                 no_second_sequence):
    """The two-sequence context refused (memory, say): the one-sequence context is made back,
    usable, and the runtime is not asked again; a caller computes exactly."""
    rt = Runtime(model_path, model_hash="refused", n_ctx=512)
    try:
        tokens = rt.tokenize(TEXT, add_bos=rt.adds_bos)[:80]
        rt.prefill(tokens)
        kv = rt.capture()
        with pytest.raises(inplace.Unavailable, match="two sequences"):
            inplace.restore(rt, kv, tokens, [(10, 20)])
        assert not inplace.can_compute(rt)
        assert llama_cpp.llama_n_seq_max(rt.llm._ctx.ctx) == 1 and rt.n_tokens == 0
        rt.prefill(tokens)  # the context made back works
        assert rt.tokens == tokens and np.isfinite(rt.logits()).all()
        with pytest.raises(inplace.Unavailable):  # and is not rebuilt again
            inplace.restore(rt, kv, tokens, [(10, 20)])
        assert rt.tokens == tokens
    finally:
        rt.close()
