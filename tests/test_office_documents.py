"""Word documents (.docx) and EPUB books: their text in order with their headings, tables and
lists; passages cited under their sections; a clear message for each bad or unsupported file.
The files are made here with python-docx and ebooklib themselves."""

from __future__ import annotations

import io
import re
import zipfile
from urllib.parse import quote

import docx
import pytest
from ebooklib import epub

from desktop_app.chat.documents import DocumentError, extract
from desktop_app.formats import office
from desktop_app.passages.split import split


def words(text: str) -> int:
    return len(text.split())


def make_docx(path, build) -> str:
    document = docx.Document()
    build(document)
    document.save(path)
    return path


def make_epub(path, chapters, *, title="The  Long Voyage", order=None, nav=True,
              contents: bool | str = False) -> str:
    """A book of (heading, body HTML) chapters; `order`: the spine's order of them."""
    book = epub.EpubBook()
    book.set_identifier("kvdesk-test")
    book.set_title(title)
    book.set_language("en")
    items = []
    for i, (heading, body) in enumerate(chapters, 1):
        item = epub.EpubHtml(title=heading, file_name=f"ch{i}.xhtml", lang="en")
        head = f"<h1>{heading}</h1>" if heading else ""
        item.content = (f"<html><head><title>{heading}</title></head><body>{head}{body}"
                        "</body></html>")
        book.add_item(item)
        items.append(item)
    book.toc = items
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = (["nav"] if nav else []) + [items[i] for i in (order or range(len(items)))]
    if contents:  # an EPUB 2 book's contents page, named by its guide (its name, or True)
        named = contents if isinstance(contents, str) else "toc.xhtml"
        page = epub.EpubHtml(title="Contents", file_name=named, lang="en")
        page.content = ("<html><head><title>Contents</title></head><body><h1>Contents</h1>"
                        + "".join(f"<p>{h}</p>" for h, _ in chapters) + "</body></html>")
        book.add_item(page)
        book.spine.insert(0, page)
        book.guide.append({"type": "toc", "href": quote(named), "title": "Contents"})
    epub.write_epub(str(path), book)
    return path


def contract(document):
    document.core_properties.title = "Service Agreement"
    document.sections[0].header.paragraphs[0].text = "CONFIDENTIAL - page header"
    document.add_paragraph("Service Agreement", style="Title")
    document.add_heading("Definitions", level=1)
    document.add_paragraph("The Supplier means ACME Ltd.")
    document.add_paragraph("")
    document.add_paragraph("   ")
    document.add_paragraph("deliver the parts", style="List Number")
    document.add_paragraph("invoice them", style="List Number")
    document.add_paragraph("a bullet point", style="List Bullet")
    document.add_heading("Payment terms", level=2)
    document.add_paragraph("Invoices are paid within 30 days.")
    document.add_heading("Fine print", level=8)
    document.add_paragraph("Nothing else.")


def test_docx_paragraphs_headings_and_lists_in_order(tmp_path):
    doc = extract(make_docx(tmp_path / "contract.docx", contract))
    assert doc.kind == "docx" and doc.title == "Service Agreement" and not doc.warnings
    assert doc.text.split("\n\n") == [
        "Service Agreement", "Definitions", "The Supplier means ACME Ltd.",
        "1. deliver the parts\n2. invoice them\n- a bullet point", "Payment terms",
        "Invoices are paid within 30 days.", "Fine print", "Nothing else."]
    assert "CONFIDENTIAL" not in doc.text  # (a header: the same line on every page)
    assert [(level, title) for _, _, level, title in doc.headings] == [
        (1, "Service Agreement"), (1, "Definitions"), (2, "Payment terms"), (6, "Fine print")]
    assert all(doc.text[start:end] == title for start, end, _, title in doc.headings)


def test_docx_tables_as_records_or_rows(tmp_path):
    def build(document):
        document.add_paragraph("Prices follow.")
        table = document.add_table(rows=3, cols=3)
        for r, row in enumerate([["Item", "Price", "Due"], ["Setup", "500 EUR", "March"],
                                 ["Support", "90 EUR", "monthly"]]):
            for c, value in enumerate(row):
                table.cell(r, c).text = value
        bare = document.add_table(rows=2, cols=2)  # no header row: numbers first
        for r, row in enumerate([["12", "first"], ["13", "second"]]):
            for c, value in enumerate(row):
                bare.cell(r, c).text = value
        document.add_paragraph("After the tables.")

    doc = extract(make_docx(tmp_path / "prices.docx", build))
    assert doc.text == ("Prices follow.\n\nColumns: Item, Price, Due\n"
                        "Item: Setup | Price: 500 EUR | Due: March\n"
                        "Item: Support | Price: 90 EUR | Due: monthly\n\n"
                        "12 | first\n13 | second\n\nAfter the tables.")


def test_epub_chapters_in_spine_order_with_headings_and_no_toc(tmp_path):
    path = make_epub(tmp_path / "voyage.epub", [
        ("Chapter One", "<p>It began at sea.</p><h2>A storm</h2><p>Waves rose.</p>"),
        ("Chapter Two", "<p>The harbour at last.</p>")], order=[1, 0], contents=True)
    doc = extract(path)
    assert doc.kind == "epub" and doc.title == "The Long Voyage"
    assert doc.text == ("Chapter Two\n\nThe harbour at last.\n\nChapter One\n\n"
                        "It began at sea.\n\nA storm\n\nWaves rose.")  # no nav, no contents
    assert [(doc.text[s:e], level) for s, e, level, _ in doc.headings] == [
        ("Chapter Two", 1), ("Chapter One", 1), ("A storm", 2)]


def with_entry(path, name: str, data: str) -> None:
    with zipfile.ZipFile(path, "a") as z:
        z.writestr(name, data)


ENCRYPTION = """<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container"
  xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>
  <enc:EncryptionMethod Algorithm="{algorithm}"/>
  <enc:CipherData><enc:CipherReference URI="{uri}"/></enc:CipherData>
</enc:EncryptedData></encryption>"""


def test_epub_with_drm_is_refused_but_obfuscated_fonts_are_read(tmp_path):
    path = make_epub(tmp_path / "locked.epub", [("One", "<p>Text.</p>")])
    with_entry(path, "META-INF/encryption.xml", ENCRYPTION.format(
        algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc", uri="EPUB/ch1.xhtml"))
    with pytest.raises(DocumentError, match="locked.epub: the EPUB book is protected by DRM"):
        extract(path)
    fonts = make_epub(tmp_path / "fonts.epub", [("One", "<p>Text.</p>")])
    with_entry(fonts, "META-INF/encryption.xml", ENCRYPTION.format(
        algorithm="http://www.idpf.org/2008/embedding", uri="EPUB/fonts/serif.otf"))
    assert extract(fonts).text == "One\n\nText."
    # (a chapter hidden as fonts are is no more readable than one encrypted)
    hidden = make_epub(tmp_path / "hidden.epub", [("One", "<p>Text.</p>")])
    with_entry(hidden, "META-INF/encryption.xml", ENCRYPTION.format(
        algorithm="http://www.idpf.org/2008/embedding", uri="EPUB/ch1.xhtml"))
    with pytest.raises(DocumentError, match="hidden.epub: the EPUB book is protected by DRM"):
        extract(hidden)


def _truncated(tmp_path):
    whole = make_docx(tmp_path / "whole.docx", contract)
    data = open(whole, "rb").read()
    (tmp_path / "cut.docx").write_bytes(data[:len(data) // 2])
    return tmp_path / "cut.docx"


def _other_zip(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("readme.txt", "an archive")
    (tmp_path / "archive.docx").write_bytes(buffer.getvalue())
    return tmp_path / "archive.docx"


def _encrypted(tmp_path):
    # What Word writes for a password-protected document: an OLE container (not a ZIP) whose
    # directory names an "EncryptedPackage" stream (names are UTF-16).
    (tmp_path / "secret.docx").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(500)
                                           + "EncryptedPackage".encode("utf-16-le"))
    return tmp_path / "secret.docx"


def _legacy_doc(tmp_path):
    (tmp_path / "old.doc").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(500)
                                       + "WordDocument".encode("utf-16-le"))
    return tmp_path / "old.doc"


def _odt(tmp_path):
    with zipfile.ZipFile(tmp_path / "letter.odt", "w") as z:
        z.writestr("mimetype", "application/vnd.oasis.opendocument.text")
        z.writestr("content.xml", "<office:document-content/>")
    return tmp_path / "letter.odt"


def _rtf(tmp_path):
    (tmp_path / "memo.rtf").write_text(r"{\rtf1\ansi\deff0 {\fonttbl {\f0 Times;}} Hello}")
    return tmp_path / "memo.rtf"


def _text_named_docx(tmp_path):
    (tmp_path / "notes.docx").write_text("plain notes, renamed")
    return tmp_path / "notes.docx"


def rezipped(source, path, edit) -> str:
    """`source`'s archive written to `path`, each entry's bytes through `edit(name, data)`."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(path, "w") as new:
        for name in old.namelist():
            new.writestr(name, edit(name, old.read(name)))
    return path


def _bad_content_types(tmp_path):
    # python-docx met it with an AttributeError, which reached the user as a traceback.
    return rezipped(make_docx(tmp_path / "whole.docx", contract), tmp_path / "types.docx",
                    lambda name, data: b"<Types/>" if name == "[Content_Types].xml" else data)


def _no_body(tmp_path):
    # (a TypeError, as python-docx met it)
    empty = (b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/'
             b'main"/>')
    return rezipped(make_docx(tmp_path / "whole.docx", contract), tmp_path / "nobody.docx",
                    lambda name, data: empty if name == "word/document.xml" else data)


def _empty_epub(tmp_path):
    return make_epub(tmp_path / "pictures.epub", [("", "<p> </p><img src='a.png'/>")])


@pytest.mark.parametrize("make, message", [
    (_text_named_docx, "notes.docx: the file cannot be read as a Word document: it is not a "
                       "ZIP archive"),
    (_truncated, "cut.docx: the Word document cannot be read: it is not a complete ZIP "
                 "archive"),
    (_other_zip, "archive.docx: a ZIP archive, but without a Word document's contents"),
    (_encrypted, "secret.docx: the document is encrypted (password-protected)"),
    (_bad_content_types, "types.docx: the Word document cannot be read: it is damaged "
                         "(AttributeError: "),
    (_no_body, "nobody.docx: the Word document cannot be read: it is damaged (its "
               "document.xml has no body)"),
    (_empty_epub, "pictures.epub: the EPUB book has no text"),
    (_legacy_doc, "old.doc: a Word 97-2003 document (.doc) is not supported; save it as .docx "
                  "or PDF"),
    (_odt, "letter.odt: an OpenDocument text (.odt) is not supported; save it as .docx or PDF"),
    (_rtf, "memo.rtf: a Rich Text Format document (.rtf) is not supported; save it as .docx"),
])
def test_bad_or_unsupported_files_say_what_they_are(tmp_path, make, message):
    with pytest.raises(DocumentError) as caught:
        extract(make(tmp_path))
    assert str(caught.value).startswith(message)


def test_a_long_docx_becomes_passages_under_their_sections(tmp_path):
    def build(document):
        document.add_paragraph("Master Services Agreement", style="Title")
        for article in range(1, 13):
            document.add_heading(f"Article {article}", level=1)
            for section in range(1, 4):
                document.add_heading(f"Section {article}.{section}", level=2)
                for k in range(4):
                    document.add_paragraph(
                        f"Clause {article}.{section}.{k}: the parties agree that the terms "
                        f"of schedule {article * k} apply to deliveries made in region "
                        f"{section + k}, unless agreed otherwise in writing.")
                if (article, section) == (9, 2):
                    document.add_paragraph("The liability cap is four million euros.")

    doc = extract(make_docx(tmp_path / "msa.docx", build))
    passages = split(doc.text, doc.kind, words, headings=doc.headings, line_numbers=doc.lines,
                     target=120, limit=240)
    assert len(passages) > 30
    cap = next(p for p in passages if "liability cap" in p.text)
    assert cap.heading == ("Article 9", "Section 9.2")
    assert all(p.text == doc.text[p.start:p.end] for p in passages)


def test_a_docx_without_styles_or_numbering_is_read(tmp_path):
    """Word always writes both parts; other tools may not (python-docx would make a default
    of the one and fail on the other)."""
    whole = make_docx(tmp_path / "whole.docx", contract)
    bare = tmp_path / "bare.docx"
    with zipfile.ZipFile(whole) as src, zipfile.ZipFile(bare, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename in ("word/styles.xml", "word/numbering.xml"):
                continue
            if item.filename == "word/_rels/document.xml.rels":
                data = re.sub(rb'<Relationship [^>]*Target="(styles|numbering)\.xml"/>', b"",
                              data)
            dst.writestr(item, data)
    doc = extract(bare)
    assert doc.kind == "docx" and "deliver the parts\ninvoice them" not in doc.text
    assert doc.text.split("\n\n")[:3] == ["Service Agreement", "Definitions",
                                          "The Supplier means ACME Ltd."]
    assert doc.headings == ()  # (its paragraphs name styles it no longer defines)


def with_zeros(path, member: str, megabytes: int) -> None:
    """`member` added to the archive: `megabytes` of zeros, which deflate packs about
    1000:1 (written a megabyte at a time, never held whole)."""
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as z, \
            z.open(member, "w", force_zip64=True) as entry:
        for _ in range(megabytes):
            entry.write(bytes(1 << 20))


def test_a_zip_bomb_is_refused_before_it_is_unpacked(tmp_path, monkeypatch):
    # python-docx and ebooklib read every part whole: the sizes the archive declares decide.
    huge = make_docx(tmp_path / "huge.docx", contract)
    with_zeros(huge, "word/media/blank.bin", 210)  # beyond the most text a file gives
    assert (tmp_path / "huge.docx").stat().st_size < 2_000_000
    with pytest.raises(DocumentError, match=r"huge.docx: the archive's word/media/blank.bin "
                       r"expands to 220\.[0-9] MB from 214\.[0-9] KB: refused, as a zip bomb "
                       "would be"):
        extract(huge)
    packed = make_epub(tmp_path / "packed.epub", [("One", "<p>Text.</p>")])
    with_zeros(packed, "EPUB/images/cover.png", 20)  # packed 1000:1
    with pytest.raises(DocumentError, match="packed.epub: the archive's EPUB/images/cover.png "
                       r"expands to 21\.[0-9] MB from 2[0-9]\.[0-9] KB: refused"):
        extract(packed)
    monkeypatch.setattr(office, "MAX_EXPANDED_BYTES", 10_000)  # (1 GiB, all told)
    with pytest.raises(DocumentError, match=r"many.docx: the archive expands to [0-9.]+ KB: "
                       "refused, as a zip bomb would be"):
        extract(make_docx(tmp_path / "many.docx", contract))


def test_epub_chapters_are_read_in_their_own_encoding_and_said(tmp_path):
    book = make_epub(tmp_path / "book.epub", [("One", "<p>alpha</p>"), ("Two", "<p>beta</p>"),
                                              ("", "<p> </p>")])

    def encoded(name, data):  # chapter one in Windows-1252, chapter two in UTF-16
        if name.endswith("ch1.xhtml"):
            return data.replace(b"alpha", "caf\xe9 \u2014 na\xefve".encode("cp1252"))
        if name.endswith("ch2.xhtml"):
            return data.decode().replace("utf-8", "utf-16").encode("utf-16")
        return data

    doc = extract(rezipped(book, tmp_path / "old.epub", encoded))
    # (ebooklib's own reading made U+FFFD of the first without a word and dropped the second)
    assert doc.text == "One\n\ncaf\xe9 \u2014 na\xefve\n\nTwo\n\nbeta"
    assert any(w.startswith("old.epub: ch1.xhtml: not UTF-8; read as cp1252")
               for w in doc.warnings)
    assert "old.epub: ch3.xhtml: the chapter has no text; left out" in doc.warnings


def test_a_contents_page_named_with_a_space_is_not_read(tmp_path):
    # (its guide's href is URL-encoded, "toc%20page.xhtml")
    book = make_epub(tmp_path / "spaced.epub", [("One", "<p>alpha</p>")],
                     contents="toc page.xhtml")
    assert extract(book).text == "One\n\nalpha"
