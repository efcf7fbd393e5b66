"""One chat growing turn by turn in one engine, as the window and `kvdesk serve` hold it: what a
turn costs as the chat grows (probe 117: "later turns get slower").

Each turn is a short instruction and a short greedy answer, asked in the same chat over a small
document. At every `--every`-th turn it records the time to first token, the turn's wall time,
the context's tokens, and the time `ChatSession.conversation` takes alone (the chat's messages
and their tokens, read for every turn: once a render of the whole chat per message, quadratic
in the chat's length), so that what grows with the chat is told apart from the model's own
cost (a question's prefill attends to the whole context).

    .venv/bin/python -m benchmarks.bench_long_chat [--turns 150] [--every 25] [--max-tokens 12]
        [--n-ctx 8192]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from desktop_app.engine import Engine
from desktop_app.model.models import content_hash, resolve_model_path
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions
from store import Store

DOC = ("The lighthouse keeper was named Oren Valdis. He painted the tower blue in 1911 and kept "
       "a log of every ship that passed.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--turns", type=int, default=150)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--n-ctx", type=int, default=8192)
    args = p.parse_args()
    model = resolve_model_path(args.model)
    greedy = GenerationOptions(max_tokens=args.max_tokens, temperature=0)
    rows, load = [], os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store = Store(folder / "data")
        eng = Engine(store, lambda: Runtime(model, model_hash=content_hash(
            model, folder / "hashes.json"), n_ctx=args.n_ctx), fill_passages=False,
            background=False)
        path = folder / "notes.txt"
        path.write_text(DOC)
        eng.warm_up()
        doc, chat = eng.attach(path).doc_id, None
        for turn in range(1, args.turns + 1):
            t0 = time.perf_counter()
            res = eng.ask(f"Remember this: turn {turn}'s codeword is WORD-{turn:03d}. Reply OK.",
                          chat_id=chat, doc_ids=[] if chat else [doc], generation=greedy)
            wall, chat = time.perf_counter() - t0, res.chat_id
            if turn % args.every and turn != args.turns:
                continue
            c0 = time.perf_counter()
            _, tokens, _ = eng.session.conversation(eng.runtime, chat)
            rows.append({"turn": turn, "messages": 2 * turn, "context_tokens": len(tokens),
                         "ttft_s": res.ttft_s, "wall_s": round(wall, 3),
                         "conversation_s": round(time.perf_counter() - c0, 4),
                         "recomputed": res.recomputed_tokens, "load": os.getloadavg()[0]})
            print(json.dumps(rows[-1]), flush=True)
        eng.close()
        store.close()
    print(json.dumps({"model": str(model), "load_before": load, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
