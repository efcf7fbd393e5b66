"""Retrieval over two long documents at once: is the planted fact's passage among those read?

A chat can be about several long documents (`ask --doc 1 --doc 2`): each question retrieves
from all of them (`passages.across`). Two haystacks of `bench_retrieval` (different kinds,
each with its own planted facts) are indexed in one store as attach does it, and every
fact's question is asked over the pair, in both orders, as a chat asks it (`focus`, the
default number of passages). Measured: how often the fact's passage is among the passages
read, and how many are read. Beside it the merge it replaced, reproduced here as the baseline:
each document's hits sorted together by their own scores, which do not compare between
documents (fused in one, raw BM25 in another).

    .venv/bin/python -m benchmarks.bench_retrieval_pairs [--size 300000] [--seeds 0,1]
        [--pairs docs+code,docs+markdown,code+markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

import llama_cpp

from benchmarks.bench_retrieval import _cpu, facts, haystack
from desktop_app.model.models import default_model_path
from desktop_app.passages import DEFAULT_K
from desktop_app.passages.across import across
from desktop_app.passages.embed import WordLlamaEmbedder
from desktop_app.passages.retrieve import Retriever
from store import Store


def by_own_scores(retriever: Retriever, doc_ids: list[int], question: str, k: int):
    """The merge `across` replaced: every document's focused hits, sorted by score."""
    return sorted(((d, h) for d in doc_ids
                   for h in retriever.retrieve(d, question, k=k, focus=True)),
                  key=lambda dh: -dh[1].score)[:k]


def run_pair(kinds: tuple[str, str], size: int, seed: int, llm, embedder) -> dict:
    count = lambda s: len(llm.tokenize(s.encode("utf-8"), add_bos=False, special=True))  # noqa: E731
    merges = {"across": lambda r, ids, q: across(r, ids, q, k=DEFAULT_K, focus=True),
              "own-scores": lambda r, ids, q: by_own_scores(r, ids, q, DEFAULT_K)}
    found = {m: 0 for m in merges}
    read = {m: 0 for m in merges}
    asked = 0
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp)) as store:
        retriever = Retriever(store, embedder)
        planted, ids = {}, []
        for kind in kinds:
            facts_here = facts(random.Random(f"{seed}-{kind}-{size}"))
            text = haystack(kind, size, facts_here)
            if text is None:
                raise SystemExit(f"too little {kind} text for {size:,} characters")
            doc = store.add_document(f"{kind}-{size}-{seed}", kind, text, type=kind)
            retriever.index.add(doc.id, text, "code" if kind == "code" else "markdown", count)
            planted[doc.id] = facts_here
            ids.append(doc.id)
        for doc_id, facts_here in planted.items():
            for fact, question in facts_here:
                for order in (ids, ids[::-1]):
                    asked += 1
                    for name, merge in merges.items():
                        hits = merge(retriever, order, question)
                        found[name] += any(d == doc_id and fact in h.text for d, h in hits)
                        read[name] += len(hits)
    return {"pair": "+".join(kinds), "size": size, "seed": seed, "questions": asked,
            "fact_read": {m: round(found[m] / asked, 3) for m in merges},
            "passages_read": {m: round(read[m] / asked, 2) for m in merges}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=300_000, help="characters a document")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--pairs", default="docs+code,docs+markdown,code+markdown")
    args = parser.parse_args(argv)
    llm = llama_cpp.Llama(str(default_model_path()), vocab_only=True, verbose=False)
    embedder = WordLlamaEmbedder()
    results = [run_pair(tuple(pair.split("+")), args.size, int(seed), llm, embedder)
               for pair in args.pairs.split(",") for seed in args.seeds.split(",")]
    total = sum(r["questions"] for r in results)
    mean = {m: round(sum(r["fact_read"][m] * r["questions"] for r in results) / total, 3)
            for m in results[0]["fact_read"]}
    print(json.dumps({"cpu": _cpu(), "load_average": os.getloadavg(), "results": results,
                      "fact_read": mean}, indent=2))


if __name__ == "__main__":
    main()
