"""A file's bytes as the text its author wrote: which encoding they are in, and the text.

`decode` reads the mark a file begins with (UTF-8, UTF-16 or UTF-32), else UTF-16 without a
mark (zero bytes in its head), else UTF-8, else UTF-8 with a few stray bytes (a line pasted
from an older file: each stray byte read as Windows-1252), else the legacy encoding
charset-normalizer detects (or Windows-1252 when the text is too short to tell).
`utf8_evidence` and `looks_like_utf8` are the rule that tells the last two apart, measured on
real text by `benchmarks/utf8_strays.py` (RESULTS.md, "UTF-8 with stray bytes").

It must never guess silently: whatever is not read as the bytes say (a stray byte, an
encoding detected or assumed, a byte replaced with U+FFFD) is said in `warnings`. It only
decodes bytes it is given: it never opens files, never tokenizes, never touches the model or
the store.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from dataclasses import dataclass

import charset_normalizer

from ..errors import NotTextError

FALLBACK_ENCODING = "cp1252"  # Windows-1252: a superset of Latin-1's letters
# Magic numbers of common binary formats, named so the message can say what the file is.
BINARY_MAGIC = {
    b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image", b"GIF8": "a GIF image",
    b"PK\x03\x04": "a ZIP archive (or an Office document)", b"\x7fELF": "an executable",
    b"GGUF": "a model file", b"\x1f\x8b": "a gzip archive", b"%PDF": "a PDF",
    b"SQLite format 3": "a SQLite database", b"MZ": "a Windows executable",
}
_UTF8_MARK = b"\xef\xbb\xbf"


def decode(data: bytes, name: str, warnings: list[str]) -> str:
    """The text of a file's `data` (named `name` in what is said), or NotTextError for
    binary data; every guess is appended to `warnings`."""
    # (UTF-32's marks first: little-endian UTF-32's begins with UTF-16's.)
    for bom, enc in ((_UTF8_MARK, "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32"),
                     (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"),
                     (b"\xfe\xff", "utf-16")):
        if data.startswith(bom):  # says its encoding: nothing is guessed
            text = data.decode(enc, errors="replace")
            # (a BOM on binary data says nothing of it)
            if not _reads_as_text(text[:8192], behind_utf8=enc == "utf-8-sig"):
                raise NotTextError(f"{name}: this is a binary file, not a text document")
            bad = text.count("\ufffd") - data.decode(enc, errors="ignore").count("\ufffd")
            if bad and enc == "utf-8-sig":  # stray bytes, read as they are without the mark
                return _utf8_or_legacy(data[len(bom):], name, warnings, marked=True)
            if bad:
                warnings.append(f"{name}: {bad} byte sequence(s) not valid {enc.upper()} "
                                "(replaced with \ufffd)")
            return text
    head = data[:8192]
    for magic, what in BINARY_MAGIC.items():
        if head.startswith(magic):
            raise NotTextError(f"{name}: this is {what}, not a document kvdesk can read")
    if b"\x00" in head:
        if (enc := _bomless_utf16(head)) is not None:
            warnings.append(f"{name}: no byte order mark; read as {enc.upper()}, which its "
                            "bytes are")
            return data.decode(enc, errors="replace")
        raise NotTextError(f"{name}: this is a binary file, not a text document")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return _utf8_or_legacy(data, name, warnings, marked=False)


def _text_throughout(data: bytes, text: str, *, spaced: bool) -> bool:
    """Whether `text`, read from `data` that is not clean UTF-8, is text all through, not a
    text head on a binary body (an installer's script before its archive, a log with a dump
    appended): no NUL anywhere, text (`_reads_as_text`) at its start, middle and end, and, in
    a one-byte encoding (`spaced`), where nearly every byte reads as some letter, the
    whitespace every language written so puts between its words and lines."""
    if b"\x00" in data:
        return False
    step = max(1, (len(text) - 4096) // 4)
    if not all(_reads_as_text(text[i:i + 4096]) for i in range(0, max(1, len(text) - 4095),
                                                                step)):
        return False
    return not spaced or len(text) < 200 or sum(map(str.isspace, text)) >= 0.01 * len(text)


@dataclass(frozen=True)
class Utf8Evidence:
    """What a text that is not valid UTF-8 holds of UTF-8: its bytes (≥ 0x80) that are part
    of no valid sequence, and its valid 2-, 3- and 4-byte sequences."""
    strays: int
    two: int
    three: int
    four: int
    clean_long: int  # the 3- and 4-byte sequences on lines that have no stray byte

    @property
    def valid(self) -> int:
        return self.two + self.three + self.four


_STRAY_BYTE = re.compile("[\udc80-\udcff]")  # a byte `surrogateescape` could not decode
_TWO = re.compile("[\u0080-\u07ff]")
_THREE = re.compile("[\u0800-\udc7f\udd00-\uffff]")
_FOUR = re.compile("[\U00010000-\U0010ffff]")
_STRAY_LINE = re.compile("^.*[\udc80-\udcff].*$", re.MULTILINE)


def utf8_evidence(data: bytes) -> Utf8Evidence:
    text = data.decode("utf-8", errors="surrogateescape")
    strays = len(_STRAY_BYTE.findall(text))
    clean = _STRAY_LINE.sub("", text) if strays else text
    return Utf8Evidence(strays, len(_TWO.findall(text)), len(_THREE.findall(text)),
                        len(_FOUR.findall(text)),
                        len(_THREE.findall(clean)) + len(_FOUR.findall(clean)))


def _one_byte(encoding: str) -> bool:
    """Whether `encoding` reads each byte as one character (Windows-1251: yes; GBK: no)."""
    return len(bytes(range(128, 256)).decode(encoding, errors="replace")) == 128


def _without_valid(data: bytes) -> bytes:
    text = data.decode("utf-8", errors="surrogateescape")
    return _VALID.sub("", text).encode("utf-8", errors="surrogateescape")


_VALID = re.compile("[\u0080-\udc7f\udd00-\U0010ffff]")


def looks_like_utf8(ev: Utf8Evidence) -> bool:
    """Whether a text with stray bytes is UTF-8 all the same (the rest of it is).

    Legacy text forms valid UTF-8 sequences by chance (benchmarks/utf8_strays.py: 1 M
    messages of translation catalogs, 39 languages in 12 encodings), per 1,000 stray bytes:
    2-byte ones 0.05 in Western text in Windows-1252, up to 4 in Belarusian or Ukrainian in
    Windows-1251 and 150-250 in Japanese, Chinese or Korean in Shift-JIS, EUC-JP, GBK, Big5
    or EUC-KR; 3- and 4-byte ones 0.002, 0.45 and 7-41. So no count of them tells a short
    legacy text from UTF-8 with a pasted line, nor does "any 3-byte sequence" (a page of
    Ukrainian has one). Where they stand does: a pasted line brings its stray bytes along, so
    the file's own lines hold its UTF-8 and no stray byte, while legacy text's chance
    sequences sit among its other letters, stray bytes all. A 3- or 4-byte sequence on a
    line without a stray byte came by chance 3 times in 10 M stray bytes (at most 0.003 per
    1,000 in any encoding).

    So UTF-8, when either:
    - its valid sequences outnumber its stray bytes (legacy text: CJK snippets of a few
      characters, 0.1-0.6 % of single messages, as before), or
    - a 3- or 4-byte sequence stands on a line with no stray byte, at least 1 such per 1,000
      stray bytes (300 times what legacy text makes by chance).
    2-byte sequences on clean lines decide nothing alone: short lines of Chinese in GBK pair
    up so as often as twice their stray bytes. (`_utf8_or_legacy` keeps them where the rest
    is read as Windows-1252 anyway.)
    """
    return ev.valid > ev.strays or (ev.clean_long >= 1 and 1000 * ev.clean_long >= ev.strays)


def _utf8_or_legacy(data: bytes, name: str, warnings: list[str], *, marked: bool) -> str:
    """Text that is not valid UTF-8 (behind a UTF-8 mark when `marked`)."""
    ev = utf8_evidence(data)
    if not looks_like_utf8(ev):
        # A legacy encoding: detected when the text says enough about its language, else
        # Windows-1252, the most common one for Western text (a superset of Latin-1's
        # letters).
        encoding, how = _legacy_encoding(data)
        if ev.valid and encoding != FALLBACK_ENCODING and _one_byte(encoding) and \
                _legacy_encoding(_without_valid(data))[0] == FALLBACK_ENCODING:
            # the valid sequences' own bytes (0x8D of "č") ruled out the rest's Windows-1252
            # (never for CJK: taking them out would cut its characters in two)
            encoding = FALLBACK_ENCODING
        if encoding != FALLBACK_ENCODING or not (marked or ev.valid):
            text = data.decode(encoding, errors="replace")
            if not _text_throughout(data, text, spaced=_one_byte(encoding)):
                raise NotTextError(f"{name}: this is a binary file, not a text document")
            bad = text.count("\ufffd")
            warnings.append(f"{name}: "
                            + ("a UTF-8 byte order mark, but not valid UTF-8-SIG" if marked
                               else "not UTF-8")
                            + f"; read as {encoding} ({how})"
                            + (f", {bad} byte(s) of it not valid there (replaced with \ufffd)"
                               if bad else "")
                            + "; if letters look wrong, save the file as UTF-8")
            return text
        if not marked:
            # Windows-1252 all the same: read so, the text differs only where its bytes form
            # valid UTF-8, which Windows-1252 text does once in 20,000 stray bytes (and an
            # older file's mojibake, "cafÃ©", did as often): such a character is kept.
            text = data.decode("utf-8", errors=_STRAY)
            if not _text_throughout(data, text, spaced=True):
                raise NotTextError(f"{name}: this is a binary file, not a text document")
            warnings.append(f"{name}: not UTF-8 but for {ev.valid} character(s); the rest "
                            f"read as {encoding} ({how}); if letters look wrong, save the "
                            "file as UTF-8")
            return text
    # UTF-8 with a few stray bytes (a line pasted from an older file): each stray byte is
    # read as Windows-1252, the rest as the UTF-8 it is.
    text = data.decode("utf-8", errors=_STRAY)
    if not _text_throughout(data, text, spaced=False):
        raise NotTextError(f"{name}: this is a binary file, not a text document")
    sequences = data.decode("utf-8", errors="replace").count("\ufffd") - data.count(
        "\ufffd".encode())
    warnings.append(f"{name}: UTF-8 but for {sequences} stray byte sequence(s), each byte "
                    f"read as {FALLBACK_ENCODING}")
    return text


def _stray(e: UnicodeDecodeError) -> tuple[str, int]:
    """A byte that is not UTF-8, read as Windows-1252 (a codec error handler)."""
    return e.object[e.start:e.start + 1].decode(FALLBACK_ENCODING, errors="replace"), \
        e.start + 1


_STRAY = "kvdesk-stray-cp1252"
codecs.register_error(_STRAY, _stray)


def _bomless_utf16(head: bytes) -> str | None:
    """"utf-16-le" or "-be" for text saved so without a byte order mark: mostly Latin
    letters, so nearly every other byte is zero, on one side, and it decodes cleanly; else
    None (a binary file)."""
    even = head[:len(head) // 2 * 2]
    for enc, zeros in (("utf-16-le", even[1::2]), ("utf-16-be", even[0::2])):
        if len(zeros) >= 16 and zeros.count(0) >= 0.9 * len(zeros):
            try:
                text = even.decode(enc)
            except UnicodeDecodeError:
                continue
            if sum(c.isprintable() or c.isspace() for c in text) >= 0.98 * len(text):
                return enc
    return None


def _reads_as_text(text: str, *, behind_utf8: bool = False) -> bool:
    """Whether decoded `text` is text in some language: at most a tenth of its characters are
    control characters other than whitespace, unassigned or private code points, or bytes not
    valid in its encoding (U+FFFD). A text of any script has next to none (format characters
    such as emoji's joiners are text); binary data read as UTF-16 has a sixth or more. Text in
    a legacy encoding behind a UTF-8 mark is all U+FFFD, and none of the others: there those
    count only beside a few of the others (it is read, and said)."""
    odd = sum(unicodedata.category(c) in _NOT_TEXT and not c.isspace() for c in text)
    invalid = text.count("\ufffd") if not behind_utf8 or odd > 0.01 * len(text) else 0
    return odd + invalid <= 0.1 * len(text)


_NOT_TEXT = {"Cc", "Cn", "Co", "Cs"}


def _legacy_encoding(data: bytes) -> tuple[str, str]:
    """(encoding, "detected" or "assumed") of text that is not UTF-8.

    Windows-1252 is by far the most common legacy encoding of the texts people attach, and
    for a few accented letters charset-normalizer cannot tell it from a neighbour (measured:
    French and English samples ranked cp1257 or cp775 first). So it is kept whenever the
    detector finds it plausible at all, and the detector's choice wins only when it rules
    Windows-1252 out (Czech in cp1250, Russian in cp1251, Greek in cp1253...).
    """
    matches = charset_normalizer.from_bytes(data)
    if not matches or any(FALLBACK_ENCODING in m.could_be_from_charset for m in matches):
        return FALLBACK_ENCODING, "assumed"
    return matches.best().encoding, "detected"
