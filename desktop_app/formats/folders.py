"""A folder — a code base, a folder of notes — read as one document: its readable files one
after another, each under a heading that is its path relative to the folder, two blank lines
between files (`FILE_GAP`: which no file's text holds, so its headings are told from it).

The folder is walked recursively in sorted order (the same folder gives the same text, so
attaching it again unchanged is the same document). Left out, and counted in what is said:
hidden files and folders (a name starting with "."), the build and dependency folders of
`SKIPPED_FOLDERS`, what the folder's own top-level .gitignore ignores (a subset of its rules:
`Ignore`), binary files (a NUL byte in the first 8 KB, or not UTF-8), empty files, files over
`MAX_FILE_BYTES`, and files the caller's reader refuses. The files kvdesk reads as documents
by their format (PDF, Word, EPUB, web pages) are read the way attach reads them, by the reader
the caller passes (`chat.documents`); every other file is read as its text.

Each file's lines keep their numbers within the file (`Folder.lines`), and its heading is a
level-1 heading (its inner ones, a Markdown file's # headings, a web page's h1-h6, below it),
so a passage names the file and the lines in it.

This module only reads files: it never tokenizes, never touches the model or the store, and
never follows a link out of the folder.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import DocumentError
from ..results import size_text
from .office import DOCX_SUFFIXES, EPUB_SUFFIXES

# Build outputs and dependencies: generated, not what the folder is about.
SKIPPED_FOLDERS = frozenset({"node_modules", "__pycache__", "build", "dist", "target",
                             "venv", "site-packages", "bower_components"})
MAX_FILE_BYTES = 2_000_000  # one file of a folder: a data dump or a log, not a source or a note
BINARY_PROBE = 8192
# Files read by their format even though their bytes are not text.
DOCUMENT_SUFFIXES = frozenset({".pdf", *DOCX_SUFFIXES, *EPUB_SUFFIXES})
FILE_HEADING = "File: "  # the line each file starts under, before its path
_ATX = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r"^[ \t]*(```|~~~)")


@dataclass(frozen=True)
class Read:
    """One file as the caller's reader gives it: normalized text (no trailing blanks, no runs
    of blank lines), the file's number of each of its lines, its kind and inner headings."""
    text: str
    lines: tuple[int, ...]
    kind: str
    headings: tuple[tuple[int, int, int, str], ...] = ()


ReadFile = Callable[[Path, bytes], Read]  # raises DocumentError for a file it cannot read


@dataclass
class Folder:
    text: str
    title: str
    lines: tuple[int, ...]  # each line of `text`: its number within its own file
    headings: tuple[tuple[int, int, int, str], ...]  # (start, end in `text`, level, title)
    files: int  # how many were read
    left_out: dict[str, int] = field(default_factory=dict)  # why -> how many files
    unreadable: list[str] = field(default_factory=list)  # the first few, with why
    skipped: list[str] = field(default_factory=list)  # the folders not walked into

    @property
    def summary(self) -> str:
        """"412 files read, 37 left out: 30 binary, 5 over 2 MB, 2 ignored by .gitignore"."""
        said = f"{self.title}: {self.files} file{'s' * (self.files != 1)} read"
        if n := sum(self.left_out.values()):
            said += f", {n} left out: " + _reasons(self.left_out)
        if self.skipped:
            names = sorted({name.rsplit("/", 1)[-1] for name in self.skipped})
            said += (f"; {len(self.skipped)} folder{'s' * (len(self.skipped) != 1)} not read"
                     f" (hidden, build or ignored: {', '.join(names[:5])}"
                     + (", ..." if len(names) > 5 else "") + ")")
        return said


def _reasons(left_out: dict[str, int]) -> str:
    """"30 binary, 5 over 2.0 MB": the most common reason first."""
    return ", ".join(f"{n} {why}" for why, n in sorted(left_out.items(), key=lambda r: -r[1]))


class Ignore:
    """The rules of a folder's top-level .gitignore that kvdesk follows: blank lines and
    # comments skipped; a pattern without "/" matches a name at any depth, one with a "/"
    (other than at its end) the path from the folder ("/" at its start only anchors it);
    "/" at its end matches folders only; "*", "?", "[...]" and "**" as globs; "!" takes a
    path back, the last matching rule winning. Nested .gitignore files are not read."""

    def __init__(self, text: str):
        self.rules: list[tuple[bool, bool, bool, str]] = []  # (negated, dirs, anchored, glob)
        for line in text.splitlines():
            line = line.rstrip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            line = line[1:] if negated else line
            dirs = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            line = line.lstrip("/").replace("**/", "*").replace("/**", "/*")
            if line:
                self.rules.append((negated, dirs, anchored, line))

    def ignores(self, relpath: str, is_dir: bool) -> bool:
        ignored = False
        name = relpath.rsplit("/", 1)[-1]
        for negated, dirs, anchored, glob in self.rules:
            if dirs and not is_dir:
                continue
            if fnmatch.fnmatchcase(relpath if anchored else name, glob):
                ignored = not negated
        return ignored


def read(root: Path, read_file: ReadFile, *, total_limit: int) -> Folder:
    """The folder `root` as one document, or DocumentError when it has no readable file or
    its readable files hold more than `total_limit` bytes."""
    ignore = _ignore(root)
    left_out: dict[str, int] = {}
    unreadable: list[str] = []
    skipped: list[str] = []
    parts: list[tuple[str, Read]] = []
    total = 0

    def leave(why: str) -> None:
        left_out[why] = left_out.get(why, 0) + 1

    for relpath, path in _walk(root, ignore, leave, skipped.append):
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                leave(f"over {size_text(MAX_FILE_BYTES)}")
                continue
            data = path.read_bytes()
        except OSError:
            leave("unreadable")
            continue
        if not data.strip():
            leave("empty")
            continue
        if path.suffix.lower() not in DOCUMENT_SUFFIXES and _binary(data):
            leave("binary")
            continue
        try:
            part = read_file(path, data)
        except DocumentError as e:
            leave("unreadable")
            if len(unreadable) < 5:
                unreadable.append(str(e))
            continue
        if not part.text.strip():
            leave("empty")
            continue
        total += len(part.text.encode("utf-8"))
        if total > total_limit:
            raise DocumentError(f"{root.name}: its readable files hold more than "
                                f"{size_text(total_limit)}, the most kvdesk reads as one "
                                "document (attach a folder inside it)")
        parts.append((relpath, part))
    if not parts:
        said = Folder("", root.name, (), (), 0, left_out, [], skipped).summary
        raise DocumentError(f"{root.name}: the folder has no readable file to attach ("
                            f"{said.split(': ', 1)[1]})")
    return replace(_joined(root.name, parts), left_out=left_out, unreadable=unreadable,
                   skipped=skipped)


def _ignore(root: Path) -> Ignore | None:
    gitignore = root / ".gitignore"
    return Ignore(gitignore.read_text("utf-8", "replace")) if gitignore.is_file() else None


def _walk(root: Path, ignore: Ignore | None, leave: Callable[[str], None],
          skip: Callable[[str], None], walked: Callable[[Path], None] = lambda _: None):
    """(path from the folder with "/", path) of the files to read, in sorted order; each
    folder walked into (the root too) to `walked`."""
    for folder, dirs, files in os.walk(root):  # (links to folders are not followed)
        base = Path(folder)
        walked(base)
        rel = base.relative_to(root).as_posix()
        rel = "" if rel == "." else rel + "/"
        kept = []
        for d in sorted(dirs):
            if d.startswith(".") or d in SKIPPED_FOLDERS or (
                    ignore is not None and ignore.ignores(rel + d, True)):
                skip(rel + d)
            else:
                kept.append(d)
        dirs[:] = kept
        for name in sorted(files):
            path = base / name
            if name.startswith("."):
                leave("hidden")
            elif ignore is not None and ignore.ignores(rel + name, False):
                leave("ignored by .gitignore")
            elif path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
                leave("linking out of the folder")
            elif path.is_file():
                yield rel + name, path


def _binary(data: bytes) -> bool:
    if b"\0" in data[:BINARY_PROBE]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# Files are joined by two blank lines, which no file's text holds (`Read`: its blank runs are
# one blank line), so a file's own "File: x" line after a blank one is never taken for one.
FILE_GAP = "\n\n\n"
_FILE_LINE = re.compile(rf"(?:\A|(?<={FILE_GAP})){FILE_HEADING}([^\n]+)\n")


def file_count(text: str) -> int:
    """How many files a folder's text (`read`'s) joins: its headings (`from_text`)."""
    return len(_FILE_LINE.findall(text))


def from_text(text: str) -> tuple[tuple[int, ...], tuple[tuple[int, int, int, str], ...]]:
    """(`Folder.lines`, its files' headings) as far as a folder's stored text tells them, its
    folder changed or gone: each file's lines numbered from 1 (a blank run its file had, which
    the text holds as one blank line, is not counted)."""
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


def markdown_headings(text: str) -> tuple[tuple[int, int, int, str], ...]:
    """A Markdown file's # headings (outside fenced blocks), as `Read.headings`."""
    out, offset, fenced = [], 0, False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := _ATX.match(line)):
            out.append((offset, offset + len(line), len(m.group(1)), m.group(2)))
        offset += len(line) + 1
    return tuple(out)


def _joined(title: str, parts: list[tuple[str, Read]]) -> Folder:
    chunks: list[str] = []
    lines: list[int] = []
    headings: list[tuple[int, int, int, str]] = []
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
        chunks.append(head + "\n" + part.text)
        lines += [part.lines[0] if part.lines else 1, *part.lines]
        offset += len(chunks[-1])
    return Folder(FILE_GAP.join(chunks), title, tuple(lines), tuple(headings), len(parts))


# A walk costs ~20 us a file (a 13,000-file folder: ~0.26 s), and whether a folder changed is
# asked at each listing of documents and each question: a walk slower than SLOW_WALK_S is
# reused for STAMP_REUSE_S (an edit of a large folder is seen within a minute).
SLOW_WALK_S = 0.05
STAMP_REUSE_S = 60.0
_STAMPS: dict[Path, tuple[float, tuple[int, int]]] = {}  # a slow walk's root -> (when, stamp)


def stamp(root: Path) -> tuple[int, int]:
    """(newest modification time in ns, how many) of the files `read` would look at and the
    folders holding them: a file edited, added, removed or renamed anywhere in it moves it.
    A walk and a stat per file, no file read (a slow walk's reused a while)."""
    now = time.monotonic()
    if (held := _STAMPS.get(root)) and now - held[0] < STAMP_REUSE_S:
        return held[1]
    found = _walked_stamp(root)
    if time.monotonic() - now > SLOW_WALK_S:
        _STAMPS[root] = (now, found)
    else:
        _STAMPS.pop(root, None)
    return found


def _walked_stamp(root: Path) -> tuple[int, int]:
    newest, count, folders = 0, 0, []
    for _, path in _walk(root, _ignore(root), lambda _: None, lambda _: None, folders.append):
        try:
            newest = max(newest, path.stat().st_mtime_ns)
        except OSError:  # (gone meanwhile)
            continue
        count += 1
    for folder in folders:
        with contextlib.suppress(OSError):
            newest = max(newest, folder.stat().st_mtime_ns)
    return newest, count
