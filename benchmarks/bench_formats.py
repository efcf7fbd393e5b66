"""What reading a Word document and an EPUB book costs beside a PDF of the same text.

The same ~1 MB of made-up prose (a title, chapters of sections of paragraphs) is written as a
.docx (python-docx), an .epub (ebooklib, one chapter a spine document, with its contents page)
and a PDF (40 lines of ~100 characters a page), and each is read by `documents.extract` as
attach reads it: best of `--runs`, with the text's length and the headings found. Prints one
JSON object.

    .venv/bin/python -m benchmarks.bench_formats [--paragraphs 2500] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import docx
from ebooklib import epub

from desktop_app.chat import documents

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pdf_helpers import make_pdf  # noqa: E402

WORDS = ("harbour ledger tide vessel cargo clause party supplier invoice schedule region storm "
         "keeper lantern archive crew anchor voyage north south east west morning evening").split()
PER_CHAPTER, PER_SECTION = 50, 10


def paragraphs(n: int) -> list[str]:
    rng = random.Random(7)
    return [f"Paragraph {i}: " + " ".join(rng.choice(WORDS) for _ in range(60)) + "."
            for i in range(n)]


def write_docx(path: Path, paras: list[str]) -> None:
    d = docx.Document()
    d.add_paragraph("Harbour Records", style="Title")
    for i, p in enumerate(paras):
        if i % PER_CHAPTER == 0:
            d.add_heading(f"Chapter {i // PER_CHAPTER + 1}", level=1)
        if i % PER_SECTION == 0:
            d.add_heading(f"Section {i // PER_CHAPTER + 1}.{i % PER_CHAPTER // PER_SECTION + 1}",
                          level=2)
        d.add_paragraph(p)
    d.save(path)


def write_epub(path: Path, paras: list[str]) -> None:
    book = epub.EpubBook()
    book.set_identifier("bench")
    book.set_title("Harbour Records")
    book.set_language("en")
    chapters = []
    for c in range(0, len(paras), PER_CHAPTER):
        n = c // PER_CHAPTER + 1
        body = "".join((f"<h2>Section {n}.{k // PER_SECTION + 1}</h2>" if k % PER_SECTION == 0
                        else "") + f"<p>{p}</p>" for k, p in enumerate(paras[c:c + PER_CHAPTER]))
        chapter = epub.EpubHtml(title=f"Chapter {n}", file_name=f"c{n}.xhtml", lang="en")
        chapter.content = f"<html><body><h1>Chapter {n}</h1>{body}</body></html>"
        book.add_item(chapter)
        chapters.append(chapter)
    book.toc = chapters
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *chapters]
    epub.write_epub(str(path), book)


def write_pdf(path: Path, paras: list[str]) -> None:
    lines = [p[i:i + 100] for p in paras for i in range(0, len(p), 100)]
    make_pdf(path, [lines[i:i + 40] for i in range(0, len(lines), 40)])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paragraphs", type=int, default=2500)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    paras = paragraphs(args.paragraphs)
    out = {"paragraphs": args.paragraphs, "text_bytes": len("\n\n".join(paras).encode()),
           "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, write in (("docx", write_docx), ("epub", write_epub), ("pdf", write_pdf)):
            path = Path(tmp, f"book.{kind}")
            write(path, paras)
            times = []
            for _ in range(args.runs):
                t = time.perf_counter()
                doc = documents.extract(path)
                times.append(time.perf_counter() - t)
            out[kind] = {"file_bytes": path.stat().st_size, "extract_s": round(min(times), 3),
                         "text_chars": len(doc.text), "headings": len(doc.headings or ())}
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
