"""Whether answers over a long document state its planted facts, against the model's ceiling.

    .venv/bin/python -m benchmarks.bench_longdoc_answers [--model default|gemma|PATH]
        [--size 100000] [--kinds docs,code,markdown] [--seed 0] [--n-ctx 4096]
        [--max-tokens 32] [--k K] [--wide]

The haystacks and facts of `bench_retrieval` (a fact about invented names planted at each
depth 0, 10 ... 100 %, asked for in other words). Each haystack is attached as a user attaches
a file (longer than the context: split, indexed and embedded), and each fact's question asked
in a new chat over it (temperature 0): its passages retrieved (focused, as the app does:
for a question naming something rare, those holding it; `--wide`: always the k best), their
KV computed or read back and blended (a sliding-window model's, Gemma 3's, computed exactly:
not blended), the question computed. Beside it, the model's ceiling: the same question asked in
a new chat over a document holding only the fact's paragraph; and, to tell the blend's
approximation from the model's reading of many passages, the same passages computed exactly
from their text (`--no-cache`). Per fact: whether the fact's passage is among the answer's
sources, whether the answer states the fact (contains every value the fact gives: a number, a
name, a time), and whether the exact reading and the ceiling do. Prints one JSON
document with the rates: `sources_hit` (goal >= 0.95) and `states_where_ceiling_does` (goal
>= 0.90).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from benchmarks.bench_retrieval import facts_with_answers, haystack
from benchmarks.common import model_of
from desktop_app.engine import Engine
from desktop_app.model.models import content_hash
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from store import Store


def states(answer: str, values: list[str]) -> bool:
    text = answer.lower()
    return all(v.lower() in text for v in values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default",
                   help="default (SmolLM2-135M), gemma (Gemma 3 270M) or a GGUF path")
    p.add_argument("--models-dir", default=str(Path.home() / ".cache" / "kvdesk" / "models"),
                   help="where gemma is assembled on first use")
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--kinds", default="docs,code,markdown")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=None, help="passages retrieved per question "
                   "(default: the app's)")
    p.add_argument("--wide", action="store_true",
                   help="always the k best passages, not the app's focused retrieval")
    args = p.parse_args()
    model = model_of(args.model, Path(args.models_dir))
    greedy = GenerationOptions(max_tokens=args.max_tokens, temperature=0)
    rows = []
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        digest = content_hash(model, folder / "hashes.json")
        store = Store(folder / "data")
        eng = Engine(store, lambda: Runtime(model, model_hash=digest, n_ctx=args.n_ctx),
                     fill_passages=False)
        if args.k is not None:
            eng.session.longdocs.top_k = args.k
        eng.session.longdocs.focus = not args.wide
        eng.warm_up()
        for kind in args.kinds.split(","):
            planted = facts_with_answers(random.Random(f"{args.seed}-{kind}-{args.size}"))
            text = haystack(kind, args.size, [(f, q) for f, q, _ in planted])
            if text is None:
                continue
            path = folder / f"{kind}.txt"
            path.write_text(text)
            doc = eng.attach(path)
            for i, (fact, question, values) in enumerate(planted):
                out = eng.ask(question, doc_ids=[doc.doc_id], generation=greedy)
                exact = eng.ask(question, doc_ids=[doc.doc_id], generation=greedy,
                                restore=RestoreOptions(no_cache=True))
                alone = folder / f"{kind}-fact-{i}.txt"
                alone.write_text(fact + "\n")
                ceiling = eng.ask(question, doc_ids=[eng.attach(alone).doc_id],
                                  generation=greedy)
                rows.append({
                    "kind": kind, "depth": i / (len(planted) - 1), "question": question,
                    "values": values, "source_hit": any(fact in s["text"] for s in out.sources),
                    "states": states(out.answer, values),
                    "exact_states": states(exact.answer, values),
                    "ceiling_states": states(ceiling.answer, values),
                    "answer": out.answer, "ceiling_answer": ceiling.answer,
                    "ttft_s": out.ttft_s, "passages": len(out.sources)})
                print(json.dumps(rows[-1]), flush=True)
        eng.close()
        store.close()
    capable = [r for r in rows if r["ceiling_states"]]
    report = {
        "model": str(model), "size": args.size, "n_ctx": args.n_ctx, "facts": len(rows),
        "k": eng.session.longdocs.top_k, "focused": not args.wide,
        "passages_mean": round(sum(r["passages"] for r in rows) / max(1, len(rows)), 2),
        "sources_hit": round(sum(r["source_hit"] for r in rows) / max(1, len(rows)), 3),
        "ceiling_states": round(len(capable) / max(1, len(rows)), 3),
        "states": round(sum(r["states"] for r in rows) / max(1, len(rows)), 3),
        "exact_states": round(sum(r["exact_states"] for r in rows) / max(1, len(rows)), 3),
        "exact_states_where_ceiling_does": round(sum(r["exact_states"] for r in capable)
                                                 / max(1, len(capable)), 3),
        "states_where_ceiling_does": round(sum(r["states"] for r in capable)
                                           / max(1, len(capable)), 3),
        "seconds": round(time.perf_counter() - t_start, 1),
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
