"""A long document cut into passages of a few hundred tokens, on the document's own boundaries.

The text is first read as units: paragraphs (and fenced code blocks) of prose and Markdown,
with the heading path they sit under; top-level definitions of code (a class's methods too),
with the definition they belong to as heading; every page of a PDF starts a unit of its own
(under the headings its outline gives). Units are then packed, in order, into passages of about
`target` tokens: a unit that starts a section, a definition or a page starts a new passage (a
page always; a section once the passage holds a quarter of the target, so a run of tiny
sections is not a run of tiny passages), and a unit longer than `limit` tokens is cut at lines,
then sentences, then words. A passage begun inside a section ends where the next one starts;
one that spans sections (tiny ones in a row) is cited under the heading where it starts (code:
under the definition most of it is). A passage's text is exactly `text[start:end]` of the
document.

Tokens are counted with the caller's `count_tokens` (the model's tokenizer), once per unit;
a passage's count is the sum over its units (within a token or two of tokenizing it whole).
This module only reads text: it never touches the model, the store or any KV.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .code_lines import Strings, declaration, definition
from .plain_headings import plain_headings

# A small model reads the fact it is asked for better in a passage of ~130 tokens than of
# ~250 (the target's 160 against 320: RESULTS.md, "Passage size and distraction"), for about
# twice the passages and a sixth more KV tokens per MB of text (each passage's KV holds its
# own copy of the system prompt).
TARGET_TOKENS = 160
LIMIT_TOKENS = 512

CountFn = Callable[[str], int]


@dataclass(frozen=True)
class Passage:
    """One passage of a document, and where it is in it."""

    index: int  # its order in the document, from 0
    text: str  # = document text[start:end]
    start: int  # character range in the document's text
    end: int
    page: int | None  # a PDF's page it is on (1-based), None for other documents
    lines: tuple[int, int]  # its first and last line in the document's text (1-based)
    heading: tuple[str, ...]  # the headings (or definitions) most of it sits under, outermost
    # first
    tokens: int  # its token count under the tokenizer it was split with


@dataclass(frozen=True)
class _Unit:
    start: int
    end: int
    heading: tuple[str, ...]
    page: int | None
    opens: bool  # a section, definition or page starts here
    new_page: bool = False
    title_only: bool = False  # only a heading's lines (the next heading came before any text)


_ATX = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_UNDERLINE = re.compile(r"^(=+|-+|~+|\^+|\*+)[ \t]*$")
# Words set apart by a run of spaces (or a tab), as a table's columns are; three columns.
_GAP = r"\S(?: {2,}|\t)\S"
_COLUMNS = re.compile(f"{_GAP}.*?{_GAP}")
_FENCE = re.compile(r"^[ \t]*(```|~~~)")


def split(text: str, kind: str, count_tokens: CountFn, *,
          pages: Sequence[tuple[int, int]] | None = None,
          line_numbers: Sequence[int] | None = None,
          headings: Sequence[tuple[int, int, int, str]] | None = None,
          target: int = TARGET_TOKENS, limit: int = LIMIT_TOKENS) -> list[Passage]:
    """`text` as passages. `kind` is the document's (text, markdown, html, code, pdf, docx and
    epub — prose whose only headings are `headings`, as html's —, and table and json, read as
    records a line each: `records`; folder, its level-1 headings its files, each split by its
    own kind: `folder_split`);
    `pages`: (page number, character offset its text starts at) of a PDF's pages, in order;
    `line_numbers`: the file's number of each of `text`'s lines, where they differ (a file
    whose blank runs the text collapsed, a web page's text, a folder's files, each numbered
    within its own, its text files' blank runs kept), so that a passage's lines are the
    file's; `headings`: a web page's own or a PDF's outline's (start, end offset, level,
    title), each starting a line (several may start the same one), its only headings (a line
    of its text reading "# ..." is not one)."""
    if not 0 < target <= limit:
        raise ValueError(f"a passage's target ({target}) must be positive and at most its "
                         f"limit ({limit})")
    # Plain text keeps underlined headings but not "# " ones: there a "#" line is as often a
    # comment of a script or a configuration quoted in it as a title; without underlines, its
    # lines in capitals standing alone ("OPTIONS", "ARTICLE 1. DEFINITIONS": `plain_headings`).
    if kind == "text" and not headings:
        headings = plain_headings(text)
    if kind == "folder":  # each file by its own kind (imported here: it splits through us)
        from .folder_split import split_folder
        return split_folder(text, count_tokens, line_numbers=line_numbers,
                            headings=headings or (), pages=pages or (), target=target,
                            limit=limit)
    units = (_code_units(text) if kind == "code" else _prose_units(
        text, markdown=kind in ("markdown", "text"), hashes=kind != "text",
        setext=kind == "markdown", marked=headings or ()))
    if pages:
        units = _on_pages(units, pages)
    lines = _Lines(text, line_numbers)
    return _pack(text, units, count_tokens, target, limit, lines, most=kind == "code")


def file_lines(text: str, line_numbers: Sequence[int],
               spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The file's (first, last) line of each [start, end) span of `text` (`split`'s
    `line_numbers`): the lines of passages split before they were numbered so."""
    lines = _Lines(text, line_numbers)
    return [(lines.of(start), lines.of(end - 1)) for start, end in spans]


class _Lines:
    """Line numbers of character offsets (through `numbers`, the file's, when given)."""

    def __init__(self, text: str, numbers: Sequence[int] | None = None):
        self._breaks = [m.start() for m in re.finditer("\n", text)]
        if numbers is not None and len(numbers) != len(self._breaks) + 1:
            raise ValueError(f"{len(numbers)} line numbers for {len(self._breaks) + 1} lines")
        self._numbers = numbers

    def of(self, offset: int) -> int:
        line = bisect.bisect_left(self._breaks, offset) + 1
        return line if self._numbers is None else self._numbers[line - 1]


def _line_spans(text: str):
    """(start, end) of each line, without its newline."""
    start = 0
    for m in re.finditer("\n", text):
        yield start, m.start()
        start = m.end()
    yield start, len(text)


def _prose_units(text: str, *, markdown: bool, hashes: bool = True, setext: bool = False,
                 marked: Sequence[tuple[int, int, int, str]] = ()) -> list[_Unit]:
    """Paragraphs, fenced blocks whole, each under its heading path (Markdown's # headings,
    unless not `hashes`, and underlined headings, reStructuredText's too; `marked`, `split`'s
    `headings`, where not `markdown`)."""
    # (a PDF's outline may put a chapter and its first section on one line)
    marks: dict[int, list[tuple[int, int, str]]] = {}
    for start, end, level, title in marked:
        marks.setdefault(start, []).append((end, level, title))
    heading_end = -1  # where the marked heading being read ends
    units: list[_Unit] = []
    heading: list[tuple[int, str]] = []  # (level, title)
    # Underline characters by level, in the order first seen (reStructuredText's rule: Python's
    # documentation underlines its top level with *, its sections with =); in Markdown
    # (`setext`) = and - are always the first two, as its # and ## are.
    underline_levels: list[str] = ["=", "-"] if setext else []
    para: list[tuple[int, int]] = []
    fence: str | None = None
    opens = True
    titled = False  # the paragraph so far is a heading
    heads: set[int] = set()  # where each heading's lines start

    def flush() -> None:
        nonlocal para, opens
        if para:
            units.append(_Unit(para[0][0], para[-1][1], tuple(t for _, t in heading), None,
                               opens, title_only=all(s in heads for s, _ in para)))
            opens = False
        para = []

    def under_title(line: str = "") -> tuple[int, int] | None:
        """The line an underline would make a title: one alone, or right under headings
        ("Guide / ===== / Part 0 / ------"), or under its overline (`overline`); never a line
        of marks itself (an underline, or the overline of the title below it)."""
        title = para[-1] if para and (all(s in heads for s, _ in para[:-1]) or
                                      overline(line)) else None
        return None if not title or _UNDERLINE.match(text[title[0]:title[1]].strip()) \
            else title

    def overline(line: str) -> tuple[int, int] | None:
        """The line of the same marks over the title this `line` underlines, if any
        (reStructuredText's document title: "=====", "Title", "=====")."""
        if setext or len(para) < 2 or not all(s in heads for s, _ in para[:-2]):
            return None
        over = text[para[-2][0]:para[-2][1]].strip()
        return para[-2] if (line.strip()[:1] == over[:1] and _UNDERLINE.match(over)
                            and para[-2][0] not in heads) else None

    def enter(level: int, title: str) -> None:
        nonlocal opens
        while heading and heading[-1][0] >= level:
            heading.pop()
        heading.append((level, title))
        opens = True

    for start, end in _line_spans(text):
        line = text[start:end]
        if fence is not None:
            para.append((start, end))
            if line.strip().startswith(fence):
                fence = None
            continue
        if markdown and _FENCE.match(line) and not _underlines(line, under_title(), text):
            fence = _FENCE.match(line).group(1)
            para.append((start, end))
            continue
        if not line.strip():
            if not titled:  # a heading on its own stays with the paragraph under it
                flush()
            continue
        if start in marks:
            flush()
            heading_end = max(end for end, _, _ in marks[start])
            for _, level, title in marks[start]:
                enter(level, title)
            para, titled = [(start, end)], True
            heads.add(start)
            continue
        if start < heading_end:  # the marked heading's later lines
            para.append((start, end))
            heads.add(start)
            continue
        titled = False
        atx = _ATX.match(line) if markdown and hashes else None
        under = _UNDERLINE.match(line) if markdown else None
        if atx:
            flush()
            enter(len(atx.group(1)), atx.group(2).strip())
            para, titled = [(start, end)], True
            heads.add(start)
        elif under and under_title(line) is not None and len(line.strip()) >= 3 and \
                len(text[para[-1][0]:para[-1][1]].strip()) <= 120 and \
                not (not setext and _ruled_table(text, para[-1], end)):
            over = overline(line)
            mark = line.strip()[0] * (2 if over else 1)  # (overlined: a style of its own)
            if mark not in underline_levels:
                underline_levels.append(mark)
            title_span = para.pop()
            spans = [para.pop(), title_span] if over else [title_span]
            flush()
            enter(underline_levels.index(mark) + 1, text[title_span[0]:title_span[1]].strip())
            para, titled = [*spans, (start, end)], True
            heads.update((*(s for s, _ in spans), start))
        else:
            para.append((start, end))
    flush()
    return units


def _ruled_table(text: str, title: tuple[int, int], rule_end: int) -> bool:
    """Whether the `title` line over a rule is a plain-text table's header, not a heading:
    three columns or more over the rule ("Language  Sources      Development"), and the row
    right under it in columns too (a title written with double spaces has prose or a blank
    line under it)."""
    row = text[rule_end + 1:].split("\n", 1)[0]
    return bool(_COLUMNS.search(text[title[0]:title[1]]) and re.search(_GAP, row))


def _underlines(line: str, title: tuple[int, int] | None, text: str) -> bool:
    """Whether a line of tildes is reStructuredText's underline of the `title` line before it
    (as long as that title at least), not a Markdown fence opening (which may name its
    language, and is not drawn to a title's length)."""
    mark = line.strip()
    return (title is not None and set(mark) == {"~"}
            and 0 < len(text[title[0]:title[1]].strip()) <= len(mark))


def _code_units(text: str) -> list[_Unit]:
    """Runs of lines between blank lines, a definition (`code_lines.definition`, with the
    comments and decorators just above it) opening a unit of its own, under the definitions
    enclosing it; a statement back at the top level ends them. One-line declarations in a
    row (#defines, signatures) stay one unit under the first; a triple-quoted string's lines
    are text (a docstring's "class Leaf:" is no definition)."""
    units: list[_Unit] = []
    stack: list[tuple[int, str]] = []  # (indent, first line) of the enclosing definitions
    run: list[tuple[int, int]] = []
    heading: tuple[str, ...] = ()  # the run's: the stack when it began
    opens = True
    lead: list[tuple[int, int]] = []  # comment or decorator lines waiting for what follows

    def flush() -> None:
        nonlocal run, lead
        spans = run + lead
        if spans:
            units.append(_Unit(spans[0][0], spans[-1][1], heading, None, opens))
        run, lead = [], []

    strings = Strings()
    table: tuple[int, str] | None = None  # (indent, kind) of the declarations in a row
    for start, end in _line_spans(text):
        line = text[start:end]
        stripped = line.strip()
        quoted = strings.inside(line)  # a string's text: no definition, comment or statement
        if not stripped:
            flush()
            heading, opens = tuple(t for _, t in stack), False
            continue
        indent = len(line) - len(line.lstrip())
        kind = None if quoted else declaration(line)
        if kind and table == (indent, kind) and len(lead) <= 2:
            run += [*lead, (start, end)]  # a table of them, a one-line comment or two in it
            lead = []
        elif not quoted and definition(line):
            pending = lead
            lead = []
            flush()
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, stripped[:80]))
            run, heading, opens = [*pending, (start, end)], tuple(t for _, t in stack), True
            table = (indent, kind) if kind else None
        elif not quoted and stripped.startswith(("@", "#", "//", "/*", "*", "--")):
            lead.append((start, end))
        else:
            if not quoted and indent == 0 and stack and \
                    not stripped.startswith((")", "}", "]", "{")):
                flush()  # back at the top level, outside any definition
                stack.clear()
                heading, opens = (), True
            run += [*lead, (start, end)]
            lead = []
            if table and indent <= table[0]:  # (not a declaration's next lines)
                table = None
    flush()
    return units


def _on_pages(units: list[_Unit], pages: Sequence[tuple[int, int]]) -> list[_Unit]:
    """Each unit given its page; a unit that crosses into the next page is cut there."""
    starts = [offset for _, offset in pages]
    out: list[_Unit] = []
    page_of = None
    for unit in units:
        start = unit.start
        while start < unit.end:
            i = max(0, bisect.bisect_right(starts, start) - 1)
            end = min(unit.end, starts[i + 1]) if i + 1 < len(starts) else unit.end
            number = pages[i][0]
            new_page = number != page_of
            out.append(_Unit(start, end, unit.heading, number,
                             unit.opens or new_page, new_page))
            page_of, start = number, end
    return [u for u in out if u.start < u.end]


def _pack(text: str, units: list[_Unit], count: CountFn, target: int, limit: int,
          lines: _Lines, most: bool = False) -> list[Passage]:
    """Units packed into passages; each cited under the heading where its text starts, or
    with `most` (code) under the definition that most of it is (a small one and the start
    of the next share a passage under the one it is more of)."""
    passages: list[Passage] = []
    group: list[tuple[_Unit, int, int, int]] = []  # (unit, start, end, tokens)
    size = 0

    def flush() -> None:
        nonlocal group, size
        start, end = group[0][1] if group else 0, group[-1][2] if group else 0
        body = text[start:end]
        if body.strip():
            # Blank lines are trimmed, the first line's indentation kept: a method's passage
            # reads as the code it is. A passage that begins inside a line drops its spaces.
            lead = len(body) - len(body.lstrip())
            newline = body.rfind("\n", 0, lead)
            line_start = newline >= 0 or start == 0 or text[start - 1] == "\n"
            start += newline + 1 if line_start else lead
            end -= len(body) - len(body.rstrip())
            under: dict[tuple[str, ...], int] = {}
            for unit, _, _, tokens in group:
                under[unit.heading] = under.get(unit.heading, 0) + tokens
            # A passage is cited under the heading where its text starts, however much of the
            # next section joined it (a run of tiny sections), not a title and chapter heading
            # above that text; a document's untitled first lines under the section most of it is.
            first = next((u for u, _, _, _ in group if not u.title_only), group[0][0])
            heading = max(under, key=under.get) if most or not first.heading else \
                first.heading
            passages.append(Passage(len(passages), text[start:end], start, end,
                                    first.page, (lines.of(start), lines.of(end - 1)),
                                    heading, size))
        group, size = [], 0

    for unit in units:
        for start, end, tokens in _pieces(text, unit.start, unit.end, count, target, limit):
            # A run of tiny sections shares a passage; a passage begun inside a section
            # ends at the next one, however small (a section's last lines once the rest
            # filled a passage: they used to run on into the next section, cited under it).
            if group and (unit.new_page or size + tokens > target or
                          (unit.opens and start == unit.start and (
                              size >= target // 4 or not _opening(group[0])))):
                flush()
            group.append((unit, start, end, tokens))
            size += tokens
    flush()
    return passages


def _opening(piece: tuple[_Unit, int, int, int]) -> bool:
    """Whether a (unit, start, end, tokens) piece begins its section (or definition)."""
    return piece[0].opens and piece[1] == piece[0].start


# Lines, then sentences (a full stop and a space; or a Chinese or Japanese one, which no
# space follows, with any closing quote or bracket after it), then words.
_SEPARATORS = (re.compile("\n"), re.compile(r"\. |[。！？．][」』）)”’]*"), re.compile(" "))


def _pieces(text: str, start: int, end: int, count: CountFn, target: int, limit: int,
            depth: int = 0) -> list[tuple[int, int, int]]:
    """[start, end) as (start, end, tokens) pieces of at most `limit` tokens: whole if it
    fits, else cut at lines, then sentences, then words, then characters."""
    tokens = count(text[start:end])
    if tokens <= limit:
        return [(start, end, tokens)]
    if depth == len(_SEPARATORS):
        step = max(1, (end - start) * target // tokens)
        return [piece for s in range(start, end, step)
                for piece in _pieces(text, s, min(end, s + step), count, target, limit, depth)
                ] if step < end - start else [(start, end, tokens)]
    sep = _SEPARATORS[depth]
    cuts = [start] + [start + m.end() for m in sep.finditer(text[start:end])
                      if start + m.end() < end]
    if len(cuts) == 1:
        return _pieces(text, start, end, count, target, limit, depth + 1)
    out: list[tuple[int, int, int]] = []
    for a, b in zip(cuts, [*cuts[1:], end], strict=True):
        out += _pieces(text, a, b, count, target, limit, depth + 1)
    return _merge(out, target, limit)


def _merge(pieces: list[tuple[int, int, int]], target: int,
           limit: int) -> list[tuple[int, int, int]]:
    """Neighbouring small pieces joined back up to `target` tokens; a piece much smaller
    than that (a heading line) joins the next up to `limit`."""
    out: list[tuple[int, int, int]] = []
    for start, end, tokens in pieces:
        if out and (out[-1][2] + tokens <= target or
                    (out[-1][2] < target // 4 and out[-1][2] + tokens <= limit)):
            s, _, t = out[-1]
            out[-1] = (s, end, t + tokens)
        else:
            out.append((start, end, tokens))
    return out
