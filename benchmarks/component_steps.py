"""Per-component quantizer steps under the alphabet limit: do they pay? An emulation.

    .venv/bin/python -m benchmarks.component_steps --kv benchmarks/data/kv4096.npz \
        --variants centred,pca,pca-kv --weights /tmp/weights.json --kld --out steps.jsonl
    .venv/bin/python -m benchmarks.component_steps --summary steps.jsonl --plot rd.png

A calibrated level quantizes an exact transform's coefficients with one step per (layer,
chunk), |q| <= 63 (codec.calibrated.intinverse.MAX_Q), so the step is at least the layer's
largest coefficient / 63. Scheme `layer` is that (the codec as it is). Scheme `comp` gives each
component j of a layer its own step s * 2^m_j, m_j >= 0 the least power of two that fits the
component's range in the chunk into the alphabet (reverse water-filling with the alphabet as
its constraint: only the components that would overflow are coarsened; m_j uncapped here).
Both run the real codec for the bits, with the alphabet the calibration gives each layer (maxq
= the calibration text's median chunk maximum / s, at most 63) and the step the codec then
takes (the chunk's largest |coefficient| / maxq; in `comp` after component j is divided by
2^m_j, chosen so that no component exceeds maxq * s), and `comp` adds 2 bits of side
information per (layer, chunk, component).

Everything the product measures comes from its own calibration pipeline
(desktop_app.calibration.calibrate): the calibration text's exact KV, the KLD weights of every
(kind, layer) (Gaussian noise in one layer at a time; cached in --weights, ~60 model runs),
steps w^-1/2 and the transform variants fitted on the first two thirds. Rows, per variant,
scheme and scale: bits per element and the KLD-weighted squared error (sum over (kind, layer)
of weight x MSE, the calibration's `_weighted_error`: a prediction of the KLD the error adds)
on (a) the calibration text's held-out last third and (b) with --kv, a recorded KV of another
text (pydoc topics, 4,096 tokens), and with --kld the KLD and top-1 the model measures on the
calibration text with the variants refitted on all of it (in-sample, as the level search
sees it). SmolLM2-style single-section models only. What it found, and the codec built on it
and measured with the product's calibration (it did not pay: reverted): benchmarks/RESULTS.md,
"Per-component steps under the alphabet limit". An experiment: it must never change the codec
or a stored calibration, and writes only --out, --weights and --plot.
"""

from __future__ import annotations

import argparse
import json
import os
from fractions import Fraction
from pathlib import Path

import numpy as np

import codec
from codec.calibrated import intinverse, transform
from desktop_app.calibration import calibrate, quality
from desktop_app.calibration.steps import Run
from desktop_app.model import kvstate, rope
from desktop_app.model.models import default_model_path

CHUNK = quality.CHUNK_TOKENS
SIDE_BITS = 2  # per (layer, chunk, component) of the `comp` scheme: its m_j


def coded(y: np.ndarray, step: np.ndarray, maxq: np.ndarray,
          scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """One chunk's coefficients y [L, T, C] (float32) at per-layer steps and alphabets [L]:
    the codec's input z (fp16) and the multipliers 2^m [L, C]. The codec then quantizes z
    with the step max |z| / maxq, as the product does; `comp` first divides every component
    whose range exceeds the alphabet at the asked step (maxq * step) by the least power of
    two that fits it, so that step holds for the others."""
    top = np.abs(y).max(axis=1)  # [L, C]
    if scheme == "comp":
        room = maxq * step
        m = np.maximum(0, np.ceil(np.log2(np.maximum(top / room[:, None], 1e-30)))).astype(int)
    else:
        m = np.zeros(top.shape, int)
    mult = np.ldexp(1.0, m).astype(np.float32)
    return (y / mult[:, None, :]).astype(np.float16), mult


def coefficients(x: np.ndarray, tf: codec.KindTransform, first: int) -> np.ndarray:
    cos, sin = transform.angles(tf, first, x.shape[1])
    return transform.forward(x, tf, cos, sin).astype(np.float16).astype(np.float32)


def alphabet(top: np.ndarray, step: np.ndarray) -> np.ndarray:
    """maxq per layer as the calibration sets it (calibrate._bins): the calibration text's
    median chunk maximum over the step, at most 63."""
    return np.clip(np.rint(top / np.maximum(step, 1e-12)), 1, intinverse.MAX_Q).astype(int)


def roundtrip_kind(y: np.ndarray, x: np.ndarray, tf: codec.KindTransform, first: int,
                   step: np.ndarray, maxq: np.ndarray, scheme: str) -> tuple[np.ndarray, float]:
    """Coefficients y of x [L, T, C] -> (x's reconstruction fp16, coded bits) via `scheme`."""
    back = np.empty_like(y)
    bits = 0.0
    cfg = {"id": codec.levels()["high"].get_config()["id"], "name": "emul",
           "mode": "quantized", "lanes": 32, "states": 4, "sink_tokens": 0, "anchor_group": 0}
    kind = {"scale": "layer", "bins": [int(2 * q + 2) for q in maxq],
            "layer_edges": [round(i / len(maxq), 6) for i in range(1, len(maxq))]}
    for t0 in range(0, y.shape[1], CHUNK):
        z, mult = coded(y[:, t0:t0 + CHUNK], step, maxq, scheme)
        blob = codec.encode(z, z, {**cfg, "keys": kind, "values": kind})
        zk, _ = codec.decode(blob)
        back[:, t0:t0 + CHUNK] = zk.astype(np.float32) * mult[:, None, :]
        bits += len(blob) * 8 / 2  # the blob codes z twice (as keys and as values)
        if scheme == "comp":
            bits += SIDE_BITS * mult.size
    u = back
    if tf.basis is not None:
        n_layer, n_tok, n_ch = u.shape
        b = tf.block
        blocks = u.reshape(n_layer, n_tok, n_ch // b, b).swapaxes(1, 2)  # [L, G, T, b]
        u = np.matmul(blocks, tf.basis.swapaxes(2, 3)).swapaxes(1, 2).reshape(
            n_layer, n_tok, n_ch)
    plain = codec.KindTransform(tf.head_dim, tf.rope, tf.theta, tf.mean)
    cos, sin = transform.angles(tf, first, x.shape[1])
    return transform.inverse(np.ascontiguousarray(u), plain, cos, sin).view(np.float16), bits


class Coded:
    """One section through one variant's transforms: its coefficients computed once, then
    round trips at any scale and scheme (alphabets from the calibration text's `tops`)."""

    def __init__(self, kv: kvstate.KVState, part: codec.Part, tops: dict):
        self.kv, self.part, self.tops = kv, part, tops
        first = int(kv.positions[0])
        self.sink = 1 if first == 0 else 0
        self.first = first + self.sink
        self.y = {kind: coefficients(np.ascontiguousarray(getattr(kv, kind)[:, self.sink:]),
                                     part.transform(kind), self.first)
                  for kind in ("keys", "values")}

    def roundtrip(self, steps: dict, scale: float,
                  scheme: str) -> tuple[np.ndarray, np.ndarray, float]:
        """keys, values (position order; the sink token exact) and bits per element."""
        kv = self.kv
        outs, bits = [], 0.0
        for kind in ("keys", "values"):
            x = getattr(kv, kind)
            step = scale * np.array([steps[(kind, layer)] for layer in range(kv.n_layer)])
            rec, b = roundtrip_kind(self.y[kind], x[:, self.sink:], self.part.transform(kind),
                                    self.first, step, alphabet(self.tops[kind], step), scheme)
            full = x.copy()
            full[:, self.sink:] = rec
            outs.append(full)
            bits += b + 16 * x[:, :self.sink].size
        return outs[0], outs[1], bits / (2 * kv.keys.size)


def chunk_tops(kv: kvstate.KVState, part: codec.Part) -> dict:
    """{kind: [L]} the median chunk maximum of the coefficients (calibrate._chunk_max)."""
    first = int(kv.positions[0])
    sink = 1 if first == 0 else 0
    return {kind: calibrate._chunk_max(getattr(kv, kind)[:, sink:], part.transform(kind),
                                       first + sink) for kind in ("keys", "values")}


def weighted_error(kv: kvstate.KVState, keys, values, weights: dict) -> float:
    total = 0.0
    for kind, got in (("keys", keys), ("values", values)):
        err = (got.astype(np.float32) - getattr(kv, kind).astype(np.float32)) ** 2
        mse = err.mean(axis=(1, 2))
        total += sum(weights[(kind, layer)] * mse[layer] for layer in range(kv.n_layer))
    return float(total)


def load_weights(path: Path | None, ev, sections, settings) -> list[dict]:
    if path and path.exists():
        raw = json.loads(path.read_text())
        return [{(k.split(":")[0], int(k.split(":")[1])): v for k, v in part.items()}
                for part in raw]
    run = Run(settings, None, None)
    weights = calibrate._sensitivity(ev, sections, run, ev.row(quality.FLOOR)["kld"])
    if path:
        path.write_text(json.dumps([{f"{k}:{layer}": v for (k, layer), v in part.items()}
                                    for part in weights]))
    return weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="centred,pca,pca-kv")
    ap.add_argument("--schemes", default="layer,comp")
    ap.add_argument("--scales", default="1/32,1/16,1/8,1/4,1/2,1,2",
                    help="multiples of the calibration's mid scale")
    ap.add_argument("--weights", type=Path, help="cache of the KLD weights (JSON)")
    ap.add_argument("--kv", type=Path, help="a recorded KV of another text (npz, position order)")
    ap.add_argument("--kld", action="store_true", help="also measure KLD on the calibration text")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summary", type=Path, help="only print the bits at equal error of these rows")
    ap.add_argument("--plot", type=Path, help="with --summary: their curves into this PNG")
    ap.add_argument("--targets", default="held=0.001,0.003,0.01;kv=0.001,0.003,0.01;"
                    "cal=0.0045,0.01,0.02", help="the errors --summary compares bits at")
    args = ap.parse_args()
    if args.summary:
        summary(args.summary, {k: [float(t) for t in v.split(",")] for k, v in
                               (item.split("=") for item in args.targets.split(";"))})
        if args.plot:
            plot(args.summary, args.plot)
        return
    settings = calibrate.Settings()
    rows = []

    def show(row):
        row["load"] = round(os.getloadavg()[0], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")

    with quality.Evaluator(default_model_path(), calibrate.calibration_text(),
                           prefix_tokens=settings.prefix_tokens,
                           cont_tokens=settings.cont_tokens, greedy_tokens=0) as ev:
        kind, n_rot, fscale, bases = rope.candidates(ev.exact)
        facts = {"type": kind or "none", "n_rot": n_rot, "freq_scale": fscale,
                 "bases": sorted(set(bases)), "head_dim": ev.exact.layout.head_dim}
        sections = [kvstate.in_position_order(kv) for kv in ev.seq_state.sections]
        if len(sections) != 1:
            raise SystemExit("single-section models only")
        weights = load_weights(args.weights, ev, sections, settings)
        steps = [{k: w ** -0.5 for k, w in part.items()} for part in weights]
        norm = np.exp(np.mean([np.log(s).mean() for part in steps for s in part.values()]))
        steps = [{k: s / norm for k, s in part.items()} for part in steps]
        fitting, held = calibrate._split(sections[0], settings.held_out)
        other = None
        if args.kv:
            with np.load(args.kv) as z:
                n_tok = z["keys"].shape[1]
                other = kvstate.KVState(z["keys"], z["values"], np.arange(n_tok), False, 0)
        scales = [float(Fraction(s)) for s in args.scales.split(",")]
        for variant in args.variants.split(","):
            fit_part = calibrate._fit([fitting], facts, variant)[0]
            all_part = calibrate._fit(sections, facts, variant)[0]
            mid = calibrate._mid_scale(codec.Calibration((fit_part,)), sections, steps)
            runs = {"held": Coded(held, fit_part, chunk_tops(fitting, fit_part))}
            tops = chunk_tops(sections[0], all_part)
            if other is not None:
                runs["kv"] = Coded(other, all_part, tops)
            if args.kld:
                runs["cal"] = Coded(sections[0], all_part, tops)
            for scheme in args.schemes.split(","):
                for mult in scales:
                    row = {"variant": variant, "scheme": scheme, "scale_x_mid": mult}
                    for name, run in runs.items():
                        k, v, bits = run.roundtrip(steps[0], mid * mult, scheme)
                        row[f"{name}_bits"] = round(bits, 4)
                        row[f"{name}_werr"] = weighted_error(run.kv, k, v, weights[0])
                        if name == "cal":
                            row.update(measure(ev, run.kv, k, v, bits))
                    show(row)


def measure(ev, kv: kvstate.KVState, keys, values, bits) -> dict:
    """KLD and top-1 of the model with this section's KV replaced (keys/values in position
    order), on the Evaluator's text."""
    orig = ev.seq_state.sections[0]
    order = np.argsort(orig.positions, kind="stable")
    back_k, back_v = np.empty_like(orig.keys), np.empty_like(orig.values)
    back_k[:, order], back_v[:, order] = keys, values
    sec = kvstate.KVState(back_k, back_v, orig.positions, orig.v_trans, orig.seq_id)
    state = kvstate.build_seq_sections(kvstate.SeqState([sec], ev.seq_state.seq_id))
    row = ev.measure_state("emul", state, bits)
    return {"cal_bits": round(bits, 4), "cal_kld": row["kld"], "cal_top1": row["top1"]}


def bits_at(rows: list[dict], prefix: str, target: float, error: str = "werr") -> float | None:
    """Bits per element of one curve at an error `target`, interpolated linearly in bits
    against log error between its two nearest points (None outside the curve)."""
    pts = sorted({(r[f"{prefix}_{error}"], r[f"{prefix}_bits"]) for r in rows})
    for (e0, b0), (e1, b1) in zip(pts, pts[1:], strict=False):
        if e0 <= target <= e1 and e1 > e0:
            f = np.log(target / e0) / np.log(e1 / e0)
            return float(b0 + f * (b1 - b0))
    return None


def summary(path: Path, targets: dict[str, float]) -> None:
    """Bits of every (variant, scheme) at equal error, from the rows in `path`: per measure
    (held-out weighted error, the other text's weighted error, the calibration text's KLD)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    curves = {}
    for r in rows:
        curves.setdefault((r["variant"], r["scheme"]), []).append(r)
    measures = [("held", "werr"), ("kv", "werr"), ("cal", "kld")]
    print("| variant | scheme | " + " | ".join(
        f"{p} bits at {e} {t:g}" for p, e in measures for t in targets[p]) + " |")
    print("|---|---|" + "---|" * sum(len(targets[p]) for p, _ in measures))
    for (variant, scheme), rs in curves.items():
        cells = []
        for p, e in measures:
            for t in targets[p]:
                b = bits_at(rs, p, t, e) if f"{p}_{e}" in rs[0] else None
                cells.append("-" if b is None else f"{b:.3f}")
        print(f"| {variant} | {scheme} | " + " | ".join(cells) + " |")


def plot(path: Path, out: Path) -> None:
    """Bits against error of every (variant, scheme): one panel per measure (matplotlib, the
    dev extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    panels = [("held", "werr", "calibration text, held-out third: KLD-weighted error"),
              ("kv", "werr", "pydoc (4,096 tokens): KLD-weighted error"),
              ("cal", "kld", "calibration text (in-sample): KLD")]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, (p, e, title) in zip(axes, panels, strict=True):
        for variant in dict.fromkeys(r["variant"] for r in rows):
            for scheme, style in (("layer", "--"), ("comp", "-")):
                pts = sorted((r[f"{p}_bits"], r[f"{p}_{e}"]) for r in rows
                             if r["variant"] == variant and r["scheme"] == scheme
                             and f"{p}_{e}" in r)
                if pts:
                    name = "per component" if scheme == "comp" else "per layer"
                    ax.plot(*zip(*pts, strict=True), style, marker="o", ms=3,
                            label=f"{variant}, {name}")
        ax.set_yscale("log")
        ax.set_xlabel("bits per element")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("SmolLM2-135M: one step per layer (dashed) vs per-component steps (solid)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
