"""Does a decorrelating transform before the codec pay? An emulation on unchanged levels.

    .venv/bin/python -m benchmarks.kv_transforms --text pydoc --level high \
        --mults 0.7 1.0 1.4 --variants plain klt-KV --out kt.jsonl

Variants (per layer, float64, the codec run unchanged on the transformed fp16 arrays, the
inverse applied after decoding, the exact sink token put back):
    plain        the level as it is;
    klt-K/-KV    keys un-RoPE'd (positions known), then projected on the eigenvectors of their
                 covariance on a calibration text (pydoc's second half, or with --calib-mix
                 half of that and half of `collections`' source: no evaluation text);
                 values (KV) projected on their own eigenvectors; re-RoPE'd after;
    oracle-*     the same with the eigenvectors of the evaluated KV itself (an upper bound);
    unrope-K     keys un-RoPE'd only (no projection);
    klt-K-head   one basis per KV head (block-diagonal) instead of one per layer;
    wkltP-K      klt-K on pre-RoPE keys scaled per channel by w^P (w: query energy from
                 `benchmarks.qk_importance`, geometric mean 1 per layer), unscaled after.
Rows for the level's bins scaled by each multiplier, all scored against one exact run: compare
the curves at equal bits. Single-section models with "norm" RoPE (SmolLM2) only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import codec
from benchmarks import qk_importance as calibration
from benchmarks.common import (
    calibration_kv,
    common_args,
    model_of,
    roundtrip,
    row_printer,
    scaled_bins,
    score,
    text_of,
)
from desktop_app.calibration import quality
from desktop_app.model import kvstate


def rope_angles(positions: np.ndarray, head_dim: int, base: float) -> np.ndarray:
    """llama.cpp "norm" RoPE: channel pair (2i, 2i+1) turns by pos * base^(-2i/d)."""
    theta = base ** (-np.arange(0, head_dim, 2) / head_dim)
    return positions[:, None].astype(np.float64) * theta[None, :]


def rope(x: np.ndarray, ang: np.ndarray, sign: float) -> np.ndarray:
    """Rotate x [T, C] (C = heads * head_dim) by sign * ang [T, head_dim / 2] per pair."""
    t, c = x.shape
    half = ang.shape[1]
    y = x.reshape(t, c // (2 * half), half, 2)
    cos, sin = np.cos(ang)[:, None, :], sign * np.sin(ang)[:, None, :]
    a, b = y[..., 0], y[..., 1]
    return np.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(t, c)


def basis(x: np.ndarray, block: int = 0) -> np.ndarray:
    """Eigenvectors of the covariance of x [T, C] (columns), largest variance first; with
    block > 0 one basis per run of `block` channels (a head), block-diagonal."""
    if block:
        out = np.zeros((x.shape[1], x.shape[1]))
        for i in range(0, x.shape[1], block):
            out[i:i + block, i:i + block] = basis(x[:, i:i + block])
        return out
    w, v = np.linalg.eigh(np.cov(x.T))
    return v[:, ::-1]


def main() -> None:
    ap = common_args(__doc__)
    ap.add_argument("--variants", nargs="*", default=["plain", "klt-KV"])
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rope-base", type=float, default=100000.0)
    ap.add_argument("--calib-tokens", type=int, default=2048)
    ap.add_argument("--calib-mix", action="store_true",
                    help="calibrate on pydoc's second half + collections' source, not pydoc's only")
    ap.add_argument("--importance", type=Path, default=Path("/tmp/imp_default.npz"),
                    help="benchmarks.channel_weighting's cache of the importance arrays")
    args = ap.parse_args()
    show = row_printer(args)
    model = model_of(args.model, args.cache_dir)

    cal = calibration_kv(model, args.calib_tokens, args.calib_mix)
    cal_ang = rope_angles(cal.positions, args.head_dim, args.rope_base)
    cal_k = [rope(cal.keys[layer, 1:].astype(np.float64), cal_ang[1:], -1)
             for layer in range(cal.n_layer)]
    cal_v = [cal.values[layer, 1:].astype(np.float64) for layer in range(cal.n_layer)]
    base = codec.levels()[args.level].get_config()
    with quality.Evaluator(model, text_of(args.text), prefix_tokens=args.prefix_tokens,
                           cont_tokens=args.cont_tokens, greedy_tokens=0) as ev:
        kv = kvstate.in_position_order(ev.seq_state.sections[0])
        ang = rope_angles(kv.positions, args.head_dim, args.rope_base)
        pre_k = [rope(kv.keys[layer].astype(np.float64), ang, -1) for layer in range(kv.n_layer)]
        vals = [kv.values[layer].astype(np.float64) for layer in range(kv.n_layer)]
        for variant in args.variants:
            oracle = variant.startswith("oracle")
            bk = bv = None
            scale = np.ones((kv.n_layer, kv.channels))
            if variant.startswith("wklt"):
                power = float(variant[4:].split("-")[0])
                imp = np.load(args.importance)["keys"]
                scale = 1 / calibration.step_weights(imp, power)
            if "klt" in variant or oracle:
                src_k, src_v = (pre_k, vals) if oracle else (cal_k, cal_v)
                src_k = [x * scale[layer] for layer, x in enumerate(src_k)]
                block = args.head_dim if "head" in variant else 0
                bk = [basis(x[1:], block) for x in src_k]
                bv = [basis(x[1:]) for x in src_v] if "KV" in variant else None
            unrope = variant != "plain"
            keys = np.stack([
                ((pre_k[layer] * scale[layer]) @ bk[layer] if bk else pre_k[layer]) if unrope
                else kv.keys[layer]
                for layer in range(kv.n_layer)]).astype(np.float16)
            values = np.stack([vals[layer] @ bv[layer] if bv else kv.values[layer]
                               for layer in range(kv.n_layer)]).astype(np.float16)
            for mult in args.mults:
                cfg = {**scaled_bins(base, mult), "name": f"{args.level}x{mult}"}
                back_k, back_v, nbytes = roundtrip(
                    kvstate.KVState(keys, values, kv.positions, kv.v_trans, kv.seq_id), cfg)
                if unrope:
                    back_k = np.stack([
                        rope(back_k[layer].astype(np.float64) @ bk[layer].T / scale[layer]
                             if bk else back_k[layer].astype(np.float64), ang, 1)
                        for layer in range(kv.n_layer)]).astype(np.float16)
                if bv:
                    back_v = np.stack([back_v[layer].astype(np.float64) @ bv[layer].T
                                       for layer in range(kv.n_layer)]).astype(np.float16)
                score(ev, kv, back_k, back_v, nbytes, f"{args.level}x{mult}-{variant}", show)


if __name__ == "__main__":
    main()
