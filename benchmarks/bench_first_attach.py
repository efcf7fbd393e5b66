"""The first `kvdesk attach` in a new process: with the codec's kernels cached, and without.

    .venv/bin/python benchmarks/bench_first_attach.py [--tokens 2000] [--rounds 3] [--json]

A document of about --tokens tokens (pydoc_data.topics, as bench_engine.py) is attached by a
fresh `python -m desktop_app attach --json` process, in a fresh data folder, twice a round:
"cached", with the numba cache a checkout's `make venv` leaves (the kernels compiled ahead);
and "uncached", with NUMBA_CACHE_DIR pointing at an empty folder, as on a fresh clone before
this warm-up existed (every kernel compiles during the attach). The cost of an attach is its
prefill plus its encoding and storing of every level; the goal (issue 19) is a first attach
costing at most 1.2x its prefill. Also the command's wall time (imports and the model's load
included). Medians over rounds; the two conditions alternate so that other work on a shared
machine falls on both alike. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_engine import reference_text  # noqa: E402
from desktop_app.app import App  # noqa: E402
from desktop_app.settings import Settings  # noqa: E402


def attach_once(doc: Path, tmp: Path, uncached: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "KVDESK_"))}
    env["PYTHONPATH"] = str(ROOT)
    if uncached:
        env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(dir=tmp, prefix="numba-")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "desktop_app", "--data-dir",
                           tempfile.mkdtemp(dir=tmp, prefix="data-"), "attach", str(doc),
                           "--json"], env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    res = json.loads(proc.stdout)[0]
    return {"wall_s": wall, "prefill_s": res["prefill_s"], "encode_s": res["encode_s"],
            "tokens": res["kept_tokens"],
            "cost_over_prefill": (res["prefill_s"] + res["encode_s"]) / res["prefill_s"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load = [round(os.getloadavg()[0], 2)]
    runs: dict[str, list[dict]] = {"cached": [], "uncached": []}
    with tempfile.TemporaryDirectory(prefix="kvdesk-first-attach-") as scratch:
        tmp = Path(scratch)
        app = App(Settings(data_dir=str(tmp / "tokenizer")))
        doc = tmp / "reference.txt"
        doc.write_text(reference_text(app.engine.runtime, args.tokens + 120))  # + the template
        app.close()
        for _ in range(args.rounds):
            for name in runs:
                runs[name].append(attach_once(doc, tmp, name == "uncached"))
            load.append(round(os.getloadavg()[0], 2))
    out = {name: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
           for name, rs in runs.items()}
    out.update(rounds=args.rounds, loadavg_1min=load, cpus=os.cpu_count())
    if args.json:
        print(json.dumps(out))
        return
    print(f"first attach of {out['cached']['tokens']:.0f} tokens, fresh process; median of "
          f"{args.rounds} rounds; load average {load} on {out['cpus']} CPUs")
    for name in runs:
        r = out[name]
        print(f"{name:<9} prefill {r['prefill_s']:6.2f} s  encode+store {r['encode_s']:6.2f} s"
              f"  (prefill+encode)/prefill {r['cost_over_prefill']:.2f}  wall {r['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
