"""Document extraction: each kind of file, and a clear message for each kind of bad file."""

from __future__ import annotations

import os
import re

import pytest
from pdf_helpers import make_pdf as make_pdf_pages

from desktop_app.chat import documents
from desktop_app.chat.documents import DocumentError, extract


def make_pdf(path, lines):
    """A minimal, valid one-page PDF with a text layer (Helvetica)."""
    return make_pdf_pages(path, [lines])


def test_text_markdown_and_code(tmp_path):
    (tmp_path / "a.txt").write_text("Hello\r\nworld\n\n\n\nbye   \n")
    doc = extract(tmp_path / "a.txt")
    assert doc.text == "Hello\nworld\n\nbye" and doc.kind == "text" and doc.title == "a.txt"
    (tmp_path / "b.md").write_text("# Title\n\nSome *text*.")
    assert extract(tmp_path / "b.md").kind == "markdown"
    (tmp_path / "c.py").write_text("def f():\n    return 1\n")
    code = extract(tmp_path / "c.py")
    assert code.kind == "code" and "    return 1" in code.text
    (tmp_path / "LICENSE").write_text("Permission is hereby granted")
    assert extract(tmp_path / "LICENSE").kind == "text"
    assert not doc.warnings and len(doc.content_hash) == 64


def test_html_visible_text(tmp_path):
    (tmp_path / "p.html").write_text(
        "<!DOCTYPE html><html><head><title>The  Page</title><style>p{color:red}</style>"
        "<script>var secret = 1;</script></head><body><h1>Heading</h1><p>First &amp; "
        "second.</p><noscript>enable js</noscript><p>Third</p></body></html>")
    doc = extract(tmp_path / "p.html")
    assert doc.kind == "html" and doc.title == "The Page"
    assert "Heading" in doc.text and "First & second." in doc.text and "Third" in doc.text
    assert "secret" not in doc.text and "color" not in doc.text and "enable js" not in doc.text


def test_pdf(tmp_path):
    doc = extract(make_pdf(tmp_path / "d.pdf", ["Attention sinks matter.", "Second line."]))
    assert doc.kind == "pdf" and "Attention sinks matter." in doc.text


@pytest.mark.parametrize("text, encoding", [
    ("café au lait", "latin-1"),  # too short to detect: Windows-1252 is assumed
    ("Le café est très apprécié. Où est la bibliothèque? Déjà vu.", "latin-1"),
    ("Привет, как дела? Сегодня хорошая погода, и мы идём гулять в парк.", "cp1251"),
    ("Señor Müller paid 20€ for the naïve résumé.", "cp1252"),
    ("Příliš žluťoučký kůň úpěl ďábelské ódy. Večer jsme šli do kina a potom na "
     "večeři. Počasí bylo krásné a všichni byli spokojení.", "cp1250"),
    # bytes that form valid UTF-8 by chance, 3-byte ones too ("дії", "会议"): still legacy
    ("Ці дії неможливо скасувати. Відкрити файл? Ні, спершу збережіть зміни у документі.",
     "cp1251"),
    ("会议将于星期一上午十点开始。请提前阅读材料。", "gbk"),
    ("会議は月曜日の午前十時から始まります。資料を事前に読んでおいてください。", "shift_jis"),
])
def test_legacy_encodings_keep_their_accents_and_say_so(tmp_path, text, encoding):
    (tmp_path / "legacy.txt").write_bytes(text.encode(encoding))
    doc = extract(tmp_path / "legacy.txt")
    assert doc.text == text
    assert len(doc.warnings) == 1 and "not UTF-8; read as" in doc.warnings[0]


def test_utf8_with_a_stray_byte_stays_utf8_and_the_byte_is_read_as_windows_1252(tmp_path):
    """A line pasted from an older file must not turn the whole document into mojibake."""
    text = "Die Zürcher Straßenbahn fährt um 08:30 ab. 東京 — naïve.\n" * 40
    half = len(text.encode()) // 2
    (tmp_path / "mixed.txt").write_bytes(text.encode()[:half] + "Café\n".encode("latin-1")
                                         + text.encode()[half:])
    doc = extract(tmp_path / "mixed.txt")
    assert doc.text.startswith(text[:200]) and "Café" in doc.text and "\ufffd" not in doc.text
    assert doc.warnings == ["mixed.txt: UTF-8 but for 1 stray byte sequence(s), each byte "
                            "read as cp1252"]


@pytest.mark.parametrize("name, data, text, warning", [
    # Two UTF-8 characters (one of three bytes, on lines of their own) and six stray bytes
    # from a pasted Windows-1252 line: UTF-8 still, not "â€”" and "cafÃ©".
    ("mixed2.txt", b"Meeting notes \xe2\x80\x94 Monday\n\nWe met at the caf\xc3\xa9 downtown.\n"
     b"Pasted from the old memo: \x93Ship it by Friday\x94 and don\x92t forget the "
     b"d\xe9p\xf4t.\nBudget: 5\x80 per unit.\n",
     "Meeting notes — Monday\n\nWe met at the café downtown.\nPasted from the old memo: "
     "“Ship it by Friday” and don’t forget the dépôt.\nBudget: 5€ per unit.",
     "mixed2.txt: UTF-8 but for 6 stray byte sequence(s), each byte read as cp1252"),
    # One 2-byte character proves nothing by itself, but where the stray bytes are read as
    # Windows-1252 anyway, it is kept as the UTF-8 it is.
    ("m.txt", b"We met at the caf\xc3\xa9 downtown.\nPasted: \x93Ship it\x94 and don\x92t "
     b"forget.\n",
     "We met at the café downtown.\nPasted: “Ship it” and don’t forget.",
     "m.txt: not UTF-8 but for 1 character(s); the rest read as cp1252 (assumed); if letters "
     "look wrong, save the file as UTF-8"),
    # As Notepad long wrote: a UTF-8 mark, then Windows-1252 bytes. Its letters are kept.
    ("bom.txt", b"\xef\xbb\xbfUTF-8 with BOM and a stray byte: caf\xe9 and na\xefve and more "
     b"plain text here.\n",
     "UTF-8 with BOM and a stray byte: café and naïve and more plain text here.",
     "bom.txt: UTF-8 but for 2 stray byte sequence(s), each byte read as cp1252"),
], ids=["utf8-beside-a-pasted-line", "one-utf8-character-in-cp1252", "strays-behind-a-mark"])
def test_utf8_with_stray_bytes_keeps_what_each_part_is(tmp_path, name, data, text, warning):
    (tmp_path / name).write_bytes(data)
    doc = extract(tmp_path / name)
    assert doc.text == text
    assert doc.warnings == [warning]


def test_pdf_reader_complaints_become_warnings(tmp_path, capsys):
    pdf = make_pdf(tmp_path / "d.pdf", ["Attention sinks matter."])
    data = pdf.read_bytes()
    at = re.search(rb"startxref\s+(\d+)", data)
    # A wrong cross-reference offset: the reader repairs it, and complains.
    (tmp_path / "damaged.pdf").write_bytes(
        data[:at.start(1)] + str(int(at.group(1)) + 7).encode() + data[at.end(1):])
    doc = extract(tmp_path / "damaged.pdf")
    assert "Attention sinks matter." in doc.text
    assert capsys.readouterr().err == ""
    assert doc.warnings and all(w.startswith("damaged.pdf: the PDF reader says")
                                for w in doc.warnings)


def test_utf16_with_bom(tmp_path):
    (tmp_path / "w.txt").write_bytes("\ufeffWindows text".encode("utf-16-le"))
    got = extract(tmp_path / "w.txt")
    assert got.text == "Windows text" and not got.warnings  # the BOM says it: nothing guessed
    # a lone surrogate at the end: replaced, and said
    (tmp_path / "w.txt").write_bytes("\ufeffWindows text".encode("utf-16-le") + b"\x00\xd8")
    got = extract(tmp_path / "w.txt")
    assert got.text == "Windows text\ufffd"
    assert got.warnings == ["w.txt: 1 byte sequence(s) not valid UTF-16 (replaced with \ufffd)"]


ELF_HEAD = (b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00>\x00\x01\x00\x00\x00`\x10"
            + bytes(6) + b"@" + bytes(7) + b"\xf0:" + bytes(10) + b"@\x008\x00\r\x00@\x00'\x00&\x00"
            + bytes(range(256)) * 4)


@pytest.mark.parametrize("bom", [b"\xff\xfe", b"\xfe\xff", b"\xef\xbb\xbf"])
def test_binary_data_after_a_byte_order_mark_is_refused(tmp_path, bom):
    """A byte order mark says how text is encoded, not that what follows is text: binary
    data after one (NULs, control bytes) is refused as any binary file is, not read as CJK."""
    (tmp_path / "blob.txt").write_bytes(bom + ELF_HEAD)
    with pytest.raises(DocumentError, match="blob.txt: this is a binary file, not a text"):
        extract(tmp_path / "blob.txt")


@pytest.mark.parametrize("text", [
    "这是一份测试文档。渡轮每天早上七点十五分出发。\n" * 20,  # CJK: every character non-Latin
    "フェリーは平日の朝七時十五分に出発します。\n" * 20,
    "این یک متن آزمایشی است. می‌خواهم بنویسم.\n" * 20,  # with zero-width non-joiners
    "Family: 👨‍👩‍👧, flag: 🏳️‍🌈.\n" * 20,  # emoji joined by format characters
])
@pytest.mark.parametrize("enc", ["utf-16-le", "utf-16-be"])
def test_utf16_text_of_any_script_with_a_bom_is_read(tmp_path, text, enc):
    (tmp_path / "t.txt").write_bytes(("\ufeff" + text).encode(enc))
    got = extract(tmp_path / "t.txt")
    assert got.text == text.strip() and not got.warnings


def test_utf32_and_a_legacy_text_behind_a_utf8_mark_are_read(tmp_path):
    text = "Café notes: the ferry leaves at 07:15.\n" * 5
    (tmp_path / "wide.txt").write_bytes(text.encode("utf-32"))  # (its mark begins UTF-16's)
    assert extract(tmp_path / "wide.txt").text == text.strip()
    russian = "Паром отходит в 7:15 по будням.\n" * 5
    (tmp_path / "ru.txt").write_bytes(b"\xef\xbb\xbf" + russian.encode("cp1251"))
    got = extract(tmp_path / "ru.txt")  # not "binary": read in its own encoding, and said
    assert got.text == russian.strip() and "not valid UTF-8-SIG" in got.warnings[0]


@pytest.mark.parametrize("enc", ["utf-16-le", "utf-16-be"])
def test_utf16_without_bom_is_read_and_said(tmp_path, enc):
    text = "Caf\u00e9 notes.\nThe ferry leaves at 07:15 on weekdays.\n" * 3
    (tmp_path / "n.txt").write_bytes(text.encode(enc))
    got = extract(tmp_path / "n.txt")
    assert got.text == text.strip()
    assert got.warnings == [f"n.txt: no byte order mark; read as {enc.upper()}, which its "
                            "bytes are"]


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("empty.txt", b"", "empty"),
        ("blank.txt", b"  \n\t\n", "no text"),
        ("img.png", b"\x89PNG\r\n\x1a\n" + bytes(50), "PNG image"),
        ("blob.dat", b"\x01\x02\x00\x03" * 10, "binary file"),
        ("a.docx", b"PK\x03\x04" + bytes(30), "ZIP archive"),
        ("broken.pdf", b"%PDF-1.4\nthis is not a pdf", "cannot be read"),
    ],
)
def test_bad_files_say_why(tmp_path, name, data, message):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DocumentError, match=message):
        extract(tmp_path / name)


@pytest.mark.parametrize("make, message", [
    (lambda pdf: pdf[:len(pdf) // 2], "incomplete, cut off before its end"),
    (lambda pdf: pdf[:100], "incomplete, cut off before its end"),
    (lambda pdf: bytes(range(256)) * 20, "does not begin as a PDF does"),
    (lambda pdf: b"%PDF-1.4\n" + bytes(range(256)) * 20, "the file is damaged"),
])
def test_a_cut_off_or_damaged_pdf_says_which(tmp_path, make, message):
    # Both used to say only "the PDF cannot be read (Stream has ended unexpectedly)".
    pdf = make_pdf(tmp_path / "ok.pdf", ["Attention sinks matter."]).read_bytes()
    (tmp_path / "bad.pdf").write_bytes(make(pdf))
    with pytest.raises(DocumentError, match=message) as raised:
        extract(tmp_path / "bad.pdf")
    assert "(the PDF reader says: " in str(raised.value)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(DocumentError, match="no such file"):
        extract(tmp_path / "nope.txt")
    (tmp_path / "empty").mkdir()  # (a folder is one document: tests/test_folders.py)
    with pytest.raises(DocumentError, match="empty: the folder has no readable file"):
        extract(tmp_path / "empty")


def test_a_file_too_large_says_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(documents, "MAX_FILE_BYTES", 1000)
    (tmp_path / "big.txt").write_text("x" * 2500)
    with pytest.raises(DocumentError, match=r"big.txt: 2.5 KB is too large to attach \(the "
                       r"most kvdesk reads is 1.0 KB\)"):
        extract(tmp_path / "big.txt")


def test_paths_that_are_no_readable_file_say_why(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(DocumentError, match="not a regular file"):
        extract(tmp_path / "pipe")  # never opened: reading a pipe would wait for a writer
    with pytest.raises(DocumentError, match="not a regular file"):
        extract("/dev/null")
    with pytest.raises(DocumentError, match="cannot be read .File name too long"):
        extract(tmp_path / ("a" * 300 + ".txt"))
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(DocumentError, match="cannot be read|no such file"):
        extract(tmp_path / "loop")


def test_a_file_whose_size_says_zero_is_read_all_the_same():
    # /proc's files report a size of 0 and hold text
    assert "Name:" in extract("/proc/self/status").text


def test_pdf_without_text_layer(tmp_path):
    with pytest.raises(DocumentError, match="no text layer"):
        extract(make_pdf(tmp_path / "scan.pdf", []))


def test_a_file_that_fails_to_read_in_any_way_is_not_changed(tmp_path, monkeypatch):
    # An attached file overwritten with one its reader fails on must not break `kvdesk docs`,
    # the window's list or an answer: the attached text stands.
    (tmp_path / "a.txt").write_text("Some text")
    assert documents.file_hash(str(tmp_path / "a.txt")) == extract(tmp_path / "a.txt").content_hash
    (tmp_path / "b.txt").write_text("Other text")

    def fails(path):
        raise AttributeError("a reader's own failure")

    monkeypatch.setattr(documents, "extract", fails)
    assert documents.file_hash(str(tmp_path / "b.txt")) is None
    assert not documents.changed_since(str(tmp_path / "b.txt"), "0" * 64, 0.0)
