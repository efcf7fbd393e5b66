"""A Word document's (.docx) text, through python-docx: its body in order, its headings marked.

Read: the body's paragraphs in order (content controls' too), each its own paragraph, empty
ones skipped; its headings — paragraphs whose style is Title or Heading 1-9, or is based on
one, or gives an outline level — as `Book.headings` (Heading 7-9 as level 6), so that
passages cite the section they sit in; list items a line each, numbered as Word numbers them
("1.2", "(a)", "-" for a bullet; a numbered heading keeps its number, "3. Payment"); tables
a row a line — read as records (`passages.records`: "Columns: ...", then each value after its
column's name) when their first row names the columns, else their cells separated by " | ";
tracked changes as they would be accepted (insertions kept, deletions left out).
Left out, and never read: headers and footers (the same lines on every page), footnotes,
endnotes and comments, text boxes and drawings, field codes (a field's shown result is kept).

This module only reads a document's bytes: it never tokenizes, never touches the model or the
store, and never writes the document.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator

from ..errors import DocumentError
from ..passages import records
from .office import Book


def read(data: bytes, name: str) -> Book:
    """The text of the Word document `data` (named `name` in what is said), or DocumentError."""
    import docx
    from docx.opc.constants import RELATIONSHIP_TYPE as RT
    from docx.oxml.ns import qn

    def related(kind: str):
        # (not python-docx's `styles` or `numbering_part`: for a document without one, the
        # first makes a default from its templates, the second raises NotImplementedError)
        try:
            return document.part.part_related_by(kind).element
        except KeyError:
            return None

    try:
        document = docx.Document(io.BytesIO(data))
        title = (document.core_properties.title or "").strip() or None
        body = document.element.body
        if body is None:
            raise _Damaged("its document.xml has no body")
        reader = _Reader(qn, related(RT.STYLES), related(RT.NUMBERING))
        blocks = list(reader.blocks(body))
    except ValueError as e:  # python-docx's "not a Word file": a macro document, a template
        raise DocumentError(f"{name}: not a Word document kvdesk can read ({e}); save it as "
                            ".docx (File > Save As) and attach that") from e
    # python-docx raises whatever its parsing meets in a damaged package (a KeyError for a
    # missing part, lxml's syntax errors, an AttributeError for a [Content_Types].xml without
    # its entries, a TypeError deeper in): each is the document's damage to report, not
    # kvdesk's failure, as in `ebooks.read`.
    except Exception as e:
        why = str(e) if isinstance(e, _Damaged) else f"{type(e).__name__}: {e}"
        raise DocumentError(f"{name}: the Word document cannot be read: it is damaged "
                            f"({why})") from e
    parts, headings, offset, listed = [], [], 0, False
    for text, level, item in blocks:
        # A list's items stay together, a line each; every other block is a paragraph.
        gap = "\n" if listed and item else "\n\n"
        if parts:
            offset += len(gap)
            parts.append(gap)
        if level is not None:
            headings.append((offset, offset + len(text), level, " ".join(text.split())))
        parts.append(text)
        offset += len(text)
        listed = item
    return Book("".join(parts), title, tuple(headings))


class _Damaged(Exception):
    """Damage this module finds itself, said as it is."""


class _Reader:
    """The blocks of a document's body: (text, heading level or None, whether a list item)."""

    def __init__(self, qn, styles, numbering):
        self.q = qn
        w = qn
        self._t, self._tab, self._ptab = w("w:t"), w("w:tab"), w("w:ptab")
        self._breaks = {w("w:br"), w("w:cr")}
        self._hyphen = w("w:noBreakHyphen")
        # Deleted and moved-away text, text boxes (a drawing's, read twice in Word's own
        # fallback copy) and properties hold no text of the paragraph as it reads.
        self._skip = {w("w:del"), w("w:moveFrom"), w("w:txbxContent"), w("w:pPr"), w("w:rPr"),
                      w("w:sdtPr"), "{http://schemas.openxmlformats.org/markup-compatibility/"
                      "2006}Fallback"}
        self.styles = {s.get(w("w:styleId")): s for s in styles.iter(w("w:style"))} \
            if styles is not None else {}
        # The style of a paragraph that names none: the one marked the default.
        self.default = next((sid for sid, s in self.styles.items()
                             if s.get(w("w:type")) == "paragraph"
                             and s.get(w("w:default")) in ("1", "true")), None)
        numbering = numbering if numbering is not None else ()
        abstract = {a.get(w("w:abstractNumId")): a for a in numbering
                    if a.tag == w("w:abstractNum")}
        self.lists: dict[str, dict[int, tuple[int, str, str]]] = {}  # numId: ilvl: definition
        for num in (n for n in numbering if n.tag == w("w:num")):
            ref = num.find(w("w:abstractNumId"))
            levels = abstract.get(ref.get(w("w:val"))) if ref is not None else None
            if levels is not None:
                self.lists[num.get(w("w:numId"))] = {
                    _int(lvl.get(w("w:ilvl"))): (_int(self._val(lvl, "w:start"), 1),
                                                  self._val(lvl, "w:numFmt") or "decimal",
                                                  self._val(lvl, "w:lvlText") or "")
                    for lvl in levels.iter(w("w:lvl"))}
        self.counts: dict[str, list[int | None]] = {}

    def _val(self, el, tag: str) -> str | None:
        child = el.find(self.q(tag)) if el is not None else None
        return child.get(self.q("w:val")) if child is not None else None

    def blocks(self, body) -> Iterator[tuple[str, int | None, bool]]:
        q = self.q
        for el in body:
            if el.tag in (q("w:sdt"), q("w:sdtContent"), q("w:customXml"), q("w:ins")):
                yield from self.blocks(el)
            elif el.tag == q("w:p"):
                lines = [line.rstrip() for line in re.split(r"[\r\n]", self._text(el))]
                text = "\n".join(line for line in lines if line.strip())
                if not text:
                    continue
                level, label = self._heading(el), self._label(el)
                if label:
                    text = f"{label} {text}"
                yield text, level, bool(label) and level is None
            elif el.tag == q("w:tbl") and (table := self._table(el)):
                yield table, None, False

    def _text(self, el) -> str:
        out: list[str] = []
        self._runs(el, out)
        return "".join(out)

    def _runs(self, el, out: list[str]) -> None:
        for child in el:
            tag = child.tag
            if tag == self._t:
                out.append(child.text or "")
            elif tag in (self._tab, self._ptab):
                out.append("\t")
            elif tag in self._breaks:
                out.append("\n")
            elif tag == self._hyphen:
                out.append("-")
            elif tag not in self._skip:
                self._runs(child, out)

    def _chain(self, p) -> Iterator:
        """The paragraph's own properties, then its style's, then those it is based on."""
        ppr = p.find(self.q("w:pPr"))
        yield ppr
        style, seen = self._val(ppr, "w:pStyle") or self.default, set()
        while style in self.styles and style not in seen and len(seen) < 20:
            seen.add(style)
            yield self.styles[style]
            style = self._val(self.styles[style], "w:basedOn")

    def _heading(self, p) -> int | None:
        for el in self._chain(p):
            if el is None:
                continue
            if el.tag == self.q("w:style"):
                name = (self._val(el, "w:name") or "").lower()
                if m := re.fullmatch(r"heading ([1-9])", name):
                    return min(int(m.group(1)), 6)
                if name == "title":
                    return 1
                el = el.find(self.q("w:pPr"))
            outline = self._val(el, "w:outlineLvl")
            if outline is not None and 0 <= _int(outline, 9) < 9:
                return min(_int(outline) + 1, 6)
        return None

    def _label(self, p) -> str:
        """A list item's number as Word shows it ("2.", "1.3", "(b)"; "-" for a bullet)."""
        for el in self._chain(p):
            ppr = el if el is None or el.tag != self.q("w:style") else el.find(self.q("w:pPr"))
            numpr = ppr.find(self.q("w:numPr")) if ppr is not None else None
            if numpr is not None:
                num, ilvl = self._val(numpr, "w:numId"), _int(self._val(numpr, "w:ilvl"))
                break
        else:
            return ""
        levels = self.lists.get(num)
        if not levels or ilvl not in levels:  # numId 0: numbering turned off
            return ""
        counts = self.counts.setdefault(num, [None] * 10)
        ilvl = min(ilvl, 9)
        counts[ilvl] = levels[ilvl][0] if counts[ilvl] is None else counts[ilvl] + 1
        counts[ilvl + 1:] = [None] * (9 - ilvl)
        start, fmt, text = levels[ilvl]
        if fmt == "bullet":
            return "  " * ilvl + "-"
        if fmt == "none":
            return text if "%" not in text else ""

        def number(m: re.Match) -> str:
            k = int(m.group(1)) - 1
            first, kind, _ = levels.get(k, (1, "decimal", ""))
            return _numeral(counts[k] if k < len(counts) and counts[k] is not None else first,
                            kind)

        return "  " * ilvl + re.sub(r"%([1-9])", number, text)

    def _table(self, tbl) -> str:
        q = self.q
        rows = []
        for tr in tbl.iter(q("w:tr")):
            if tr.getparent() is not tbl:  # (a nested table's rows are read in its cell)
                continue
            row = []
            for tc in tr.iter(q("w:tc")):
                if tc.getparent() is not tr:
                    continue
                cell = " ".join(" ".join(self._text(p).split()) for p in tc.iter(q("w:p")))
                span = _int(self._val(tc.find(q("w:tcPr")), "w:gridSpan"), 1)
                row.extend([cell.strip()] * max(1, min(span, 64)))
            if any(row):
                rows.append(row)
        if not rows:
            return ""
        # Through the records reader of CSV and TSV files: one rule for what names columns.
        tsv = io.StringIO()
        csv.writer(tsv, delimiter="\t", lineterminator="\n").writerows(rows)
        found = records.read(tsv.getvalue(), ".tsv")
        if found is not None:
            return found.text
        return "\n".join(" | ".join(_merged(row)) for row in rows)


def _merged(row: list[str]) -> list[str]:
    """A row's cells, one spanning several columns once, the empty ones left out."""
    return [c for i, c in enumerate(row) if c and (i == 0 or row[i - 1] != c)]


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _numeral(n: int, fmt: str) -> str:
    if fmt in ("lowerLetter", "upperLetter"):
        letters = ""
        while n > 0:
            n, r = divmod(n - 1, 26)
            letters = chr(ord("a") + r) + letters
        return letters.upper() if fmt == "upperLetter" else letters
    if fmt in ("lowerRoman", "upperRoman") and 0 < n < 4000:
        out = ""
        for value, digits in ((1000, "m"), (900, "cm"), (500, "d"), (400, "cd"), (100, "c"),
                              (90, "xc"), (50, "l"), (40, "xl"), (10, "x"), (9, "ix"),
                              (5, "v"), (4, "iv"), (1, "i")):
            while n >= value:
                out, n = out + digits, n - value
        return out.upper() if fmt == "upperRoman" else out
    return f"{n:02d}" if fmt == "decimalZero" else str(n)
