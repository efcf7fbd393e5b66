"""Which lines of a plain-text document are headings though nothing underlines them, for
`split`'s prose units of kind "text" (never Markdown, code or a PDF's pages).

A man page rendered as text, a contract or a standard titles its sections with a short line
in capitals standing alone ("OPTIONS", "SHELL GRAMMAR", "ARTICLE 1. DEFINITIONS", "1.
SCOPE"): a blank line (or the start) before it, text after it, no sentence's punctuation at
its end ("ARTICLE 4." may end on its number's). Such a line is a heading, at level 1, when
what follows shows it: text indented deeper right under it, the heading at the page's
margin (a man page's sections); a sentence right under it, the heading at the margin; or a
blank line and a paragraph that is no such line itself. A man page's subsection ("   Tilde
Expansion") is one at level 2: a short capitalised line standing alone (or right under its
section's heading), indented deeper than the section's heading but less than the section's
body text, which follows right under it; so is a numbered title under a heading ("1.2
Payment Terms": its long words capitalised), a sentence or a paragraph after it.

It must never make a heading of what is text: a paragraph's shouting first line (the next
line shouts too), a table's header row (columns apart by runs of spaces), a line of code or
an identifier (=, *, square brackets, underscores ...), a word alone of three letters or
fewer, an admonition ("NOTE", "WARNING": it would take the place of the section it sits
in), a list's term (indented as deep as the body), a last line with nothing after it. A
document with underlined headings (reStructuredText's) keeps only those. It only reads text.
"""

from __future__ import annotations

import re

_CAPS = re.compile(r"^[A-Z0-9][A-Za-z0-9 .,'’&/()\-–—:]*$")
_TITLE = re.compile(r"^[A-Z][A-Za-z0-9 ,'’&/\-–—]*$")
_NUMBER_END = re.compile(r"(?:^|\s)(?:\d+(?:\.\d+)*|[IVXLC]+)\.$")  # "ARTICLE 4.", "1."
_NUMBERED = re.compile(r"^\d+(?:\.\d+)+\.?[ \t]+([A-Z][A-Za-z0-9 ,'’&/\-–—]*[A-Za-z0-9])$")
_COLUMNS = re.compile(r"[^.:)\s]\s{2,}\S")  # runs of spaces apart from a numbering's
_UNDERLINE = re.compile(r"^[ \t]*(=+|-+|~+|\^+|\*+)[ \t]*$")
_ADMONITIONS = {"NOTE", "NOTES", "WARNING", "CAUTION", "IMPORTANT", "TIP", "HINT", "TODO",
                "FIXME", "DANGER", "ATTENTION", "EXAMPLE", "REMARK"}
_LONGEST = 60  # characters of a heading line, at most
_WORDS = 8


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _shouts(line: str) -> bool:
    """Whether a line is a heading in capitals by its own shape, whatever is around it."""
    s = line.strip()
    if not (2 <= len(s) <= _LONGEST and len(s.split()) <= _WORDS and _CAPS.match(s)):
        return False
    if _COLUMNS.search(s) or (s[-1] in ".,;:" and not _NUMBER_END.search(s)):
        return False
    upper = sum(c.isupper() for c in s)
    lower = sum(c.islower() for c in s)
    words = [w for w in re.split(r"[^A-Za-z]+", s) if w]
    if upper < 2 or lower * 10 > upper or not any(len(w) >= 2 and w.isupper() for w in words):
        return False
    return not (len(words) == 1 and (len(words[0]) <= 3 or words[0] in _ADMONITIONS))


def _prose(line: str) -> bool:
    """Whether a line reads as text in lower case (more lower-case letters than capitals;
    a sentence's first line: not a code's "where id = 1")."""
    lower, upper = sum(c.islower() for c in line), sum(c.isupper() for c in line)
    return not line.lstrip()[:1].islower() and lower > upper


def plain_headings(text: str) -> list[tuple[int, int, int, str]]:
    """(start, end offset, level, title) of `text`'s headings in capitals, and of a man
    page's subsections under them; none where underlines make headings."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in re.finditer("\n", text):
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(text)))
    lines = [text[a:b] for a, b in spans]
    for i in range(1, len(lines)):
        mark, title = lines[i].strip(), lines[i - 1].strip()
        if _UNDERLINE.match(mark) and len(mark) >= max(3, len(title) // 2) and title and \
                not _UNDERLINE.match(title) and (i == 1 or not lines[i - 2].strip()):
            return []
    filled = [line for line in lines if line.strip()]
    if not filled:
        return []
    margin = min(_indent(line) for line in filled)
    body = 0  # the indent of the page's body text, as the last section's first line had it
    out: list[tuple[int, int, int, str]] = []
    section: int | None = None  # the indent of the man-page section heading we are under
    last = -2  # the line of the last heading
    for i, line in enumerate(lines):
        alone = i == 0 or not lines[i - 1].strip()
        if not line.strip() or not (alone or last == i - 1):
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        indent = _indent(line)
        if alone and _shouts(line):
            level1 = False
            if nxt.strip():
                if _indent(nxt) > indent == margin:  # a man page's section
                    level1, section = True, indent
                    if not _subsection(lines, i + 1, indent, body):
                        body = _indent(nxt)
                elif _indent(nxt) == indent == margin and _prose(nxt):
                    level1, section = True, None
            elif i + 2 < len(lines) and lines[i + 2].strip():
                after = lines[i + 2]
                if not _UNDERLINE.match(after) and not (
                        _shouts(after) and (i + 3 >= len(lines) or not lines[i + 3].strip())):
                    level1, section = True, None
            if level1:
                out.append((*spans[i], 1, line.strip()))
                last = i
                continue
        if (section is not None and _subsection(lines, i, section, body)) or (
                alone and out and _numbered(lines, i)):
            out.append((*spans[i], 2, line.strip()))
            last = i
    return out


def _numbered(lines: list[str], i: int) -> bool:
    """Whether line `i` is a numbered subsection's title under a section in capitals
    ("1.2 Payment Terms"): its words of four letters or more capitalised (not a clause's
    first line, "1.2 Customer shall pay ..."), a sentence or a paragraph after it."""
    s = lines[i].strip()
    m = _NUMBERED.match(s)
    if not m or len(s) > _LONGEST or len(s.split()) > _WORDS or _COLUMNS.search(s):
        return False
    if any(len(w) >= 4 and not w[0].isupper() for w in re.findall(r"[A-Za-z]+", m.group(1))):
        return False
    nxt = lines[i + 1] if i + 1 < len(lines) else ""
    if not nxt.strip():
        nxt = lines[i + 2] if i + 2 < len(lines) else ""
    return _prose(nxt) and not _NUMBERED.match(nxt.strip())


def _subsection(lines: list[str], i: int, section: int, body: int) -> bool:
    """Whether line `i` is a man page's subsection title: capitalised, short, indented
    between its section's heading (`section`) and the `body` text that follows right under
    it."""
    s, indent = lines[i].strip(), _indent(lines[i])
    nxt = lines[i + 1] if i + 1 < len(lines) else ""
    return (section < indent < body and bool(nxt.strip()) and _indent(nxt) >= body
            and bool(_TITLE.match(s)) and len(s) <= _LONGEST and len(s.split()) <= _WORDS
            and not _COLUMNS.search(s) and not s.isupper())
