"""The exact KV bridge: byte-for-byte round trips, and refusal of everything else."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from desktop_app.model.kvstate import (
    SEQ_STATE_MAGIC,
    KVState,
    KVStateError,
    StateBuffer,
    build_seq_state,
    parse_seq_state,
)

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3


def synthetic(n_layer=3, n_tokens=5, channels=8, dtype=np.float16, v_trans=True, seq_id=0):
    rng = np.random.default_rng(0)
    shape = (n_layer, n_tokens, channels)
    return KVState(
        keys=rng.standard_normal(shape).astype(dtype),
        values=rng.standard_normal(shape).astype(dtype),
        positions=np.arange(n_tokens, dtype=np.int32),
        v_trans=v_trans,
        seq_id=seq_id,
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("v_trans", [False, True])
def test_synthetic_round_trip(dtype, v_trans):
    kv = synthetic(dtype=dtype, v_trans=v_trans)
    data = build_seq_state(kv)
    back = parse_seq_state(data)
    assert back.keys.dtype == dtype and back.v_trans == v_trans
    np.testing.assert_array_equal(back.keys, kv.keys)
    np.testing.assert_array_equal(back.values, kv.values)
    np.testing.assert_array_equal(back.positions, kv.positions)
    assert build_seq_state(back) == data


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("window", [None, (2, np.arange(3, 7))])
def test_state_buffer_writes_every_byte(v_trans, window):
    """A state buffer is not zero-filled (and may be the previous restore's): filled over any
    old bytes, it must come out the same."""
    kv = synthetic(v_trans=v_trans)

    def filled(old: int) -> bytes:
        size = len(StateBuffer(*kv.keys.shape, kv.keys.dtype, v_trans=v_trans,
                               window=window).data)
        buf = StateBuffer(*kv.keys.shape, kv.keys.dtype, v_trans=v_trans, window=window,
                          reuse=np.full(size, old, np.uint8))
        buf.keys[:], buf.values[:] = kv.keys, kv.values
        if window is not None:
            buf.window_keys[:] = buf.window_values[:] = 1.5
        return bytes(buf.data)

    assert filled(0x00) == filled(0xFF)
    if window is None:
        assert filled(0xAB) == build_seq_state(kv)


def test_transposed_values_are_token_major():
    kv = synthetic(v_trans=True)
    data = build_seq_state(kv)
    # layout: header 12, count 4, cells 12*n, v_trans+n_layer 8, K layers (12 + n*c*2 each)
    n_layer, n, c = kv.keys.shape
    v0 = 12 + 4 + 12 * n + 8 + n_layer * (12 + n * c * 2) + 12
    first_channel = np.frombuffer(data[v0 : v0 + 2 * n], dtype="<f2")
    np.testing.assert_array_equal(first_channel, kv.values[0, :, 0])


def test_empty_state_round_trip():
    data = struct.pack("<IiII", SEQ_STATE_MAGIC, 0, 1, 0)
    kv = parse_seq_state(data)
    assert kv.n_tokens == 0
    assert build_seq_state(kv) == data


def test_real_state_round_trip_is_byte_exact(any_runtime):
    rt = any_runtime
    rt.reset()
    rt.prefill(rt.tokenize(PROMPT, add_bos=rt.adds_bos))
    data = rt.state_bytes()
    kv = parse_seq_state(data)
    lay = rt.layout
    assert kv.keys.shape == (lay.n_layer, rt.n_tokens, lay.channels)
    assert kv.v_trans == lay.v_trans
    assert kv.keys.dtype == np.float16
    np.testing.assert_array_equal(kv.positions, np.arange(rt.n_tokens))
    assert np.isfinite(kv.keys).all() and np.isfinite(kv.values).all()
    assert build_seq_state(kv) == data


def every_cut(data: bytes):
    """Truncation points across every region, densely at the start and around boundaries."""
    cuts = set(range(0, min(len(data), 200)))
    cuts |= set(range(0, len(data), max(1, len(data) // 300)))
    cuts |= {len(data) - k for k in range(1, 40)}
    return sorted(c for c in cuts if 0 <= c < len(data))


def test_truncated_states_are_refused(runtime):
    runtime.reset()
    runtime.prefill(runtime.tokenize("Hello there"))
    data = runtime.state_bytes()
    for cut in every_cut(data):
        with pytest.raises(KVStateError):
            parse_seq_state(data[:cut])


def test_trailing_section_is_refused():
    data = build_seq_state(synthetic())
    with pytest.raises(KVStateError, match="second cache section"):
        parse_seq_state(data + struct.pack("<II", 1, 0))


@pytest.mark.parametrize(
    "offset, value, message",
    [
        (0, 0xDEADBEEF, "not a llama.cpp sequence state"),
        (8, 2, "2 KV streams"),
        (16 + 4, 2, "n_seq_id=2"),  # first cell's id count: per-cell extension or several seqs
        (16 + 8, 7, "seq_id=7"),
        (16 + 12 * 5, 2, "v_trans is 2"),
        (16 + 12 * 5 + 8, 8, "q8_0 is not supported"),  # layer 0 K type
    ],
)
def test_garbled_fields_are_refused(offset, value, message):
    data = bytearray(build_seq_state(synthetic()))
    data[offset : offset + 4] = struct.pack("<I", value)
    with pytest.raises(KVStateError, match=message):
        parse_seq_state(bytes(data))


def test_foreign_bytes_are_refused():
    rng = np.random.default_rng(1)
    for n in (0, 3, 64, 10_000):
        with pytest.raises(KVStateError):
            parse_seq_state(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    with pytest.raises(KVStateError):
        parse_seq_state(b"GGUF" + bytes(100))


def test_real_quantized_cache_is_refused(model_path):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=256, flash_attn=True,
                          type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0,
                          verbose=False)
    try:
        llm.eval(llm.tokenize(b"Hello there"))
        size = llama_cpp.llama_state_seq_get_size(llm._ctx.ctx, 0)
        buf = (llama_cpp.ctypes.c_uint8 * size)()
        llama_cpp.llama_state_seq_get_data(llm._ctx.ctx, buf, size, 0)
        with pytest.raises(KVStateError, match="q8_0 is not supported"):
            parse_seq_state(bytes(buf))
    finally:
        llm.close()


def test_mixed_layer_widths_refused():
    kv = synthetic(n_layer=2)
    data = bytearray(build_seq_state(kv))
    k1 = 16 + 12 * 5 + 8 + (12 + 5 * 8 * 2)  # layer 1 K header
    data[k1 + 4 : k1 + 12] = struct.pack("<Q", 4 * 2)
    with pytest.raises(KVStateError, match="different widths"):
        parse_seq_state(bytes(data))
