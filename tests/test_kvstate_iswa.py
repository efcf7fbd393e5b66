"""The bridge on sliding-window (iSWA) states: Gemma 3's two cache sections round-trip byte for
byte, a restored state continues like a plain prefill, and anything else is still refused."""

from __future__ import annotations

import numpy as np
import pytest

from desktop_app.model.kvstate import (
    KVState,
    KVStateError,
    SeqState,
    build_seq_sections,
    build_seq_state,
    parse_seq_sections,
    parse_seq_state,
)

# Gemma 3 270M: 18 layers, every sixth full attention; one KV head of 256; window 512.
GEMMA_FULL_LAYERS, GEMMA_SWA_LAYERS, GEMMA_CHANNELS, GEMMA_WINDOW = 3, 15, 256, 512


def section(n_layer, positions, channels=8, v_trans=True, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n_layer, len(positions), channels)
    return KVState(rng.standard_normal(shape).astype(np.float16),
                   rng.standard_normal(shape).astype(np.float16),
                   np.asarray(positions, np.int32), v_trans)


@pytest.mark.parametrize("v_trans", [False, True])
def test_synthetic_two_sections_round_trip(v_trans):
    # The window section is a suffix of the positions, in ring-buffer (not sorted) order.
    state = SeqState([section(2, range(10), v_trans=v_trans),
                      section(4, [7, 8, 9, 4, 5, 6], v_trans=v_trans, seed=1)])
    data = build_seq_sections(state)
    back = parse_seq_sections(data)
    assert back.is_iswa and [s.n_layer for s in back.sections] == [2, 4]
    for a, b in zip(state.sections, back.sections, strict=True):
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.positions, b.positions)
    assert build_seq_sections(back) == data
    with pytest.raises(KVStateError, match="parse_seq_sections"):
        parse_seq_state(data)


def test_one_section_is_the_plain_state():
    kv = section(3, range(5))
    assert build_seq_sections(SeqState([kv])) == build_seq_state(kv)
    assert not parse_seq_sections(build_seq_state(kv)).is_iswa


def test_a_third_section_is_refused():
    data = build_seq_sections(SeqState([section(2, range(4)), section(2, range(2, 4))]))
    extra = build_seq_state(section(1, range(4)))[8:]
    with pytest.raises(KVStateError, match="follow 2 cache sections"):
        parse_seq_sections(data + extra)


def test_a_window_outside_the_full_section_is_refused():
    data = build_seq_sections(SeqState([section(2, range(4)), section(2, [3, 4])]))
    with pytest.raises(KVStateError, match="not a subset"):
        parse_seq_sections(data)


@pytest.mark.model
def test_gemma_state_round_trips_and_restores_like_a_prefill(gemma_path):
    import pydoc_data.topics

    from desktop_app.calibration.quality import greedy
    from desktop_app.model.runtime import Runtime

    text = "\n\n".join(pydoc_data.topics.topics[k] for k in ("if", "while", "for", "try"))
    n = GEMMA_WINDOW + 88  # past the window: the sliding section holds only its last 512
    # Without flash attention: llama.cpp's CPU kernel accumulates in fp16 and its result then
    # depends on where cells sit in the cache, which a restore changes (see quality.py).
    rt = Runtime(gemma_path, model_hash="test", n_ctx=n + 16, flash_attn=False)
    try:
        tokens = rt.tokenize(text, add_bos=True, special=False)[:n]
        assert len(tokens) == n
        rt.prefill(tokens)
        data = rt.state_bytes()
        seq = parse_seq_sections(data)
        full, swa = seq.sections
        assert (full.n_layer, full.n_tokens, full.channels) == (GEMMA_FULL_LAYERS, n,
                                                                GEMMA_CHANNELS)
        assert (swa.n_layer, swa.n_tokens, swa.channels) == (GEMMA_SWA_LAYERS, GEMMA_WINDOW,
                                                             GEMMA_CHANNELS)
        assert sorted(swa.positions) == list(range(n - GEMMA_WINDOW, n))
        rebuilt = build_seq_sections(seq)
        assert rebuilt == data
        after_prefill = greedy(rt, 8)
        rt.restore_bytes(rebuilt, tokens)  # a cleared cache: the cells land in other slots
        assert greedy(rt, 8) == after_prefill
    finally:
        rt.close()
