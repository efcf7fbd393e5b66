"""One chat's follow-ups over a long document, turn by turn: what each reads, how soon it answers.

The probe's conversation (stop 55): a fact planted in Python's pydoc topics (~470 KB), asked
about, then followed up with "it" questions, questions about something else, and the fact's
subject named again. Each turn in one chat of one engine, as the window and `kvdesk serve`
ask it (exact passes off: every change of the passages is blended, so turns compare alike),
with no passage KV computed before the first question (a passage is computed the first time
it is read, as after an attach whose background pass has not reached it). Per turn: the
passages the context holds and how many of them an earlier question found (`earlier`), the
passages whose KV was computed for it, the time to first token, the context's tokens, and
whether the answer states what the planted fact says.

    .venv/bin/python -m benchmarks.bench_followup_turns [--model PATH] [--n-ctx 4096]
        [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

from benchmarks.common import text_of
from desktop_app.engine import Engine
from desktop_app.model.models import content_hash, resolve_model_path
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions
from store import Store

FACT = ("Operational note: the Quillmere backup daemon keeps its snapshots for 19 days and runs "
        "every night at 02:45. It is maintained by Ines Brandt from the storage team.")
# (question, what a right answer writes; None: not checked)
TURNS = [("How long does the Quillmere backup daemon keep its snapshots?", "19"),
         ("Who maintains it?", "Brandt"),
         ("What does str.casefold do?", None),
         ("What does the nonlocal statement do?", None),
         ("Give an example of it.", None),
         ("Who maintains the Quillmere daemon?", "Brandt")]
COMPUTED = re.compile(r"(\d+) passage\(s\) with no stored KV")


def haystack() -> str:
    """The pydoc topics with FACT as a paragraph of its own at 60 % of their depth."""
    text = text_of("pydoc")
    at = text.index("\n\n", int(len(text) * 0.6))
    return f"{text[:at]}\n\n{FACT}{text[at:]}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args()
    load = os.getloadavg()[0]
    model = resolve_model_path(args.model)
    greedy = GenerationOptions(max_tokens=args.max_tokens, temperature=0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store = Store(folder / "data")
        eng = Engine(store, lambda: Runtime(model, model_hash=content_hash(
            model, folder / "hashes.json"), n_ctx=args.n_ctx),
            fill_passages=False, background=False)
        path = folder / "manual.txt"
        path.write_text(haystack())
        eng.warm_up()
        doc = eng.attach(path).doc_id
        rows, chat = [], None
        for question, expected in TURNS:
            t0 = time.perf_counter()
            res = eng.ask(question, chat_id=chat, doc_ids=[] if chat else [doc],
                          generation=greedy)
            chat = res.chat_id
            computed = sum(int(m.group(1)) for note in res.messages
                           for m in [COMPUTED.search(note)] if m)
            rows.append({"question": question, "passages": len(res.sources),
                         "earlier": sum(s["earlier"] for s in res.sources),
                         "computed_passages": computed, "ttft_s": res.ttft_s,
                         "wall_s": round(time.perf_counter() - t0, 2),
                         "context_tokens": eng.runtime.n_tokens,
                         "right": None if expected is None else expected in res.answer,
                         "answer": res.answer[:120]})
            print(json.dumps(rows[-1]), flush=True)
        eng.close()
        store.close()
    print(json.dumps({"model": str(model), "n_ctx": args.n_ctx, "load_before": load,
                      "load_after": os.getloadavg()[0], "turns": rows}, indent=1))


if __name__ == "__main__":
    main()
