"""PDFs made by hand for the tests: valid, with a text layer, no library needed."""

from __future__ import annotations

from pathlib import Path

# An outline entry: (level from 1, title, where it goes): a page index from 0, "uri" (an
# external link), None (no destination), "missing" (a page object that does not exist) or
# "loop" (no destination, and its /Next goes back to the first entry: a cycle).
Entry = tuple[int, str, "int | str | None"]


def make_pdf(path: Path, pages: list[list[str]], outline: list[Entry] | None = None) -> Path:
    """A valid PDF with one text line per string on each page (Helvetica), written by hand,
    and the `outline` (bookmarks) given, nested by level."""
    n = len(pages)
    root = 4 + 2 * n  # the outline's objects follow the pages'
    objs = [b"<< /Type /Catalog /Pages 2 0 R%s >>" % (b" /Outlines %d 0 R" % root
                                                     if outline else b""),
            b"<< /Type /Pages /Kids [%s] /Count %d >>"
            % (b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(n)), n),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, lines in enumerate(pages):
        text = " ".join(f"({s}) Tj 0 -14 Td" for s in lines)
        stream = f"BT /F1 12 Tf 72 720 Td {text} ET".encode()
        objs.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
                    b"/Resources << /Font << /F1 3 0 R >> >> >>" % (5 + 2 * i))
        objs.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    if outline:
        objs += _outline(outline, root)
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def _outline(entries: list[Entry], root: int) -> list[bytes]:
    """The outline dictionary (object `root`) and one object per entry after it."""
    number = {k: root + 1 + k for k in range(len(entries))}
    parent: dict[int, int] = {}  # entry -> its parent entry (-1: the outline itself)
    stack: list[tuple[int, int]] = []  # (level, entry)
    for k, (level, _, _) in enumerate(entries):
        while stack and stack[-1][0] >= level:
            stack.pop()
        parent[k] = stack[-1][1] if stack else -1
        stack.append((level, k))
    kids = {p: [k for k in parent if parent[k] == p] for p in (-1, *parent)}

    def links(k: int) -> bytes:
        mine = kids.get(k, [])
        return (b" /First %d 0 R /Last %d 0 R /Count %d" % (number[mine[0]], number[mine[-1]],
                                                            len(mine)) if mine else b"")

    objs = [b"<< /Type /Outlines%s >>" % links(-1)]
    for k, (_, title, goes) in enumerate(entries):
        siblings = kids[parent[k]]
        at = siblings.index(k)
        if isinstance(goes, int):
            dest = b" /Dest [%d 0 R /XYZ 0 792 0]" % (4 + 2 * goes)
        elif goes == "uri":
            dest = b" /A << /S /URI /URI (https://example.org/) >>"
        elif goes == "missing":
            dest = b" /Dest [9999 0 R /Fit]"
        else:
            dest = b""
        objs.append(b"<< /Title (%s) /Parent %d 0 R%s%s%s%s >>" % (
            title.encode(), number.get(parent[k], root),
            b" /Prev %d 0 R" % number[siblings[at - 1]] if at else b"",
            b" /Next %d 0 R" % number[siblings[at + 1]] if at + 1 < len(siblings) else
            b" /Next %d 0 R" % number[0] if goes == "loop" else b"",
            links(k), dest))
    return objs
