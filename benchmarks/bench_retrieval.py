"""Retrieval benchmark: recall@k of BM25, dense and fused ranks on haystacks with planted facts.

Haystacks of three kinds, all shipped with the interpreter or its packages (nothing is
downloaded): `docs`, Python's documentation prose (pydoc topics, then the docstrings of over
200 characters of the standard library's top-level modules); `code`, the standard library's
source; `markdown`, the long descriptions of the installed packages (their METADATA). Each
is cut to 100 kB, 1 MB and 3 MB, as far as its source goes (docs ~1.2 MB, markdown ~0.9 MB
here: only code reaches 3 MB). Into each, facts about invented names are planted at depths
0, 10 ... 100 % (a paragraph of their own; a comment in code), and each is asked for with a
question that paraphrases it. A fact is found at k when a passage holding it is among the
first k.

The document is split and indexed exactly as attach does it (`passages.index`, the default
model's tokenizer), and retrieved by each mode of `passages.retrieve`, with two dense
embedders: wordllama (the default) and the chat model's own input token embeddings (mean
over a text's tokens, centred). Prints one JSON object; `--markdown` also a table.

    .venv/bin/python -m benchmarks.bench_retrieval [--sizes 100000,1000000,3000000]
        [--kinds docs,code,markdown] [--seed 0] [--target 320] [--markdown]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import llama_cpp
import numpy as np

from desktop_app.model.models import default_model_path
from desktop_app.passages.embed import WordLlamaEmbedder, normalise
from desktop_app.passages.retrieve import Retriever
from desktop_app.passages.split import TARGET_TOKENS
from store import Store

KS = (1, 3, 5, 8)
WEIGHTS = (1.0, 0.25)  # the dense ranking's share in fusions tried beside the default
DEPTHS = [i / 10 for i in range(11)]
STDLIB = Path(sysconfig.get_paths()["stdlib"])

# (fact, question): the question paraphrases the fact and shares only its name with it.
TEMPLATES = [
    ("The access code for the {name} vault is {n4}.", "Which number opens the {name} vault?"),
    ("{person} was born in the mountain village of {place}.",
     "In which village did {person} come into the world?"),
    ("The {name} project was given a budget of {n3} thousand euros.",
     "How much money was allotted to the {name} project?"),
    ("Our team's mascot is a tortoise named {pname}.",
     "What do we call the animal that serves as the team's mascot?"),
    ("The {name} ferry leaves the harbour every morning at {hh}:{mm}.",
     "At what time does the {name} boat depart each day?"),
    ("Dr. {person} keeps the spare laboratory key in a {colour} envelope.",
     "Where does Dr. {person} hide the extra key to the lab?"),
    ("The {name} server runs on port {n4} behind the firewall.",
     "Which port does the {name} machine listen on?"),
    ("{person}'s favourite dessert is {dessert} with {fruit}.",
     "What sweet dish does {person} like best?"),
    ("The warehouse in {place} stores exactly {n3} crates of {thing}.",
     "How many boxes are kept at the {place} depot?"),
    ("The password hint for the {name} account is '{word} {word2}'.",
     "What is the clue for remembering the {name} login?"),
    ("The {name} bridge was painted {colour} in {year}.",
     "What colour was the {name} bridge given, and when?"),
]
COLOURS = ["crimson", "teal", "ochre", "violet", "amber", "olive"]
DESSERTS = ["rice pudding", "baked custard", "almond tart", "semolina cake"]
FRUITS = ["quince", "gooseberries", "apricots", "blackcurrants"]
THINGS = ["lamp oil", "roofing nails", "sea salt", "copper wire"]
WORDS = ["marble", "lantern", "orchard", "falcon", "harbour", "thistle"]


def invented(rng: random.Random) -> str:
    """A pronounceable word no text contains (so a hit is the planted fact, not chance)."""
    syllables = ["zel", "mar", "qui", "dro", "vok", "ten", "bra", "lis", "ost", "une", "pha"]
    return "".join(rng.choice(syllables) for _ in range(3)).capitalize()


# What an answer must say to state each template's fact (its keys into the values).
ANSWERS = [("n4",), ("place",), ("n3",), ("pname",), ("hh", "mm"), ("colour",), ("n4",),
           ("dessert",), ("n3",), ("word", "word2"), ("colour", "year")]


def facts(rng: random.Random) -> list[tuple[str, str]]:
    return [(fact, question) for fact, question, _ in facts_with_answers(rng)]


def facts_with_answers(rng: random.Random) -> list[tuple[str, str, list[str]]]:
    """(fact, question, the strings an answer stating the fact contains), one per depth."""
    out = []
    for depth_index in range(len(DEPTHS)):
        fact, question = TEMPLATES[depth_index % len(TEMPLATES)]
        values = {"name": invented(rng), "person": f"{invented(rng)} {invented(rng)}",
                  "place": invented(rng), "pname": invented(rng), "n4": rng.randint(1000, 9999),
                  "n3": rng.randint(100, 999), "hh": f"{rng.randint(5, 9):02d}",
                  "mm": f"{rng.randint(0, 59):02d}", "colour": rng.choice(COLOURS),
                  "dessert": rng.choice(DESSERTS), "fruit": rng.choice(FRUITS),
                  "thing": rng.choice(THINGS), "word": rng.choice(WORDS),
                  "word2": rng.choice(WORDS), "year": rng.randint(1890, 1990)}
        keys = ANSWERS[depth_index % len(TEMPLATES)]
        out.append((fact.format(**values), question.format(**values),
                    [str(values[k]) for k in keys]))
    return out


def source(kind: str) -> str:
    """Up to ~4 MB of text of a kind, in a fixed order."""
    if kind == "docs":
        import pydoc_data.topics

        parts = list(pydoc_data.topics.topics.values())
        for path in sorted(STDLIB.glob("*.py")):
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            parts += [doc for node in ast.walk(tree)
                      if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module))
                      and (doc := ast.get_docstring(node)) and len(doc) > 200]
        return "\n\n".join(parts)
    if kind == "code":
        return "\n\n".join(p.read_text(encoding="utf-8", errors="replace")
                           for p in sorted(STDLIB.glob("*.py")))
    if kind == "markdown":
        site = Path(sysconfig.get_paths()["purelib"])
        parts = []
        for meta in sorted(site.glob("*.dist-info/METADATA")):
            _, _, body = meta.read_text(encoding="utf-8", errors="replace").partition("\n\n")
            parts.append(body)
        return "\n\n".join(parts)
    raise SystemExit(f"unknown kind {kind!r}: docs, code or markdown")


def haystack(kind: str, size: int, planted: list[tuple[str, str]]) -> str | None:
    """`size` characters of `kind` with each fact at its depth, or None if there is less."""
    text = source(kind)
    if len(text) < size * 0.9:
        return None
    paragraphs = text[:size].split("\n\n")
    for (fact, _), depth in sorted(zip(planted, DEPTHS, strict=True), key=lambda x: -x[1]):
        paragraphs.insert(round(depth * len(paragraphs)), f"# {fact}" if kind == "code" else fact)
    return "\n\n".join(paragraphs)


class ModelTokenEmbedder:
    """The chat model's input token embeddings, averaged over a text's tokens and centred on
    the vocabulary's mean: what "the loaded model's own embeddings" gives without running it."""

    def __init__(self, llm: llama_cpp.Llama, model_path: Path):
        from gguf import GGUFReader
        from gguf.quants import dequantize

        tensor = next(t for t in GGUFReader(model_path).tensors if t.name == "token_embd.weight")
        self.table = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        self.mean = self.table.mean(axis=0)
        self.llm = llm

    name = "model-token-embeddings"

    @property
    def dimension(self) -> int:
        return self.table.shape[1]

    def embed(self, texts):
        rows = []
        for text in texts:
            ids = self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
            rows.append(self.table[ids].mean(axis=0) - self.mean if ids else
                        np.zeros(self.dimension, np.float32))
        return normalise(np.array(rows))

    def count_tokens(self, texts) -> int:
        return sum(len(self.llm.tokenize(t.encode(), add_bos=False)) for t in texts)


def run_one(kind: str, size: int, seed: int, llm, embedder, model_embedder,
            target: int = TARGET_TOKENS) -> dict | None:
    planted = facts(random.Random(f"{seed}-{kind}-{size}"))
    text = haystack(kind, size, planted)
    if text is None:
        return None
    count = lambda s: len(llm.tokenize(s.encode("utf-8"), add_bos=False, special=True))  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp)) as store:
        doc = store.add_document(f"{kind}-{size}", kind, text, type=kind)
        default = Retriever(store, embedder)
        default.index.target = target
        t0 = time.perf_counter()
        n = default.index.add(doc.id, text, "code" if kind == "code" else "markdown", count)
        index_s = time.perf_counter() - t0
        tokens = sum(p.tokens for p in store.passages(doc.id))
        conn = store._db.get().conn
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # What attach adds beside the document's own text: passages, index, vectors.
        extra_bytes = store.path.stat().st_size - len(text.encode("utf-8"))
        own = Retriever(store, model_embedder)
        own.index.vectors(doc.id)  # made here, not inside the first query's time
        modes = {"bm25": (default, "bm25"),
                 "bm25-plain": (Retriever(store, embedder, rare_words=False), "bm25"),
                 "dense": (default, "dense"), "fused": (default, "fused")}
        for weight in WEIGHTS:
            modes[f"fused-{weight}"] = (Retriever(store, embedder, dense_weight=weight), "fused")
        modes |= {"dense-model": (own, "dense"), "fused-model": (own, "fused")}
        recall = {m: dict.fromkeys(KS, 0) for m in modes}
        query_s = dict.fromkeys(modes, 0.0)
        for fact, question in planted:
            for mode, (retriever, how) in modes.items():
                t = time.perf_counter()
                hits = retriever.retrieve(doc.id, question, k=max(KS), mode=how)
                query_s[mode] += time.perf_counter() - t
                rank = next((i for i, h in enumerate(hits) if fact in h.text), None)
                for k in KS:
                    recall[mode][k] += rank is not None and rank < k
    q = len(planted)
    return {"kind": kind, "chars": len(text), "tokens": tokens, "passages": n,
            "index_s": round(index_s, 2),
            "index_bytes_per_MB": round(extra_bytes / len(text.encode("utf-8")) * 1e6),
            "recall": {m: {f"@{k}": round(v / q, 3) for k, v in r.items()} for m, r in
                       recall.items()},
            "query_ms": {m: round(1000 * s / q, 1) for m, s in query_s.items()}}


def markdown(results: list[dict]) -> str:
    modes = list(results[0]["recall"])
    lines = ["| haystack | passages | index s | " + " | ".join(
        f"{m} @1/@3/@8" for m in modes) + " |", "|---" * (3 + len(modes)) + "|"]
    for r in results:
        lines.append(f"| {r['kind']} {r['chars'] / 1e6:.2f} MB | {r['passages']:,} | "
                     f"{r['index_s']} | " + " | ".join(
                         "/".join(f"{r['recall'][m][k]:.2f}" for k in ("@1", "@3", "@8"))
                         for m in modes) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,3000000")
    parser.add_argument("--kinds", default="docs,code,markdown")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=int, default=TARGET_TOKENS,
                        help="a passage's size in tokens (default: the app's)")
    parser.add_argument("--markdown", action="store_true", help="also print a table")
    args = parser.parse_args(argv)
    model = default_model_path()
    llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    model_embedder = ModelTokenEmbedder(llm, model)
    embedder = WordLlamaEmbedder()
    t0 = time.perf_counter()
    embedder.embed(["load"])
    load_s = time.perf_counter() - t0
    results = []
    for kind in args.kinds.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            result = run_one(kind, size, args.seed, llm, embedder, model_embedder,
                              args.target)
            if result is not None:
                results.append(result)
                print(json.dumps(result), file=sys.stderr)
    totals = {m: {k: round(float(np.mean([r["recall"][m][k] for r in results])), 3)
                  for k in results[0]["recall"][m]} for m in results[0]["recall"]}
    print(json.dumps({"cpu": _cpu(), "load_average": os.getloadavg(), "seed": args.seed,
                      "target": args.target,
                      "embedder_load_s": round(load_s, 2),
                      "results": results, "mean_recall": totals}, indent=2))
    if args.markdown:
        print(markdown(results))


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
