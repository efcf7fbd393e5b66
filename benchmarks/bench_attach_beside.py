"""An answer and an attach computing at once, against each alone (the window's and the server's
attaches run in their own context beside the chat's turns).

    .venv/bin/python -m benchmarks.bench_attach_beside [--rounds 2] [--doc-chars 8000]
        [--paste-chars 1500] [--max-tokens 48] [--stream]
        [--two-documents]

One process, the default model (SmolLM2), temperature 0. Each round, in this order:
- `answer alone`: a new chat whose message pastes `--paste-chars` of Python's reference before
  a question; its time to first token and its tokens/s after the first;
- `attach alone`: a new document of `--doc-chars` of the reference (~2,000 tokens), its wall
  time and prefill tokens/s;
- `both`: an attach started, then, once its prefill has begun, a question asked (`--stream`:
  questions one after another, the attach started after the first answer, the questions
  going on until it ends): the answers' medians and the attach's figures as above;
- `both, no yield`: the same with FairLock.wait_free made a no-op (nothing waits for the
  questions: neither the background passes nor anything else).
Each phase also gives the process's CPU use (CPU seconds / wall seconds: 2.0 = both cores) and
the load average after it. Every text is new to the store (no cache reused).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

from benchmarks.common import text_of
from desktop_app.chat.fairlock import FairLock
from desktop_app.engine import Engine
from desktop_app.model.models import content_hash, default_model_path
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions
from store import Store

QUESTIONS = ["What is a Python decorator?", "How does a hash table work?",
             "What does a compiler do?", "What is recursion?", "Why is the sky blue?"]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def answer(eng: Engine, message: str, max_tokens: int, doc_ids: tuple[int, ...] = ()) -> dict:
    """Time to first token and tokens/s after it, and when the answer ended."""
    stamps: list[float] = []
    t0 = time.perf_counter()
    eng.ask(message, doc_ids=doc_ids,
            generation=GenerationOptions(temperature=0, max_tokens=max_tokens),
            on_token=lambda _t: stamps.append(time.perf_counter()))
    end = time.perf_counter()
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return {"ttft_s": round(stamps[0] - t0, 3) if stamps else None,
            "tok_s": round(rate, 1), "answer_s": round(end - t0, 3)}


def attach(eng: Engine, path: Path, started: threading.Event | None = None) -> dict:
    t0 = time.perf_counter()

    def progress(p) -> None:
        if started is not None and p.phase == "prefill" and p.done:
            started.set()
    result = eng.attach(path, progress=progress)
    return {"attach_s": round(time.perf_counter() - t0, 3), "tokens": result.tokens,
            "prefill_s": result.prefill_s,
            "prefill_tok_s": round(result.tokens / max(result.prefill_s, 1e-6), 1)}


def both(eng: Engine, path: Path, messages, max_tokens: int, stream: bool,
         doc_ids: tuple[int, ...] = ()) -> dict:
    """An attach started, then a question asked once its prefill has begun; `stream`: questions
    asked one after another, the attach started once the first is answered, the questions
    going on until it ends (the probe's chat driver)."""
    started, out, answers = threading.Event(), {}, []
    t0 = time.perf_counter()
    if stream:
        stop = threading.Event()

        def asking() -> None:
            while not stop.is_set():
                answers.append(answer(eng, next(messages), max_tokens, doc_ids))
        asker = threading.Thread(target=asking)
        asker.start()
        while not answers:
            time.sleep(0.05)
        out["attach_after_s"] = round(time.perf_counter() - t0, 3)
        out.update(attach(eng, path))
        stop.set()
        asker.join()
    else:
        worker = threading.Thread(target=lambda: out.update(attach(eng, path, started)))
        worker.start()
        started.wait(60)
        out["asked_after_s"] = round(time.perf_counter() - t0, 3)
        answers.append(answer(eng, next(messages), max_tokens, doc_ids))
        worker.join()
    for key in answers[0]:
        out[key] = statistics.median(a[key] for a in answers)
    out["answers"] = len(answers)
    out["both_done_s"] = round(time.perf_counter() - t0, 3)
    return out


def measured(eng: Engine, run) -> dict:
    eng.exactness.idle.wait(300)  # (each way after the exact contexts the last one asked for)
    c0, t0 = _cpu(), time.perf_counter()
    row = run()
    wall = time.perf_counter() - t0
    row["cpu_cores"] = round((_cpu() - c0) / wall, 2)
    row["load_1m"] = round(os.getloadavg()[0], 2)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--doc-chars", type=int, default=8000)
    p.add_argument("--paste-chars", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--stream", action="store_true",
                   help="beside the attach, questions one after another until it ends (the "
                        "answers' medians)")
    p.add_argument("--two-documents", action="store_true",
                   help="each question a new chat over two small documents attached first: a "
                        "blended chat, whose exact context the background pass then computes "
                        "in the attach context (as after the probe's chats over two or long "
                        "documents)")
    args = p.parse_args()
    load_before = os.getloadavg()
    model = default_model_path()
    reference = text_of("pydoc")
    ways = ["answer alone", "attach alone", "both", "both, no yield"]
    rows: dict[str, list[dict]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store = Store(folder / "data")
        digest = content_hash(model, folder / "hashes.json")
        eng = Engine(store, lambda: Runtime(model, model_hash=digest, n_ctx=4096),
                     fill_passages=False)
        eng.warm_up()
        answer(eng, "Warm-up: hello?", 4)
        texts = iter(range(10_000, len(reference), 3_000))

        def doc(chars: int = args.doc_chars) -> Path:
            start = next(texts)
            path = folder / f"doc{start}.txt"
            path.write_text(reference[start:start + chars])
            return path

        def message(way: str, question: str) -> str:
            start = next(texts)  # (its own text: no cache read back from another's)
            return f"({way}) {reference[start:start + args.paste_chars]}\n\n{question}"

        def messages(way: str, question: str):
            while True:
                yield message(way, question)

        pair: tuple[int, ...] = ()
        if args.two_documents:
            pair = tuple(eng.attach(doc(args.doc_chars // 4)).doc_id for _ in range(2))
        for r in range(args.rounds):
            q = QUESTIONS[r % len(QUESTIONS)]
            rows["answer alone"].append(measured(eng,
                lambda q=q: answer(eng, message("alone", q), args.max_tokens, pair)))
            rows["attach alone"].append(measured(eng, lambda: attach(eng, doc())))
            rows["both"].append(measured(eng,
                lambda q=q: both(eng, doc(), messages("both", q), args.max_tokens,
                                 args.stream, pair)))
            with mock.patch.object(FairLock, "wait_free", lambda self, *args, **kwargs: None):
                rows["both, no yield"].append(measured(eng,
                    lambda q=q: both(eng, doc(), messages("no yield", q),
                                     args.max_tokens, args.stream, pair)))
            print(json.dumps({w: rows[w][-1] for w in ways}), flush=True)
        eng.close()
        store.close()
    medians = {w: {k: statistics.median(row[k] for row in rows[w])
                   for k in rows[w][0] if isinstance(rows[w][0][k], (int, float))}
               for w in ways}
    print(json.dumps({"median": medians, "cpu": _cpu_name(), "load_average": {
        "before": load_before, "after": os.getloadavg()}}, indent=2))


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return f"{os.cpu_count()} cores"


if __name__ == "__main__":
    main()
