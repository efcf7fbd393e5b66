"""A question's time to first token while the codec calibrates in the background.

    .venv/bin/python -m benchmarks.bench_calibrate_beside [--questions 3] [--wait-s 30]
        [--paste-chars 6000]

What the server and the window do after the first start on a model: calibrate beside the
questions they answer. Three ways, one after the other in one process (the same model, the
same questions, each a new chat with no document whose message pastes `--paste-chars` of
Python's reference before the question, as a request to the local API does; temperature 0,
16 tokens):
- `alone`: no calibration running;
- `beside`: a calibration started `--wait-s` before each question, its steps waiting while a
  question is being answered (`Engine.calibrate`'s pause, as shipped);
- `beside, no pause`: the same with the pause taken out (FairLock.wait_free made a no-op: how
  it ran before).
Prints each question's time to first token and the medians, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

from benchmarks.common import text_of
from desktop_app.chat.fairlock import FairLock
from desktop_app.engine import Engine
from desktop_app.errors import Cancelled
from desktop_app.model.models import content_hash, default_model_path
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions
from store import Store

QUESTIONS = ["What is a Python decorator?", "How does a hash table work?",
             "Why is the sky blue?", "What does a compiler do?", "What is recursion?"]


def ask_beside(eng: Engine, question: str, wait_s: float, calibrating: bool) -> float:
    cancel = threading.Event()
    worker = None
    if calibrating:
        def run() -> None:
            try:
                eng.calibrate(cancel=cancel)
            except Cancelled:
                pass
        worker = threading.Thread(target=run)
        worker.start()
        time.sleep(wait_s)  # (past its reference prefill, into the steps that pause)
    try:
        result = eng.ask(question, generation=GenerationOptions(temperature=0, max_tokens=16))
    finally:
        cancel.set()
        if worker is not None:
            worker.join()
    return result.ttft_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--questions", type=int, default=3)
    p.add_argument("--wait-s", type=float, default=30.0,
                   help="past the calibration's reference prefill (which does not pause)")
    p.add_argument("--paste-chars", type=int, default=6000)
    args = p.parse_args()
    load_before = os.getloadavg()
    model = default_model_path()
    rows: dict[str, list[float]] = {"alone": [], "beside": [], "beside, no pause": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store = Store(folder / "data")
        digest = content_hash(model, folder / "hashes.json")
        eng = Engine(store, lambda: Runtime(model, model_hash=digest, n_ctx=4096))
        eng.warm_up()
        ask_beside(eng, "Warm-up: hello?", 0, False)
        pasted = text_of("pydoc")[:args.paste_chars]
        for question in QUESTIONS[:args.questions]:
            # (each way's message its own from its first word: none read back from another's)
            def asked(way: str, question=question) -> str:
                return f"({way}) {pasted}\n\n{question}"

            rows["alone"].append(ask_beside(eng, asked("alone"), args.wait_s, False))
            rows["beside"].append(ask_beside(eng, asked("beside"), args.wait_s, True))
            with mock.patch.object(FairLock, "wait_free", lambda self, *args, **kwargs: None):
                rows["beside, no pause"].append(
                    ask_beside(eng, asked("no pause"), args.wait_s, True))
            print(json.dumps({k: v[-1] for k, v in rows.items()}), flush=True)
        eng.close()
        store.close()
    print(json.dumps({"ttft_s": rows,
                      "median_ttft_s": {k: statistics.median(v) for k, v in rows.items()},
                      "load_average": {"before": load_before, "after": os.getloadavg()}},
                     indent=2))


if __name__ == "__main__":
    main()
