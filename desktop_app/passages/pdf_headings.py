"""A PDF's outline (its bookmarks) as headings of its text, for `split`'s prose units of kind
"pdf": the PDF's own word on its sections.

Each entry's title is looked for on the page it points to, whitespace and case aside, at or
after where the previous heading found there ends (a chapter and its first section on one
page; a title repeated); the heading takes the whole line it is on, numbering included
("1. Introduction" for "Introduction"). A title the page's text does not hold (drawn as a
picture, or worded otherwise) opens that page; one pointing at a page without text opens
the next page with text. Nested entries are the levels, clamped to 1-6.

It must never guess headings from a page's lines (`plain_headings` reads plain text's lines
in capitals; a PDF's extracted lines hold running headers, table rows and figure labels), nor
fail over an entry: one without a page of the document is skipped, at most `MAX_HEADINGS`
are placed. Reading the outline from the file is `chat.documents`'; this only reads text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

# Far beyond a real book's table of contents (a few hundred); an outline of 100,000
# generated entries (pypdf's own limit) would otherwise be placed one by one.
MAX_HEADINGS = 2000
_LONGEST_TITLE = 200  # characters looked for; a longer "title" is a paragraph pasted in

Heading = tuple[int, int, int, str]  # (start, end offset in the text, level 1-6, title)


def outline_headings(entries: Iterable[tuple[int, str, int | None]], text: str,
                     pages: Sequence[tuple[int, int]]) -> tuple[Heading, ...]:
    """(level, title, page number from 1 or None) outline entries, in the outline's order, as
    headings of `text`, each starting a line, in the text's order; `pages`: (page number,
    offset its text starts at) of the pages with text, as `split` takes them."""
    numbers = [number for number, _ in pages]
    out: list[tuple[int, int, Heading]] = []
    last = -1  # where the previous heading found ends
    for order, (level, title, number) in enumerate(entries):
        if len(out) >= MAX_HEADINGS:
            break
        title = " ".join(title.split())
        if not title or number is None:
            continue  # an external link, a destination missing or outside the document
        i = next((i for i, n in enumerate(numbers) if n >= number), None)
        if i is None:
            continue
        level = min(max(level, 1), 6)
        start = pages[i][1]
        end = pages[i + 1][1] - 2 if i + 1 < len(pages) else len(text)
        # (an outline out of the text's order looks on the whole page)
        found = _find(title[:_LONGEST_TITLE], text,
                      last if start <= last < end else start, end)
        if found is None:
            out.append((start, order, (start, start, level, title)))
            last = max(last, start)
            continue
        line_start = text.rfind("\n", 0, found[0]) + 1
        line_end = text.find("\n", found[1], end)
        out.append((line_start, order,
                    (line_start, end if line_end < 0 else line_end, level, title)))
        last = found[1]
    return tuple(heading for *_, heading in sorted(out))


def _find(title: str, text: str, start: int, end: int) -> tuple[int, int] | None:
    """Where `title` first is in text[start:end], whitespace and case aside."""
    chars = [re.escape(c) for c in title if not c.isspace()]
    if not chars or start >= end:
        return None
    m = re.compile(r"\s*".join(chars), re.IGNORECASE).search(text, start, end)
    return (m.start(), m.end()) if m else None
