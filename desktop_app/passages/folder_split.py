"""A folder's text (`formats.folders`: each file under a "File: path" line) cut into passages
file by file, each file's span by its own kind: a Python or C file by its definitions as when
attached alone, a Markdown file by its headings, plain text as text, a web page or a PDF by
the headings its reader gave.

A file's kind is judged by its name (`text_kind`), the way attach judges a file read as its
text, so a folder split again from its stored text alone splits as at its attach.

This module only reads text: it never touches the model, the store or any KV, and a passage
never spans two files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .split import CountFn, Passage, split

CODE_SUFFIXES = {
    ".py", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".java", ".kt", ".js", ".ts",
    ".tsx", ".jsx", ".rb", ".php", ".cs", ".swift", ".sh", ".sql", ".toml", ".yaml", ".yml",
    ".json", ".xml", ".css", ".scala", ".lua", ".pl", ".r", ".m", ".hs", ".ml", ".ini", ".cfg",
}
MARKDOWN_SUFFIXES = {".md", ".markdown"}


def text_kind(name: str) -> str:
    """The kind of a file read as its text, by its name: markdown, code or text
    (reStructuredText is text: its levels are its underlines', no # headings)."""
    suffix = "." + name.rsplit(".", 1)[-1].lower() if "." in name.rsplit("/", 1)[-1] else ""
    return "markdown" if suffix in MARKDOWN_SUFFIXES else (
        "code" if suffix in CODE_SUFFIXES else "text")


def split_folder(text: str, count_tokens: CountFn, *, line_numbers: Sequence[int] | None,
                 headings: Sequence[tuple[int, int, int, str]],
                 pages: Sequence[tuple[int, int]] = (), target: int,
                 limit: int) -> list[Passage]:
    """A folder's passages (`split` with kind "folder"): under each file's path (its level-1
    heading, the line it starts under), then the headings or definitions within the file;
    lines numbered as `line_numbers` says (within each file), a PDF's passages on its pages
    (`pages`: (page number within its file, offset in `text`))."""
    if line_numbers is None:
        line_numbers = range(1, text.count("\n") + 2)
    files = sorted({(start, end, title) for start, end, level, title in headings if level == 1})
    # (text before the first file: none in a folder's text, split as text all the same)
    spans = ([(0, 0, "")] if not files or files[0][0] > 0 else []) + files
    out: list[Passage] = []
    for i, (start, head_end, title) in enumerate(spans):
        end = spans[i + 1][0] if i + 1 < len(spans) else len(text)
        body = head_end + 1 if title and text[head_end:head_end + 1] == "\n" else head_end
        body_end = body + len(text[body:end].rstrip())
        inner = [(s - body, e - body, level - 1, t) for s, e, level, t in headings
                 if level > 1 and body <= s < body_end]
        kind = text_kind(title)
        if kind == "text" and inner:  # a web page, a PDF, a Word file: its reader's headings
            kind = "html"
        if kind != "html":  # (Markdown's and code's are found in their text, as when stored)
            inner = []
        first = text.count("\n", 0, body)
        numbers = line_numbers[first:first + text.count("\n", body, body_end) + 1]
        on = [(number, at - body) for number, at in pages if body <= at < body_end]
        parts = split(text[body:body_end], kind, count_tokens, line_numbers=numbers,
                      headings=inner or None, pages=on or None, target=target,
                      limit=limit) if body < body_end else []
        parts = [replace(p, start=p.start + body, end=p.end + body,
                         heading=(title, *p.heading) if title else p.heading)
                 for p in parts]
        if title:  # the file's path line opens its first passage
            line = line_numbers[text.count("\n", 0, start)]
            head = text[start:head_end + 1]
            if parts:
                p = parts[0]
                parts[0] = replace(p, start=start, text=text[start:p.end],
                                   lines=(min(line, p.lines[0]), p.lines[1]),
                                   tokens=p.tokens + count_tokens(head))
            else:
                parts = [Passage(0, text[start:head_end], start, head_end, None,
                                 (line, line), (title,), count_tokens(head))]
        out += parts
    return [replace(p, index=i) for i, p in enumerate(out)]
