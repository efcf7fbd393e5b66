"""A long document answered from its passages: time to the first token three ways, in one run.

    .venv/bin/python -m benchmarks.bench_longdoc [--model PATH] [--chars 400000] [--n-ctx 4096]
                                                 [--questions 6] [--k 8]
                                                 [--calibration FILE | --uncalibrated]
                                                 [--named] [--no-quote] [--no-quote-kv]
                                                 [--exact-passes]

The text is Python's reference manual (the standard library's pydoc topics), cut to `--chars`
characters and attached (split into passages, indexed and embedded: no prefill). Each question
names a topic heading of the manual; for each one, a new chat asks it:

    first      its passages' KV computed on first retrieval (all passage KV evicted before,
               so none is found), stored, then blended (what a first question costs)
    cached     the same question in a new chat with every passage's KV stored: read back,
               moved into place, each later passage's first tokens recomputed (blend_recompute)
    as text    the same passages in the same layout computed from their text, as GPT4All's
               LocalDocs and LM Studio re-read retrieved snippets (`--no-cache`)

The model's levels are calibrated first (minutes: what the window and `kvdesk serve` do after
the first attach), or adopted from `--calibration`; until a model is calibrated its levels are
unmeasured, and a sliding-window model keeps no passage KV (`PassageKV.kept`).
`--uncalibrated` measures that path. The chat context is emptied before each ask, so nothing
is kept from the one before, and nothing computes beside an ask: a long-running engine makes
a blended chat's context exact in the background after its answer (`chat.exactness`, ~10 s of
both cores for eight passages), which would run beside the next asks here, three a question,
and, once done, turn the cached ask into the restore of that exact copy. `--exact-passes`
measures with them on, as a user asking again right after an answer would. Prints one JSON
document: per question the three times and the passages' tokens; their medians and ratios,
per question too; the process's CPU seconds of each ask (every thread's); attach time; the
bytes stored per MB of passage text at the passage level; the levels used; the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import add_calibration_flags, text_of, use_calibration
from desktop_app.engine import Engine
from desktop_app.model.models import content_hash, resolve_model_path
from desktop_app.model.prompts import with_evidence
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from store import Store

ONE_TOKEN = GenerationOptions(max_tokens=1, temperature=0)
QUESTIONS = [
    "What does the with statement do?", "How does the import system find a module?",
    "What is a code block in the execution model?", "How are exceptions raised and handled?",
    "What does the yield expression do?", "How are class definitions executed?",
    "What does the global statement mean?", "How does a for loop iterate?",
]

# Questions naming something rare in the manual (an identifier, an environment variable): the
# ones whose turn quotes its evidence (`passages.evidence`), ~30 tokens more to compute.
NAMED = [
    "What does the PYTHONHASHSEED environment variable control?",
    "When is __missing__ called by dict subclasses?",
    "What does the __aenter__ method of an asynchronous context manager return?",
    "What is the value of __debug__?",
    "What does the __prepare__ method of a metaclass return?",
    "What must __index__ return?",
]


def ask(eng: Engine, doc_id: int, question: str, **restore) -> dict:
    eng.runtime.reset()  # nothing kept from the ask before
    t0, c0 = time.perf_counter(), time.process_time()
    out = eng.ask(question, doc_ids=[doc_id], generation=ONE_TOKEN,
                  restore=RestoreOptions(**restore))
    turn = with_evidence(question, out.evidence)
    return {"ttft_s": out.ttft_s, "wall_s": round(time.perf_counter() - t0, 3),
            "evidence_tokens": len(eng.runtime.tokenize(turn)) - len(eng.runtime.tokenize(
                question)),  # what the turn's quote added (`passages.evidence`)
            "cpu_s": round(time.process_time() - c0, 3),  # the process's, every thread's
            "recomputed_tokens": out.recomputed_tokens, "passages": len(out.sources),
            "quoted_tokens_reused": (out.blended or {}).get("quoted_tokens_reused", 0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--chars", type=int, default=400_000)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--questions", type=int, default=6)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--named", action="store_true",
                   help="ask the questions naming something rare (their turns quote evidence)")
    p.add_argument("--no-quote", action="store_true",
                   help="the question's turn without its evidence (as before it had any)")
    p.add_argument("--no-quote-kv", action="store_true",
                   help="compute the quote's tokens instead of taking them from the passages' KV")
    p.add_argument("--exact-passes", action="store_true",
                   help="a long-running engine's exact passes on, beside the asks after")
    add_calibration_flags(p)
    args = p.parse_args()
    load_before = os.getloadavg()
    model = resolve_model_path(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        digest = content_hash(model, folder / "hashes.json")
        store = Store(folder / "data")
        eng = Engine(store, lambda: Runtime(model, model_hash=digest, n_ctx=args.n_ctx),
                     fill_passages=False,  # (the first ask must find no passage computed)
                     background=args.exact_passes)
        eng.session.longdocs.top_k = args.k
        eng.session.longdocs.quote = not args.no_quote
        eng.session.blender.repeat = not args.no_quote_kv
        text = text_of("pydoc")[:args.chars]
        path = folder / "reference.txt"
        path.write_text(text)
        eng.warm_up()
        levels = use_calibration(eng, args)
        t0 = time.perf_counter()
        attached = eng.attach(path)
        attach_s = time.perf_counter() - t0
        ask(eng, attached.doc_id, "Warm-up: what is Python?")  # loads the embedder, kernels
        rows = []
        for question in (NAMED if args.named else QUESTIONS)[:args.questions]:
            store.gc(budget_bytes=1)  # no passage KV stored: the first ask computes it
            first = ask(eng, attached.doc_id, question)
            cached = ask(eng, attached.doc_id, question)
            text_row = ask(eng, attached.doc_id, question, no_cache=True)
            rows.append({"question": question, "first": first, "cached": cached,
                         "as_text": text_row})
            print(json.dumps(rows[-1]), flush=True)
        # The passages whose KV is stored now (the last question's): bytes per MB of text.
        pkv, rt = eng.session.longdocs.kv, eng.runtime
        stored = [(p.text, e) for p in store.passages(attached.doc_id)
                  for e in [pkv.entry(rt, p.text)] if e is not None]
        text_bytes = sum(len(t.encode()) for t, _ in stored)
        med = {mode: statistics.median(r[mode]["ttft_s"] for r in rows)
               for mode in ("first", "cached", "as_text")}
        report = {
            "model": str(model), "n_ctx": args.n_ctx, "k": args.k, "chars": len(text),
            "passages": attached.passages, "attach_s": round(attach_s, 2),
            "exact_passes": args.exact_passes, "quote_kv": not args.no_quote_kv,
            "passage_level": eng.session.longdocs.kv.level, "levels": levels,
            "median_ttft_s": med,
            "first_over_cached": round(med["first"] / med["cached"], 2),
            "as_text_over_cached": round(med["as_text"] / med["cached"], 2),
            # The goal holds for every question, not only the medians.
            "per_question": [{"first_over_cached": round(r["first"]["ttft_s"]
                                                         / r["cached"]["ttft_s"], 2),
                              "as_text_over_cached": round(r["as_text"]["ttft_s"]
                                                           / r["cached"]["ttft_s"], 2)}
                             for r in rows],
            "median_cpu_s": {mode: statistics.median(r[mode]["cpu_s"] for r in rows)
                             for mode in ("first", "cached", "as_text")},
            "stored_bytes_per_text_MB": round(sum(e.nbytes for _, e in stored)
                                              / max(1, text_bytes) * 1e6),
            "questions": rows,
            "load_average": {"before": load_before, "after": os.getloadavg()},
        }
        eng.close()
        store.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
