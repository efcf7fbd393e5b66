"""Make a model's codec calibration into a file, as `kvdesk calibrate` does, for benchmarks.

    .venv/bin/python -m benchmarks.make_calibration --out cal-default.kvcl
    .venv/bin/python -m benchmarks.make_calibration --model gemma --out cal-gemma.kvcl
    .venv/bin/python -m benchmarks.make_calibration --variants none,centred,klt,pca,pca-kv \
        --out cal-exact.kvcl

`--variants`: the transforms the calibration may choose from (`calibrate.Settings.variants`;
cheapest first), the product's default without it. `--prefix-tokens`, `--cont-tokens`: another
share of the built-in calibration text (1,294 SmolLM2 tokens) than the product's 1,024 + 256;
`--iterations`, `--top1-z`, `--top1-kld-safety`: the level search's `Settings`; `--registers
calibration-structured.txt` (with `--register-prefix-tokens`): every level must hold on that
built-in text too. Prints the
calibration's record as JSON, with the wall and process CPU seconds.
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
    ap.add_argument("--prefix-tokens", type=int, help="of the calibration text")
    ap.add_argument("--cont-tokens", type=int, help="scored after them")
    ap.add_argument("--iterations", type=int, help="bisection steps per level")
    ap.add_argument("--top1-z", type=float, help="top-1 levels' margin in standard errors")
    ap.add_argument("--top1-kld-safety", type=float,
                    help="fraction of the KLD at which top-1 held (1: that scale itself)")
    ap.add_argument("--registers", help="comma-separated further built-in texts every level "
                    "must hold on (desktop_app/data; calibrate.Settings.registers)")
    ap.add_argument("--register-prefix-tokens", type=int, help="of each further register")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model = model_of(args.model, args.cache_dir)
    settings = calibrate.Settings()
    if args.variants:
        settings = dataclasses.replace(settings, variants=tuple(args.variants.split(",")))
    if args.registers:
        settings = dataclasses.replace(settings, registers=tuple(args.registers.split(",")))
    for name in ("prefix_tokens", "cont_tokens", "iterations", "top1_z", "top1_kld_safety",
                 "register_prefix_tokens"):
        if getattr(args, name) is not None:
            settings = dataclasses.replace(settings, **{name: getattr(args, name)})
    t0, c0 = time.monotonic(), time.process_time()
    cal = calibrate.calibrate(model, fingerprint=model.name, settings=settings)
    args.out.write_bytes(cal.to_bytes())
    print(json.dumps({"seconds": round(time.monotonic() - t0, 1),
                      "cpu_seconds": round(time.process_time() - c0, 1),
                      "calibration": cal.meta}, default=str))


if __name__ == "__main__":
    main()
