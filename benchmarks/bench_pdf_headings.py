"""A PDF's outline as its passages' headings: how many passages get one, what retrieval does
with them, and what reading the outline costs.

The PDF is made here (nothing is downloaded): Python's documentation topics (pydoc_data) as a
report of three parts, each topic a numbered section ("1.2 The if statement") and each of its
underlined subsections a numbered subsection, wrapped as lines on ~30 pages of a PDF whose
outline has the three levels; into it, facts about invented names are planted at depths
0-100 % (`bench_retrieval`'s). The document is split and indexed as attach does it (the
default model's tokenizer, wordllama vectors), once with the outline's headings and once
without (a PDF's passages before), and asked: each fact's paraphrasing question (found when a
passage holding the fact is among the first k), and each section's own title as a question
(found when a passage of that section is). Then the same report at ~300 pages: `extract`'s
time with and without the outline read. Prints one JSON object.

    .venv/bin/python -m benchmarks.bench_pdf_headings [--pages 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import llama_cpp

from benchmarks.bench_retrieval import DEPTHS, facts
from desktop_app.chat import documents
from desktop_app.model.models import default_model_path
from desktop_app.passages.embed import WordLlamaEmbedder
from desktop_app.passages.retrieve import Retriever
from store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pdf_helpers import make_pdf  # noqa: E402

KS = (1, 3, 8)
LINES_PER_PAGE = 48
PARTS = ("Statements", "Expressions and types", "The data model")
TOPICS_PER_PART = 4


def _ascii(s: str) -> str:
    return s.encode("ascii", "replace").decode().replace("\t", "    ")


def report(n_pages: int, planted: list[str]) -> tuple[list[list[str]], list, list[tuple]]:
    """(pages of lines, outline entries, sections as (level, title, page)) of a report of
    about `n_pages` pages, the `planted` facts at their depths."""
    import pydoc_data.topics

    budget = n_pages * LINES_PER_PAGE
    per_topic = budget // (len(PARTS) * TOPICS_PER_PART)
    # Topics with a subsection within the lines each gets: the report's three levels.
    topics = [_topic_lines(pydoc_data.topics.topics[k]) for k in sorted(pydoc_data.topics.topics)]
    topics = [t[:per_topic] for t in topics
              if any(h and h[0] == 3 for _, h in t[:per_topic])][:len(PARTS) * TOPICS_PER_PART]
    lines: list[tuple[str, tuple | None]] = []  # (line, (level, title) when it heads)
    for t, topic in enumerate(topics):
        part, sec = divmod(t, TOPICS_PER_PART)
        if sec == 0:
            lines.append((f"{part + 1} {PARTS[part]}", (1, PARTS[part])))
        sub = 0
        for line, head in topic:
            if head and head[0] == 2:
                line = f"{part + 1}.{sec + 1} {line}"
            elif head:
                sub += 1
                line = f"{part + 1}.{sec + 1}.{sub} {line}"
            lines.append((line, head))
    lines = lines[:budget]
    for fact, depth in sorted(zip(planted, DEPTHS, strict=True), key=lambda x: -x[1]):
        at = round(depth * (len(lines) - 1))
        while lines[at][1] is not None:  # not between a heading and its text
            at += 1
        lines[at + 1:at + 1] = [(w, None) for w in textwrap.wrap(fact, 90)]
    pages = [[s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
              for s, _ in lines[p:p + LINES_PER_PAGE]]
             for p in range(0, len(lines), LINES_PER_PAGE)]
    sections = [(h[0], h[1], n // LINES_PER_PAGE) for n, (_, h) in enumerate(lines) if h]
    outline = [(level, title, page) for level, title, page in sections]
    return pages, outline, sections


def _topic_lines(topic: str) -> list[tuple[str, tuple | None]]:
    """A pydoc topic's lines wrapped, its underlined titles as (level, title): the topic's
    own (underlined with *) at 2, its subsections at 3."""
    raw = _ascii(topic).split("\n")
    out: list[tuple[str, tuple | None]] = []
    i = 0
    while i < len(raw):
        line = raw[i]
        under = raw[i + 1].strip() if i + 1 < len(raw) else ""
        if line.strip() and under and set(under) <= set("*=-~^") and len(under) >= 3:
            title = line.strip()
            out.append((title, (2 if under[0] == "*" else 3, title)))
            i += 2
            continue
        out += [(w, None) for w in textwrap.wrap(line, 90)] if line.strip() else []
        i += 1
    return out


def measure(pdf: Path, planted: list[tuple[str, str]], count, embedder) -> dict:
    doc = documents.extract(pdf)
    out = {"pages": len(doc.pages), "chars": len(doc.text), "outline_headings":
           len(doc.headings or ())}
    sections = _section_spans(doc)
    for name, headings in (("before", None), ("after", doc.headings)):
        with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp)) as store:
            stored = store.add_document(name, "report.pdf", doc.text, type="pdf")
            retriever = Retriever(store, embedder)
            retriever.index.add(stored.id, doc.text, "pdf", count, pages=doc.pages,
                                headings=headings)
            passages = store.passages(stored.id)
            res = {"passages": len(passages),
                   "with_heading": sum(bool(p.heading) for p in passages)}
            for mode in ("bm25", "dense", "fused"):
                facts_found = dict.fromkeys(KS, 0)
                for fact, question in planted:
                    hits = retriever.retrieve(stored.id, question, k=max(KS), mode=mode,
                                              focus=False)
                    rank = next((i for i, h in enumerate(hits) if _bare(fact) in
                                 _bare(h.text)), None)
                    for k in KS:
                        facts_found[k] += rank is not None and rank < k
                titles_found = dict.fromkeys(KS, 0)
                for title, start, end in sections:
                    hits = retriever.retrieve(stored.id, title, k=max(KS), mode=mode,
                                              focus=False)
                    rank = next((i for i, h in enumerate(hits)
                                 if start <= _start(passages, h) < end), None)
                    for k in KS:
                        titles_found[k] += rank is not None and rank < k
                res[mode] = {
                    "facts": {f"@{k}": round(v / len(planted), 3)
                              for k, v in facts_found.items()},
                    "section_titles": {f"@{k}": round(v / len(sections), 3)
                                       for k, v in titles_found.items()}}
            out[name] = res
    out["questions"] = {"facts": len(planted), "section_titles": len(sections)}
    return out


def _bare(text: str) -> str:
    """Letters and digits only: the PDF's text wraps lines and renders an apostrophe its own
    way."""
    return re.sub(r"\W+", "", text)


def _start(passages, hit) -> int:
    return next(p.start for p in passages if p.index == hit.index)


def _section_spans(doc) -> list[tuple[str, int, int]]:
    """(title, start, end) of each level-2 and level-3 section: to the next heading."""
    heads = list(doc.headings or ())
    out = []
    for n, (start, _, level, title) in enumerate(heads):
        end = heads[n + 1][0] if n + 1 < len(heads) else len(doc.text)
        if level > 1 and not re.fullmatch(r"[\W\d_]+", title):
            out.append((title, start, end))
    return out


def timing(pdf: Path, repeat: int = 5) -> dict:
    """`extract`'s seconds (best of `repeat`, alternating) with the outline read and without,
    and the outline's own: reading its entries and placing them on the text."""
    from pypdf import PdfReader

    from desktop_app.passages.pdf_headings import outline_headings

    outline = documents._outline
    times: dict[str, list[float]] = {"with": [], "without": []}
    try:
        for _ in range(repeat):
            for how in ("with", "without"):
                documents._outline = outline if how == "with" else lambda reader: iter(())
                t = time.perf_counter()
                doc = documents.extract(pdf)
                times[how].append(time.perf_counter() - t)
    finally:
        documents._outline = outline
    own = []
    for _ in range(repeat):
        reader = PdfReader(pdf)
        t = time.perf_counter()
        outline_headings(outline(reader), doc.text, doc.pages)
        own.append(time.perf_counter() - t)
    return {"extract_s_with_outline": round(min(times["with"]), 3),
            "extract_s_without_outline": round(min(times["without"]), 3),
            "outline_s": round(min(own), 4)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=30)
    ap.add_argument("--big-pages", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    llm = llama_cpp.Llama(str(default_model_path()), vocab_only=True, verbose=False)
    count = lambda s: len(llm.tokenize(s.encode("utf-8"), add_bos=False, special=True))  # noqa: E731
    planted = facts(random.Random(f"{args.seed}-pdf"))
    with tempfile.TemporaryDirectory() as tmp:
        pages, outline, _ = report(args.pages, [f for f, _ in planted])
        pdf = make_pdf(Path(tmp, "report.pdf"), pages, outline)
        result = measure(pdf, planted, count, WordLlamaEmbedder())
        result["outline_entries"] = len(outline)
        result["levels"] = sorted({level for level, _, _ in outline})
        # ~300 pages: the topics repeated until the pages are reached
        big_pages, big_outline = [], []
        while len(big_pages) < args.big_pages:
            more, more_outline, _ = report(args.pages, [f for f, _ in planted])
            big_outline += [(lv, t, p + len(big_pages)) for lv, t, p in more_outline]
            big_pages += more
        big = make_pdf(Path(tmp, "big.pdf"), big_pages, big_outline)
        result["big"] = {"pages": len(big_pages), "outline_entries": len(big_outline),
                         **timing(big)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
