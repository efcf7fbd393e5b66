"""Make a model's codec calibration into a file, as `kvdesk calibrate` does, for benchmarks.

    .venv/bin/python -m benchmarks.make_calibration --out cal-default.kvcl
    .venv/bin/python -m benchmarks.make_calibration --model gemma --out cal-gemma.kvcl
    .venv/bin/python -m benchmarks.make_calibration --variants none,centred,klt,pca,pca-kv \
        --out cal-exact.kvcl

`--variants`: the transforms the calibration may choose from (`calibrate.Settings.variants`;
cheapest first), the product's default without it. `--prefix-tokens`, `--cont-tokens`: more of
the built-in calibration text (1,294 SmolLM2 tokens) than the product's 512 + 128;
`--iterations`: bisection steps per level. Prints the calibration's record as JSON and the
process's CPU seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from benchmarks.common import model_of
from desktop_app.calibration import calibrate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="default, gemma or a GGUF path")
    ap.add_argument("--cache-dir", type=Path, default=Path("benchmarks/data"),
                    help="where the Gemma model is assembled on first use")
    ap.add_argument("--variants", help="comma-separated transform variants to choose from")
    ap.add_argument("--prefix-tokens", type=int, help="of the calibration text (default 512)")
    ap.add_argument("--cont-tokens", type=int, help="scored after them (default 128)")
    ap.add_argument("--iterations", type=int, help="bisection steps per level (default 7)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model = model_of(args.model, args.cache_dir)
    settings = calibrate.Settings()
    if args.variants:
        settings = dataclasses.replace(settings, variants=tuple(args.variants.split(",")))
    for name in ("prefix_tokens", "cont_tokens", "iterations"):
        if getattr(args, name):
            settings = dataclasses.replace(settings, **{name: getattr(args, name)})
    t0, c0 = time.monotonic(), time.process_time()
    cal = calibrate.calibrate(model, fingerprint=model.name, settings=settings)
    args.out.write_bytes(cal.to_bytes())
    print(json.dumps({"seconds": round(time.monotonic() - t0, 1),
                      "cpu_seconds": round(time.process_time() - c0, 1),
                      "calibration": cal.meta}, default=str))


if __name__ == "__main__":
    main()
