"""Moving cached keys to new positions: llama.cpp's own shift agrees on every layer (the
probe), and a fresh prefill of the same tokens at the new positions agrees on the first layer
(whose keys depend on the token alone), for the default model's RoPE and Gemma 3's."""

from __future__ import annotations

import numpy as np
import pytest

from desktop_app.model import rope
from desktop_app.model.kvstate import in_position_order, parse_seq_sections
from desktop_app.model.runtime import Runtime

TEXT = "Granite from the island, carried on carts at low tide, built the lighthouse in 1871."


def first_layer_keys(rt: Runtime, tokens: list[int]) -> tuple[np.ndarray, int]:
    """The model's first layer's keys, and that layer's index in the probe's layer order.

    With two cache sections (sliding-window models) the first layer is the window section's
    first (Gemma 3: layers 5, 11, 17 attend fully; 0 does not), listed after the full ones."""
    rt.reset()
    rt.prefill(tokens)
    sections = parse_seq_sections(rt.state_bytes()).sections
    before = sum(kv.n_layer for kv in sections[:-1])
    return in_position_order(sections[-1]).keys[:1], before


def check(rt: Runtime) -> None:
    ropes = rope.probe(rt)  # raises if some layer's keys move otherwise
    assert len(ropes) >= rt.layout.n_layer
    text = rt.tokenize(TEXT)
    head = rt.tokenize(" ", add_bos=rt.adds_bos)[: len(rt.tokenize("", add_bos=rt.adds_bos))]
    pad = rt.tokenize(" and so on" * 40)
    at_start, layer = first_layer_keys(rt, head + text)
    later, _ = first_layer_keys(rt, head + pad + text)
    n = len(text)
    layer_rope = ropes[layer : layer + 1]
    moved = rope.rerotate(at_start[:, -n:], np.full(n, len(pad)), layer_rope)
    want = later[:, -n:].astype(np.float32)
    assert np.abs(moved.astype(np.float32) - want).max() <= 0.01 * np.abs(want).max()
    # ...and a rotation undone is the identity, within fp16 rounding.
    back = rope.rerotate(moved, np.full(n, -len(pad)), layer_rope).astype(np.float32)
    assert np.abs(back - at_start[:, -n:]).max() <= 0.01 * np.abs(want).max()


def test_the_default_models_keys_move_exactly(runtime):
    check(runtime)


@pytest.mark.model
def test_gemma_3s_keys_move_exactly(gemma_path, model_hash):
    rt = Runtime(gemma_path, model_hash=model_hash, n_ctx=1024)
    try:
        check(rt)
    finally:
        rt.close()


def _turned(keys: np.ndarray, delta: np.ndarray, r: rope.Rope) -> np.ndarray:
    """The definition: each channel pair of each head as a complex number, times
    e^(i delta theta), in float64 (channels past the pairs unchanged)."""
    n = len(r.theta)
    heads = keys.astype(np.float64).reshape(keys.shape[0], -1, r.head_dim).copy()
    a, b = (np.arange(0, 2 * n, 2), np.arange(1, 2 * n, 2)) if r.kind == "norm" else \
        (np.arange(n), np.arange(n, 2 * n))
    z = (heads[:, :, a] + 1j * heads[:, :, b]) * np.exp(1j * delta[:, None, None] * r.theta)
    heads[:, :, a], heads[:, :, b] = z.real, z.imag
    return heads.reshape(keys.shape)


@pytest.mark.parametrize("kind", ["norm", "neox"])
@pytest.mark.parametrize("constant", [False, True])
def test_rerotate_turns_each_pair_by_its_angle(kind, constant):
    """Against the complex-number definition, per layer (layers of two bases, as a
    sliding-window model has; 24 of 32 channels of each head rotated), to fp16 rounding."""
    rng = np.random.default_rng(1)
    keys = rng.standard_normal((3, 50, 64)).astype(np.float16)
    delta = np.full(50, 777) if constant else rng.integers(-3000, 3000, 50)
    ropes = [rope.Rope(kind, 32, base ** (-np.arange(0, 24, 2) / 24))
             for base in (10000.0, 1e6, 10000.0)]
    out = rope.rerotate(keys, delta, ropes)
    assert out.dtype == keys.dtype and out.shape == keys.shape
    for layer, r in enumerate(ropes):
        want = _turned(keys[layer], delta.astype(np.float64), r)
        assert np.abs(out[layer].astype(np.float64) - want).max() <= 4e-3
        untouched = np.arange(64) % 32 >= 24
        assert np.array_equal(out[layer][:, untouched], keys[layer][:, untouched])
