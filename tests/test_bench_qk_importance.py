"""benchmarks.qk_importance on the real default model: the graph callback captures the keys
llama.cpp caches (so the ctypes view of ggml_tensor is right), W_o is read at the shape the
model has, and step weights keep each layer's geometric mean."""

from __future__ import annotations

import pydoc_data.topics

import numpy as np
import pytest

from benchmarks import qk_importance as calibration
from desktop_app.model import kvstate
from desktop_app.model.runtime import Runtime

pytestmark = pytest.mark.model

TEXT = "\n\n".join(pydoc_data.topics.topics[k] for k in ("if", "while", "for"))
N = 96


@pytest.fixture(scope="module")
def tokens(model_path):
    rt = Runtime(model_path, model_hash="test", n_ctx=64)
    try:
        return rt.tokenize(TEXT, add_bos=True, special=False)[:N]
    finally:
        rt.close()


@pytest.fixture(scope="module")
def captured(model_path, tokens):
    return calibration.capture_qk(model_path, tokens)


def test_captured_keys_are_the_cached_keys(model_path, tokens, captured):
    q, k, facts = captured
    assert facts["n_layer"] == 30 and facts["n_head"] == 9 and facts["n_head_kv"] == 3
    assert q[0].shape == (N, 9, 64) and k[29].shape == (N, 3, 64)
    rt = Runtime(model_path, model_hash="test", n_ctx=N + 8, flash_attn=True)
    try:
        rt.prefill(tokens)
        cached = kvstate.in_position_order(rt.capture().sections[0]).keys
    finally:
        rt.close()
    for layer in (0, 17, 29):
        got = k[layer].reshape(N, -1)
        # the cache holds the same float32 keys rounded to float16
        np.testing.assert_array_equal(got.astype(np.float16), cached[layer])
    assert np.abs(q[5]).max() > 0.1


def test_output_projection_has_the_model_shape(model_path):
    wo = calibration.read_tensor(model_path, "blk.3.attn_output.weight", 9 * 64)
    assert wo.shape == (576, 576) and np.isfinite(wo).all()
    # a trained projection: columns of comparable, non-zero norm
    norms = np.linalg.norm(wo, axis=0)
    assert norms.min() > 0.05 * norms.mean()
    with pytest.raises(calibration.CalibrationError, match="no tensor"):
        calibration.read_tensor(model_path, "blk.3.nothing.weight", 576)


def test_importance_and_step_weights(model_path, tokens):
    imp = calibration.importance(model_path, tokens)
    assert imp.keys.shape == imp.values.shape == (30, 192)
    assert (imp.keys > 0).all() and (imp.values > 0).all()
    # RoPE partners (adjacent channels for this model) share their pair's energy
    np.testing.assert_array_equal(imp.keys[:, 0::2], imp.keys[:, 1::2])
    assert ((imp.head_spread > 1 / N) & (imp.head_spread <= 1)).all()
    steps = calibration.step_weights(imp.keys)
    np.testing.assert_allclose(np.log(steps).mean(axis=1), 0, atol=1e-9)
    # more important channels get finer steps
    layer = imp.keys[12]
    assert steps[12, layer.argmax()] < 1 < steps[12, layer.argmin()]
