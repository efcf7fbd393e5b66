"""Turning user files into the plain text the model reads.

Supported: plain text, Markdown and source code (anything that is text, whatever its
extension), tables (CSV, TSV) and JSON read as records (`passages.records`: each value next to
its column or key), HTML (the visible text: no scripts, styles or markup; each line numbered
by the file's line it starts on, its h1-h6 kept as the headings), PDF (through pypdf; its
outline's entries as the headings, `passages.pdf_headings`), Word documents and EPUB
books (the `formats` room: their headings kept too), and folders (`formats.folders`: the
readable files one after another, each under its path, its lines numbered within its file).
Each problem is a `DocumentError` with a message meant for the user — a binary or unknown
file, an empty document, a PDF without a text layer — and text that is not UTF-8 is decoded
in the encoding charset-normalizer detects (or Windows-1252; UTF-8 with a few stray bytes
stays UTF-8, each stray byte read as Windows-1252: `encodings`) and *said so* in
`Extracted.warnings`, never silently; so are a PDF reader's complaints about its text (never
about its outline: a broken bookmark only loses its heading), which never reach the terminal on
their own.

This module only reads files: it never tokenizes, never touches the model or the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import re
import stat
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Cancelled, DocumentError
from ..formats import office, webpages
from ..passages import records
from ..passages.folder_split import text_kind
from ..passages.pdf_headings import outline_headings
from ..results import size_text
from .encodings import decode

MAX_FILE_BYTES = 200_000_000  # far beyond any context; refuses accidental disk images

HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PDF_SUFFIXES = {".pdf"}


@dataclass
class Extracted:
    text: str
    title: str
    kind: str  # text | markdown | code | html | pdf | table (CSV, TSV) | json | docx | epub |
    # folder (its files one after another, each under its path: `formats.folders`)
    source: str
    warnings: list[str] = field(default_factory=list)
    # A PDF's pages that have text: (page number from 1, the offset in `text` it starts at).
    pages: tuple[tuple[int, int], ...] | None = None
    # The file's line number of each line of `text` (a file's blank runs are collapsed in
    # `text`, a folder's text file's kept; a record's or a web page's line is the one it
    # starts on): none for a PDF's.
    lines: tuple[int, ...] | None = None
    # A web page's h1-h6, a PDF's outline: (start, end offset in `text`, level 1-6, title),
    # for `split`.
    headings: tuple[tuple[int, int, int, str], ...] | None = None
    # What the user should know before any prefill (a folder: its files read and left out).
    note: str = ""
    left_out: list[dict[str, str]] = field(default_factory=list)  # a folder's: {"path", "why"}
    # When its file was read (the store's clock; None: now): what a change is measured from.
    read_at: float | None = None

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


# A file's text hash by (path, modification time, size): a changed file is read once.
_HASHES: dict[tuple, str] = {}  # (path, time, size, *avoided) -> hash


MTIME_SLACK = 2.0


def changed_since(source: str | None, content_hash: str, attached: float, *,
                  avoid: Collection[Path] = ()) -> bool:
    """Whether the file a document was attached from now holds another text. Read again only
    when it was modified after the attach; a file gone or no longer readable as a document is
    not "changed" (the attached text stands). `avoid`: as attach's (kvdesk's data folder)."""
    # (MTIME_SLACK before: a FAT drive keeps a file's time to 2 s, rounded down)
    found = file_hash(source, modified_after=attached - MTIME_SLACK, avoid=avoid)
    return found is not None and found != content_hash


def file_hash(source: str | None, *, modified_after: float | None = None,
              avoid: Collection[Path] = ()) -> str | None:
    """The content hash of the text a file holds now (None: gone, no longer readable as a
    document — whatever its reader meets — or not modified after `modified_after`). A
    folder is modified when a file in it is (`folders.stamp`: its newest and its count), and
    read leaving out the folders of `avoid`, as attach does (kvdesk's data folder)."""
    try:
        st = Path(source).stat() if source else None
        if st is not None and stat.S_ISDIR(st.st_mode):
            from ..formats import folders
            modified, size = folders.stamp(Path(source), avoid)
        elif st is not None:
            modified, size = st.st_mtime_ns, st.st_size
    # (a folder that can no longer be listed; ValueError: a path this locale cannot encode,
    # attached under another, is not checked, as a file gone is not)
    except (OSError, ValueError):
        return None
    if st is None or (modified_after is not None and modified / 1e9 <= modified_after):
        return None
    key = (source, modified, size, *sorted(map(str, avoid)))
    if key not in _HASHES:
        try:
            _HASHES[key] = extract(source, avoid=avoid).content_hash
        # (any failure, not only a DocumentError: a file gone bad after its attach must not
        # break the listing or an answer; its attached text stands)
        except Exception:
            return None
    return _HASHES[key]


def extract(path: str | Path, *, progress: Callable[[int, int], None] | None = None,
            cancel: threading.Event | None = None, avoid: Collection[Path] = ()) -> Extracted:
    """Read `path` and return its text, or raise DocumentError saying why not. A folder's
    walk says how far it is to `progress` (files read, of those found; 0 found while walking),
    stops at `cancel` (Cancelled) and leaves out the folders of `avoid` (kvdesk's data)."""
    path = Path(path)
    try:
        if path.is_dir():
            return _folder(path, progress, cancel, avoid)
        if not path.exists():
            raise DocumentError(f"{path}: no such file")
        if not path.is_file():
            raise DocumentError(f"{path}: not a regular file (a device, a pipe or a socket)")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise DocumentError(f"{path.name}: {size_text(size)} is too large to attach (the "
                                f"most kvdesk reads is {size_text(MAX_FILE_BYTES)})")
        # read even when its size says 0: files of /proc and the like have text all the same
        data = path.read_bytes()
    except OSError as e:  # a name too long, a link loop, unreadable
        raise DocumentError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not data:
        raise DocumentError(f"{path.name}: the file is empty")
    return _read(path, data)


def _read(path: Path, data: bytes) -> Extracted:
    """The file `path` (its bytes `data`, read once) as a document, by its format."""
    suffix = path.suffix.lower()
    warnings: list[str] = []
    pages = table = page = headings = None
    if suffix in PDF_SUFFIXES or data.startswith(b"%PDF"):
        (text, pages, headings), title, kind = _pdf_text(data, path, warnings), None, "pdf"
    elif kind := office.kind_of(data, suffix, path.name):  # (or refused, named)
        # (imported here: python-docx, ebooklib and lxml load only for such a file)
        from ..formats import ebooks, wordfiles
        book = wordfiles.read(data, path.name) if kind == "docx" else ebooks.read(
            data, path.name, warnings, lambda raw, where: html_page(decode(raw, where, warnings)))
        text, title, headings = book.text, book.title, book.headings
    else:
        raw = decode(data, path.name, warnings)
        if suffix in HTML_SUFFIXES or _looks_like_html(raw):
            page = html_page(raw)
            text, title, kind, headings = page.text, page.title, "html", page.headings
        elif (table := records.read(raw, suffix)) is not None:
            # Values read next to their column or key (`records`): already normalized.
            text, title, kind = table.text, None, table.kind
        else:
            text, title, kind = raw, None, text_kind(path.name)
    normalized = _normalize(text)
    if not normalized.strip():
        raise DocumentError(f"{path.name}: the document has no text")
    lines = table.lines if table is not None else page.lines if page is not None \
        else None if kind == "pdf" else _file_lines(text, normalized)
    return Extracted(text=normalized, title=title or path.name, kind=kind,
                     source=str(path.resolve()), warnings=warnings, pages=pages, lines=lines,
                     headings=headings)


def _folder(path: Path, progress, cancel, avoid) -> Extracted:
    """A folder as one document (`formats.folders`): what was left out said at once, named."""
    from ..formats import folders

    found = folders.read(path, _folder_file, total_limit=MAX_FILE_BYTES, progress=progress,
                         cancel=cancel, avoid=avoid)
    return Extracted(text=found.text, title=found.title, kind="folder",
                     source=str(path.resolve()), warnings=[*found.warnings],
                     lines=found.lines, headings=found.headings, note=found.summary,
                     left_out=found.left_out_dicts(), pages=found.pages or None)


def stored(doc, *, read: bool = False, avoid: Collection[Path] = (),
           cancel: threading.Event | None = None) -> Extracted:
    """A stored document (`store.Document`) as its text tells it; `read`: as its file tells
    it when the file still holds that text (its lines, pages and headings as at its attach),
    a folder read leaving out `avoid` as attach did, stopping at `cancel` (Cancelled).
    From the text alone (`source` "" saying so), a folder's files' headings and lines are
    found again (`folders.from_text`): a text file's lines as the file numbers them, but a
    web page's or Word file's by its text's lines and a PDF without its pages."""
    if read and doc.source_path and Path(doc.source_path).exists():  # (a folder's too)
        try:
            found = extract(doc.source_path, cancel=cancel, avoid=avoid)
            if found.content_hash == doc.content_hash:
                return found
        except Cancelled:
            raise
        except Exception:  # noqa: BLE001 - the file only adds lines and pages; the text stands
            pass
    if doc.type != "folder":
        return Extracted(doc.text, doc.title, doc.type, "")
    from ..formats import folders

    lines, headings = folders.from_text(doc.text)
    return Extracted(doc.text, doc.title, doc.type, "", lines=lines, headings=headings)


def _folder_file(path: Path, data: bytes, name: str):
    """One file of a folder (`name`: its path in it, as said): a document by its format read
    as attach reads it, any other as its text in the encoding attach would find."""
    from ..formats import folders

    suffix = path.suffix.lower()
    if suffix in folders.DOCUMENT_SUFFIXES | HTML_SUFFIXES or data.startswith(b"%PDF"):
        found = _read(path, data)
        text = found.text
        # (a PDF's lines only number its text: its passages are cited by its pages)
        lines = found.lines or tuple(range(1, text.count("\n") + 2))
        return folders.Read(text, lines, found.kind, found.headings or (), found.pages or (),
                            tuple(found.warnings))
    warnings: list[str] = []
    raw = decode(data, name, warnings)
    text = folders.file_text(_line_ends(raw))  # (each of its lines kept: `folders.from_text`)
    # (its kind, and so its headings, as `passages.split` judges it again from the path)
    return folders.Read(text, tuple(range(1, text.count("\n") + 2)), text_kind(path.name),
                        warnings=tuple(warnings))


def _looks_like_html(text: str) -> bool:
    head = text[:1024].lstrip().lower()
    return head.startswith("<!doctype html") or head.startswith("<html")


@dataclass(frozen=True)
class _Page:
    text: str  # normalized (`_normalize`)
    title: str | None
    lines: tuple[int, ...]  # the file's line each line of `text` starts on
    headings: tuple[tuple[int, int, int, str], ...]  # (start, end in `text`, level, title)


def html_page(raw: str) -> _Page:
    """A web page's (or an EPUB chapter's: `ebooks`) visible text, lines and headings."""
    parser = webpages.VisibleText()
    parser.feed(raw)
    parser.close()
    text = re.sub(r"[ \t\r\f\v]+", " ", "".join(parser.parts))  # (newlines kept)
    normalized = _normalize(text)
    # Each normalized line is a line of `text` (`_file_lines`); one with no visible character
    # of its own (a blank line) takes the line before it.
    at, lines, of_line = 1, [], {}
    for i, line in enumerate(_file_lines(text, normalized)):
        at = parser.sources[line - 1] or at
        lines.append(at)
        of_line[line - 1] = i
    starts = [0] + [m.end() for m in re.finditer("\n", normalized)]
    ends = [m.start() for m in re.finditer("\n", normalized)] + [len(normalized)]
    headings = []
    for first, last, level, title in parser.headings:
        kept = [of_line[i] for i in range(first, last + 1) if i in of_line
                and starts[of_line[i]] < ends[of_line[i]]]
        if kept:
            headings.append((starts[kept[0]], ends[kept[-1]], level, title))
    return _Page(normalized, " ".join("".join(parser.title).split()) or None, tuple(lines),
                 tuple(headings))


class _Collect(logging.Handler):
    def __init__(self, name: str, warnings: list[str]):
        super().__init__(logging.WARNING)
        self.name_, self.warnings = name, warnings

    def emit(self, record: logging.LogRecord) -> None:
        note = f"{self.name_}: the PDF reader says: {record.getMessage()}"
        if note not in self.warnings and len(self.warnings) < 5:
            self.warnings.append(note)


@contextlib.contextmanager
def _pdf_log(name: str, warnings: list[str]):
    """pypdf's log records become the document's warnings instead of stray terminal lines."""
    log = logging.getLogger("pypdf")
    handler, propagate = _Collect(name, warnings), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.propagate = propagate


def _pdf_text(data: bytes, path: Path, warnings: list[str]
              ) -> tuple[str, tuple[tuple[int, int], ...], tuple[tuple[int, int, int, str], ...]]:
    """The PDF's text, where each page with text starts in it, and its outline's headings."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        with _pdf_log(path.name, warnings):
            reader = PdfReader(io.BytesIO(data))
            if reader.is_encrypted:
                raise DocumentError(f"{path.name}: the PDF is encrypted")
            pages = [page.extract_text() or "" for page in reader.pages]
    except DocumentError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as e:
        raise DocumentError(_unreadable(path.name, data, e)) from e
    if not any(p.strip() for p in pages):
        raise DocumentError(f"{path.name}: the PDF has no text layer (a scan?); "
                            "kvdesk does not do OCR")
    # Each page normalized on its own and the pages joined by a blank line: the same text as
    # normalizing them joined (a page's edges are blank lines or spaces either way), with
    # each page's offset known.
    parts, starts, offset = [], [], 0
    for number, page in enumerate(pages, 1):
        page = re.sub(r"[ \t]+$", "", _normalize(page))
        if page.strip():
            parts.append(page)
            starts.append((number, offset))
            offset += len(page) + 2
    text = "\n\n".join(parts)
    # A broken bookmark costs the document nothing but its heading: pypdf's complaints about
    # the outline (a cycle's holds a page of the entry's dictionary) are not said over it.
    with _pdf_log(path.name, []):
        return text, tuple(starts), outline_headings(_outline(reader), text, starts)


def _outline(reader) -> Iterator[tuple[int, str, int | None]]:
    """(level from 1, title, page number from 1 or None) of the outline's entries in order,
    a nested list holding the entries under the one before it; an entry pypdf cannot place
    has no page, and an outline it gives up on (too deep, too many entries) none at all."""
    try:
        outline = reader.outline
    except Exception:  # noqa: BLE001 - a broken outline is no outline, never a failed attach
        return
    stack = [(1, iter(outline))]
    while stack:
        level, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
        elif isinstance(item, list):
            stack.append((level + 1, iter(item)))
        else:
            try:
                index = reader.get_destination_page_number(item)
                title = str(item.title or "")
            except Exception:  # noqa: BLE001 - one broken entry is skipped, the rest kept
                continue
            yield level, title, index + 1 if isinstance(index, int) and index >= 0 else None


def _unreadable(name: str, data: bytes, error: Exception) -> str:
    """Why a PDF the reader refused cannot be read, as its owner can act on it: a file
    that is not a PDF inside, one cut off before its end (a PDF's objects, then no "%%EOF" at
    its end), or one damaged; the reader's own words after it."""
    said = f"(the PDF reader says: {error})"
    if b"%PDF-" not in data[:1024]:  # (the header may follow a little junk)
        return (f"{name}: the file cannot be read as a PDF: it does not begin as a PDF does "
                f"(damaged, or another kind of file named .pdf) {said}")
    if b"%%EOF" not in data[-1024:] and re.search(rb"\d+\s+\d+\s+obj\b", data[:65536]):
        return (f"{name}: the PDF cannot be read: the file is incomplete, cut off before its "
                f"end (a download or copy that did not finish?) {said}")
    return f"{name}: the PDF cannot be read: the file is damaged {said}"


def _normalize(text: str) -> str:
    text = _line_ends(text)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def _line_ends(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return re.sub(r"[ \t]+\n", "\n", text)


def _file_lines(raw: str, normalized: str) -> tuple[int, ...]:
    """The line number in `raw` of each line of `_normalize(raw)`: normalizing only drops
    whole blank lines (leading, trailing, and all but one of a run), so the normalized lines
    are the raw ones in order, each found at the next raw line equal to it."""
    source = _line_ends(raw).split("\n")
    out, at = [], 0
    for line in normalized.split("\n"):
        while source[at] != line:
            at += 1
        at += 1
        out.append(at)
    return tuple(out)
