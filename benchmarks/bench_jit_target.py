"""What a portable build of the codec's kernels costs against one tuned for this CPU.

`python benchmarks/bench_jit_target.py [--rounds 3] [--runs 5] [--levels ...] [--json]`

numba normally compiles for the host CPU (every instruction-set extension it has). A cache
that ships inside the bundle must run on other CPUs, so it is compiled for a named baseline
instead (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES; see codec/jit/jitcache.py). For each target this
compiles the kernels into a fresh cache (`python -m codec.precompile`: the compile time),
then runs `python -m codec.bench` on them, the targets interleaved round by round so that
other work on a shared machine falls on all of them alike. Speeds are MB/s of fp16 KV, wall
and per CPU-second (the latter moves less when other processes take the cores), as medians
over rounds, with each target's ratio to the host build. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from codec.jit import jitcache  # noqa: E402 - after the path: run as a script from the checkout

FIGURES = ("encode", "decode", "decode_engine")


def _env(target: str, cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "KVDESK_"))}
    env.update(PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=cache, **jitcache.target_env(target))
    return env


def _python(args: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, *args], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(["host", *jitcache.portable_targets()]))
    ap.add_argument("--levels", default="lossless,high,balanced,compact")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    targets = args.targets.split(",")
    load = [round(os.getloadavg()[0], 2)]
    with tempfile.TemporaryDirectory(prefix="kvdesk-jit-target-") as tmp:
        compile_s = {}
        for t in targets:
            t0 = time.perf_counter()
            _python(["-m", "codec.precompile", "--json"], _env(t, f"{tmp}/{t}"))
            compile_s[t] = round(time.perf_counter() - t0, 1)
        rows: dict[str, list[dict]] = {t: [] for t in targets}
        for _ in range(args.rounds):
            for t in targets:
                rows[t].append(_python(["-m", "codec.bench", "--json", "--levels", args.levels,
                                        "--runs", str(args.runs)], _env(t, f"{tmp}/{t}")))
            load.append(round(os.getloadavg()[0], 2))
    result = {"targets": {}, "compile_s": compile_s, "rounds": args.rounds, "runs": args.runs,
              "loadavg_1min": load, "cpus": os.cpu_count(), "machine": platform.machine(),
              "host_cpu": jitcache.host_cpu_name()}
    for t in targets:
        per_level = {}
        for level in args.levels.split(","):
            rs = [(r["levels"][level], math.prod(r["kv"]["shape"]) * 4 / 1e6) for r in rows[t]]
            fig = {}
            for f in FIGURES:
                fig[f"{f}_MBps"] = round(statistics.median(r[f"{f}_MBps"] for r, _ in rs), 1)
                fig[f"{f}_MBps_cpu"] = round(statistics.median(
                    mb / r[f"{f}_cpu_s"] for r, mb in rs), 1)  # K and V, 2 bytes each
            per_level[level] = fig
        result["targets"][t] = per_level
    for t in targets:
        for level, fig in result["targets"][t].items():
            host = result["targets"][targets[0]][level]
            fig["ratio_to_" + targets[0]] = {k: round(v / host[k], 2) for k, v in fig.items()
                                             if not isinstance(v, dict)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"host CPU {result['host_cpu']} ({result['machine']}, {result['cpus']} CPUs); "
          f"median of {args.rounds} rounds x {args.runs} runs; load average {load}")
    print("compile (s): " + ", ".join(f"{t} {s}" for t, s in compile_s.items()))
    print(f"{'target':<12} {'level':<10} " + " ".join(f"{f + ' MB/s':>18}" for f in FIGURES)
          + "   (wall, per CPU-second; ratio to " + targets[0] + " per CPU-second)")
    for t in targets:
        for level, fig in result["targets"][t].items():
            ratio = fig["ratio_to_" + targets[0]]
            cells = " ".join(f"{fig[f + '_MBps']:>8} {fig[f + '_MBps_cpu']:>8}" + " "
                             for f in FIGURES)
            rel = " ".join(f"{ratio[f + '_MBps_cpu']:.2f}" for f in FIGURES)
            print(f"{t:<12} {level:<10} {cells}  ({rel})")


if __name__ == "__main__":
    main()
