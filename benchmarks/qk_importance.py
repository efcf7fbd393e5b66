"""Per-channel importance of a model's KV cache (research: benchmarks.channel_weighting and
kv_transforms use it; the product's calibration is desktop_app.calibration.calibrate).

An error e in key channel c of a cached token shifts that token's attention logit for a query
q by q_c * e_c, so it costs in proportion to E[q_c^2] (post-RoPE queries; the two channels of
a RoPE pair rotate into each other, so both get the pair's mean). An error in value channel c
reaches the residual stream through the output projection: it costs ||W_o[:, c]||^2 times how
concentrated the head's attention is (E_i sum_j a_ij^2: errors of different tokens average
out under spread attention). Query heads sharing a KV head (GQA) add up.

For a weighted distortion sum_c w_c D_c at a fixed rate, entropy-coded uniform quantizers are
best with steps proportional to w_c^-1/2; `step_weights` turns importances into such relative
steps, normalized within each layer to geometric mean 1 (the layer's own step, and so its rate,
is set by the codec level). Measured by running the model through llama.cpp on a calibration
text with a graph callback that copies the post-RoPE query and key tensors; W_o is read from
the GGUF file and dequantized by ggml itself, so any weight type works.

This module measures and returns arrays: it must never write files, touch the store, or
change the codec.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

# ggml.h (ggml 0.25.3, llama-cpp-python 0.3.36): the leading fields of struct ggml_tensor up to
# its name. GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64 bytes, GGML_MAX_SRC 10, GGML_MAX_NAME 64.
GGML_TYPE_F32 = 0
GGML_OP_ROPE = 48  # enum ggml_op


class _GgmlTensor(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


class _GgufInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


class _TypeTraits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_CAPTURED = re.compile(rb"^([QK])cur-(\d+)$")
LLAMA_ROPE_TYPE_NEOX = 2
BATCH = 512


class CalibrationError(RuntimeError):
    """The model could not be calibrated (text too short, tensors not found, ...)."""


@dataclass
class Importance:
    """Per (model layer, KV channel) importance of keys and values, [n_layer, n_head_kv * d]."""

    keys: np.ndarray
    values: np.ndarray
    head_spread: np.ndarray  # [n_layer, n_head] E_i sum_j a_ij^2 of each query head
    n_tokens: int


def _ggml_lib() -> ctypes.CDLL:
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    lib = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GgufInitParams]
    lib.gguf_find_tensor.restype = ctypes.c_int64
    lib.gguf_find_tensor.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    for f in ("gguf_get_tensor_offset", "gguf_get_tensor_size"):
        getattr(lib, f).restype = ctypes.c_size_t
        getattr(lib, f).argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_data_offset.restype = ctypes.c_size_t
    lib.gguf_get_data_offset.argtypes = [ctypes.c_void_p]
    lib.gguf_get_tensor_type.restype = ctypes.c_int
    lib.gguf_get_tensor_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    return lib


def read_tensor(model_path: str | Path, name: str, n_in: int) -> np.ndarray:
    """A weight of the GGUF file as float32 [rows, n_in] (ggml's ne[1] x ne[0])."""
    lib = _ggml_lib()
    ctx = lib.gguf_init_from_file(str(model_path).encode(), _GgufInitParams(True, None))
    if not ctx:
        raise CalibrationError(f"{model_path} is not a GGUF file ggml can read")
    try:
        idx = lib.gguf_find_tensor(ctx, name.encode())
        if idx < 0:
            raise CalibrationError(f"{model_path} has no tensor {name!r}")
        offset = lib.gguf_get_data_offset(ctx) + lib.gguf_get_tensor_offset(ctx, idx)
        size = lib.gguf_get_tensor_size(ctx, idx)
        ggml_type = lib.gguf_get_tensor_type(ctx, idx)
    finally:
        lib.gguf_free(ctx)
    traits = lib.ggml_get_type_traits(ggml_type).contents
    raw = np.fromfile(model_path, np.uint8, count=size, offset=offset)
    n = size // traits.type_size * traits.blck_size
    if n % n_in:
        raise CalibrationError(f"{name}: {n} elements are not rows of {n_in}")
    out = np.empty(n, np.float32)
    if ggml_type == GGML_TYPE_F32:
        out[:] = raw.view(np.float32)
    else:
        _TO_FLOAT(traits.to_float)(raw.ctypes.data, out.ctypes.data, n)
    return out.reshape(n // n_in, n_in)


def capture_qk(model_path: str | Path, tokens: Sequence[int], *, n_threads: int | None = None,
               ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray], dict]:
    """Post-RoPE queries and keys of every layer, float32 [n_tokens, n_head(_kv), head_dim],
    from one causal pass over `tokens` in a context of its own; and the model's shape facts."""
    n_threads = n_threads or os.cpu_count() or 1
    got: dict[tuple[str, int], list[np.ndarray]] = {}

    def on_tensor(ptr, ask, _user) -> bool:
        t = _GgmlTensor.from_address(ptr)
        m = _CAPTURED.match(t.name)
        if m is None or t.type != GGML_TYPE_F32 or t.op != GGML_OP_ROPE:
            return False if ask else True
        if ask:
            return True
        ne, nb = list(t.ne[:3]), list(t.nb[:3])
        span = sum((n - 1) * s for n, s in zip(ne, nb, strict=True)) + 4
        buf = (ctypes.c_uint8 * span).from_address(t.data)
        arr = np.lib.stride_tricks.as_strided(np.frombuffer(buf, np.float32),
                                              shape=ne[::-1], strides=nb[::-1])
        got.setdefault((m.group(1).decode(), int(m.group(2))), []).append(arr.copy())
        return True

    callback = llama_cpp.ggml_backend_sched_eval_callback(on_tensor)
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=8, vocab_only=False,
                          n_threads=n_threads, verbose=False)
    try:
        model = llm._model.model
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = len(tokens) + 8
        params.n_batch = params.n_ubatch = BATCH
        params.n_threads = params.n_threads_batch = n_threads
        params.cb_eval = callback
        params.cb_eval_user_data = None
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise CalibrationError("llama.cpp could not create a calibration context")
        try:
            for i in range(0, len(tokens), BATCH):
                piece = (llama_cpp.llama_token * len(tokens[i:i + BATCH]))(*tokens[i:i + BATCH])
                if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(piece, len(piece))):
                    raise CalibrationError("llama.cpp failed to evaluate the calibration text")
        finally:
            llama_cpp.llama_free(ctx)
        facts = {"n_layer": llama_cpp.llama_model_n_layer(model),
                 "n_head": llama_cpp.llama_model_n_head(model),
                 "n_head_kv": llama_cpp.llama_model_n_head_kv(model),
                 "n_embd": llama_cpp.llama_model_n_embd(model),
                 "rope_neox": llama_cpp.llama_model_rope_type(model) == LLAMA_ROPE_TYPE_NEOX}
    finally:
        llm.close()
    q = {layer: np.concatenate(v) for (kind, layer), v in got.items() if kind == "Q"}
    k = {layer: np.concatenate(v) for (kind, layer), v in got.items() if kind == "K"}
    if len(q) != facts["n_layer"] or len(k) != facts["n_layer"]:
        raise CalibrationError(f"captured queries of {len(q)} and keys of {len(k)} layers; the "
                               f"model has {facts['n_layer']} (tensor names changed?)")
    return q, k, facts


def _pair_mean(x: np.ndarray, neox: bool) -> np.ndarray:
    """Average each channel with its RoPE partner along the last axis (head_dim)."""
    d = x.shape[-1]
    if neox:  # pairs (i, i + d/2)
        m = (x[..., : d // 2] + x[..., d // 2 :]) / 2
        return np.concatenate([m, m], axis=-1)
    m = (x[..., 0::2] + x[..., 1::2]) / 2
    return np.repeat(m, 2, axis=-1)


def importance(model_path: str | Path, tokens: Sequence[int], *,
               n_threads: int | None = None) -> Importance:
    """Key and value importance of every (layer, KV channel), measured on `tokens`."""
    q, k, facts = capture_qk(model_path, tokens, n_threads=n_threads)
    n_layer, n_head, n_head_kv = facts["n_layer"], facts["n_head"], facts["n_head_kv"]
    group = n_head // n_head_kv
    d = q[0].shape[-1]
    key_w, val_w = [], []
    spread = np.zeros((n_layer, n_head))
    n = q[0].shape[0]
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    for layer in range(n_layer):
        energy = _pair_mean((q[layer].astype(np.float64) ** 2).mean(0), facts["rope_neox"])
        key_w.append(energy.reshape(n_head_kv, group, d).sum(1).ravel())
        for h in range(n_head):
            s = q[layer][:, h] @ k[layer][:, h // group].T / np.sqrt(d) + mask
            a = np.exp(s - s.max(1, keepdims=True))
            a /= a.sum(1, keepdims=True)
            spread[layer, h] = float((a**2).sum(1).mean())
        wo = read_tensor(model_path, f"blk.{layer}.attn_output.weight", n_head * d)
        col = (wo.astype(np.float64) ** 2).sum(0).reshape(n_head, d) * spread[layer][:, None]
        val_w.append(col.reshape(n_head_kv, group, d).sum(1).ravel())
    return Importance(np.array(key_w), np.array(val_w), spread, n)


def step_weights(weights: np.ndarray, power: float = 0.5) -> np.ndarray:
    """Relative quantization steps w^-power per (layer, channel), geometric mean 1 per layer."""
    w = np.maximum(weights, weights.max(axis=1, keepdims=True) * 1e-6)
    log_step = -power * np.log(w)
    return np.exp(log_step - log_step.mean(axis=1, keepdims=True))
