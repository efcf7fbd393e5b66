"""Which packaged document a file is — a Word document (.docx), an EPUB book, or a format
kvdesk does not read — told from its bytes as much as from its name.

`kind_of` names a DOCX or an EPUB by what its ZIP archive holds (so a book saved without its
extension is read all the same), and refuses with a `DocumentError` meant for the user what
cannot be read: a DOCX that is not a ZIP archive or is cut off, a password-protected Office
document (an OLE container holding an "EncryptedPackage", not a ZIP), and the formats kvdesk
does not read (Word 97-2003 .doc, OpenDocument, RTF, spreadsheets and slides), each named
with what to save it as instead. A DOCX or an EPUB whose members would expand beyond what
is read in memory (a zip bomb) is refused too, from the sizes its archive declares. `Book`
is what the readers (`wordfiles`, `ebooks`) give back to `chat.documents`.

This module only looks at bytes: it never parses a document's content (the readers do),
never tokenizes, never touches the model or the store.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from dataclasses import dataclass

from ..errors import DocumentError
from ..results import size_text

DOCX_SUFFIXES = {".docx", ".docm", ".dotx"}
EPUB_SUFFIXES = {".epub"}
_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # Office 97-2003 files, and encrypted Office files
# Formats people attach that kvdesk does not read: what they are, and what to save them as.
_REFUSED = {
    ".doc": ("a Word 97-2003 document (.doc)", ".docx or PDF"),
    ".dot": ("a Word 97-2003 template (.dot)", ".docx or PDF"),
    ".odt": ("an OpenDocument text (.odt)", ".docx or PDF"),
    ".rtf": ("a Rich Text Format document (.rtf)", ".docx or PDF"),
    ".pages": ("an Apple Pages document", ".docx or PDF"),
    ".xls": ("an Excel 97-2003 workbook (.xls)", "CSV"),
    ".xlsx": ("an Excel workbook (.xlsx)", "CSV"),
    ".ods": ("an OpenDocument spreadsheet (.ods)", "CSV"),
    ".ppt": ("a PowerPoint 97-2003 presentation (.ppt)", "PDF"),
    ".pptx": ("a PowerPoint presentation (.pptx)", "PDF"),
    ".odp": ("an OpenDocument presentation (.odp)", "PDF"),
}
# What a DOCX or an EPUB may expand to, all told and in one member (the most text kvdesk
# attaches from a file), and how much smaller than its text a large member may be packed:
# Word's and books' XML packs about 5-20:1, deflate's best is about 1000:1.
MAX_EXPANDED_BYTES = 1024 ** 3
MAX_MEMBER_BYTES = 200 * 1024 * 1024
MAX_RATIO = 100
_RATIO_FROM_BYTES = 8 * 1024 * 1024
# An OpenDocument's "mimetype" entry, and the suffix whose message it gets.
_OPENDOCUMENT = {b"application/vnd.oasis.opendocument.text": ".odt",
                 b"application/vnd.oasis.opendocument.spreadsheet": ".ods",
                 b"application/vnd.oasis.opendocument.presentation": ".odp"}


@dataclass(frozen=True)
class Book:
    """A packaged document's text, as `documents.extract` takes it: already normalized (no
    trailing blanks, no runs of blank lines), so its headings' offsets stand as they are."""
    text: str
    title: str | None  # from the document's own metadata, when it has one
    headings: tuple[tuple[int, int, int, str], ...]  # (start, end in `text`, level, title)


def kind_of(data: bytes, suffix: str, name: str) -> str | None:
    """"docx" or "epub" for a file that is one, None for any other file (left to the other
    readers), or DocumentError for one kvdesk does not read, named."""
    if data.startswith(_OLE):
        if "EncryptedPackage".encode("utf-16-le") in data:
            raise DocumentError(f"{name}: the document is encrypted (password-protected); "
                                "remove its password in Word, save it, and attach it again")
        # (an OLE file of another kind — an .msg, a .ppt — is said by its suffix, or left to
        # the text reader, which calls it binary)
        if b"W\x00o\x00r\x00d\x00D\x00o\x00c\x00u\x00m\x00e\x00n\x00t\x00" in data:
            suffix = ".doc" if suffix not in _REFUSED else suffix
    elif data.startswith(b"PK\x03\x04"):
        found, members = _zipped_kind(data)
        if found in ("docx", "epub"):
            _refuse_bomb(members, name)
            return found
        if found == "zip" and suffix in DOCX_SUFFIXES | EPUB_SUFFIXES:
            what = "a Word document's" if suffix in DOCX_SUFFIXES else "an EPUB book's"
            raise DocumentError(f"{name}: a ZIP archive, but without {what} contents inside "
                                "(another kind of file, renamed?)")
        suffix = found if found and found != "zip" else suffix
    elif data[:64].lstrip()[:5] == b"{\\rtf":
        suffix = ".rtf"
    elif b"\x00" not in data[:8192] and suffix not in DOCX_SUFFIXES | EPUB_SUFFIXES:
        # Text named .doc or .rtf (a web page Word saved so, notes renamed): read as text.
        return None
    if suffix in _REFUSED:
        what, instead = _REFUSED[suffix]
        raise DocumentError(f"{name}: {what} is not supported; save it as {instead} "
                            "(File > Save As) and attach that")
    if suffix in DOCX_SUFFIXES | EPUB_SUFFIXES:
        what = "Word document" if suffix in DOCX_SUFFIXES else "EPUB book"
        if data.startswith(b"PK"):
            raise DocumentError(f"{name}: the {what} cannot be read: it is not a complete ZIP "
                                "archive, as a .docx or .epub is (cut off before its end, or "
                                "damaged?)")
        raise DocumentError(f"{name}: the file cannot be read as a {what}: it is not a ZIP "
                            f"archive, as a {suffix} is (another kind of file, renamed?)")
    return None


def _zipped_kind(data: bytes) -> tuple[str | None, list[zipfile.ZipInfo]]:
    """What a ZIP archive holds — "docx", "epub", the suffix of a format refused (".odt",
    ".xlsx", ...), "zip" (another archive), or None (one that cannot be opened) — and its
    members."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = z.infolist()
            names = {m.filename for m in members}
            if "word/document.xml" in names:
                return "docx", members
            if "xl/workbook.xml" in names:
                return ".xlsx", members
            if "ppt/presentation.xml" in names:
                return ".pptx", members
            mimetype = b""
            if "mimetype" in names:  # (read no more than a mimetype: it may be a zip bomb)
                with z.open("mimetype") as entry:
                    mimetype = entry.read(100).strip()
    # (RuntimeError: a member encrypted, or packed in a way zipfile does not unpack)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, EOFError,
            ValueError, RuntimeError):
        return None, []  # (a truncated one: said by its suffix, or called a ZIP archive)
    if mimetype == b"application/epub+zip" or "META-INF/container.xml" in names:
        return "epub", members
    return _OPENDOCUMENT.get(mimetype, "zip"), members


def _refuse_bomb(members: list[zipfile.ZipInfo], name: str) -> None:
    """DocumentError for an archive that would expand beyond what is read in memory.

    python-docx and ebooklib read every part they reach whole, and deflate shrinks up to about
    1000:1, so a small file can ask for gigabytes (and `kvdesk serve` takes uploads). The sizes
    the archive declares bound what is read: zipfile stops at a member's declared size."""
    total = sum(m.file_size for m in members)
    if total > MAX_EXPANDED_BYTES:
        raise DocumentError(f"{name}: the archive expands to {size_text(total)}: refused, as a zip "
                            "bomb would be")
    for m in members:
        if m.file_size > MAX_MEMBER_BYTES or (
                m.file_size > _RATIO_FROM_BYTES
                and m.file_size > MAX_RATIO * max(m.compress_size, 1)):
            raise DocumentError(
                f"{name}: the archive's {m.filename} expands to {size_text(m.file_size)} from "
                f"{size_text(m.compress_size)}: refused, as a zip bomb would be")
