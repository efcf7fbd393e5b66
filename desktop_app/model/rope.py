"""RoPE as llama.cpp applies it to a model's keys: what it is, and moving cached keys.

A cached key is rotated for the position its token had when it was computed. A document's KV,
computed at the start of its own prefix, can serve at another position — after another
document, in a chat over several — once its keys are turned by the difference (`rerotate`):
rotations compose, R(new) R(old)^-1 = R(new - old). Values carry no position.

`probe(runtime)` finds the rotation of every layer of a loaded model and checks it against
llama.cpp itself: a short text is prefilled, llama.cpp shifts its cells by a large offset
(the K-shift it applies when a context slides; a sliding-window cache, which it cannot
shift, is probed in a small context of its own whose window layers keep every position), and
each layer's shifted keys must equal the cached keys turned by `rerotate` within fp16
rounding. The angles per channel pair follow
llama.cpp's formula for the RoPE type (norm: pairs 2i, 2i+1; neox: pairs i, i + n_rot / 2) from
the model's base frequency and scale; a layer whose keys match none of the candidate bases
(the metadata's, the sliding-window layers' 10,000 that llama.cpp assumes for Gemma 3...)
means this model's RoPE is one kvdesk does not reproduce (per-dimension frequency factors,
YaRN): blending is then off for it, and chats over several documents compute them as before.

It never changes what a runtime holds beyond the probe it runs in a context of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import llama_cpp
import numpy as np
from llama_cpp import _internals

from ..errors import EngineError
from .kvstate import in_position_order, parse_seq_sections
from .runtime import Runtime

PROBE_TEXT = ("The quick brown fox jumps over the lazy dog while the keeper of the lighthouse "
              "writes the weather in his logbook and counts the ships that pass the point.")
PROBE_SHIFT = 3001  # large: a wrong frequency shows, even on the slowest-turning pairs
MATCH_TOLERANCE = 0.02  # of the keys' largest magnitude: fp16 rounding is ~1e-3
EXTRA_BASES = (10000.0, 1000000.0)
PROBE_CONTEXT = 128  # cells of the context a cache that cannot shift is probed in


@dataclass(frozen=True)
class Rope:
    """The rotation of one layer's keys: `theta` radians per position for each channel pair
    of each head's first 2 * len(theta) channels, paired llama.cpp's `kind` of way."""

    kind: str  # "norm" | "neox"
    head_dim: int
    theta: np.ndarray  # float64 [n_rot / 2]

    def pairs(self) -> tuple[slice, slice]:
        """The channels of each head paired for rotation: (first of each pair, second)."""
        n = len(self.theta)
        return (slice(0, 2 * n, 2), slice(1, 2 * n, 2)) if self.kind == "norm" else \
            (slice(0, n), slice(n, 2 * n))


def rerotate(keys: np.ndarray, delta: np.ndarray, ropes: list[Rope]) -> np.ndarray:
    """Keys [n_layer, tokens, channels] turned by `delta` positions per token (layer l by
    ropes[l]); float32 arithmetic, returned in the keys' dtype."""
    out = np.empty(keys.shape, keys.dtype)
    delta = np.asarray(delta, np.float64)
    # A blend moves a whole run by one offset: its angles are one row, not one per token.
    if len(delta) and (delta == delta[0]).all():
        delta = delta[:1]
    turns: dict[tuple[str, int, bytes], tuple[np.ndarray, np.ndarray]] = {}
    for layer, rope in enumerate(ropes):
        a, b = rope.pairs()
        key = (rope.kind, rope.head_dim, rope.theta.tobytes())  # most layers share one
        if key not in turns:
            angle = delta[:, None] * rope.theta[None, :]  # [tokens or 1, pairs]
            turns[key] = (np.cos(angle).astype(np.float32)[:, None, :],
                          np.sin(angle).astype(np.float32)[:, None, :])
        cos, sin = turns[key]
        heads = keys[layer].astype(np.float32).reshape(keys.shape[1], -1, rope.head_dim)
        x0, x1 = heads[:, :, a].copy(), heads[:, :, b].copy()
        heads[:, :, a] = x0 * cos - x1 * sin
        heads[:, :, b] = x0 * sin + x1 * cos
        out[layer] = heads.reshape(keys.shape[1], -1)
    return out


def candidates(rt: Runtime) -> tuple[str | None, int, float, list[float]]:
    """(RoPE kind: "norm", "neox" or None for another, rotated channels, frequency scale,
    candidate bases) from the model: what the data then decides between (`probe`, and the
    codec's calibration)."""
    llm = rt.llm
    model = llm._model.model
    kind = {llama_cpp.LLAMA_ROPE_TYPE_NORM: "norm",
            llama_cpp.LLAMA_ROPE_TYPE_NEOX: "neox"}.get(llama_cpp.llama_model_rope_type(model))
    arch = llm.metadata.get("general.architecture", "")
    n_rot = int(llm.metadata.get(f"{arch}.rope.dimension_count", 0)) or rt.layout.head_dim
    scale = float(llama_cpp.llama_model_rope_freq_scale_train(model)) or 1.0
    bases = [float(llm.metadata[k]) for k in (f"{arch}.rope.freq_base",
                                              f"{arch}.rope.freq_base_swa") if k in llm.metadata]
    return kind, n_rot, scale, list(dict.fromkeys([*bases, *EXTRA_BASES]))


def probe(rt: Runtime) -> list[Rope]:
    """Each layer's Rope, checked against llama.cpp's own shift of a probe text in `rt`
    (whose context it resets); EngineError if some layer matches no candidate."""
    kind, n_rot, scale, bases = candidates(rt)
    if kind is None:
        raise EngineError("this model's RoPE type cannot be moved between positions")
    head_dim = rt.layout.head_dim
    tokens = rt.tokenize(PROBE_TEXT, add_bos=rt.adds_bos)
    rt.reset()
    with _shiftable(rt):
        rt.prefill(tokens)
        before = _layers(rt)
        memory = llama_cpp.llama_get_memory(rt.llm._ctx.ctx)
        if not llama_cpp.llama_memory_can_shift(memory):
            raise EngineError("this model's cache cannot be shifted between positions")
        llama_cpp.llama_memory_seq_add(memory, 0, 0, -1, PROBE_SHIFT)
        _eval_at(rt, tokens[-1], len(tokens) + PROBE_SHIFT)  # llama.cpp applies the shift
        after = _layers(rt)
    ropes = []
    for layer in range(before.shape[0]):
        k0, k1 = before[layer : layer + 1, : len(tokens)], after[layer : layer + 1, : len(tokens)]
        scale_k = float(np.abs(k1.astype(np.float32)).max()) or 1.0
        for base in bases:
            theta = scale * base ** (-np.arange(0, n_rot, 2) / n_rot)
            rope = Rope(kind, head_dim, theta)
            moved = rerotate(k0, np.full(len(tokens), PROBE_SHIFT), [rope])
            err = float(np.abs(moved.astype(np.float32) - k1.astype(np.float32)).max())
            if err <= MATCH_TOLERANCE * scale_k:
                ropes.append(rope)
                break
        else:
            raise EngineError(f"layer {layer}'s keys move in a way kvdesk does not reproduce "
                              "(a RoPE with per-dimension factors or YaRN scaling)")
    return ropes


@contextlib.contextmanager
def _shiftable(rt: Runtime) -> Iterator[None]:
    """Around the probe: `rt`'s context, reset after; for a cache llama.cpp cannot shift (a
    sliding-window one keeps only its window) a small context of the same model in its place,
    whose window layers keep every position (swa_full), so that it can."""
    llm = rt.llm
    own = llm._ctx
    if llama_cpp.llama_memory_can_shift(llama_cpp.llama_get_memory(own.ctx)):
        try:
            yield
        finally:
            rt.reset()
        return
    params = type(llm.context_params).from_buffer_copy(llm.context_params)
    params.n_ctx = params.n_batch = params.n_ubatch = PROBE_CONTEXT
    params.n_seq_max, params.swa_full = 1, True
    try:
        llm._ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=llm.verbose)
    except ValueError as e:
        raise EngineError(f"llama.cpp could not make a context to probe RoPE in ({e})") from e
    try:
        rt.reset()
        yield
    finally:
        probe, llm._ctx = llm._ctx, own
        probe.close()
        rt.reset()


def _layers(rt: Runtime) -> np.ndarray:
    """Keys [all layers of every section, tokens, channels] in position order."""
    sections = [in_position_order(kv) for kv in parse_seq_sections(rt.state_bytes()).sections]
    n = min(kv.n_tokens for kv in sections)
    return np.concatenate([kv.keys[:, :n] for kv in sections], axis=0)


def _eval_at(rt: Runtime, token: int, position: int) -> None:
    batch = llama_cpp.llama_batch_init(1, 0, 1)
    try:
        batch.n_tokens = 1
        batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, position, 1
        batch.seq_id[0][0], batch.logits[0] = 0, False
        if llama_cpp.llama_decode(rt.llm._ctx.ctx, batch) != 0:
            raise EngineError("llama.cpp could not evaluate the RoPE probe")
    finally:
        llama_cpp.llama_batch_free(batch)
