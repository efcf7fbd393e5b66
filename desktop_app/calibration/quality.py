"""How well a compressed KV cache answers like the exact one: `kvdesk eval` as a Python API.

Method (benchmarks/RESULTS.md, "Quality"): prefill the first N tokens of a text exactly
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

Codec levels are the model's calibrated ones when a `codec.Calibration` is given (its level
names, e.g. "high"), else the model-independent defaults (`codec.levels()`, also reachable as
"default-high" etc. beside a calibration). `contracts` says whether each calibrated level
keeps its promise on the text: `high` KLD <= KLD(q8_0) + KLD(fp16-ulp), `balanced` top-1 >=
top-1(q8_0) - 0.03, `compact` top-1 >= top-1(q8_0) - 0.08.

Sliding-window (iSWA) models are handled section by section (`kvstate.parse_seq_sections`).
Every context is a `runtime.Runtime`. This module measures only: it must never write files,
touch the store, or change the codec.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import codec
from store import DEFAULT_CHUNK_SIZE

from ..errors import Cancelled
from ..model import kvstate
from ..model.runtime import PREFILL_SLICE, Runtime

REFERENCE = "fp16"
FLOOR = "fp16-ulp"
FLOOR_FRACTION = 1e-4
# llama.cpp's own KV cache types, with their bits per element (32-value blocks + fp16 scale).
NATIVE_TYPES = {"q8_0": 8.5, "q4_0": 4.5}
DEFAULT_CONFIGS = ("fp16", FLOOR, "q8_0", "q4_0", "cachegen-1", "cachegen-2", "cachegen-3", "high",
                   "balanced", "compact")
DEFAULT_PREFIX = "default-"  # "default-high": the uncalibrated level beside a calibrated one
CHUNK_TOKENS = DEFAULT_CHUNK_SIZE  # the engine's chunks
# A level's promise, relative to llama.cpp's q8_0 KV on the same model and text.
CONTRACTS = {
    "high": ("kld", "KLD <= KLD(q8_0) + KLD(fp16-ulp)",
             lambda q8, floor: q8["kld"] + floor["kld"]),
    "balanced": ("top1", "top-1 >= top-1(q8_0) - 0.03", lambda q8, floor: q8["top1"] - 0.03),
    "compact": ("top1", "top-1 >= top-1(q8_0) - 0.08", lambda q8, floor: q8["top1"] - 0.08),
}


def targets(q8: dict, floor: dict) -> dict[str, float]:
    """Each level's contract target on one text, from its q8_0 and fp16-ulp rows there."""
    return {level: contract[2](q8, floor) for level, contract in CONTRACTS.items()}


# What the evaluation's own runtimes are keyed by: they never store or load a cache.
UNHASHED = "unhashed-evaluation"

Config = str | dict


class EvalError(ValueError):
    """The text is too short, or a configuration is unknown."""


def check_length(n_tokens: int, prefix_tokens: int, cont_tokens: int) -> None:
    """Refuse a text of `n_tokens` too short for the prefix and the scored continuation."""
    need = prefix_tokens + cont_tokens + 1
    if prefix_tokens < 1 or cont_tokens < 1 or n_tokens < need:
        raise EvalError(f"the text has {n_tokens:,} tokens; {need:,} are needed "
                        f"({prefix_tokens:,} prefix + {cont_tokens:,} continuation + 1)")


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
    calibration: codec.Calibration | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> dict:
    """Measure every configuration on `text`; the `kvdesk eval --json` document.

    With the fp16-ulp and q8_0 rows and levels of `CONTRACTS` among the configs, "contracts"
    says whether each level met its promise on this text."""
    configs = list(configs)
    for c in configs:
        check_config(c, calibration)
    with Evaluator(model_path, text, prefix_tokens=prefix_tokens, cont_tokens=cont_tokens,
                   greedy_tokens=greedy_tokens, calibration=calibration) as ev:
        rows = []
        for c in configs:
            rows.append(ev.row(c))
            if on_row is not None:
                on_row(rows[-1])
    report = {"model": Path(model_path).name, "prefix_tokens": prefix_tokens,
              "cont_tokens": cont_tokens, "rows": rows}
    if calibration is not None:
        report["calibration"] = calibration.id
    verdicts = contracts(rows)
    if verdicts:
        report["contracts"] = verdicts
    return report


def contracts(rows: Sequence[dict]) -> dict[str, dict]:
    """{level: {"contract", "target", "value", "met"}} for the rows of contract levels, given
    the q8_0 and fp16-ulp rows among `rows` ({} without them)."""
    by = {r["config"]: r for r in rows}
    if "q8_0" not in by or FLOOR not in by:
        return {}
    out = {}
    for level, (metric, text, target) in CONTRACTS.items():
        if level in by:
            goal = target(by["q8_0"], by[FLOOR])
            value = by[level][metric]
            met = value <= goal if metric == "kld" else value >= goal
            out[level] = {"contract": text, "target": goal, "value": value, "met": bool(met)}
    return out


def check_config(config: Config, calibration: codec.Calibration | None = None, *,
                 calibrating: bool = False) -> None:
    """Refuse an unknown configuration before any model work starts; `calibrating`: the
    model's calibration is still to be made (its level names are the codec's)."""
    if isinstance(config, dict):
        try:
            codec.CodecConfig.from_config(config)
        except codec.CodecError as e:
            raise EvalError(str(e)) from e
        return
    known = [REFERENCE, FLOOR, *NATIVE_TYPES, *codec.levels()]
    if calibration is not None or calibrating:
        known += [DEFAULT_PREFIX + n for n in codec.levels()]
    if calibration is not None:
        known += [n for n in calibration.level_names if n not in known]
    if config not in known:
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


def floor_state(seq: kvstate.SeqState) -> kvstate.SeqState:
    """The fp16-ulp row's state: `nudge` on every section, with a fixed seed."""
    rng = np.random.default_rng(0)
    return kvstate.SeqState([kvstate.KVState(
        nudge(kv.keys, kv.positions, rng), nudge(kv.values, kv.positions, rng), kv.positions,
        kv.v_trans, kv.seq_id) for kv in seq.sections], seq.seq_id)


def greedy(rt: Runtime, n: int, between: Callable[[], None] | None = None) -> list[int]:
    """n argmax tokens after what the context holds (no stop at end of generation);
    `between` called before each."""
    out: list[int] = []
    if n:
        rt.ensure_logits()
    for _ in range(n):
        if between is not None:
            between()
        out.append(int(np.argmax(rt.logits())))
        rt.prefill(out[-1:])
    return out


@dataclass
class _Reference:
    state: bytes
    logprobs: np.ndarray  # float32 [M, n_vocab], log-softmax of the exact run
    targets: np.ndarray  # the token each scored position predicts
    greedy: list[int]


class Evaluator:
    """The exact run of one text, computed once, against which configurations are scored.

    Keeps one f16 runtime for the reference and every codec configuration; natively quantized
    caches get their own runtime (and their own prefill) when asked for. With `fit`, a text
    shorter than prefix + continuation tokens shrinks both in proportion instead of failing.
    """

    def __init__(self, model_path: str | Path, text: str | None = None, *,
                 prefix_tokens: int = 2048, cont_tokens: int = 256, greedy_tokens: int = 64,
                 n_threads: int | None = None, calibration: codec.Calibration | None = None,
                 tokens: Sequence[int] | None = None, flash_attn: bool = True,
                 fit: bool = False, cancel: threading.Event | None = None,
                 pause: Callable[[], None] | None = None):
        self.model_path = Path(model_path)
        self.n_threads = n_threads or os.cpu_count() or 1
        self.prefix_tokens, self.cont_tokens = prefix_tokens, cont_tokens
        self.greedy_tokens = greedy_tokens
        self.calibration = calibration
        self.flash_attn = flash_attn
        # Between two slices of any model run: `pause` waits while something goes first (a
        # question being answered), then `cancel` stops it (runtime.Cancelled).
        self.cancel, self.pause = cancel, pause
        self.n_ctx = prefix_tokens + max(cont_tokens, greedy_tokens) + 8
        self.exact = self.runtime("f16")
        try:
            if tokens is None:
                tokens = self.exact.tokenize(text, add_bos=True, special=False)
            need = prefix_tokens + cont_tokens + 1
            if fit and len(tokens) < need:  # a tokenizer that needs fewer tokens for the text
                share = (len(tokens) - 1) / (prefix_tokens + cont_tokens)
                prefix_tokens, cont_tokens = int(prefix_tokens * share), int(cont_tokens * share)
                self.prefix_tokens, self.cont_tokens = prefix_tokens, cont_tokens
                need = prefix_tokens + cont_tokens + 1
            check_length(len(tokens), prefix_tokens, cont_tokens)
            self.prefix = list(tokens[:prefix_tokens])
            self.cont = list(tokens[prefix_tokens : prefix_tokens + cont_tokens + 1])
            self.reference = self._reference()
            self.seq_state = kvstate.parse_seq_sections(self.reference.state)
        except BaseException:
            self.close()
            raise

    def runtime(self, cache_type: str) -> Runtime:
        return Runtime(self.model_path, model_hash=UNHASHED, n_ctx=self.n_ctx,
                       flash_attn=self.flash_attn, cache_type=cache_type,
                       n_threads=self.n_threads)

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.exact.close()

    def _reference(self) -> _Reference:
        rt = self.exact
        rt.reset()
        rt.prefill(self.prefix, cancel=self.cancel, progress=self._between)
        state = rt.state_bytes()
        logprobs, tokens = self._score(rt, state)
        return _Reference(state, logprobs, np.array(self.cont[1:]), tokens)

    def _score(self, rt: Runtime, state: bytes) -> tuple[np.ndarray, list[int]]:
        """Load `state` into `rt` (a cleared cache: the same cell placement for every row),
        score the continuation, then decode greedily from the prefix."""
        rt.restore_bytes(state, self.prefix)
        scored, logprobs = self.cont[:-1], []
        for at in range(0, len(scored), PREFILL_SLICE):  # (each slice joins the sequence)
            self._between()
            logprobs.append(rt.score(scored[at:at + PREFILL_SLICE]))
        # Scoring moved the cache past the prefix; a sliding-window cache cannot be cut back.
        rt.restore_bytes(state, self.prefix)
        return np.concatenate(logprobs), greedy(rt, self.greedy_tokens, self._between)

    def _between(self, *_) -> None:
        if self.pause is not None:
            self.pause()
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("stopped between two slices of a model run")

    def row(self, config: Config) -> dict:
        """One configuration's measurements: the row of `kvdesk eval --json`."""
        check_config(config, self.calibration)
        if isinstance(config, str) and config in NATIVE_TYPES:
            rt = self.runtime(config)
            try:
                rt.prefill(self.prefix, cancel=self.cancel, progress=self._between)
                return self._measure(config, NATIVE_TYPES[config], rt, rt.state_bytes())
            finally:
                rt.close()
        if config in (REFERENCE, FLOOR):
            seq = floor_state(self.seq_state) if config == FLOOR else self.seq_state
            return self.measure_state(config, kvstate.build_seq_sections(seq), 16.0)
        state, bits = self.compressed_state(config)
        return self.measure_state(config_name(config), state, bits)

    def level(self, config: Config, part: int) -> codec.CodecConfig:
        """The codec config a configuration names, for a part (section) of the KV."""
        cal = self.calibration
        if isinstance(config, str):
            if cal is not None and config in cal.level_names:
                return cal.config(config, part)
            return codec.levels()[config.removeprefix(DEFAULT_PREFIX)]
        return codec.CodecConfig.from_config(config)

    def compressed_state(self, config: Config) -> tuple[bytes, float]:
        """The exact state after a codec round trip, and the codec's bits per element."""
        seq = self.seq_state
        out, nbytes, elements = [], 0, 0
        for part, kv in enumerate(seq.sections):
            # Chunks are runs of consecutive positions, as the engine stores a document; the
            # sliding-window section of an iSWA cache starts mid-document (no sink tokens).
            order = np.argsort(kv.positions, kind="stable")
            level = self.level(config, part)
            blobs = codec.encode_chunks(
                np.ascontiguousarray(kv.keys[:, order]),
                np.ascontiguousarray(kv.values[:, order]), level, chunk_tokens=CHUNK_TOKENS,
                first_token=int(kv.positions[order[0]]), calibration=self.calibration)
            resolver = {self.calibration.id: self.calibration} if self.calibration else None
            keys, values = codec.decode_chunks(blobs, calibrations=resolver)
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

    def measure_state(self, name: str, state: bytes, bits: float, *,
                      noise: bool = False) -> dict:
        """Score any state of the prefix (e.g. KV altered by an experiment). With `noise`, the
        row also has the standard errors of its KLD and top-1 over the scored positions
        ("kld_se", "top1_se"): how far the same configuration could land on another M tokens."""
        return self._measure(name, bits, self.exact, state, noise)

    def _measure(self, name: str, bits: float, rt: Runtime, state: bytes,
                 noise: bool = False) -> dict:
        ref = self.reference
        logprobs, tokens = self._score(rt, state)
        kld, agree, nll = [], [], 0.0
        for i in range(0, len(logprobs), 16):
            p_ref = ref.logprobs[i : i + 16].astype(np.float64)
            p = logprobs[i : i + 16].astype(np.float64)
            kld.append((np.exp(p_ref) * (p_ref - p)).sum(axis=1))
            agree.append(p_ref.argmax(1) == p.argmax(1))
            nll -= float(p[np.arange(len(p)), ref.targets[i : i + 16]].sum())
        n = len(logprobs)
        kld, agree = np.concatenate(kld), np.concatenate(agree)
        top1 = int(agree.sum()) / n
        row = {"config": name, "bits_per_element": round(bits, 4), "kld": float(kld.sum()) / n,
               "top1": top1, "ppl": float(np.exp(nll / n)), "greedy_match": tokens == ref.greedy}
        if noise:
            row["kld_se"] = float(kld.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
            row["top1_se"] = float(np.sqrt(top1 * (1 - top1) / n))
        return row
