"""A folder — a code base, a folder of notes — read as one document: its readable files one
after another, each under a heading that is its path relative to the folder, two blank lines
between files (`FILE_GAP`: a "File: " line after two blank lines is a file's heading; a
file's own such line is not: `file_text`).

The folder is walked recursively in sorted order (the same folder gives the same text, so
attaching it again unchanged is the same document), never following a link to a folder (nor
out of one into a loop). Left out, and named with why in what is said (`Folder.left_out`):
hidden files and folders (a name starting with "."; a .gitignore file is the walk's
rules, neither read nor named), the build and dependency folders of
`SKIPPED_FOLDERS`, what the .gitignore files ignore (`gitignore`), folders that cannot be
listed, kvdesk's own data folder, links to folders, broken links and link loops, links out of
the folder, a link to a file the folder holds anyway (read once, there), binary files (bytes
the caller's reader finds are not text: `NotTextError`), empty files, files over
`MAX_FILE_BYTES` (a document by its format: over the folder's whole limit), files that cannot
be read and files the caller's reader refuses. The files kvdesk reads as documents by their
format (PDF, Word, EPUB, web pages) are read the way attach reads them, by the reader the
caller passes (`chat.documents`); every other file is read as its text, in the encoding that
reader finds. A name that is not UTF-8, or holds a line break or another control character,
is shown escaped (`shown`, by `one_line`: as plain-text output shows every title), so a
heading is always one line of the file's name.

A file read as its text keeps its runs of blank lines, so the stored text alone numbers its
lines as the file does (`from_text`, when the folder has changed or gone). Each file's lines
keep their numbers within the file (`Folder.lines`), a PDF's pages theirs
(`Folder.pages`), and its heading is a level-1 heading (its reader's inner ones, a web page's
h1-h6, below it; a Markdown file's and a code file's are found in its text), so a passage
names the file and the lines (or the page) in it.

This module only reads files: it never tokenizes, never touches the model or the store, and
never follows a link out of the folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import Cancelled, DocumentError, NotTextError
from ..results import size_text
from .gitignore import Rules
from .office import DOCX_SUFFIXES, EPUB_SUFFIXES

# Build outputs and dependencies: generated, not what the folder is about.
SKIPPED_FOLDERS = frozenset({"node_modules", "__pycache__", "build", "dist", "target",
                             "venv", "site-packages", "bower_components"})
MAX_FILE_BYTES = 2_000_000  # one file of a folder: a data dump or a log, not a source or a note
# Files read by their format even though their bytes are not text.
DOCUMENT_SUFFIXES = frozenset({".pdf", *DOCX_SUFFIXES, *EPUB_SUFFIXES})
FILE_HEADING = "File: "  # the line each file starts under, before its path
WARNINGS = 5  # why files could not be read: the first few said (all named in `left_out`)
NOTES = 3  # what readers said of the files read (encodings guessed): the first few, counted
NAMED = 3  # the names said per reason in a folder's note (all of them in `Folder.left_out`)
PROGRESS_S = 0.5  # how often a long walk says how far it is
# C0, DEL, C1 and the Unicode line and paragraph separators: what a terminal acts on or breaks
# a line at.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class Read:
    """One file as the caller's reader gives it: its text (a text file's as `file_text`, a
    document's as its reader normalizes it), the file's number of each of its lines, its kind,
    inner headings, a PDF's pages and what its reader said of it (an encoding guessed)."""
    text: str
    lines: tuple[int, ...]
    kind: str
    headings: tuple[tuple[int, int, int, str], ...] = ()
    pages: tuple[tuple[int, int], ...] = ()  # a PDF's: (page number, offset in `text`)
    warnings: tuple[str, ...] = ()


# (path, its bytes, its name as said): raises NotTextError for a file that is not text,
# DocumentError for one it cannot read.
ReadFile = Callable[[Path, bytes, str], Read]
# (done, total): files read of those found; total 0 while the folder is still being walked.
FolderProgress = Callable[[int, int], None]


@dataclass
class Folder:
    text: str
    title: str
    lines: tuple[int, ...]  # each line of `text`: its number within its own file
    headings: tuple[tuple[int, int, int, str], ...]  # (start, end in `text`, level, title)
    files: int  # how many were read
    # (path from the folder, as shown; why): what was not read, a folder's path ending in "/"
    left_out: list[tuple[str, str]] = field(default_factory=list)
    # Why its first files could not be read, then what was said of the first files read.
    warnings: list[str] = field(default_factory=list)
    # Its PDFs' pages: (page number within its file, offset in `text`), in order.
    pages: tuple[tuple[int, int], ...] = ()

    @property
    def summary(self) -> str:
        """"tool: 412 files read, 37 left out: 30 binary (a.png, b.png, c.png, ...), 5 over
        2.0 MB (...), ...; 3 folders not read: 2 hidden (.git, .venv), 1 build or dependency
        (node_modules)"."""
        said = f"{self.title}: {self.files} file{'s' * (self.files != 1)} read"
        files = [(path, why) for path, why in self.left_out if not path.endswith("/")]
        folders = [(path[:-1], why) for path, why in self.left_out if path.endswith("/")]
        if files:
            said += f", {len(files)} left out: " + _reasons(files)
        if folders:
            said += (f"; {len(folders)} folder{'s' * (len(folders) != 1)} not read: "
                     + _reasons(folders))
        return said

    def left_out_dicts(self) -> list[dict[str, str]]:
        """`left_out` as JSON has it: [{"path", "why"}]."""
        return [{"path": path, "why": why} for path, why in self.left_out]


def _reasons(left_out: list[tuple[str, str]]) -> str:
    """"30 binary (a.png, b.png, c.png, ...), 5 over 2.0 MB (...)": the most common first."""
    by_why: dict[str, list[str]] = {}
    for path, why in left_out:
        by_why.setdefault(why, []).append(path)
    return ", ".join(
        f"{len(paths)} {why} ({', '.join(paths[:NAMED])}{', ...' * (len(paths) > NAMED)})"
        for why, paths in sorted(by_why.items(), key=lambda r: -len(r[1])))


def shown(name: str) -> str:
    """A file's name as text: bytes that are not UTF-8 as "\\xe9", a line break as "\\n" and
    any other control character escaped, so a heading is one line that names the file."""
    return one_line(os.fsencode(name).decode("utf-8", "backslashreplace"))


def one_line(text: str) -> str:
    """`text` on one line with no character a terminal would act on: a line break as "\\n",
    any other control character as Python writes it ("\\x07", "\\x1b"). Plain-text output
    shows every title so (`kvdesk docs | grep` reads a row per document; a title with an
    escape sequence cannot recolour the terminal); `--json` keeps the title as it is."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def title_of(root: Path) -> str:
    """A folder's title: its own name however it was written ("." or "src/" too)."""
    absolute = os.path.abspath(root)
    return shown(os.path.basename(absolute) or absolute)


def read(root: Path, read_file: ReadFile, *, total_limit: int,
         progress: FolderProgress | None = None, cancel: threading.Event | None = None,
         avoid: Collection[Path] = ()) -> Folder:
    """The folder `root` as one document, or DocumentError when it has no readable file, its
    readable files hold more than `total_limit` bytes or it is (inside) a folder of `avoid`
    (kvdesk's own data); Cancelled as soon as `cancel` is set, walking or reading."""
    title, real = title_of(root), root.resolve()
    avoided = {a.resolve() for a in avoid}
    if any(real.is_relative_to(a) for a in avoided):
        raise DocumentError(f"{title}: kvdesk's own data folder, not a document to attach")
    left_out: list[tuple[str, str]] = []
    warnings: list[str] = []  # (why files could not be read)
    notes: list[str] = []  # (what their readers said of the files read)
    walk = _Walk(real, avoided, left_out, warnings, progress, cancel)
    found = list(walk.files(real, "", Rules.for_folder(real)))
    parts: list[tuple[str, Read]] = []
    total = 0

    def leave(relpath: str, why: str, error: str = "") -> None:
        left_out.append((relpath, why))
        if error:
            walk.say(error)

    for done, (relpath, path) in enumerate(found):
        walk.tick(done, len(found))
        try:
            size = path.stat().st_size
            # (a PDF's or a Word file's bytes are mostly not its text: its text counts)
            most = total_limit if path.suffix.lower() in DOCUMENT_SUFFIXES else MAX_FILE_BYTES
            if size > most:
                leave(relpath, f"over {size_text(most)}")
                continue
            data = path.read_bytes()
        except OSError as e:
            leave(relpath, "unreadable", f"{relpath}: cannot be read ({e.strerror or e})")
            continue
        if not data.strip():
            leave(relpath, "empty")
            continue
        try:
            part = read_file(path, data, relpath)
        except NotTextError:
            leave(relpath, "binary")
            continue
        except DocumentError as e:
            leave(relpath, "unreadable", shown(str(e)))
            continue
        if not part.text.strip():
            leave(relpath, "empty")
            continue
        total += len(part.text.encode("utf-8"))
        if total > total_limit:
            raise DocumentError(f"{title}: its readable files hold more than "
                                f"{size_text(total_limit)}, the most kvdesk reads as one "
                                "document (attach a folder inside it)")
        parts.append((relpath, part))
        notes += part.warnings
    left_out.sort(key=lambda r: r[0])
    if not parts:
        said = Folder("", title, (), (), 0, left_out).summary
        raise DocumentError(f"{title}: the folder has no readable file to attach ("
                            f"{said.split(': ', 1)[1]})")
    more = len(notes) - NOTES
    said = notes[:NOTES] + ([f"{title}: {more} more such note(s) of its files"]
                            if more > 0 else [])
    return replace(_joined(title, parts), left_out=left_out, warnings=warnings + said)


class _Walk:
    """The files to read under a folder, in sorted order (a folder's files, then each of its
    folders in turn), what is not read put in `left_out`; progress said and `cancel` checked
    at every entry met."""

    def __init__(self, real: Path, avoided: set[Path], left_out: list[tuple[str, str]],
                 warnings: list[str], progress: FolderProgress | None,
                 cancel: threading.Event | None):
        self.real, self.avoided, self.left_out = real, avoided, left_out
        self.warnings, self.progress, self.cancel = warnings, progress, cancel
        self.seen, self.said = 0, time.monotonic()
        self.regular: set[Path] = set()  # the real paths of the files found (not links)
        self.links: list[tuple[str, Path, Path]] = []  # (relpath, path, target in the folder)
        self.walked: list[Path] = []  # the folders listed (the root too)

    def say(self, error: str) -> None:
        if len(self.warnings) < WARNINGS:
            self.warnings.append(error)

    def tick(self, done: int, total: int) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled()
        if self.progress is not None and time.monotonic() - self.said >= PROGRESS_S:
            self.said = time.monotonic()
            self.progress(done, total)

    def files(self, real: Path, rel: str, rules: Rules) -> Iterator[tuple[str, Path]]:
        """(path from the folder with "/", path) of the files to read under `real`."""
        found = list(self._folder(real, rel, rules))
        if not self.links:
            return iter(found)
        for relpath, path, target in self.links:  # (a file read once, under its own name)
            if target in self.regular:
                self.left_out.append((relpath, "link to a file read anyway"))
            else:
                found.append((relpath, path))
        return iter(sorted(found, key=lambda f: _order(f[1].relative_to(self.real))))

    def _folder(self, real: Path, rel: str, rules: Rules) -> Iterator[tuple[str, Path]]:
        self.walked.append(real)
        try:
            with os.scandir(real) as listing:
                entries = sorted(listing, key=lambda e: os.fsencode(e.name))
        except OSError as e:
            if rel:
                self.left_out.append((rel, "unreadable"))
                self.say(f"{rel}: cannot be read ({e.strerror or e})")
                return
            raise DocumentError(f"{title_of(real)}: cannot be read ({e.strerror or e})"
                                ) from None
        if any(e.name == ".gitignore" for e in entries):
            rules = rules.within(real, rel)
        folders = []
        for entry in entries:
            self.seen += 1
            self.tick(self.seen, 0)
            relpath = rel + shown(entry.name)
            path = Path(entry.path)
            try:
                is_link, is_dir = entry.is_symlink(), entry.is_dir(follow_symlinks=False)
            except OSError:
                is_link = is_dir = False
            if entry.name == ".gitignore" and not is_dir:
                continue  # (the rules the walk follows, not a file left out of the text)
            if entry.name.startswith("."):
                self.left_out.append((relpath + "/" * is_dir, "hidden"))
            elif rules.ignores(relpath, is_dir):
                self.left_out.append((relpath + "/" * is_dir, "ignored by .gitignore"))
            elif is_link:
                self._link(relpath, path)
            elif is_dir:
                if entry.name in SKIPPED_FOLDERS:
                    self.left_out.append((relpath + "/", "build or dependency"))
                elif path in self.avoided:
                    self.left_out.append((relpath + "/", "kvdesk's own data"))
                else:
                    folders.append((path, relpath + "/"))
            elif entry.is_file(follow_symlinks=False):
                self.regular.add(path)
                yield relpath, path
            else:
                self.left_out.append((relpath, "not a regular file"))
        for path, relpath in folders:
            yield from self._folder(path, relpath, rules)

    def _link(self, relpath: str, path: Path) -> None:
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError):  # (3.11 raises RuntimeError for a loop, 3.13 OSError)
            self.left_out.append((relpath, "broken link or link loop"))
            return
        if target.is_dir():
            self.left_out.append((relpath + "/", "link, not followed"))
        elif not target.is_relative_to(self.real):
            self.left_out.append((relpath, "linking out of the folder"))
        else:
            self.links.append((relpath, path, target))


def _order(relpath: Path) -> tuple[tuple[int, bytes], ...]:
    """A path's place in the walk: a folder's files before its folders, each sorted by its
    name's bytes, as `_folder` lists them (never by the shown name: a name that is not UTF-8
    would sort elsewhere)."""
    parts = [os.fsencode(p) for p in relpath.parts]
    return tuple((1, p) for p in parts[:-1]) + ((0, parts[-1]),)


# Files are joined by two blank lines: a "File: x" line after them starts a file, and no
# file's text holds one so (`file_text`), so a file's own "File: x" line is never taken for one.
FILE_GAP = "\n\n\n"
_FILE_LINE = re.compile(rf"(?:\A|(?<={FILE_GAP})){FILE_HEADING}([^\n]+)\n")
_GAP_HEADING = re.compile(rf"\n{{3,}}(?={FILE_HEADING})")


def file_text(text: str) -> str:
    """A text file's text (its line ends "\n", no trailing blanks on a line) as a folder holds
    it: its lines and blank runs as they are, its trailing blank lines dropped; the last blank
    line before a "File: " line of its own holds a space, so that it is not the joining's gap
    and every line keeps its number."""
    return _GAP_HEADING.sub(lambda m: m.group()[:-1] + " \n", "\n" + text.rstrip())[1:]


def file_count(text: str) -> int:
    """How many files a folder's text (`read`'s) joins: its headings (`from_text`)."""
    return len(_FILE_LINE.findall(text))


def from_text(text: str) -> tuple[tuple[int, ...], tuple[tuple[int, int, int, str], ...]]:
    """(`Folder.lines`, its files' headings) as a folder's stored text tells them, its folder
    changed or gone: each file's lines numbered from 1, a text file's as the file numbers them
    (`file_text`), a web page's or a Word file's by the lines of its text."""
    starts = {m.start(): m for m in _FILE_LINE.finditer(text)}
    lines: list[int] = []
    number = offset = 0
    gap = len(FILE_GAP) - 1  # its blank lines, numbered as the line before them: `_joined`
    for line in text.split("\n"):
        if offset in starts:  # (numbered as its file's first line: `_joined`)
            number = 0
            if offset:
                lines[-gap:] = [lines[-gap - 1]] * gap
        else:
            number += 1
        lines.append(max(1, number))
        offset += len(line) + 1
    return tuple(lines), tuple(
        (m.start(), m.end() - 1, 1, m.group(1)) for m in starts.values())


def _joined(title: str, parts: list[tuple[str, Read]]) -> Folder:
    chunks: list[str] = []
    lines: list[int] = []
    headings: list[tuple[int, int, int, str]] = []
    pages: list[tuple[int, int]] = []
    offset = 0
    for relpath, part in parts:
        if chunks:  # the blank lines between files: numbered as the line before them
            lines += [lines[-1]] * (len(FILE_GAP) - 1)
            offset += len(FILE_GAP)
        head = FILE_HEADING + relpath
        headings.append((offset, offset + len(head), 1, relpath))
        body = offset + len(head) + 1
        headings += [(body + start, body + end, min(6, level + 1), name)
                     for start, end, level, name in part.headings]
        pages += [(number, body + start) for number, start in part.pages]
        chunks.append(head + "\n" + part.text)
        lines += [part.lines[0] if part.lines else 1, *part.lines]
        offset += len(chunks[-1])
    return Folder(FILE_GAP.join(chunks), title, tuple(lines), tuple(headings), len(parts),
                  pages=tuple(pages))


# A walk costs ~20 us a file (a 13,000-file folder: ~0.26 s), and whether a folder changed is
# asked at each listing of documents and each question: a walk slower than SLOW_WALK_S is
# reused for STAMP_REUSE_S (an edit of a large folder is seen within a minute).
SLOW_WALK_S = 0.05
STAMP_REUSE_S = 60.0
# A slow walk's (root, avoided) -> (when, stamp).
_STAMPS: dict[tuple[Path, frozenset[Path]], tuple[float, tuple[int, int]]] = {}


def stamp(root: Path, avoid: Collection[Path] = ()) -> tuple[int, int]:
    """(newest modification time in ns, how many) of the files `read` would look at and the
    folders holding them, the folders of `avoid` left out as `read` leaves them (kvdesk's
    data, written at every store write, never moves it): a file edited, added, removed or
    renamed anywhere in it moves it. A walk and a stat per file, no file read (a slow walk's
    reused a while)."""
    now, key = time.monotonic(), (root, frozenset(a.resolve() for a in avoid))
    if (held := _STAMPS.get(key)) and now - held[0] < STAMP_REUSE_S:
        return held[1]
    found = _walked_stamp(root, set(key[1]))
    if time.monotonic() - now > SLOW_WALK_S:
        _STAMPS[key] = (now, found)
    else:
        _STAMPS.pop(key, None)
    return found


def _walked_stamp(root: Path, avoided: set[Path]) -> tuple[int, int]:
    real = root.resolve()
    walk = _Walk(real, avoided, [], [], None, None)
    newest, count = 0, 0
    for _, path in walk.files(real, "", Rules.for_folder(real)):
        try:
            newest = max(newest, path.stat().st_mtime_ns)
        except OSError:  # (gone meanwhile)
            continue
        count += 1
    for folder in walk.walked:
        with contextlib.suppress(OSError):
            newest = max(newest, folder.stat().st_mtime_ns)
    return newest, count
