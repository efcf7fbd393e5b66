"""Per-model codec calibration: levels that keep the same promise on every model.

A level is a quality contract (quality.CONTRACTS), measured against llama.cpp's q8_0 KV on
the same model and text. `calibrate` runs the model once on a built-in calibration text
(desktop_app/data/calibration.txt, written for kvdesk, Apache-2.0 like the rest; never an
evaluation text) and returns a `codec.Calibration` that makes the levels hold there:

1. Reference runs (quality.Evaluator): the exact cache, llama.cpp's q8_0 cache and the
   fp16-ulp noise floor; they set each contract's target.
2. Transforms, fitted on the exact KV of every cache section (codec.calibrated.transform.fit):
   keys with RoPE removed (llama.cpp's RoPE type; of the candidate bases, the one that leaves
   the keys' channels least variance), centred, and optionally turned onto exact bases
   (inverted in integers at BLAS speed, codec.calibrated.intinverse): per head (klt) or one
   over the whole layer (pca, and pca-kv with the values' too); values centred. Each variant
   is fitted on the first two thirds of the calibration KV, and the one that codes the last
   third in the fewest bits at equal KLD-weighted error is kept (then fitted on all of it),
   unless it saves too little for what it costs a decode (`Settings`).
3. Sensitivity: KLD per unit of error variance of every (kind, layer), from Gaussian noise
   added to that layer alone. Steps go as w^-1/2 (the rate-distortion optimum of a weighted
   squared error), one scale per level.
4. Levels: for each, the coarsest scale whose row still meets its contract with a margin on
   the calibration text (bisection), turned into per-layer bins (`codec` levels quantize with
   one scale per layer and chunk: bins follow from the layer's usual maximum and the step).
   Where no scale does, the level says so (its row's "met" is false) and takes the coarsest
   scale within the measurement's noise of the best one tried, not the finest.

Progress goes to `progress(stage, fraction)`; `cancel` (a threading.Event) is checked between
model runs and raises runtime.Cancelled. Every measurement that runs the model (a reference
row, a layer's sensitivity probe, a step of a level's search) goes through `keep` when given
(`Steps`: the caller keeps them), each under its name for this run (the model, the text, the
settings: `run_key`), so a calibration stopped or killed goes on where it was: what the steps
hold is read back instead of measured again, and the rest, a function of them, comes out the
same. This module measures and returns a calibration: it must never touch the store, and
knows the model only through Runtime and quality.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

import codec
from codec.calibrated import transform
from codec.format.levels import CALIBRATED, CODEC_ID

from ..model import kvstate, rope
from . import quality, registers, search
from .steps import Run, Steps, run_key

ProgressFn = Callable[[str, float], None]
LEVELS = ("high", "balanced", "compact")
MAX_MAXQ = 63  # codec.format.levels.MAX_BINS // 2 - 1
TEXT_NAME = "calibration.txt"


@dataclass(frozen=True)
class Settings:
    """How much the calibration measures (tests use far fewer tokens). 1,024 + 256 tokens of
    the built-in text (it has ~1,290; a tokenizer that needs fewer shrinks both): with 512 +
    128, top-1 was measured on 128 positions (+-0.02) and `balanced` missed on both held-out
    texts of SmolLM2 (RESULTS, "The level search's noise"). SmolLM2-135M: 7 minutes on 2
    loaded cores; Gemma 3 270M: 8 minutes of CPU."""

    prefix_tokens: int = 1024
    cont_tokens: int = 256
    noise: float = 0.25  # probe noise, relative to a layer's RMS after centring
    kld_margin: float = 0.8  # `high` aims at this fraction of its KLD budget
    # top-1 levels aim this many binomial standard errors (on the scored tokens) above target
    top1_z: float = 1.0
    # Top-1 at a given KLD varies from text to text (pydoc: 0.93 where the calibration text
    # has 0.95): a top-1 level then halves the KLD at which it met its target here. Without
    # it (1) SmolLM2 kept 3 of 6 contracts (RESULTS, "The second stage's cost")
    top1_kld_safety: float = 0.5
    min_gain: float = 0.03  # a costlier transform must save this fraction of the bits
    # the variants are fitted on the rest and compared on this last fraction of the tokens: a
    # basis scored on its own fitting data looks better than it codes anything else (SmolLM2's
    # layer-wide values basis: -25 % bits in-sample, -12 % held out)
    held_out: float = 0.33
    iterations: int = 6  # bisection steps per level (1/64 of the log-scale range)
    # cheapest to decode first. The exact bases ("klt", "pca", "pca-kv") move the
    # rate-distortion curve, but one step per layer runs out of alphabet on them: placed by
    # this search, "pca-kv" kept SmolLM2's 6 contracts in fewer bits but `balanced`'s, and on
    # Gemma 3 put 128 bins in every layer at every level (5 of 6 contracts, more bits); it
    # decodes at 2.5x the CPU (benchmarks/RESULTS.md, "Exact transforms", "The second
    # stage's cost"). Not defaults until the alphabet stops binding.
    variants: tuple[str, ...] = ("none", "centred")
    # further built-in texts (registers.py) on which every level must hold too, each with
    # its own targets and top-1 noise (the worst decides), on `register_prefix_tokens` +
    # cont_tokens tokens. Not the default: see RESULTS, "Two calibration registers"
    registers: tuple[str, ...] = ()
    register_prefix_tokens: int = 768


def calibration_text() -> str:
    return registers.text(TEXT_NAME)


def calibrate(model_path: str | Path, *, fingerprint: str, settings: Settings = Settings(),
              progress: ProgressFn | None = None, cancel: threading.Event | None = None,
              text: str | None = None, pause: Callable[[], None] | None = None,
              keep: Steps | None = None) -> codec.Calibration:
    """Calibrate the codec for one model (see the module docstring). `pause` is called
    between its steps, to wait while anything goes first (a question being answered); `keep`
    keeps its measurements, those of a run stopped before read back."""
    t0 = time.monotonic()
    if keep is not None:
        keep.begin(run_key(fingerprint, settings, text or calibration_text()))
    run = Run(settings, progress, cancel, pause, keep)
    run.say("reference", 0.0)
    with ExitStack() as stack:
        ev = stack.enter_context(quality.Evaluator(
            model_path, text or calibration_text(), prefix_tokens=settings.prefix_tokens,
            cont_tokens=settings.cont_tokens, greedy_tokens=0, fit=True, cancel=cancel,
            pause=pause))
        # another tokenizer may need fewer tokens for the built-in text: the top-1 margin is
        # the noise of the positions actually scored
        settings = replace(settings, prefix_tokens=ev.prefix_tokens, cont_tokens=ev.cont_tokens)
        others = registers.open_all(stack, model_path, settings.registers,
                                    settings.register_prefix_tokens, settings.cont_tokens,
                                    cancel=cancel, pause=pause)
        run.check()
        q8 = run.kept("q8_0", lambda: ev.row("q8_0"))
        run.check()
        floor = run.kept(quality.FLOOR, lambda: ev.row(quality.FLOOR))
        run.say("transforms", 0.05)
        kind, n_rot, scale, bases = rope.candidates(ev.exact)
        # the data decides between the bases (`_fit`): llama.cpp keeps some models' window
        # layers at another base than the metadata's (Gemma 3: 10,000)
        facts = {"type": kind or "none", "n_rot": n_rot, "freq_scale": scale,
                 "bases": sorted(set(bases)), "head_dim": ev.exact.layout.head_dim}
        sections = [kvstate.in_position_order(kv) for kv in ev.seq_state.sections]
        fitting, held_out = zip(*(_split(kv, settings.held_out) for kv in sections), strict=True)
        fits = {v: _fit(fitting, facts, v) for v in settings.variants}
        run.say("sensitivity", 0.1)
        weights = _sensitivity(ev, sections, run, floor["kld"])
        steps = [{k: w ** -0.5 for k, w in part.items()} for part in weights]
        norm = np.exp(np.mean([np.log(s).mean() for part in steps for s in part.values()]))
        steps = [{k: s / norm for k, s in part.items()} for part in steps]
        variant, bits_by_variant = _choose(fits, held_out, steps, weights, settings)
        parts = _fit(sections, facts, variant)
        draft = codec.Calibration(tuple(parts))
        ev.calibration = draft
        targets = quality.targets(q8, floor)
        levels, rows = [{} for _ in parts], {}
        # wide enough below: on Gemma 3 (no KLT) `high` was still short of its goal at 1/64
        lo_scale = _mid_scale(draft, sections, steps) / 512
        for i, name in enumerate(LEVELS):
            run.say(name, 0.5 + 0.15 * i)
            scale, row = _search(ev, draft, sections, steps, name, targets[name], lo_scale,
                                 settings, run, others)
            lo_scale = scale  # a cheaper level is never finer than a better one
            rows[name] = row
            for p, cfg in enumerate(_configs(draft, sections, steps, scale, name)):
                levels[p][name] = cfg
    meta = {"fingerprint": fingerprint, "model": Path(model_path).name,
            "text": "built-in" if text is None else "given", "settings": asdict(settings),
            "variant": variant, "bits_by_variant": bits_by_variant,
            "q8_0": _short(q8), "fp16-ulp": _short(floor), "levels": rows,
            "targets": targets, "rope": facts,
            "registers": {r.name: {"tokens": [r.ev.prefix_tokens, r.ev.cont_tokens],
                                   "targets": r.targets} for r in others},
            "seconds": round(time.monotonic() - t0, 1),
            "created": time.time()}
    run.say("done", 1.0)
    return codec.Calibration(tuple(codec.Part(p.n_layer, p.channels, p.keys, p.values,
                                              levels[i]) for i, p in enumerate(parts)), meta)


def _short(row: dict) -> dict:
    return {k: row[k] for k in ("bits_per_element", "kld", "top1")}


def _theta(facts: dict, base: float, head_dim: int) -> np.ndarray:
    n_rot = facts["n_rot"] or head_dim
    return facts["freq_scale"] * base ** (-np.arange(0, n_rot, 2) / n_rot)


def _fit(sections: list[kvstate.KVState], facts: dict, variant: str) -> list[codec.Part]:
    """One variant's transforms for every section (tokens after the sink)."""
    parts = []
    head_dim = facts["head_dim"]
    for kv in sections:
        first = int(kv.positions[0])
        sink = 1 if first == 0 else 0
        keys, values = kv.keys[:, sink:], kv.values[:, sink:]
        if variant == "none":
            kt = vt = codec.KindTransform(head_dim)
        else:
            kt = min((transform.fit(keys, first + sink, head_dim, facts["type"],
                                    _theta(facts, b, head_dim)) for b in facts["bases"]),
                     key=lambda tf: _spread(keys, tf, first + sink))
            if facts["type"] == "none" or _spread(keys, kt, first + sink) > _spread(
                    keys, transform.fit(keys, first + sink, head_dim), first + sink):
                kt = transform.fit(keys, first + sink, head_dim)
            block = {"klt": head_dim, "pca": kv.channels, "pca-kv": kv.channels}.get(variant)
            if block:
                kt = transform.fit(keys, first + sink, head_dim, kt.rope, kt.theta, basis=True,
                                   block=block, exact=True)
            vt = transform.fit(values, first + sink, head_dim, basis=variant == "pca-kv",
                               block=block, exact=variant == "pca-kv")
        parts.append(codec.Part(kv.n_layer, kv.channels, kt, vt))
    return parts


def _split(kv: kvstate.KVState, fraction: float) -> tuple[kvstate.KVState, kvstate.KVState]:
    """kv (in position order) cut in two at 1 - fraction of its tokens."""
    cut = max(1, min(kv.n_tokens - 1, round(kv.n_tokens * (1 - fraction))))
    return tuple(kvstate.KVState(kv.keys[:, part], kv.values[:, part], kv.positions[part],
                                 kv.v_trans, kv.seq_id) for part in (slice(None, cut),
                                                                     slice(cut, None)))


def _spread(x: np.ndarray, tf: codec.KindTransform, first: int) -> float:
    """Mean log-variance of the channels of x through tf: what a channel costs at one step."""
    y = transform.forward(x, tf, *transform.angles(tf, first, x.shape[1]))
    return float(np.log(y.var(axis=1) + 1e-12).mean())


def _sensitivity(ev: quality.Evaluator, sections, run: Run, floor_kld: float) -> list[dict]:
    """[{("keys"|"values", layer): KLD per unit of noise variance}] per section."""
    rng = np.random.default_rng(0)
    out = []
    total = sum(2 * kv.n_layer for kv in sections)
    done = 0
    for s, kv in enumerate(sections):
        weights = {}
        for kind in ("keys", "values"):
            for layer in range(kv.n_layer):
                run.say("sensitivity", 0.1 + 0.35 * done / total)
                done += 1
                x = getattr(kv, kind)[layer].astype(np.float32)
                sigma = ev_noise(x, run.settings.noise)
                noisy = (x + sigma * rng.standard_normal(x.shape)).astype(x.dtype)
                noisy[kv.positions == 0] = getattr(kv, kind)[layer][kv.positions == 0]
                kld = run.kept(f"probe/{s}/{kind}/{layer}",
                               partial(_probe, ev, s, kv, kind, layer, noisy))
                weights[(kind, layer)] = max(kld - floor_kld, 0.1 * floor_kld) / sigma**2
        out.append(weights)
    return out


def _probe(ev: quality.Evaluator, s: int, kv, kind: str, layer: int,
           noisy: np.ndarray) -> float:
    """KLD with one layer of one kind of section s replaced by `noisy`."""
    changed = _with_layer(ev.seq_state, s, kv, kind, layer, noisy)
    return ev.measure_state("probe", kvstate.build_seq_sections(changed), 16.0)["kld"]


def ev_noise(x: np.ndarray, relative: float) -> float:
    """Probe noise: `relative` times the layer's RMS about its channel means."""
    return relative * float(np.sqrt((x - x.mean(axis=0)).var(axis=0).mean()) + 1e-12)


def _with_layer(seq: kvstate.SeqState, s: int, kv_sorted: kvstate.KVState, kind: str,
                layer: int, data: np.ndarray) -> kvstate.SeqState:
    """The exact state with one layer of one kind of section s replaced (data in position
    order)."""
    sections = list(seq.sections)
    orig = sections[s]
    order = np.argsort(orig.positions, kind="stable")
    arrays = {"keys": orig.keys, "values": orig.values}
    arr = arrays[kind].copy()
    arr[layer, order] = data
    arrays[kind] = arr
    sections[s] = kvstate.KVState(arrays["keys"], arrays["values"], orig.positions,
                                  orig.v_trans, orig.seq_id)
    return kvstate.SeqState(sections, seq.seq_id)


def _chunk_max(x: np.ndarray, tf: codec.KindTransform, first: int) -> np.ndarray:
    """[L] median over 256-token chunks of the largest |coefficient| of each layer."""
    y = transform.forward(x, tf, *transform.angles(tf, first, x.shape[1]))
    tops = [np.abs(y[:, i:i + quality.CHUNK_TOKENS]).max(axis=(1, 2))
            for i in range(0, y.shape[1], quality.CHUNK_TOKENS)]
    return np.median(np.stack(tops), axis=0)


def _bins(top: np.ndarray, step: np.ndarray) -> list[int]:
    maxq = np.clip(np.rint(top / np.maximum(step, 1e-12)), 1, MAX_MAXQ).astype(int)
    return [int(2 * q + 2) for q in maxq]


def _configs(cal: codec.Calibration, sections, steps, scale: float, name: str) -> list[dict]:
    """The level config of every part for one scale (steps = scale * per-unit steps)."""
    out = []
    for p, (part, kv) in enumerate(zip(cal.parts, sections, strict=True)):
        first = int(kv.positions[0])
        sink = 1 if first == 0 else 0
        kinds = {}
        for kind in ("keys", "values"):
            tf = part.transform(kind)
            top = _chunk_max(getattr(kv, kind)[:, sink:], tf, first + sink)
            step = scale * np.array([steps[p][(kind, layer)] for layer in range(kv.n_layer)])
            kinds[kind] = {"scale": "layer", "bins": _bins(top, step),
                           "layer_edges": [round(i / kv.n_layer, 6) for i in range(1, kv.n_layer)]}
            if not tf.identity:
                kinds[kind]["transform"] = CALIBRATED
        out.append({"id": CODEC_ID, "name": name, "mode": "quantized", "lanes": 32,
                    "states": 4, "sink_tokens": 1, "anchor_group": 0, **kinds})
    return out


def _blobs(cal: codec.Calibration, sections, configs: list[dict]) -> list[list[bytes]]:
    """Every part's KV (in position order) encoded at its config."""
    out = []
    for p, (kv, cfg) in enumerate(zip(sections, configs, strict=True)):
        level = {**cfg, "calibration": {"id": cal.id, "part": p}} if any(
            "transform" in cfg[k] for k in ("keys", "values")) else cfg
        out.append(codec.encode_chunks(kv.keys, kv.values, level, calibration=cal,
                                       first_token=int(kv.positions[0]),
                                       chunk_tokens=quality.CHUNK_TOKENS))
    return out


def _bits(sections, blobs: list[list[bytes]]) -> float:
    nbytes = sum(len(b) for part in blobs for b in part)
    return nbytes * 8 / sum(2 * kv.keys.size for kv in sections)


def _choose(fits, sections, steps, weights, settings: Settings) -> tuple[str, dict]:
    """The variant with the fewest bits at equal KLD-weighted error: for each, bits + 0.5 *
    log2(sum of w * squared error) (the high-rate rate-distortion trade: half a bit per halving
    of the error), summed over a mid and a fine scale (where a layer's alphabet can run out:
    a variant whose keys keep large offsets then cannot reach the step it is given). A
    costlier variant (settings.variants is cheapest first) must win by settings.min_gain of
    the cheapest's bits."""
    scores, bits = {}, {}
    for variant, parts in fits.items():
        cal = codec.Calibration(tuple(parts))
        mid = _mid_scale(cal, sections, steps)
        scores[variant] = 0.0
        for scale in (mid, mid / 8):
            configs = _configs(cal, sections, steps, scale, "probe")
            blobs = _blobs(cal, sections, configs)
            rate = _bits(sections, blobs)
            bits.setdefault(variant, round(rate, 4))
            scores[variant] += rate + 0.5 * float(np.log2(_weighted_error(cal, sections, blobs,
                                                                          weights)))
    best = settings.variants[0]
    for variant in settings.variants[1:]:
        if scores[variant] < scores[best] - settings.min_gain * bits[best]:
            best = variant
    return best, {v: {"bits": bits[v], "score": round(scores[v], 4)} for v in fits}


def _weighted_error(cal, sections, blobs, weights) -> float:
    """sum over (kind, layer) of the KLD weight times the mean squared error of a round trip."""
    total = 0.0
    for s, (kv, part) in enumerate(zip(sections, blobs, strict=True)):
        keys, values = codec.decode_chunks(part, calibrations={cal.id: cal})
        for kind, got in (("keys", keys), ("values", values)):
            err = (got.astype(np.float32) - getattr(kv, kind).astype(np.float32)) ** 2
            mse = err.mean(axis=(1, 2))
            total += sum(weights[s][(kind, layer)] * mse[layer] for layer in range(kv.n_layer))
    return max(float(total), 1e-30)


def _mid_scale(cal, sections, steps) -> float:
    """A mid-rate scale: the median unit's step a third of its RMS about the channel means
    (the same for every variant: error is what the transforms keep)."""
    tops = []
    for p, kv in enumerate(sections):
        sink = 1 if int(kv.positions[0]) == 0 else 0
        for kind in ("keys", "values"):
            x = getattr(kv, kind)[:, sink:].astype(np.float32)
            rms = np.sqrt((x - x.mean(axis=1, keepdims=True)).var(axis=1).mean(axis=1))
            tops += list(rms / np.array([steps[p][(kind, layer)] for layer in range(kv.n_layer)]))
    return float(np.median(tops)) / 3.0


def _search(ev, cal, sections, steps, name, target, lo_scale, settings, run, others=()):
    """The coarsest scale meeting `name`'s contract (with margin) on the calibration text
    and on every further register in `others` (registers.Register)."""

    def measured(scale):
        configs = _configs(cal, sections, steps, scale, name)
        row = {**_noisy(ev, cal, sections, configs, name), "scale": scale}
        if others:  # the same configs, as the product stores them, on each register's KV
            row["registers"] = {r.name: _noisy(r.ev, cal, r.sections, configs, name)
                                for r in others}
        return row

    def measure(scale):
        run.check()
        return run.kept(f"{name}/{scale!r}", lambda: measured(scale))

    return search.place(measure, quality.CONTRACTS[name][0], target, lo_scale,
                        _mid_scale(cal, sections, steps) * 8, settings,
                        {r.name: (r.targets[name], r.ev.cont_tokens) for r in others})


def _noisy(ev, cal, sections, configs, name) -> dict:
    state, bits = _state(ev, cal, sections, configs)
    row = ev.measure_state(name, state, bits, noise=True)
    return {**_short(row), "kld_se": row["kld_se"], "top1_se": row["top1_se"]}


def _state(ev, cal, sections, configs) -> tuple[bytes, float]:
    """The exact state after a round trip through a level's configs (one per part)."""
    seq = ev.seq_state
    blobs = _blobs(cal, sections, configs)
    out = []
    for orig, part in zip(seq.sections, blobs, strict=True):
        keys, values = codec.decode_chunks(part, calibrations={cal.id: cal})
        order = np.argsort(orig.positions, kind="stable")
        back_k, back_v = np.empty_like(orig.keys), np.empty_like(orig.values)
        back_k[:, order], back_v[:, order] = keys, values
        out.append(kvstate.KVState(back_k, back_v, orig.positions, orig.v_trans, orig.seq_id))
    state = kvstate.build_seq_sections(kvstate.SeqState(out, seq.seq_id))
    codec.release_tables()  # every step of the search has configs of its own
    return state, _bits(sections, blobs)
