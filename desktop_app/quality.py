"""How well a compressed KV cache answers like the exact one: `kvdesk eval` as a Python API.

Method (../shared/notes/quality-baselines.md): prefill the first N tokens of a text exactly
(f16 cache), keep the state; then for each configuration load that prefix's KV as the
configuration would deliver it (codec levels: encoded in the engine's 256-token chunks and
decoded; `fp16`: the exact state through the bridge; llama.cpp's `q8_0`/`q4_0`: the prefix
prefilled natively in a cache of that type) and evaluate the next M tokens under teacher
forcing, compared position by position with the exact run: mean KL(exact || config) of the
next-token distributions, top-1 agreement, perplexity of the true continuation, and whether
the first greedy tokens after the prefix are identical. Bits per element count every byte the
configuration stores.

Every context runs with flash attention (llama.cpp needs it for quantized V), so configurations
differ from the reference only in their KV. Scored positions are the M continuation tokens
themselves (each predicting the one after it), decoded in one batch. The reference, too, is
scored from its state loaded into a fresh cache, as every configuration is: where cells sit in
the cache changes the order in which llama.cpp's CPU flash attention (which accumulates in
fp16) sums them, and on Gemma 3 270M's sliding-window cache that alone moves the logits
measurably (KLD ~0.002-0.004 between a plain prefill and its exact restore, as large as q8_0's
loss; without flash attention the two are bit-identical). So an exact restore gives
bit-identical logits, and KLD 0 is the bridge's test; whether a restore continues like a plain
prefill is tested apart.

The `fp16-ulp` row is the measurement's noise floor: the exact state with a fixed, seeded
0.01 % of its elements (never a sequence's first token) moved by one fp16 ulp, the smallest
change there is. On models with quantized weights llama.cpp's CPU matmuls round activations to
8 bits (q8_1 against Q4_1 weights), so any change of the KV flips some roundings and the logits
move by a fixed amount: on SmolLM2-135M Q4_1 this floor is KLD ~0.003, most of q8_0's 0.0037
(benchmarks/RESULTS.md, "The high-rate floor"). A configuration's loss is its KLD above it.

Sliding-window (iSWA) models are handled section by section (`kvstate.parse_seq_sections`).
This module measures only: it must never write files, touch the store, or change the codec.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import _internals

import codec
from store import DEFAULT_CHUNK_SIZE as DEFAULT_CHUNK_TOKENS

from . import kvstate

REFERENCE = "fp16"
FLOOR = "fp16-ulp"
FLOOR_FRACTION = 1e-4
# llama.cpp's own KV cache types: (ggml type, bits per element: 32-value blocks + fp16 scale).
NATIVE_TYPES = {"q8_0": (llama_cpp.GGML_TYPE_Q8_0, 8.5), "q4_0": (llama_cpp.GGML_TYPE_Q4_0, 4.5)}
DEFAULT_CONFIGS = ("fp16", FLOOR, "q8_0", "q4_0", "cachegen-1", "cachegen-2", "cachegen-3", "high",
                   "balanced", "compact")
BATCH = 512
# Rows of logits turned into log-probabilities at a time: Gemma's vocabulary is 262,144 wide.
ROW_BLOCK = 16

Config = str | dict


class EvalError(ValueError):
    """The text is too short, or a configuration is unknown."""


def config_name(config: Config) -> str:
    return config.get("name", "custom") if isinstance(config, dict) else config


def evaluate(
    model_path: str | Path,
    text: str,
    *,
    prefix_tokens: int = 2048,
    cont_tokens: int = 256,
    configs: Iterable[Config] = DEFAULT_CONFIGS,
    greedy_tokens: int = 64,
    on_row: Callable[[dict], None] | None = None,
) -> dict:
    """Measure every configuration on `text`; the `kvdesk eval --json` document."""
    configs = list(configs)
    for c in configs:
        check_config(c)
    with Evaluator(model_path, text, prefix_tokens=prefix_tokens, cont_tokens=cont_tokens,
                   greedy_tokens=greedy_tokens) as ev:
        rows = []
        for c in configs:
            rows.append(ev.row(c))
            if on_row is not None:
                on_row(rows[-1])
    return {"model": Path(model_path).name, "prefix_tokens": prefix_tokens,
            "cont_tokens": cont_tokens, "rows": rows}


def check_config(config: Config) -> None:
    """Refuse an unknown configuration before any model work starts."""
    if isinstance(config, dict):
        try:
            codec.CodecConfig.from_config(config)
        except codec.CodecError as e:
            raise EvalError(str(e)) from e
    elif config not in (REFERENCE, FLOOR) and config not in NATIVE_TYPES \
            and config not in codec.levels():
        known = [REFERENCE, FLOOR, *NATIVE_TYPES, *codec.levels()]
        raise EvalError(f"unknown configuration {config!r}; known: {', '.join(known)}")


def nudge(a: np.ndarray, positions: np.ndarray, rng: np.random.Generator,
          fraction: float = FLOOR_FRACTION) -> np.ndarray:
    """A copy of a [L, T, C] float16 cache with a random `fraction` of its elements moved by
    one ulp up or down (never at position 0, the attention sink; never to Inf or NaN)."""
    if a.dtype != np.float16:
        raise EvalError(f"the noise-floor row needs an f16 cache, not {a.dtype}")
    out = a.copy()
    bits = out.view(np.uint16)
    hit = (rng.random(a.shape) < fraction) & (positions != 0)[None, :, None]
    hit &= (bits & 0x7FFF) < 0x7BFF  # finite and not the largest finite magnitude
    step = np.where(rng.random(a.shape) < 0.5, 1, -1)
    # Moving the bit pattern by -1 from +0 / -0 would wrap: step those up instead.
    step[(bits & 0x7FFF) == 0] = 1
    bits[hit] = (bits[hit].astype(np.int32) + step[hit]).astype(np.uint16)
    return out


@dataclass
class _Reference:
    state: bytes
    logprobs: np.ndarray  # float32 [M, n_vocab], log-softmax of the exact run
    targets: np.ndarray  # the token each scored position predicts
    greedy: list[int]


class Evaluator:
    """The exact run of one text, computed once, against which configurations are scored.

    Keeps one f16 context for the reference and every codec configuration; natively quantized
    caches get their own context (and their own prefill) when asked for.
    """

    def __init__(self, model_path: str | Path, text: str, *, prefix_tokens: int = 2048,
                 cont_tokens: int = 256, greedy_tokens: int = 64, n_threads: int | None = None):
        self.model_path = Path(model_path)
        self.n_threads = n_threads or os.cpu_count() or 1
        self.prefix_tokens, self.cont_tokens = prefix_tokens, cont_tokens
        self.greedy_tokens = greedy_tokens
        self.n_ctx = prefix_tokens + max(cont_tokens, greedy_tokens) + 8
        self.exact = _Context(self.model_path, self.n_ctx, llama_cpp.GGML_TYPE_F16,
                              self.n_threads)
        try:
            tokens = self.exact.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
            need = prefix_tokens + cont_tokens + 1
            if prefix_tokens < 1 or cont_tokens < 1 or len(tokens) < need:
                raise EvalError(f"the text has {len(tokens)} tokens; {need} are needed "
                                f"({prefix_tokens} prefix + {cont_tokens} continuation + 1)")
            self.prefix = tokens[:prefix_tokens]
            self.cont = tokens[prefix_tokens : prefix_tokens + cont_tokens + 1]
            self.reference = self._reference()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.exact.close()

    @property
    def seq_state(self) -> kvstate.SeqState:
        return kvstate.parse_seq_sections(self.reference.state)

    def _reference(self) -> _Reference:
        ctx = self.exact
        ctx.prefill(self.prefix)
        state = ctx.state()
        ctx.load(state)
        logprobs = ctx.score(self.cont[:-1], len(self.prefix))
        ctx.load(state)
        greedy = ctx.greedy(self.prefix, self.greedy_tokens)
        return _Reference(state, logprobs, np.array(self.cont[1:]), greedy)

    def row(self, config: Config) -> dict:
        """One configuration's measurements: the row of `kvdesk eval --json`."""
        check_config(config)
        if isinstance(config, str) and config in NATIVE_TYPES:
            ggml_type, bits = NATIVE_TYPES[config]
            ctx = _Context(self.model_path, self.n_ctx, ggml_type, self.n_threads)
            try:
                ctx.prefill(self.prefix)
                return self._measure(config, bits, ctx, ctx.state())
            finally:
                ctx.close()
        if config in (REFERENCE, FLOOR):
            seq = self.seq_state
            if config == FLOOR:
                rng = np.random.default_rng(0)
                seq = kvstate.SeqState([kvstate.KVState(
                    nudge(kv.keys, kv.positions, rng), nudge(kv.values, kv.positions, rng),
                    kv.positions, kv.v_trans, kv.seq_id) for kv in seq.sections], seq.seq_id)
            state = kvstate.build_seq_sections(seq)
            bits = 16.0
        else:
            state, bits = self.compressed_state(config)
        return self._measure(config_name(config), bits, self.exact, state)

    def compressed_state(self, config: Config) -> tuple[bytes, float]:
        """The exact state after a codec round trip, and the codec's bits per element."""
        seq = self.seq_state
        out, nbytes, elements = [], 0, 0
        for kv in seq.sections:
            # Chunks are runs of consecutive positions, as the engine stores a document; the
            # sliding-window section of an iSWA cache starts mid-document (no sink tokens).
            order = np.argsort(kv.positions, kind="stable")
            blobs = codec.encode_chunks(
                np.ascontiguousarray(kv.keys[:, order]),
                np.ascontiguousarray(kv.values[:, order]), config,
                chunk_tokens=DEFAULT_CHUNK_TOKENS, first_token=int(kv.positions[order[0]]))
            keys, values = codec.decode_chunks(blobs)
            back_k, back_v = np.empty_like(kv.keys), np.empty_like(kv.values)
            back_k[:, order], back_v[:, order] = keys, values
            out.append(kvstate.KVState(back_k, back_v, kv.positions, kv.v_trans, kv.seq_id))
            nbytes += sum(len(b) for b in blobs)
            elements += 2 * kv.keys.size
        state = kvstate.build_seq_sections(kvstate.SeqState(out, seq.seq_id))
        return state, nbytes * 8 / elements

    def state_with(self, sections: Sequence[kvstate.KVState]) -> bytes:
        """State bytes for KV sections shaped like the reference's (for experiments)."""
        return kvstate.build_seq_sections(kvstate.SeqState(list(sections), 0))

    def measure_state(self, name: str, state: bytes, bits: float) -> dict:
        """Score any state of the prefix (e.g. KV altered by an experiment)."""
        return self._measure(name, bits, self.exact, state)

    def _measure(self, name: str, bits: float, ctx: _Context, state: bytes) -> dict:
        """Load `state` into `ctx`, score the continuation, then decode greedily."""
        ref = self.reference
        ctx.load(state)
        logprobs = ctx.score(self.cont[:-1], len(self.prefix))
        kld = top1 = nll = 0.0
        for i in range(0, len(logprobs), ROW_BLOCK):
            p_ref = ref.logprobs[i : i + ROW_BLOCK].astype(np.float64)
            p = logprobs[i : i + ROW_BLOCK].astype(np.float64)
            kld += float((np.exp(p_ref) * (p_ref - p)).sum())
            top1 += int((p_ref.argmax(1) == p.argmax(1)).sum())
            nll -= float(p[np.arange(len(p)), ref.targets[i : i + ROW_BLOCK]].sum())
        n = len(logprobs)
        # Scoring moved the cache past the prefix; a sliding-window cache cannot be cut back.
        ctx.load(state)
        greedy = ctx.greedy(self.prefix, self.greedy_tokens)
        return {"config": name, "bits_per_element": round(bits, 4), "kld": kld / n,
                "top1": top1 / n, "ppl": float(np.exp(nll / n)),
                "greedy_match": greedy == ref.greedy}


class _Context:
    """A llama.cpp context of one sequence, driven through the low-level API.

    Positions and cache contents are managed here explicitly; the Llama object's own token
    bookkeeping is not used.
    """

    def __init__(self, model_path: Path, n_ctx: int, cache_type: int, n_threads: int,
                 flash_attn: bool = True):
        self.llm = llama_cpp.Llama(
            model_path=str(model_path), n_ctx=n_ctx, n_batch=BATCH, n_threads=n_threads,
            n_threads_batch=n_threads, flash_attn=flash_attn, type_k=cache_type,
            type_v=cache_type, verbose=False)
        self.ctx = self.llm._ctx
        self.n_vocab = self.llm.n_vocab()
        self.batch = _internals.LlamaBatch(n_tokens=BATCH, embd=0, n_seq_max=1)
        self.n_past = 0

    def close(self) -> None:
        self.batch.close()
        self.llm.close()

    def _decode(self, tokens: Sequence[int], all_logits: bool) -> None:
        self.batch.set_batch(tokens, self.n_past, all_logits)
        self.ctx.decode(self.batch)
        self.n_past += len(tokens)

    def _logits(self, n: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits(self.ctx.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab))

    def prefill(self, tokens: Sequence[int]) -> None:
        self.ctx.kv_cache_clear()
        self.n_past = 0
        for i in range(0, len(tokens), BATCH):
            self._decode(tokens[i : i + BATCH], all_logits=False)

    def state(self) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self.ctx.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(self.ctx.ctx, buf, size, 0) != size:
            raise RuntimeError("llama.cpp did not write the whole sequence state")
        return bytes(buf)

    def load(self, state: bytes) -> None:
        self.ctx.kv_cache_clear()
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if llama_cpp.llama_state_seq_set_data(self.ctx.ctx, buf, len(state), 0) != len(state):
            raise RuntimeError("llama.cpp refused the sequence state")

    def score(self, tokens: Sequence[int], n_past: int) -> np.ndarray:
        """Log-probabilities after each of `tokens`, evaluated after the first n_past."""
        self.ctx.kv_cache_seq_rm(0, n_past, -1)
        self.n_past = n_past
        out = np.empty((len(tokens), self.n_vocab), np.float32)
        for i in range(0, len(tokens), BATCH):
            piece = tokens[i : i + BATCH]
            self._decode(piece, all_logits=True)
            logits = self._logits(len(piece))
            for j in range(0, len(piece), ROW_BLOCK):
                x = logits[j : j + ROW_BLOCK] - logits[j : j + ROW_BLOCK].max(1, keepdims=True)
                out[i + j : i + j + len(x)] = x - np.log(np.exp(x).sum(1, keepdims=True))
        return out

    def greedy(self, prefix: Sequence[int], n: int) -> list[int]:
        """n argmax tokens after the loaded prefix, its last token re-evaluated for logits."""
        self.ctx.kv_cache_seq_rm(0, len(prefix) - 1, -1)
        self.n_past = len(prefix) - 1
        return self._greedy_from(prefix[-1], n)

    def _greedy_from(self, token: int, n: int) -> list[int]:
        out = []
        for _ in range(n):
            self._decode([token], all_logits=True)
            token = int(self._logits(1)[0].argmax())
            out.append(token)
        return out
