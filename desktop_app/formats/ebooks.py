"""An EPUB book's text, through ebooklib: its chapters in reading order, their headings marked.

The spine's XHTML documents, in its order, each read from its own bytes by the chapter reader
the caller passes (`chat.documents`: decoded in the encoding it is written in, any guess said,
then the web page reader's visible text, h1-h6 as headings) and joined by a blank line; a
chapter with neither text nor pictures is said to be left out;
the book's title from its metadata. Navigation documents (the table of contents: EPUB 3's nav,
EPUB 2's NCX, and the contents page an EPUB 2 book's guide names), the cover, images, styles
and fonts are not read. A book protected by DRM (META-INF/encryption.xml encrypting more than
fonts, whatever the algorithm: publishers obfuscate fonts in books that are otherwise open,
never their chapters) is refused with a
`DocumentError`, and so is one with no text. Lines are the book's text's own: a chapter's file
lines would mean nothing to its reader.

This module only reads a book's bytes: it never tokenizes, never touches the model or the
store, and never writes the book.
"""

from __future__ import annotations

import io
import posixpath
import re
import zipfile
import zlib
from collections.abc import Callable
from typing import Protocol
from urllib.parse import unquote
from xml.etree import ElementTree

from ..errors import DocumentError
from .office import Book

# How publishers obfuscate the fonts of a book that is otherwise open (IDPF's and Adobe's).
_FONT_OBFUSCATION = {"http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC"}
_FONT_SUFFIXES = (".ttf", ".otf", ".woff", ".woff2")
_DOCUMENT_SUFFIXES = (".xhtml", ".html", ".htm", ".xml", ".svg", ".ncx", ".opf")
_ENC = "{http://www.w3.org/2001/04/xmlenc#}"
# A chapter with no text but these is a picture: a cover, a plate, a comic's page.
_PICTURES = re.compile(rb"<(?:\w+:)?(?:img|image|svg|object|video)\b", re.IGNORECASE)


class Chapter(Protocol):
    text: str  # normalized
    headings: tuple[tuple[int, int, int, str], ...]  # (start, end in `text`, level, title)


def read(data: bytes, name: str, warnings: list[str],
         chapter: Callable[[bytes, str], Chapter]) -> Book:
    """The text of the EPUB book `data` (named `name` in what is said), or DocumentError;
    `chapter` reads a chapter's XHTML bytes (named by the second argument in what it says)."""
    from ebooklib import ITEM_DOCUMENT, epub

    _refuse_drm(data, name)
    try:
        book = epub.read_epub(io.BytesIO(data), {"ignore_ncx": True})
    # ebooklib raises whatever its parsing meets in a damaged book (a KeyError for a missing
    # chapter, an IndexError for a nav without a list, lxml's syntax errors): each is the
    # book's damage to report, not kvdesk's failure.
    except Exception as e:
        raise DocumentError(f"{name}: the EPUB book cannot be read: it is damaged "
                            f"({type(e).__name__}: {e})") from e
    titles = [value for value, _ in book.get_metadata("DC", "title") if (value or "").strip()]
    # An EPUB 2 book's contents page is a chapter of its spine like any other: its guide
    # names it.
    # (its href as written, "Text/toc%20page.xhtml" or "./toc.xhtml"; ebooklib's file names
    # are unquoted)
    contents = {posixpath.normpath(unquote((g.get("href") or "").split("#")[0]))
                for g in book.guide if g.get("type") == "toc" and g.get("href")}
    parts, headings, offset = [], [], 0
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        if (item is None or isinstance(item, epub.EpubNav) or item.get_type() != ITEM_DOCUMENT
                or "nav" in (getattr(item, "properties", None) or ())
                or posixpath.normpath(item.file_name) in contents):
            continue
        # (its bytes as the book holds them, not ebooklib's `get_content()`: that re-parses a
        # chapter as UTF-8, replacing what is not without a word, and gives nothing back for
        # one it cannot parse, a UTF-16 chapter among them)
        raw = item.content if isinstance(item.content, bytes) else item.get_content()
        try:
            page = chapter(raw, f"{name}: {item.file_name}")
        except DocumentError as e:  # a chapter that is not text: the others are still read
            warnings.append(f"{e}; left out")
            continue
        # (a chapter's text is normalized, but for the spaces its last line may end with)
        text = page.text.rstrip()
        if not text.strip():
            if not _PICTURES.search(raw):  # (a cover or a plate: nothing is left out)
                warnings.append(f"{name}: {item.file_name}: the chapter has no text; left out")
            continue
        if parts:
            offset += 2
        headings += [(offset + start, offset + min(end, len(text)), level, title)
                     for start, end, level, title in page.headings if start < len(text)]
        parts.append(text)
        offset += len(text)
    if not parts:
        raise DocumentError(f"{name}: the EPUB book has no text (its chapters are empty, or "
                            "images only)")
    return Book("\n\n".join(parts), " ".join(titles[0].split()) if titles else None,
                tuple(headings))


def _refuse_drm(data: bytes, name: str) -> None:
    """DocumentError for a book whose chapters are encrypted (DRM), not just its fonts."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if "META-INF/encryption.xml" not in z.namelist():
                return
            root = ElementTree.fromstring(z.read("META-INF/encryption.xml"))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, EOFError,
            RuntimeError, ElementTree.ParseError) as e:  # (RuntimeError: a member zip-encrypted)
        raise DocumentError(f"{name}: the EPUB book cannot be read: it is damaged ({e})") from e
    for entry in root.iter(f"{_ENC}EncryptedData"):
        method = entry.find(f"{_ENC}EncryptionMethod")
        algorithm = method.get("Algorithm", "") if method is not None else ""
        reference = entry.find(f"{_ENC}CipherData/{_ENC}CipherReference")
        uri = (reference.get("URI", "") if reference is not None else "").lower()
        # A font, whatever hides it; or what a font's obfuscation hides, but for a document
        # (a chapter "obfuscated" is as unreadable as one encrypted)
        if not (uri.endswith(_FONT_SUFFIXES) or (algorithm in _FONT_OBFUSCATION
                                                 and not uri.endswith(_DOCUMENT_SUFFIXES))):
            raise DocumentError(f"{name}: the EPUB book is protected by DRM (its text is "
                                "encrypted); kvdesk reads only DRM-free books")
