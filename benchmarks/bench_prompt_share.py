"""Bytes the local API's prompt cache stores per request when requests share a long system
prompt and differ in their question (what a tool with one long instruction sends).

    .venv/bin/python -m benchmarks.bench_prompt_share [--tokens 1500] [--requests 4]

The engine as `kvdesk serve` runs it (default settings: levels, chunk size), in-process, on a
fresh data directory; the system message is Python's reference (pydoc_data) cut to about
`--tokens` tokens, each request a new one-question conversation after it, answered greedily
in 8 tokens. After each request: the store's bytes and entries. Prints one JSON document with
the load average (sizes do not depend on it).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

QUESTIONS = ["What is this section about?", "Which statement does it describe first?",
             "Name one keyword it mentions.", "Is there an example in it?",
             "What does it say about errors?", "Who is it written for?"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1500)
    p.add_argument("--requests", type=int, default=4, choices=range(2, len(QUESTIONS) + 1))
    args = p.parse_args()
    os.environ["KVDESK_DATA_DIR"] = tempfile.mkdtemp(prefix="kvdesk-share-")
    os.environ["KVDESK_CONFIG_DIR"] = tempfile.mkdtemp(prefix="kvdesk-share-cfg-")
    from pydoc_data.topics import topics

    from desktop_app.app import App
    from desktop_app.options import GenerationOptions
    from desktop_app.settings import load

    before = os.getloadavg()
    app = App(load(), background=False)
    eng = app.engine
    text = "\n\n".join(topics[k] for k in sorted(topics))
    system = {"role": "system", "content": eng.runtime.detokenize(
        eng.runtime.tokenize(text)[:args.tokens])}
    rows = []
    for question in QUESTIONS[:args.requests]:
        t0 = time.perf_counter()
        done = eng.complete([system, {"role": "user", "content": question}],
                            generation=GenerationOptions(max_tokens=8, temperature=0))
        rows.append({"prompt_tokens": done.prompt_tokens, "stored": done.stored,
                     "store_MB": round(eng.store.usage_bytes() / 1e6, 2),
                     "entries": len(eng.store.entries()),
                     "seconds": round(time.perf_counter() - t0, 2)})
    eng.close()
    added = [round(b["store_MB"] - a["store_MB"], 2) for a, b in zip(rows, rows[1:], strict=False)]
    print(json.dumps({"tokens": args.tokens, "requests": rows,
                      "MB_per_later_request": added,
                      "load_average": {"before": before, "after": os.getloadavg()}}, indent=2))


if __name__ == "__main__":
    main()
