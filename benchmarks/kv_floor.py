"""Where does the high-rate KLD floor of the "layer" levels come from? Emulations.

    .venv/bin/python -m benchmarks.kv_floor --text pydoc --level high --mults 2 3 \
        --variants plain K V lossless out99.9 center-KV --out floor.jsonl
    .venv/bin/python -m benchmarks.kv_floor --text pydoc --stats --mults 3   # no model runs

Variants (the codec runs unchanged; what it does not see is put back exact after decoding):
    plain        the level's bins scaled by each multiplier;
    lossless     the codec's lossless mode (must score KLD 0: the harness's own floor);
    K, V         only keys (values exact) or only values quantized;
    K@a-b etc.   only layers a..b-1 of that kind (K, V or KV) quantized;
    outP         per (layer, 256-token chunk, kind) the elements with |x| above the P-th
                 percentile kept exact (counted 32 bits each: fp16 value + 16-bit position),
                 the rest clipped to that percentile before the codec (a finer layer step);
    outP-K/-V    the same for one kind only;
    normN        per (layer, chunk, kind) the N tokens of largest norm kept exact (16 bits per
                 element + 16 bits per token);
    sinkN        the config's sink_tokens = N, the first token NOT put back exact afterwards;
    center-K/V/KV per (layer, chunk, channel) mean removed before the codec (stored fp16:
                 16 bits per channel and chunk) and added back after;
    centroid     decoded elements moved from their bin's centre to the mean of the elements
                 coded to it: per (kind, layer, |symbol|), in units of the layer-chunk's step
                 (Lloyd-Max reconstruction points at the codec's thresholds), fitted on the
                 other parity of 256-token chunks (every chunk reconstructed with offsets it
                 did not help fit); the offsets counted 16 bits each; centroid-energy: then
                 scaled per (kind, layer) to the elements' own energy (fitted the same way);
    ulpF[-K/-V]  no codec: a random fraction F of the (non-sink) elements moved by one fp16
                 ulp (the smallest possible change; bits shown as 16).
    emuq8, emuq4 no codec: llama.cpp's q8_0 / q4_0 block quantization (32 channels of one
                 token per fp16 scale, the reference rounding of quantize_row_q8_0/q4_0_ref)
                 emulated in numpy on K and V, stored back as f16 (8.5 / 4.5 bits); unlike the
                 native cache types the queries stay unquantized, and it runs without flash
                 attention too.
--no-flash runs every context without flash attention (llama.cpp's CPU flash-attention kernel
accumulates the attention output over an f16 V cache in fp16).
Rows are scored with benchmarks.common.score against one exact run (N = 2,048, M = 256).
--stats prints, without the model, facts about the recorded KV at the scaled bins: the layer
step relative to the channels' spread, where the largest elements sit (tokens or channels),
and the decoded error's bias per channel.
"""

from __future__ import annotations

import numpy as np

import codec
from benchmarks.common import (
    CHUNK,
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


def chunks(n_tok: int):
    return [slice(i, min(i + CHUNK, n_tok)) for i in range(0, n_tok, CHUNK)]


def outlier_mask(x: np.ndarray, pct: float, sink: int) -> np.ndarray:
    """True where |x| [L, T, C] is above the pct-th percentile of its (layer, chunk); the
    sink tokens (kept exact by the codec already) neither count nor set the percentile."""
    mask = np.zeros(x.shape, bool)
    a = np.abs(x.astype(np.float32))
    for sl in chunks(x.shape[1]):
        lo = max(sl.start, sink)
        if lo >= sl.stop:
            continue
        seg = a[:, lo:sl.stop].reshape(x.shape[0], -1)
        thr = np.percentile(seg, pct, axis=1)
        mask[:, lo:sl.stop] = a[:, lo:sl.stop] > thr[:, None, None]
    return mask


def clip_outliers(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """x with every masked element replaced by the largest unmasked |x| of its (layer, chunk),
    same sign, so that the codec's layer step comes from the kept elements."""
    out = x.copy()
    a = np.abs(x.astype(np.float32))
    for sl in chunks(x.shape[1]):
        kept = np.where(mask[:, sl], 0, a[:, sl]).reshape(x.shape[0], -1).max(axis=1)
        m = mask[:, sl]
        out[:, sl] = np.where(m, np.sign(x[:, sl]) * kept[:, None, None].astype(x.dtype),
                              x[:, sl])
    return out


def norm_mask(x: np.ndarray, n: int, sink: int) -> np.ndarray:
    """True on the n tokens of largest L2 norm of every (layer, chunk) (sinks excluded)."""
    mask = np.zeros(x.shape, bool)
    nrm = np.linalg.norm(x.astype(np.float32), axis=2)
    for sl in chunks(x.shape[1]):
        lo = max(sl.start, sink)
        if lo >= sl.stop:
            continue
        top = np.argsort(-nrm[:, lo:sl.stop], axis=1)[:, :n] + lo
        for layer in range(x.shape[0]):
            mask[layer, top[layer]] = True
    return mask


def chunk_means(x: np.ndarray, sink: int) -> np.ndarray:
    """Per (layer, chunk, channel) mean of the non-sink tokens, fp16, broadcast to x's shape."""
    out = np.zeros(x.shape, np.float16)
    for sl in chunks(x.shape[1]):
        lo = max(sl.start, sink)
        if lo < sl.stop:
            out[:, sl] = x[:, lo:sl.stop].astype(np.float32).mean(axis=1, keepdims=True)
    return out


def _blocks(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)


def q8_0(x: np.ndarray) -> np.ndarray:
    """llama.cpp's q8_0 round trip: d = amax / 127, q = round(x / d), x' = q * fp16(d)."""
    b = _blocks(x)
    d = np.abs(b).max(axis=-1, keepdims=True) / 127
    inv = np.divide(1, d, out=np.zeros_like(d), where=d > 0)
    q = np.round(b * inv)  # roundf: halves away from zero; ties are measure-zero here
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape).astype(np.float16)


def q4_0(x: np.ndarray) -> np.ndarray:
    """llama.cpp's q4_0 round trip: d = (signed value of largest |x|) / -8,
    q = min(15, trunc(x / d + 8.5)), x' = (q - 8) * fp16(d)."""
    b = _blocks(x)
    idx = np.abs(b).argmax(axis=-1)[..., None]
    d = np.take_along_axis(b, idx, axis=-1) / -8
    inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, np.trunc(b * inv + 8.5))
    return ((q - 8) * d.astype(np.float16).astype(np.float32)).reshape(x.shape).astype(
        np.float16)


def centroids(x: np.ndarray, back: np.ndarray, sink: int,
              energy: bool = False) -> tuple[np.ndarray, int]:
    """`back` (x through the codec) with every element moved to the centroid of its
    (layer, |symbol|) bin fitted on the chunks of the other parity (with `energy`, then
    scaled to the layer's energy there); and the offsets' count."""
    out = back.astype(np.float32)
    count = 0
    for layer in range(x.shape[0]):
        rows = []  # (parity, |q|, sign, |x| / step, slice) per chunk
        for i, c in enumerate(chunks(x.shape[1])):
            c = slice(max(c.start, sink), c.stop)
            b = back[layer, c].astype(np.float64)
            nonzero = np.abs(b[b != 0])
            if nonzero.size:  # the step: the smallest nonzero magnitude (symbol +-1)
                step = nonzero.min()
                q = np.rint(b / step)
                rows.append((i % 2, np.abs(q).astype(np.int64), np.sign(q),
                             np.abs(x[layer, c].astype(np.float64)) / step, step, c))
        top = max((int(r[1].max()) for r in rows), default=0)
        for parity in (0, 1):
            fit = [r for r in rows if r[0] != parity]
            if not fit:
                continue
            a = np.concatenate([r[1].ravel() for r in fit])
            mag = np.concatenate([r[3].ravel() for r in fit])
            sums = np.bincount(a, mag, minlength=top + 1)
            counts = np.bincount(a, minlength=top + 1)
            offset = np.where(counts > 20, sums / np.maximum(counts, 1) - np.arange(top + 1), 0)
            offset[0] = 0
            count += int((counts[1:] > 20).sum()) + energy
            gain = 1.0
            if energy:  # the centroids' energy brought back to the elements' own
                rec = np.concatenate([((r[1] + offset[r[1]]) * r[4]).ravel() for r in fit])
                own = np.concatenate([(r[3] * r[4]).ravel() for r in fit])
                gain = float(np.sqrt((own ** 2).sum() / max((rec ** 2).sum(), 1e-30)))
            for _, q, sign, _, step, c in (r for r in rows if r[0] == parity):
                out[layer, c] = sign * (q + offset[q]) * step * gain
    return out.astype(back.dtype), count


def layer_range(spec: str, n_layer: int) -> np.ndarray:
    if "@" not in spec:
        return np.arange(n_layer)
    a, b = spec.split("@")[1].split("-")
    return np.arange(int(a), int(b))


def run_variant(ev, kv: kvstate.KVState, cfg: dict, variant: str, show, name: str) -> None:
    sink = cfg.get("sink_tokens", 0)
    keys, values = kv.keys, kv.values
    extra_bits = 0
    exact_first = True
    if variant == "lossless":
        cfg = {**{k: cfg[k] for k in ("id", "name", "lanes", "states")}, "mode": "lossless"}
    elif variant.startswith("sink"):
        cfg = {**cfg, "sink_tokens": int(variant[4:])}
        exact_first = False
    if variant.startswith("ulp"):
        head, _, kinds = variant.partition("-")
        rng = np.random.default_rng(0)
        out = []
        for kind, x in (("K", keys), ("V", values)):
            x = x.copy()
            if kind in (kinds or "KV"):
                hit = rng.random(x.shape) < float(head[3:])
                hit[:, :1] = False
                step = np.where(rng.random(x.shape) < 0.5, 1, -1).astype(np.int16)
                bits = x.view(np.uint16)
                bits[hit] = (bits[hit].astype(np.int32) + step[hit]).astype(np.uint16)
            out.append(x)
        score(ev, kv, out[0], out[1], 2 * kv.keys.size * 2, f"{name}-{variant}", show)
        return
    if variant in ("emuq8", "emuq4"):
        fn, bits = (q8_0, 8.5) if variant == "emuq8" else (q4_0, 4.5)
        score(ev, kv, fn(keys), fn(values), int(bits * kv.keys.size * 2 / 8),
              f"{name}-{variant}", show)
        return
    masks = [None, None]
    if variant.startswith("out") or variant.startswith("norm"):
        head, _, kinds = variant.partition("-")
        kinds = kinds or "KV"
        for i, (kind, x) in enumerate((("K", keys), ("V", values))):
            if kind not in kinds:
                continue
            if head.startswith("out"):
                masks[i] = outlier_mask(x, float(head[3:]), sink)
                extra_bits += 32 * int(masks[i].sum())
            else:
                n = int(head[4:])
                masks[i] = norm_mask(x, n, sink)
                extra_bits += int(masks[i][:, :, 0].sum()) * (16 * x.shape[2] + 16)
        keys = keys if masks[0] is None else clip_outliers(keys, masks[0])
        values = values if masks[1] is None else clip_outliers(values, masks[1])
    means = [None, None]
    if variant.startswith("center"):
        kinds = variant.split("-")[1]
        for i, (kind, x) in enumerate((("K", keys), ("V", values))):
            if kind in kinds:
                means[i] = chunk_means(x, sink)
                extra_bits += 16 * x.shape[0] * x.shape[2] * len(chunks(x.shape[1]))
        keys = keys if means[0] is None else (keys.astype(np.float32) - means[0]).astype(
            np.float16)
        values = values if means[1] is None else (values.astype(np.float32) - means[1]).astype(
            np.float16)
    back_k, back_v, nbytes = roundtrip(
        kvstate.KVState(keys, values, kv.positions, kv.v_trans, kv.seq_id), cfg)
    for i, m in enumerate(means):
        if m is not None:
            back = (back_k, back_v)[i].astype(np.float32) + m
            back_k, back_v = (back.astype(np.float16), back_v) if i == 0 else (
                back_k, back.astype(np.float16))
    for i, m in enumerate(masks):
        if m is not None:
            src, back = (kv.keys, back_k) if i == 0 else (kv.values, back_v)
            back[m] = src[m]
    if variant in ("centroid", "centroid-energy"):
        energy = variant == "centroid-energy"
        (back_k, n_k), (back_v, n_v) = (centroids(kv.keys, back_k, max(sink, 1), energy),
                                        centroids(kv.values, back_v, max(sink, 1), energy))
        extra_bits += 16 * (n_k + n_v)
    head = variant.split("@")[0]
    if head in ("K", "V", "KV") and variant != "KV":
        layers = layer_range(variant, kv.n_layer)
        keep_k = np.ones(kv.n_layer, bool)
        keep_k[layers] = False
        if "K" in head:
            back_k[keep_k] = kv.keys[keep_k]
        else:
            back_k = kv.keys.copy()
        if "V" in head:
            back_v[keep_k] = kv.values[keep_k]
        else:
            back_v = kv.values.copy()
    score(ev, kv, back_k, back_v, nbytes + extra_bits // 8, f"{name}-{variant}", show,
          exact_first=exact_first)


def stats(kv: kvstate.KVState, cfg: dict, show) -> None:
    """Facts about the recorded KV under cfg (no model): per kind and layer, the step of the
    layer scale vs the spread of the channels, how concentrated the top 0.1 % of |x| is in
    tokens and channels, and the bias of the decoded error."""
    back_k, back_v, _ = roundtrip(kv, cfg)
    sink = cfg["sink_tokens"]
    conf = codec.CodecConfig.from_config(cfg)
    for kind, x, back, bins in (("K", kv.keys, back_k, conf.keys),
                                ("V", kv.values, back_v, conf.values)):
        maxq = bins.layer_bins(kv.n_layer) // 2 - 1
        xs = x[:, sink:].astype(np.float32)
        err = back[:, sink:].astype(np.float32) - xs
        for layer in range(kv.n_layer):
            a = np.abs(xs[layer])
            steps = [a[max(sl.start - sink, 0):sl.stop - sink].max() / maxq[layer]
                     for sl in chunks(x.shape[1]) if sl.stop > sink]
            step = float(np.median(steps))
            ch_std = xs[layer].std(axis=0)
            thr = np.percentile(a, 99.9)
            top = a > thr
            tok_share = np.sort(top.sum(axis=1))[::-1]
            ch_share = np.sort(top.sum(axis=0))[::-1]
            n_top = max(int(top.sum()), 1)
            e = err[layer]
            bias = e.mean(axis=0)
            show({"kind": kind, "layer": layer, "maxq": int(maxq[layer]),
                  "step": round(step, 4), "max_abs": round(float(a.max()), 3),
                  "p99.9": round(float(thr), 3), "rms": round(float(np.sqrt((xs[layer] ** 2)
                                                                           .mean())), 4),
                  "ch_std_median_over_step": round(float(np.median(ch_std) / step), 3),
                  "frac_ch_std_below_half_step": round(float((ch_std < step / 2).mean()), 3),
                  "frac_zero_sym": round(float((np.abs(back[layer, sink:].astype(np.float32))
                                                == 0).mean()), 3),
                  "top0.1_in_top5_tokens": round(float(tok_share[:5].sum() / n_top), 3),
                  "top0.1_in_top5_channels": round(float(ch_share[:5].sum() / n_top), 3),
                  "err_rms": round(float(np.sqrt((e ** 2).mean())), 5),
                  "bias_rms_over_err_rms": round(float(np.sqrt((bias ** 2).mean()
                                                               / max((e ** 2).mean(), 1e-30))),
                                                 3),
                  "mean_rms_over_std": round(float(np.sqrt((xs[layer].mean(0) ** 2).mean()
                                                           / (ch_std ** 2).mean())), 3)})


def main() -> None:
    ap = common_args(__doc__)
    ap.add_argument("--variants", nargs="*", default=["plain"])
    ap.add_argument("--stats", action="store_true", help="print KV facts only (--kv-cache)")
    ap.add_argument("--kv-cache", help="npz of the evaluated KV (written by a model run)")
    ap.add_argument("--no-flash", action="store_true", help="contexts without flash attention")
    args = ap.parse_args()
    show = row_printer(args)
    base = codec.levels()[args.level].get_config()
    if args.stats:
        d = np.load(args.kv_cache or f"/tmp/kvfloor_{args.text}.npz")
        kv = kvstate.KVState(d["keys"], d["values"], d["positions"], bool(d["v_trans"]))
        for mult in args.mults:
            stats(kv, {**scaled_bins(base, mult), "name": "stats"}, show)
        return
    model = model_of(args.model, args.cache_dir)
    with quality.Evaluator(model, text_of(args.text), prefix_tokens=args.prefix_tokens,
                           cont_tokens=args.cont_tokens, greedy_tokens=0,
                           flash_attn=not args.no_flash) as ev:
        kv = kvstate.in_position_order(ev.seq_state.sections[0])
        np.savez(args.kv_cache or f"/tmp/kvfloor_{args.text}.npz", keys=kv.keys,
                 values=kv.values, positions=kv.positions, v_trans=kv.v_trans)
        for mult in args.mults:
            cfg = {**scaled_bins(base, mult), "name": f"{args.level}x{mult}"}
            for variant in args.variants:
                run_variant(ev, kv, cfg, variant, show, f"{args.level}x{mult}")


if __name__ == "__main__":
    main()
