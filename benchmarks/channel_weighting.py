"""Does channel-weighted quantization pay? An emulation on unchanged codec levels.

    .venv/bin/python -m benchmarks.channel_weighting --text pydoc --level high \
        --mults 0.8 1.0 1.25 --powers 0.5 --out cw.jsonl

Each (layer, channel) of K (and V) is multiplied by a_c = w_c^power (geometric mean 1 per
layer; w from `benchmarks.qk_importance.importance` on a calibration text that is not an
evaluation text) in float32 before the codec and divided after decoding, so a channel's
effective step is the layer's step / a_c. Rows for the level's bins scaled by each multiplier,
plain and weighted, all scored against one exact run: compare the curves at equal bits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import codec
from benchmarks import qk_importance as calibration
from benchmarks.common import (
    calibration_tokens,
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
