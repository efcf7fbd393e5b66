"""Follow-up retrieval: does a chat's second question get its own passages?

A chat's question is retrieved with the chat's last turns in the query (`retrieve.recent_text`):
a follow-up that says "it" needs them, one that names something new must not be drowned by
them. On the haystacks of `bench_retrieval` (facts about invented names planted at depths 0 to
100 %), three kinds of two-turn conversations, each asked through `Retriever.retrieve` as a
chat asks it (focused, `DEFAULT_K`, the first question and its answer as the recent turns):

- `switch`: the first question asks one planted fact and is answered with it; the follow-up
  asks another ("And which port does the Zelmar machine listen on?"). Its target: the second
  fact's passage.
- `switch-unsure`: the same, the first answer a model's unsure reply that repeats the first
  question's words.
- `anaphoric`: the follow-up asks about the first question's subject without naming it ("And
  who keeps the records about it?", "Who handles its insurance?"); a companion fact about
  that subject is planted in a paragraph of its own at another depth. Its target: the
  companion's passage.
- `identifiers` (code only): two methods of one class, "What does _get_x return?", then "And
  what does _get_y return?" (the case a probe found). Target: the passage defining the second.

Found: the target is among the passages retrieval returns for the follow-up (what the chat's
`_fit` then reads first); `first`: it is the first of them; `alone`: the follow-up asked with
no recent turns, for comparison (an `anaphoric` one alone finds its target by chance: every
companion is worded alike, so only the subject tells them apart). Also the mean number of
passages returned.

    .venv/bin/python -m benchmarks.bench_followups [--kinds docs,code,markdown]
        [--sizes 300000,1000000] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
from pathlib import Path

import llama_cpp

from benchmarks.bench_retrieval import facts_with_answers, haystack, invented, source
from desktop_app.model.models import default_model_path
from desktop_app.passages import DEFAULT_K
from desktop_app.passages.embed import WordLlamaEmbedder
from desktop_app.passages.retrieve import Retriever
from store import Store

UNSURE = "I am not sure. The document does not say clearly {q}"
# The subject of a planted fact: its invented name(s), as `invented` makes them.
SUBJECT = re.compile(r"\b(?:Dr\. )?[A-Z][a-z]{5,}(?: [A-Z][a-z]{5,})?\b")
# (companion, the follow-up asking it): a few subjects share each wording, so that only the
# subject tells their companions apart; the wordings' words are rare in some haystacks
COMPANIONS = [("Records about {subject} are kept by a clerk named {clerk}.",
               "And who keeps the records about it?"),
              ("The insurance of {subject} is handled by a broker called {clerk}.",
               "Who handles its insurance?"),
              ("Every complaint about {subject} goes to an ombudsman named {clerk}.",
               "And where do complaints about it go?")]


def follow(question: str) -> str:
    return "And " + question[0].lower() + question[1:]


def method_pairs(text: str, most: int = 20) -> list[tuple[str, str]]:
    """Pairs of neighbouring methods of one class with an underscore in their names, each
    defined once in `text`."""
    defined: dict[str, int] = {}
    for name in re.findall(r"^    def ([a-z_]+_[a-z_]+)\(", text, re.M):
        defined[name] = defined.get(name, 0) + 1
    pairs, previous = [], None
    for m in re.finditer(r"^(class \w+|    def ([a-z_]+_[a-z_]+)\()", text, re.M):
        name = m.group(2)
        if name is None:
            previous = None
            continue
        if previous and defined[name] == defined[previous] == 1 and name != previous:
            pairs.append((previous, name))
        previous = name
    step = max(1, len(pairs) // most)
    return pairs[::step][:most]


def conversations(kind: str, text: str, planted, rng: random.Random
                  ) -> tuple[str, list[dict]]:
    """The haystack with the companions planted, and the conversations over it."""
    paragraphs = text.split("\n\n")
    convs = []
    n = len(planted)
    for i, (fact, question, _) in enumerate(planted):
        j = (i + 1) % n
        other_fact, other_q, _ = planted[j]
        for name, answer in (("switch", fact), ("switch-unsure", UNSURE.format(q=question))):
            convs.append({"kind": name, "turns": [question, answer], "ask": follow(other_q),
                          "target": other_fact})
        subject = SUBJECT.search(fact)
        if subject:
            wording, asked = COMPANIONS[i % len(COMPANIONS)]
            companion = wording.format(subject=subject.group(), clerk=invented(rng))
            at = (round(((i + 0.5) / n) * len(paragraphs)) + len(paragraphs) // 3) % len(
                paragraphs)
            paragraphs.insert(at, f"# {companion}" if kind == "code" else companion)
            convs.append({"kind": "anaphoric", "turns": [question, fact], "ask": asked,
                          "target": companion})
    text = "\n\n".join(paragraphs)
    if kind == "code":
        for first, second in method_pairs(text):
            convs.append({"kind": "identifiers",
                          "turns": [f"What does {first} return?",
                                    f"`{first}` returns the values it was given."],
                          "ask": f"And what does {second} return?",
                          "target": f"def {second}("})
    return text, convs


def run(kind: str, size: int, seed: int, llm, embedder) -> dict | None:
    rng = random.Random(f"{seed}-{kind}-{size}")
    planted = facts_with_answers(rng)
    text = haystack(kind, size, [(f, q) for f, q, _ in planted])
    if text is None:
        return None
    text, convs = conversations(kind, text, planted, rng)
    count = lambda s: len(llm.tokenize(s.encode("utf-8"), add_bos=False, special=True))  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp)) as store:
        doc = store.add_document(f"{kind}-{size}", kind, text, type=kind)
        retriever = Retriever(store, embedder)
        retriever.index.add(doc.id, text, "code" if kind == "code" else "markdown", count)
        rows: dict[str, dict] = {}
        for c in convs:
            row = rows.setdefault(c["kind"], {"n": 0, "found": 0, "first": 0, "alone": 0,
                                              "returned": 0})
            hits = retriever.retrieve(doc.id, c["ask"], recent=c["turns"], k=DEFAULT_K,
                                      focus=True)
            alone = retriever.retrieve(doc.id, c["ask"], k=DEFAULT_K, focus=True)
            row["n"] += 1
            row["found"] += any(c["target"] in h.text for h in hits)
            row["first"] += bool(hits) and c["target"] in hits[0].text
            row["alone"] += any(c["target"] in h.text for h in alone)
            row["returned"] += len(hits)
    for row in rows.values():
        row["returned"] = round(row["returned"] / row["n"], 2)
    return {"kind": kind, "size": size, "seed": seed, "chars": len(text),
            "conversations": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="docs,code,markdown")
    ap.add_argument("--sizes", default="300000,1000000")
    ap.add_argument("--seeds", default="0,1")
    args = ap.parse_args(argv)
    llm = llama_cpp.Llama(str(default_model_path()), vocab_only=True, verbose=False)
    embedder = WordLlamaEmbedder()
    results = []
    for kind in args.kinds.split(","):
        source(kind)  # (an unknown kind: said before any work)
        for size in map(int, args.sizes.split(",")):
            for seed in map(int, args.seeds.split(",")):
                if (r := run(kind, size, seed, llm, embedder)) is not None:
                    results.append(r)
    totals: dict[str, dict] = {}
    for r in results:
        for name, row in r["conversations"].items():
            t = totals.setdefault(name, {"n": 0, "found": 0, "first": 0, "alone": 0})
            for key in t:
                t[key] += row[key]
    print(json.dumps({"load": os.getloadavg()[0], "results": results, "totals": totals},
                     indent=1))


if __name__ == "__main__":
    main()
