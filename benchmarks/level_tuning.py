"""Level tuning experiments on `desktop_app.calibration.quality.Evaluator` (results in RESULTS.md).

    # KLD when only one layer of one kind is quantized (everything else exact):
    .venv/bin/python -m benchmarks.level_tuning sens --k-bins 8 --v-bins 4 --out sens.json
    # score codec config variants (JSON {name: config dict}) against one exact run:
    .venv/bin/python -m benchmarks.level_tuning rows --variants variants.json
    # estimated bits per element of every layer and maxq, from the recorded KV (no model):
    .venv/bin/python -m benchmarks.level_tuning rates --out rates.json
    # per-layer bins for target sizes from the sensitivity runs and the rates (no model):
    .venv/bin/python -m benchmarks.level_tuning alloc --sens sens1.jsonl sens2.jsonl \
        --rates rates.json --sink-tokens 1 --target-bits 2.05 1.45 0.955 --gamma-min 1.0 \
        --min-k-bins 12 --min-v-bins 6 --out alloc.json

Both share --model/--text/--prefix-tokens/--cont-tokens with benchmarks.bench_quality; --greedy-
tokens defaults to 0 here (teacher-forced KLD and top-1 only, much faster on 2 cores). Prints
one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import codec
from benchmarks.common import CHUNK as DEFAULT_CHUNK_TOKENS
from benchmarks.common import model_of, roundtrip, text_of
from desktop_app.calibration import quality
from desktop_app.model import kvstate


def uniform(k_bins: int, v_bins: int, sink: int) -> dict:
    return {"id": codec.levels()["high"].get_config()["id"], "name": "probe",
            "mode": "quantized", "lanes": 32, "states": 4, "sink_tokens": sink,
            "anchor_group": 0,
            "keys": {"scale": "layer", "bins": [k_bins], "layer_edges": []},
            "values": {"scale": "layer", "bins": [v_bins], "layer_edges": []}}


def sensitivity(ev: quality.Evaluator, k_bins: int, v_bins: int, sink: int, show) -> None:
    seq = ev.seq_state
    cfg = uniform(k_bins, v_bins, sink)
    decoded = [roundtrip(kv, cfg)[:2] for kv in seq.sections]
    for s, kv in enumerate(seq.sections):
        for kind, idx in (("K", 0), ("V", 1)):
            for layer in range(kv.n_layer):
                parts = []
                for s2, kv2 in enumerate(seq.sections):
                    keys, values = kv2.keys, kv2.values
                    if s2 == s:
                        src = decoded[s][idx]
                        arr = (keys if idx == 0 else values).copy()
                        arr[layer] = src[layer]
                        keys, values = (arr, values) if idx == 0 else (keys, arr)
                    parts.append(kvstate.KVState(keys, values, kv2.positions, kv2.v_trans,
                                                 kv2.seq_id))
                row = ev.measure_state(f"{kind}{layer}", ev.state_with(parts), 0.0)
                show({"section": s, "kind": kind, "layer": layer, "k_bins": k_bins,
                      "v_bins": v_bins, "kld": row["kld"], "top1": row["top1"]})


MAXQ = tuple(range(1, 32))


def rate_table(x: np.ndarray, sink: int) -> list[list[float]]:
    """Estimated bits per element of every layer at every maxq (MAXQ): the empirical entropy of
    each (layer, chunk, channel) stream with the codec's "layer" scale, plus 16 bits of table id
    per stream and 5 % coder overhead."""
    n_layer, n_tok, n_ch = x.shape
    chunk = DEFAULT_CHUNK_TOKENS
    out = []
    for layer in range(n_layer):
        row = []
        for maxq in MAXQ:
            bits = 0.0
            for c0 in range(0, n_tok, chunk):
                part = x[layer, max(c0, sink) : c0 + chunk].astype(np.float32)
                scale = np.abs(part).max()
                q = np.rint(part * (maxq / scale)).astype(np.int64) + maxq if scale else \
                    np.full(part.shape, maxq)
                nsym = 2 * maxq + 1
                h = np.bincount((q + nsym * np.arange(n_ch)).ravel(),
                                minlength=nsym * n_ch).reshape(n_ch, nsym)
                p = h / h.sum(1, keepdims=True)
                with np.errstate(divide="ignore", invalid="ignore"):
                    ent = -(h * np.where(h > 0, np.log2(p), 0)).sum()
                bits += ent * 1.05 + 16 * n_ch
            row.append(bits / (n_tok * n_ch))
        out.append(row)
    return out


def distortion_model(files: list[Path], gamma_min: float = 0.3) -> dict:
    """Per (kind, layer): (a, gamma) of D(maxq) = a * maxq ** -gamma, from one or two probes."""
    points: dict = {}
    for f in files:
        for line in f.read_text().splitlines():
            r = json.loads(line)
            bins = r["k_bins"] if r["kind"] == "K" else r["v_bins"]
            points.setdefault((r["kind"], r["layer"]), []).append((bins // 2 - 1, r["kld"]))
    model = {}
    for unit, pts in points.items():
        pts = sorted(set(pts))
        gamma = 2.0
        if len(pts) >= 2 and pts[0][1] > 0 and pts[-1][1] > 0:
            gamma = float(np.clip(np.log(pts[0][1] / pts[-1][1]) /
                                  np.log(pts[-1][0] / pts[0][0]), gamma_min, 3.0))
        m, dist = pts[-1]
        model[unit] = (max(dist, 1e-6) * m**gamma, gamma)
    return model


def segment(cost: np.ndarray, groups: int) -> list[tuple[int, int, int]]:
    """Split layers into <= groups runs with one maxq each, minimizing the summed cost
    (cost[layer, maxq index]); returns (start, end, maxq index) runs."""
    n = cost.shape[0]
    cum = np.vstack([np.zeros(cost.shape[1]), np.cumsum(cost, 0)])
    best = np.full((groups + 1, n + 1), np.inf)
    back = {}
    best[0, 0] = 0.0
    for g in range(1, groups + 1):
        for j in range(1, n + 1):
            for i in range(j):
                seg = cum[j] - cum[i]
                c = best[g - 1, i] + seg.min()
                if c < best[g, j]:
                    best[g, j], back[g, j] = c, (i, int(seg.argmin()))
    g = int(best[:, n].argmin())
    runs, j = [], n
    while j > 0:
        i, q = back[g, j]
        runs.append((i, j, q))
        j, g = i, g - 1
    return runs[::-1]


def kind_config(runs: list[tuple[int, int, int]], n_layer: int) -> dict:
    return {"scale": "layer", "bins": [2 * MAXQ[q] + 2 for _, _, q in runs],
            "layer_edges": [round(i / n_layer, 6) for i, _, _ in runs[1:]]}


def allocate(sens: list[Path], rates: dict, kv, target: float, sink: int, groups: int,
             fixed_values: dict | None = None, gamma_min: float = 0.3,
             min_bins: tuple[int, int] = (4, 4)):
    """Lagrangian bit allocation over (kind, layer) from the sensitivity model and the rate
    table, the multiplier searched until the real codec hits `target` bits per element."""
    model = distortion_model(sens, gamma_min)
    maxq = np.array(MAXQ, dtype=np.float64)

    def config(lam: float) -> dict:
        kinds = {}
        for kind, name in (("K", "keys"), ("V", "values")):
            if name == "values" and fixed_values:
                kinds[name] = fixed_values
                continue
            rate = np.array(rates[kind])
            dist = np.array([model[(kind, layer)][0] * maxq ** -model[(kind, layer)][1]
                             for layer in range(rate.shape[0])])
            dist[:, maxq < min_bins[name == "values"] // 2 - 1] = 1e6
            kinds[name] = kind_config(segment(dist + lam * rate, groups), rate.shape[0])
        return {**uniform(8, 4, sink), "name": "alloc", **kinds}

    lo, hi = 1e-6, 10.0  # log-space bisection on the multiplier: larger -> fewer bits
    for _ in range(18):
        lam = (lo * hi) ** 0.5
        cfg = config(lam)
        blobs = codec.encode_chunks(kv[0], kv[1], cfg, chunk_tokens=DEFAULT_CHUNK_TOKENS)
        bits = sum(len(b) for b in blobs) * 8 / (2 * kv[0].size)
        if bits > target:
            lo = lam
        else:
            hi = lam
    cfg = config(hi)
    blobs = codec.encode_chunks(kv[0], kv[1], cfg, chunk_tokens=DEFAULT_CHUNK_TOKENS)
    return cfg, sum(len(b) for b in blobs) * 8 / (2 * kv[0].size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["sens", "rows", "rates", "alloc"])
    ap.add_argument("--sens", type=Path, nargs="*", default=[], help="sens JSON lines files")
    ap.add_argument("--rates", type=Path, help="the rates table (rates mode's --out)")
    ap.add_argument("--target-bits", type=float, nargs="*", default=[2.05, 1.45, 0.97])
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--gamma-min", type=float, default=0.3,
                    help="floor of the fitted exponent of KLD vs maxq")
    ap.add_argument("--min-k-bins", type=int, default=4)
    ap.add_argument("--min-v-bins", type=int, default=4)
    ap.add_argument("--v-token-bins", type=int, nargs="*", default=[],
                    help="also allocate keys only, values at these per-token bins")
    ap.add_argument("--model", default="default")
    ap.add_argument("--text", default="pydoc")
    ap.add_argument("--prefix-tokens", type=int, default=2048)
    ap.add_argument("--cont-tokens", type=int, default=256)
    ap.add_argument("--greedy-tokens", type=int, default=0)
    ap.add_argument("--k-bins", type=int, default=8)
    ap.add_argument("--v-bins", type=int, default=4)
    ap.add_argument("--sink-tokens", type=int, default=4)
    ap.add_argument("--variants", type=Path)
    ap.add_argument("--configs", default="", help="named configs to score too (rows)")
    ap.add_argument("--out", type=Path, help="also append the JSON lines here")
    ap.add_argument("--kv", type=Path, default=Path("benchmarks/data/kv4096.npz"))
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/kvdesk-models"))
    args = ap.parse_args()
    t0 = time.monotonic()
    out = args.out.open("a") if args.out else None

    def show(row: dict) -> None:
        line = json.dumps({**row, "model": args.model, "text": args.text,
                           "M": args.cont_tokens, "t": round(time.monotonic() - t0, 1)})
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    if args.mode == "alloc":
        d = np.load(args.kv)
        kv = (d["keys"][:, : args.prefix_tokens], d["values"][:, : args.prefix_tokens])
        result = {}
        for target in args.target_bits:
            for vb in [None, *args.v_token_bins]:
                fixed = vb and {"scale": "token", "bins": [vb], "layer_edges": []}
                cfg, bits = allocate(args.sens, json.loads(args.rates.read_text()), kv, target,
                                     args.sink_tokens, args.groups, fixed, args.gamma_min,
                                     (args.min_k_bins, args.min_v_bins))
                name = (f"alloc-{target}-g{args.gamma_min}-min{args.min_k_bins}/"
                        f"{args.min_v_bins}" + (f"-vtok{vb}" if vb else ""))
                print(f"{name}: codec {bits:.4f} bits", json.dumps(cfg), flush=True)
                result[name] = cfg
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        return
    if args.mode == "rates":
        d = np.load(args.kv)
        n = args.prefix_tokens
        table = {kind: rate_table(d[name][:, :n], args.sink_tokens) for kind, name in
                 (("K", "keys"), ("V", "values"))}
        args.out.write_text(json.dumps({"maxq": list(MAXQ), **table}))
        return
    with quality.Evaluator(model_of(args.model, args.cache_dir), text_of(args.text),
                           prefix_tokens=args.prefix_tokens, cont_tokens=args.cont_tokens,
                           greedy_tokens=args.greedy_tokens) as ev:
        if args.mode == "sens":
            sensitivity(ev, args.k_bins, args.v_bins, args.sink_tokens, show)
            return
        configs: list = [c for c in args.configs.split(",") if c]
        if args.variants:
            configs += [{"id": "kvdesk.kv", **cfg, "name": name} for name, cfg in
                        json.loads(args.variants.read_text()).items()]
        for c in configs:
            show(ev.row(c))


if __name__ == "__main__":
    main()
