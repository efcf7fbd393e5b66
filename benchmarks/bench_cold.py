"""What a new process pays before its first restore runs warm: the codec's cold start, the
window's first reopen after start, and a one-shot `kvdesk reopen`, each in fresh processes.

    .venv/bin/python -m benchmarks.bench_cold --calibration cal-default.kvcl \
        --kv benchmarks/data/kv4096.npz [--rounds 5] [--data-dir DIR] [--repo CHECKOUT]

Set-up (once, in --data-dir, kept for later runs): the model's codec calibration adopted
(--calibration: a `kvdesk calibrate` result for this model, its fingerprint rebound to this
machine's; without it `kvdesk calibrate` runs, minutes), two documents of 2,400 and 2,000 tokens
(the pydoc topics) attached, and one question asked about each: chats of ~2,500 and ~2,100
tokens (of two sizes, as two chats are: a restore reuses the previous one's state buffer only
at the same size).
Then --rounds rounds, each of:

- codec: `import numba` alone against `import codec` + one decode of a 256-token chunk at
  each level and calibrated level (`codec.bench.cold_start`; goal: <= 0.25 s beyond numba);
- window: a fresh process does what the window does at start (`App(background=True)`,
  `engine.warm_up()` on its worker: the model, then the codec in the background) and reopens
  the first chat as soon as that returns, then the second chat, then the first again, at level
  `high` (goal: the first reopen <= 1.3x the second), and the second once more after the
  warm-up has finished (`warm`: the steady state, with nothing in the background);
- one-shot: `kvdesk reopen CHAT --json` (the first chat), the whole process's wall time
  against its own restore_s and the model's load in a fresh process (`App.new_runtime`, with
  llama.cpp imported before the clock starts) (goal: wall <= restore + model load + 0.5 s).

Medians over rounds; the load average before and after each round, and each process's CPU
time where it is known. --repo runs another checkout's code (e.g. a worktree of main, for a
before/after) with this interpreter. The processes run with Python's bytecode cache, as an
installed app does (PYTHONDONTWRITEBYTECODE is dropped unless --keep-env). A benchmark: it
never asserts speed.
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

_SETUP = """
import json, sys
from pathlib import Path
import codec
from desktop_app.app import App
from desktop_app.options import GenerationOptions
from desktop_app.settings import Settings
from pydoc_data.topics import topics
data, cal_path = Path(sys.argv[1]), sys.argv[2]
app = App(Settings(data_dir=str(data)), background=False)
eng = app.engine
if cal_path:
    cal = codec.Calibration.from_bytes(Path(cal_path).read_bytes())
    eng.calibrations.adopt(codec.Calibration(cal.parts, {**cal.meta,
                                                         "fingerprint": eng.fingerprint}))
else:
    eng.calibrate()
rt, keys, chats = eng.runtime, sorted(topics), []
for i in range(2):
    # two lengths: the second reopen must not find the first one's state buffer to reuse
    text = "\\n\\n".join(topics[k] for k in keys[40 * i:40 * (i + 1)])
    toks = rt.tokenize(text)[:2400 - 400 * i]
    doc = data / f"bench-doc{i}.txt"
    doc.write_text(rt.detokenize(toks))
    attached = eng.attach(doc)
    chats.append(eng.ask("Summarize this in two sentences.", doc_ids=[attached.doc_id],
                         generation=GenerationOptions(max_tokens=60, temperature=0)).chat_id)
app.close()
print(json.dumps(chats))
"""

# The window's start and first reopens, by the service calls it makes (ui/main.py's
# _ready_engine on its worker, then MainWindow's reopen job).
_WINDOW = """
import json, os, sys, time
from desktop_app.app import App
from desktop_app.options import RestoreOptions
from desktop_app.settings import Settings
first, second = int(sys.argv[1]), int(sys.argv[2])
app = App(Settings(data_dir=os.environ["KVDESK_DATA_DIR"]), background=True)
t0 = time.perf_counter()
app.engine.warm_up()
out = {"start_s": time.perf_counter() - t0}
for name, chat in (("first", first), ("second", second), ("again", first)):
    t = time.perf_counter()
    rep = app.engine.reopen(chat, restore=RestoreOptions(level="high"))
    out[name + "_s"] = time.perf_counter() - t
    out[name + "_restore_s"] = rep.restore_s
app.engine.contexts.wait_warm()  # and once nothing runs in the background any more
t = time.perf_counter()
out["warm_restore_s"] = app.engine.reopen(second, restore=RestoreOptions(level="high")).restore_s
out["warm_s"] = time.perf_counter() - t
app.close()
print(json.dumps(out))
"""

_MODEL_LOAD = """
import json, os, time
import llama_cpp  # an import, not the load
from desktop_app.app import App
from desktop_app.settings import Settings
app = App(Settings(data_dir=os.environ["KVDESK_DATA_DIR"]), background=False)
app.model_hash, app.context  # memoised facts, not the load
t = time.perf_counter()
rt = app.new_runtime()
print(json.dumps({"model_load_s": time.perf_counter() - t}))
rt.close()
"""


def fresh(args: list[str], env: dict, cwd: Path) -> tuple[float, float, str]:
    """(wall s, CPU s of the process, stdout) of one fresh process."""
    before = os.times()
    t0 = time.perf_counter()
    run = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = os.times()
    if run.returncode:
        raise SystemExit(f"{' '.join(args[:3])} failed:\n{run.stderr[-3000:]}")
    cpu = (after.children_user - before.children_user
           + after.children_system - before.children_system)
    return wall, cpu, run.stdout


def median(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 3)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_cold",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", type=Path, help="a .kvcl calibration of the model")
    ap.add_argument("--kv", type=Path, help="recorded KV for the codec's blobs (codec.bench)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data-dir", type=Path, help="kept between runs (default: a temporary one)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose code runs")
    ap.add_argument("--only", default="codec,window,oneshot", help="comma-separated parts")
    ap.add_argument("--keep-env", action="store_true",
                    help="keep PYTHONDONTWRITEBYTECODE if it is set (dropped by default)")
    args = ap.parse_args(argv)
    repo = args.repo.resolve()
    tmp = tempfile.TemporaryDirectory(prefix="bench-cold-")
    data = args.data_dir or Path(tmp.name) / "data"
    # As an installed app runs: with its modules' bytecode cached (pip compiles it at install).
    # Without it every fresh process compiles ~900 modules first (0.1-0.2 s on these machines).
    if not args.keep_env:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    bytecode_cached = not os.environ.get("PYTHONDONTWRITEBYTECODE")
    env = {**os.environ, "KVDESK_DATA_DIR": str(data), "PYTHONPATH": str(repo)}
    py = [sys.executable]
    chats_file = data / "bench-cold-chats.json"
    if not chats_file.exists():
        data.mkdir(parents=True, exist_ok=True)
        _, _, out = fresh([*py, "-c", _SETUP, str(data), str(args.calibration or "")], env,
                          repo)
        chats_file.write_text(out.strip().splitlines()[-1])
    first, second = json.loads(chats_file.read_text())
    parts = args.only.split(",")

    codec_args = None
    if "codec" in parts:
        # This checkout's measurement (`codec.bench --cold`), on the code of --repo.
        from codec import Calibration
        from codec.bench import load_kv

        keys, values, _ = load_kv(args.kv)
        cal = Calibration.from_bytes(args.calibration.read_bytes()) if args.calibration \
            else None
        codec_args = (keys, values, cal)

    rounds = []
    for _ in range(args.rounds):
        row: dict = {"load_before": round(os.getloadavg()[0], 2)}
        if codec_args is not None:
            from codec.bench import cold_start

            c = cold_start(*codec_args[:2], ["high", "balanced", "compact"], codec_args[2],
                           rounds=1, cwd=repo)
            row["import_numba_s"] = c["import_numba_s"]
            row["codec_first_decodes_s"] = c["codec_first_decodes_s"]
            row["codec_beyond_numba_s"] = c["beyond_numba_s"]
        if "window" in parts:
            wall, cpu, out = fresh([*py, "-c", _WINDOW, str(first), str(second)], env, repo)
            w = json.loads(out.strip().splitlines()[-1])
            row.update({f"window_{k}": v for k, v in w.items()})
            row["window_ratio"] = w["first_s"] / w["second_s"]
            row["window_ratio_to_warm"] = w["first_s"] / w["warm_s"]
        if "oneshot" in parts:
            wall, cpu, out = fresh([*py, "-m", "desktop_app", "reopen", str(first), "--json"],
                                   env, repo)
            rep = json.loads(out)
            _, _, load_out = fresh([*py, "-c", _MODEL_LOAD], env, repo)
            load = json.loads(load_out.strip().splitlines()[-1])["model_load_s"]
            row.update({"oneshot_wall_s": wall, "oneshot_cpu_s": cpu,
                        "oneshot_restore_s": rep["restore_s"], "model_load_s": load,
                        "oneshot_levels": sorted(set(rep["chunk_levels"])),
                        "oneshot_beyond_s": wall - rep["restore_s"] - load})
        row["load_after"] = round(os.getloadavg()[0], 2)
        rounds.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                          for k, v in row.items()}), file=sys.stderr, flush=True)

    summary = {k: median(rounds, k) for k in rounds[0]
               if isinstance(rounds[0][k], (int, float))}
    print(json.dumps({"repo": str(repo), "rounds": args.rounds, "chats": [first, second],
                      "bytecode_cached": bytecode_cached, "median": summary,
                      "cpus": os.cpu_count()}, indent=1))
    tmp.cleanup()


if __name__ == "__main__":
    main()
