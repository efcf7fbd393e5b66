"""Does channel-weighted quantization pay? An emulation on unchanged codec levels.

    .venv/bin/python benchmarks/channel_weighting.py --text pydoc --level high \
        --mults 0.8 1.0 1.25 --powers 0.5 --out cw.jsonl

Each (layer, channel) of K (and V) is multiplied by a_c = w_c^power (geometric mean 1 per
layer; w from `desktop_app.calibration.importance` on a calibration text that is not an
evaluation text) in float32 before the codec and divided after decoding, so a channel's
effective step is the layer's step / a_c. Rows for the level's bins scaled by each multiplier,
plain and weighted, all scored against one exact run: compare the curves at equal bits.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import numpy as np
from bench_quality import model_of, text_of
from level_tuning import roundtrip

import codec
from desktop_app import calibration, kvstate, quality


def calibration_tokens(model: Path, n: int, mix: bool = False) -> list[int]:
    """The second half of the pydoc topics (the `pydoc` evaluation uses its first tokens);
    with mix, half of it and half the source of the standard library's `collections` (the
    `code` evaluation reads `argparse`)."""
    import collections
    import inspect
    import pydoc_data.topics

    text = "\n\n".join(pydoc_data.topics.topics.values())
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=8, vocab_only=True, verbose=False)
    try:
        prose = llm.tokenize(text[len(text) // 2 :].encode(), add_bos=True)
        if not mix:
            return prose[:n]
        code = llm.tokenize(Path(inspect.getsourcefile(collections)).read_text().encode(),
                            add_bos=False)
        return prose[: n // 2] + code[: n - n // 2]
    finally:
        llm.close()


def scaled_bins(config: dict, mult: float) -> dict:
    out = json.loads(json.dumps(config))
    for kind in ("keys", "values"):
        out[kind]["bins"] = [int(np.clip(2 * round(b * mult / 2), 4, 128))
                             for b in config[kind]["bins"]]
    return out


def common_args(doc: str) -> argparse.ArgumentParser:
    """The options this script shares with kv_transforms.py."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--text", default="pydoc")
    ap.add_argument("--level", default="high")
    ap.add_argument("--mults", type=float, nargs="*", default=[1.0])
    ap.add_argument("--prefix-tokens", type=int, default=2048)
    ap.add_argument("--cont-tokens", type=int, default=256)
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/kvdesk-models"))
    ap.add_argument("--out", type=Path, help="also append the JSON lines here")
    return ap


def row_printer(args: argparse.Namespace) -> Callable[[dict], None]:
    """Print a row as a JSON line (and append it to --out)."""
    t0 = time.monotonic()
    out = args.out.open("a") if args.out else None

    def show(row: dict) -> None:
        line = json.dumps({**row, "model": args.model, "text": args.text,
                           "t": round(time.monotonic() - t0, 1)})
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    return show


def score(ev: quality.Evaluator, kv: kvstate.KVState, keys: np.ndarray, values: np.ndarray,
          nbytes: int, name: str, show: Callable[[dict], None], exact_first: bool = True) -> None:
    """Measure decoded keys and values in place of kv's, the first (sink) token put back exact
    (unless not exact_first)."""
    if exact_first:
        first = np.argsort(kv.positions, kind="stable")[:1]
        keys[:, first], values[:, first] = kv.keys[:, first], kv.values[:, first]
    state = ev.state_with([kvstate.KVState(keys, values, kv.positions, kv.v_trans, kv.seq_id)])
    row = ev.measure_state(name, state, nbytes * 8 / (2 * kv.keys.size))
    show({k: row[k] for k in ("config", "bits_per_element", "kld", "top1", "ppl")})


def main() -> None:
    ap = common_args(__doc__)
    ap.add_argument("--powers", type=float, nargs="*", default=[0.5])
    ap.add_argument("--kinds", default="K,KV", help="which kinds to weight, comma-separated")
    ap.add_argument("--calib-tokens", type=int, default=1024)
    ap.add_argument("--importance", type=Path, help="cache of the importance arrays (.npz)")
    args = ap.parse_args()
    show = row_printer(args)
    model = model_of(args.model, args.cache_dir)
    if args.importance and args.importance.exists():
        d = np.load(args.importance)
        imp_k, imp_v = d["keys"], d["values"]
    else:
        imp = calibration.importance(model, calibration_tokens(model, args.calib_tokens))
        imp_k, imp_v = imp.keys, imp.values
        if args.importance:
            np.savez(args.importance, keys=imp_k, values=imp_v, spread=imp.head_spread)
    base = codec.levels()[args.level].get_config()
    with quality.Evaluator(model, text_of(args.text), prefix_tokens=args.prefix_tokens,
                           cont_tokens=args.cont_tokens, greedy_tokens=0) as ev:
        seq = ev.seq_state
        if len(seq.sections) != 1:
            raise SystemExit("only single-section (non-iSWA) models for now")
        kv = seq.sections[0]
        variants = [("plain", 0.0, "")]
        variants += [(f"w{p}-{kinds}", p, kinds) for p in args.powers
                     for kinds in args.kinds.split(",")]
        for mult in args.mults:
            cfg = {**scaled_bins(base, mult), "name": f"{args.level}x{mult}"}
            for name, power, kinds in variants:
                a_k = 1 / calibration.step_weights(imp_k, power) if "K" in kinds else None
                a_v = 1 / calibration.step_weights(imp_v, power) if "V" in kinds else None
                keys = kv.keys if a_k is None else (
                    kv.keys.astype(np.float32) * a_k[:, None, :]).astype(np.float16)
                values = kv.values if a_v is None else (
                    kv.values.astype(np.float32) * a_v[:, None, :]).astype(np.float16)
                back_k, back_v, nbytes = roundtrip(
                    kvstate.KVState(keys, values, kv.positions, kv.v_trans, kv.seq_id), cfg)
                if a_k is not None:
                    back_k = (back_k.astype(np.float32) / a_k[:, None, :]).astype(np.float16)
                if a_v is not None:
                    back_v = (back_v.astype(np.float32) / a_v[:, None, :]).astype(np.float16)
                score(ev, kv, back_k, back_v, nbytes, f"{args.level}x{mult}-{name}", show)


if __name__ == "__main__":
    main()
