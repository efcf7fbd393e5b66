"""A folder attached as one document: its readable files one after another, each under its
path; what is left out said, counted; a long one answered from passages that name the file
and the lines within it."""

from __future__ import annotations

import gzip
import json
import os
import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from desktop_app.chat import documents
from desktop_app.chat.documents import extract
from desktop_app.errors import DocumentError
from desktop_app.formats import folders
from desktop_app.formats.gitignore import Ignore
from desktop_app.passages.retrieve import Hit
from desktop_app.passages.split import split
from desktop_app.results import DocumentInfo, Progress, Source, location
from tests import test_cli_ask_output

fake_app = test_cli_ask_output.fake_app  # (the fixture: the CLI's app over a given engine)


def code_base(root):
    (root / "src").mkdir(parents=True)
    (root / "src" / "db.py").write_text("import sqlite3\n\n\n\ndef connect(path):\n"
                                        "    return sqlite3.connect(path)\n")
    (root / "README.md").write_text("# Tool\n\nIt stores notes.\n\n## Setup\n\nRun it.\n")
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    (root / "notes.db").write_bytes(b"SQLite format 3\0" + bytes(100))
    (root / "debug.log").write_text("a log line\n")
    (root / ".gitignore").write_text("# logs\n*.log\n/out/\n")
    (root / "out").mkdir()
    (root / "out" / "gen.py").write_text("x = 1\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "dep.js").write_text("module.exports = 1\n")
    (root / "big.txt").write_text("x" * (folders.MAX_FILE_BYTES + 1))
    return root


def test_a_folder_reads_as_its_files_under_their_paths_and_says_what_it_left_out(tmp_path):
    found = extract(code_base(tmp_path / "tool"))
    assert found.kind == "folder" and found.title == "tool"
    assert found.text == ("File: README.md\n# Tool\n\nIt stores notes.\n\n## Setup\n\nRun it."
                          "\n\n\nFile: src/db.py\nimport sqlite3\n\n\n\ndef connect(path):\n"
                          "    return sqlite3.connect(path)")
    # each file under its path (a Markdown file's # headings are found in its text: `split`)
    assert [(level, title) for _, _, level, title in found.headings] == [
        (1, "README.md"), (1, "src/db.py")]
    assert all(found.text[a:b].endswith(t) for a, b, _, t in found.headings)
    # each line numbered within its own file (src/db.py's blank run kept)
    assert found.lines == (1, 1, 2, 3, 4, 5, 6, 7, 7, 7, 1, 1, 2, 3, 4, 5, 6)
    # (a .gitignore is the walk's rules, not content left out: never named)
    assert found.note == ("tool: 2 files read, 4 left out: 2 binary (logo.png, notes.db), "
                          "1 over 2.0 MB (big.txt), 1 ignored by "
                          ".gitignore (debug.log); 3 folders not read: 1 hidden (.git), 1 build "
                          "or dependency (node_modules), 1 ignored by .gitignore (out)")
    assert {"path": "node_modules/", "why": "build or dependency"} in found.left_out
    assert {"path": "logo.png", "why": "binary"} in found.left_out and len(found.left_out) == 7
    assert folders.file_count(found.text) == 2
    # the same unchanged folder is the same text: the same document
    assert extract(tmp_path / "tool").content_hash == found.content_hash


def test_a_folders_passages_name_its_file_and_never_span_two(tmp_path):
    found = extract(code_base(tmp_path / "tool"))
    passages = split(found.text, found.kind, lambda t: len(t) // 4, line_numbers=found.lines,
                     headings=found.headings, target=8, limit=16)
    files = [p.heading[0] for p in passages]
    assert files == sorted(files) and set(files) == {"README.md", "src/db.py"}
    assert all(p.page is None for p in passages)
    last = passages[-1]
    assert last.heading == ("src/db.py", "def connect(path):") and last.lines[1] == 6
    assert "connect" in last.text


def test_a_folder_with_nothing_readable_or_too_much_is_refused(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    (empty / ".git").mkdir(parents=True)
    (empty / "a.bin").write_bytes(b"\0\1\2")
    with pytest.raises(DocumentError, match=r"empty: the folder has no readable file to attach "
                                            r"\(0 files read, 1 left out: 1 binary \(a.bin\); "
                                            r"1 folder not read: 1 hidden \(.git\)\)"):
        extract(empty)
    monkeypatch.setattr(documents, "MAX_FILE_BYTES", 40)
    with pytest.raises(DocumentError, match="more than 40 B, the most kvdesk reads"):
        extract(code_base(tmp_path / "tool"))


def test_a_folders_notes_in_other_encodings_and_large_pdfs_are_read_as_alone(tmp_path,
                                                                             monkeypatch):
    """A note saved in a legacy encoding, a web page too, is read as attach reads it alone
    (the encoding said), not left out as binary; bytes no encoding reads as text are; a PDF
    larger than a text file may be is read (its bytes are mostly not its text)."""
    from pdf_helpers import make_pdf

    root = tmp_path / "notes"
    root.mkdir()
    russian = "Паром отходит в 7:15 по будням, кроме праздников.\n" * 4
    (root / "ru.txt").write_bytes(russian.encode("cp1251"))
    (root / "fr.html").write_bytes("<html><body><h1>Café</h1><p>Le bac part à 7 h.</p>"
                                   "</body></html>".encode("latin-1"))
    (root / "noise.dat").write_bytes(bytes([*range(1, 32), *range(128, 256)]) * 2)  # no NUL
    make_pdf(root / "report.pdf", [["The warranty lasts 7 years."]])
    most = (root / "report.pdf").stat().st_size - 1  # (the PDF is larger, the others not)
    assert most > 400
    monkeypatch.setattr(folders, "MAX_FILE_BYTES", most)
    found = extract(root)
    assert found.note == "notes: 3 files read, 1 left out: 1 binary (noise.dat)"
    assert "File: ru.txt\n" + russian.strip() in found.text
    assert "Le bac part à 7 h." in found.text and "warranty lasts 7 years" in found.text
    assert any(w.startswith("ru.txt: not UTF-8; read as cp1251") for w in found.warnings)
    assert any(w.startswith("fr.html: not UTF-8") for w in found.warnings)
    # a folder's text file over its limit is still left out, named
    (root / "big.txt").write_text("x" * (most + 1))
    assert f"1 over {most} B (big.txt)" in extract(root).note


def test_binary_files_that_are_not_utf8_and_begin_as_text_are_left_out(tmp_path):
    """(Read as legacy text, a folder's binary files went into its text whole: an installer's
    gzip archive after its script made 88,659 tokens of garbage.) A NUL anywhere, bytes that
    read as no text at the start, middle or end, or a one-byte reading without the spaces
    every such text has, leave a file out as binary."""
    root = tmp_path / "tool"
    root.mkdir()
    (root / "notes.txt").write_bytes("Le café ouvre à 7 h.\n".encode("latin-1") * 20)
    rng = random.Random(5)
    (root / "install.run").write_bytes(b"echo unpacking\n" * 600 + b"__ARCHIVE__\n"
                                       + gzip.compress(rng.randbytes(20_000)))
    (root / "key.bin").write_bytes(bytes(rng.randrange(128, 256) for _ in range(400)))
    (root / "data.csvx").write_bytes(b"a,b\n1,2\n" * 1200 + bytes(range(256)))
    (root / "pairs.dat").write_bytes(bytes(rng.choice([0xC3, 0xA9, 0xE2, 0x80, 0x9C, 0x41])
                                           for _ in range(3000)))  # (chance UTF-8 pairs)
    found = extract(root)
    assert found.note == ("tool: 1 file read, 4 left out: 4 binary (data.csvx, install.run, "
                          "key.bin, ...)"), found.note
    with pytest.raises(DocumentError, match="install.run: this is a binary file"):
        extract(root / "install.run")  # (attached alone: refused the same)
    for n in range(4):  # what was guessed: the first few said, the rest counted
        (root / f"more{n}.txt").write_bytes("Déjà vu à Paris.\n".encode("latin-1") * 20)
    said = extract(root).warnings
    assert len(said) == 4 and said[-1] == "tool: 2 more such note(s) of its files", said


def test_gitignore_rules():
    rules = Ignore("*.log\n!keep.log\nbuild/\n/docs/*.tmp\n**/cache\n")
    assert rules.ignores("a/b.log", False) and not rules.ignores("keep.log", False)
    assert rules.ignores("src/build", True) and not rules.ignores("src/build", False)
    assert rules.ignores("docs/x.tmp", False) and not rules.ignores("src/docs/x.tmp", False)
    assert rules.ignores("a/cache", True)


def test_a_folders_source_names_the_file_and_its_lines():
    source = Source(1, 2, 3, "text", 1.0, None, (120, 148), ("connect",), file="src/db.py")
    assert source.location == "src/db.py, lines 120-148"
    assert source.label() == "#3 [src/db.py, lines 120-148] connect"
    assert Source.from_dict(source.as_dict()) == source
    assert source.as_dict()["file"] == "src/db.py" and source.as_dict()["lines"] == [120, 148]
    assert "file" not in Source(1, 2, 3, "text", 1.0, None, (1, 2)).as_dict()
    hit = Hit(1, 3, "text", None, (120, 148), ("connect",), 40, 1.0, "src/db.py")
    assert hit.location == source.location and hit.as_dict()["file"] == "src/db.py"
    assert "file" not in replace(hit, file=None).as_dict()


@pytest.mark.model
def test_a_long_folder_answers_from_the_file_holding_the_fact(tmp_path, model_path,
                                                                model_hash):
    from desktop_app.engine import Engine
    from desktop_app.model.runtime import Runtime
    from desktop_app.options import GenerationOptions
    from store import Store

    root = tmp_path / "harbour"
    (root / "logs").mkdir(parents=True)
    for i in range(12):
        (root / "logs" / f"day{i:02}.md").write_text("\n\n".join(
            f"Entry {i}.{j}: the tide rose at {j % 12 + 1} o'clock, gulls counted {i * j}, "
            f"wind from the {'north' if j % 2 else 'south'}." for j in range(8)))
    (root / "notes").mkdir()
    (root / "notes" / "boathouse.md").write_text(
        "# Boathouse\n\n\n\n" + "Paint the door.\n\n\n" * 3 +
        "The spare key of the boathouse hangs behind the barometer.\n")  # (line 14)
    (root / "photo.jpg").write_bytes(b"\xff\xd8\xff\0" * 10)
    eng = Engine(Store(tmp_path / "data"), lambda: Runtime(
        model_path, model_hash=model_hash, n_ctx=512), chunk_tokens=64, levels=["compact"])
    try:
        seen: list[Progress] = []
        res = eng.attach(root, progress=seen.append)
        # what was read and left out, said before any other work
        assert seen[0].phase == "extract" and \
            seen[0].note == "harbour: 13 files read, 1 left out: 1 binary (photo.jpg)"
        assert res.warnings[0] == seen[0].note and res.passages
        assert res.left_out == [{"path": "photo.jpg", "why": "binary"}]
        hits = eng.passages(res.doc_id, query="spare key boathouse")
        assert hits[0].file == "notes/boathouse.md" and hits[0].lines[1] == 14
        assert hits[0].location.startswith("notes/boathouse.md, line")
        answer = eng.ask("Where is the spare key of the boathouse?", doc_ids=[res.doc_id],
                         generation=GenerationOptions(max_tokens=4, temperature=0))
        assert any(s["file"] == "notes/boathouse.md" for s in answer.sources)
        assert json.dumps(answer.as_dict())
        again = eng.attach(root)
        assert again.doc_id == res.doc_id and again.reused
        # A model switch computes it again from its stored text: its passages keep the lines
        # of its files, whose blank runs that text collapsed, the folder there or gone.
        before = [(p.heading, p.lines) for p in eng.store.passages(res.doc_id)]
        eng.prefill(res.doc_id)
        root.rename(tmp_path / "moved")
        eng.prefill(res.doc_id)
        assert [(p.heading, p.lines) for p in eng.store.passages(res.doc_id)] == before
        assert eng.passages(res.doc_id, query="spare key boathouse")[0].lines[1] == 14
        root = (tmp_path / "moved").rename(root)
        [info] = eng.documents()
        assert info.title == "harbour" and info.files == 13
    finally:
        eng.close()
        eng.store.close()


@pytest.mark.model
def test_the_server_attaches_a_folder_inside_an_allowed_one_and_no_link_out_of_it(tmp_path):
    from fastapi.testclient import TestClient

    from desktop_app.app import App
    from desktop_app.server import bridge
    from desktop_app.server.api import create_api
    from desktop_app.settings import Settings

    allowed = tmp_path / "allowed"
    notes = allowed / "notes"
    notes.mkdir(parents=True)
    (notes / "ferry.md").write_text("The ferry leaves at 07:15.\n")
    secret = tmp_path / "private.txt"
    secret.write_text("the secret word is heliotrope\n")
    (notes / "link.txt").symlink_to(secret)
    app = App(Settings(data_dir=str(tmp_path / "data"), n_ctx=512,
                       server_attach_folders=(str(allowed),)))
    c = TestClient(create_api(app, api_key=None, stopping=bridge.Stopping()),
                   base_url="http://127.0.0.1:8765")
    r = c.post("/v1/kvdesk/documents", json={"path": str(notes), "levels": ["compact"]})
    assert r.status_code == 200, r.text
    assert r.json()["title"] == "notes" and r.json()["warnings"][0] == (
        "notes: 1 file read, 1 left out: 1 linking out of the folder (link.txt)")
    assert r.json()["left_out"] == [{"path": "link.txt", "why": "linking out of the folder"}]
    [doc] = c.get("/v1/kvdesk/documents").json()
    assert doc["files"] == 1 and doc["type"] == "folder"
    assert "heliotrope" not in app.engine.store.document(doc["doc_id"]).text
    outside = c.post("/v1/kvdesk/documents", json={"path": str(tmp_path)})
    assert outside.status_code == 403
    app.close()


def test_a_stored_folders_text_gives_back_its_files_and_their_lines(tmp_path):
    """A folder kept whole, split later with its folder changed or gone (`split_stored`):
    its passages still sit under their files, numbered within them."""
    found = extract(code_base(tmp_path / "tool"))
    lines, headings = folders.from_text(found.text)
    assert headings == tuple(h for h in found.headings if h[2] == 1)
    assert lines == found.lines  # (a text file's blank runs kept in the text)
    stored = documents.stored(SimpleNamespace(text=found.text, title="tool", type="folder"))
    passages = split(stored.text, stored.kind, lambda t: len(t) // 4,
                     line_numbers=stored.lines, headings=stored.headings, target=8, limit=16)
    assert {p.heading[0] for p in passages} == {"README.md", "src/db.py"}


def test_a_folder_split_again_from_its_stored_text_has_its_files_lines(tmp_path):
    """Split again from its stored text (`split_stored`, a prefill), its folder unchanged or
    gone: the passages, files and lines of its attach, those of the files on disk."""
    root = code_base(tmp_path / "tool")
    found = extract(root)
    doc = SimpleNamespace(text=found.text, title="tool", type="folder", source_path=str(root),
                          content_hash=found.content_hash)

    def located(extracted):
        return [(p.heading[0], p.lines, p.text.splitlines()[-1]) for p in split(
            extracted.text, extracted.kind, lambda t: len(t) // 4, headings=extracted.headings,
            line_numbers=extracted.lines, target=8, limit=16)]

    attached = located(found)
    assert located(documents.stored(doc, read=True)) == attached
    assert located(documents.stored(doc)) == attached  # (its folder changed or gone)
    for file, (_, last), line in attached:  # the lines of the files on disk
        assert (root / file).read_text().splitlines()[last - 1] == line
    assert ("src/db.py", (5, 6), "    return sqlite3.connect(path)") in attached
    assert documents.stored(doc).source == ""  # (its text alone: its lines no file's)


def test_a_pdf_in_a_folder_is_cited_by_its_pages_as_alone(tmp_path):
    """A PDF of a folder keeps its pages: its passages say "report.pdf, page 2", as the PDF
    attached alone says "page 2", at attach and split again from its unchanged folder."""
    from pdf_helpers import make_pdf

    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.txt").write_text("First notes.\n")
    make_pdf(root / "report.pdf", [["Page one says hello."], ["The warranty lasts 7 years."]])
    found = extract(root)
    doc = SimpleNamespace(text=found.text, title="notes", type="folder", source_path=str(root),
                          content_hash=found.content_hash)
    for extracted in (found, documents.stored(doc, read=True)):
        where = {location(p.page, p.lines, p.heading[0]): p.text for p in split(
            extracted.text, extracted.kind, lambda t: len(t) // 4, pages=extracted.pages,
            line_numbers=extracted.lines, headings=extracted.headings, target=4, limit=16)}
        assert "warranty" in where["report.pdf, page 2"] and \
            "hello" in where["report.pdf, page 1"] and "warranty" not in where[
                "report.pdf, page 1"]
        assert where["a.txt, line 1"].endswith("First notes.")
    alone = extract(root / "report.pdf")
    assert [p.page for p in split(alone.text, alone.kind, lambda t: len(t) // 4,
                                  pages=alone.pages, target=4, limit=16)] == [1, 2]


def test_a_folders_pdf_is_read_from_disk_once(tmp_path, monkeypatch):
    """The walk's bytes are the bytes read as the PDF: one read of a file of up to 200 MB,
    and no second read that could find the file changed since its size was checked."""
    from pdf_helpers import make_pdf

    root = tmp_path / "notes"
    root.mkdir()
    make_pdf(root / "report.pdf", [["The warranty lasts 7 years."]])
    reads: list[str] = []
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda p: reads.append(p.name) or read_bytes(p))
    assert "warranty" in extract(root).text
    assert reads == ["report.pdf"]


CODE = ('"""Shapes."""\n\nimport math\n\n\nclass Circle:\n    """A round one."""\n\n'
        '    def __init__(self, r):\n        self.r = r\n\n    def area(self):\n'
        '        return math.pi * self.r ** 2\n\n\ndef unit():\n    return Circle(1)\n')
NOTES = "# Notes\n\nA first part.\n\n## Sizes\n\nCircles are round.\n"


def test_each_file_of_a_folder_splits_by_its_own_kind_at_attach_and_from_its_text(tmp_path):
    """A code file in a folder splits by its definitions, a Markdown file by its headings, as
    each attached alone, under its path; its lines within it; the stored text splits alike."""
    root = tmp_path / "shapes"
    (root / "src").mkdir(parents=True)
    (root / "src" / "shapes.py").write_text(CODE)
    (root / "notes.md").write_text(NOTES)
    (root / "todo.txt").write_text("OPTIONS\n\nsmaller circles\n")

    def passages(found):
        return split(found.text, found.kind, lambda t: len(t) // 4, line_numbers=found.lines,
                     headings=found.headings, target=12, limit=40)

    attached = passages(extract(root))
    alone = {name: split(extract(root / name).text, extract(root / name).kind,
                         lambda t: len(t) // 4, line_numbers=extract(root / name).lines,
                         target=12, limit=40) for name in ("src/shapes.py", "notes.md")}
    in_folder = {name: [p for p in attached if p.heading[0] == name] for name in alone}
    for name, own in alone.items():  # the same cuts, headings and lines as the file alone
        assert [(p.heading[1:], p.lines) for p in in_folder[name]] == \
            [(p.heading, p.lines) for p in own]
    heads = {p.heading[1:] for p in in_folder["src/shapes.py"]}
    assert ("class Circle:", "def area(self):") in heads and ("def unit():",) in heads
    assert ("Notes", "Sizes") in {p.heading[1:] for p in in_folder["notes.md"]}
    assert [p.heading for p in attached if p.heading[0] == "todo.txt"] == [("todo.txt",
                                                                             "OPTIONS")]
    text = extract(root).text
    assert all(p.text == text[p.start:p.end] and p.text.count("File: ") <= 1
               and (p.text.count("File: ") == 0 or p.text.startswith("File: "))
               for p in attached)  # never two files, a file's path line opening its first
    assert [p.index for p in attached] == list(range(len(attached)))
    stored = documents.stored(SimpleNamespace(text=text, title="shapes", type="folder"))
    assert [(p.start, p.end, p.heading) for p in passages(stored)] == \
        [(p.start, p.end, p.heading) for p in attached]


def test_a_files_own_file_line_is_no_file_of_the_folder(tmp_path):
    """A file whose text holds a blank line then "File: x" is one file: attach, the stored
    text's headings and `docs`' count agree."""
    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.txt").write_text("Attach these:\n\nFile: b.txt\nand more\n\n\n\nFile: c\nd\n")
    (root / "b.txt").write_text("\n\n\nFile: c.txt\nthe second\n")
    found = extract(root)
    assert found.note.startswith("notes: 2 files read")
    lines, headings = folders.from_text(found.text)
    assert headings == tuple(h for h in found.headings if h[2] == 1)
    assert [title for *_, title in headings] == ["a.txt", "b.txt"]
    assert lines == found.lines and folders.file_count(found.text) == 2
    assert lines[:9] == (1, 1, 2, 3, 4, 5, 6, 7, 8)  # (a.txt: each line's own number)


def test_a_folder_changed_by_a_file_deep_in_it_is_seen_as_changed(tmp_path, monkeypatch):
    """An edit of a file in a subfolder (the folder's own time unmoved) changes the folder;
    a walk slower than `SLOW_WALK_S` is reused a while."""
    import os
    import time

    root = code_base(tmp_path / "tool")
    attached = extract(root)
    at = time.time()
    old = at - 100
    for path in [root, *root.rglob("*")]:
        os.utime(path, (old, old))
    assert not documents.changed_since(str(root), attached.content_hash, at)
    monkeypatch.setattr(folders, "SLOW_WALK_S", -1.0)  # every walk slow: reused a minute
    folders.stamp(root)
    db = root / "src" / "db.py"
    db.write_text(db.read_text() + "\n\ndef close(db):\n    db.close()\n")
    os.utime(root / "src", (old, old))
    os.utime(root, (old, old))
    assert not documents.changed_since(str(root), attached.content_hash, at)  # (reused)
    monkeypatch.setattr(folders, "STAMP_REUSE_S", 0.0)
    folders.stamp(root)
    assert documents.changed_since(str(root), attached.content_hash, at)
    db.unlink()  # a file gone: its folder's time and the count move
    assert documents.changed_since(str(root), attached.content_hash, at)
    info = DocumentInfo(1, "tool", "folder", 9, 9, {}, "ready", at, file_changed=True, files=3)
    assert info.changed_words == "a file in it has changed since it was attached"  # (docs)
    assert replace(info, type="text").changed_words.startswith("its file has changed")


def test_links_loops_and_folders_that_cannot_be_listed_are_left_out_and_named(tmp_path,
                                                                               monkeypatch):
    root = tmp_path / "links"
    (root / "inner").mkdir(parents=True)
    (root / "inner" / "real.txt").write_text("the real text\n")
    (root / "in_link.txt").symlink_to(root / "inner" / "real.txt")  # read once, as inner/
    (root / "me").symlink_to("me")  # a self-link
    (root / "loop_a").symlink_to("loop_b")
    (root / "loop_b").symlink_to("loop_a")
    (root / "gone.txt").symlink_to(tmp_path / "nowhere")
    (root / "self_dir").symlink_to(root)
    (root / "out.txt").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "secret.txt").write_text("heliotrope\n")
    (root / "locked").mkdir()
    (root / "locked" / "a.txt").write_text("x\n")
    listing = os.scandir

    def scandir(path):  # (chmod 000 as root, which reads any folder, is no test)
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return listing(path)
    monkeypatch.setattr(os, "scandir", scandir)
    found = extract(root)
    assert found.text == "File: inner/real.txt\nthe real text" and "heliotrope" not in found.text
    assert found.note == (
        "links: 1 file read, 6 left out: 4 broken link or link loop (gone.txt, loop_a, loop_b,"
        " ...), 1 link to a file read anyway (in_link.txt), 1 linking out of the folder "
        "(out.txt); 2 folders not read: 1 unreadable (locked), 1 link, not followed (self_dir)")
    assert {"path": "me", "why": "broken link or link loop"} in found.left_out
    assert found.warnings == ["locked/: cannot be read (Permission denied)"]


def test_a_name_not_utf8_or_holding_a_line_break_is_read_under_one_escaped_line(tmp_path):
    root = tmp_path / "odd"
    root.mkdir()
    (root / os.fsdecode(b"caf\xe9.txt")).write_text("espresso\n")
    (root / "two\nFile: lines.txt").write_text("not a file of its own\n")
    found = extract(root)
    assert found.text == ("File: caf\\xe9.txt\nespresso\n\n\n"
                          "File: two\\nFile: lines.txt\nnot a file of its own")
    assert folders.file_count(found.text) == 2 and found.content_hash
    assert [h[3] for h in found.headings] == ["caf\\xe9.txt", "two\\nFile: lines.txt"]


def test_a_name_holding_a_c1_control_is_escaped_as_plain_output_escapes_a_title(tmp_path):
    root = tmp_path / "odd"
    root.mkdir()
    (root / "red\x9b31m.txt").write_text("ink\n")  # (CSI: a terminal's colour change)
    found = extract(root)
    assert found.text == "File: red\\x9b31m.txt\nink"
    assert folders.one_line("red\x9b31m") == "red\\x9b31m"


def test_a_folder_is_titled_with_its_own_name_however_it_is_written(tmp_path, monkeypatch):
    (tmp_path / "proj" / "sub").mkdir(parents=True)
    (tmp_path / "proj" / "a.txt").write_text("a\n")
    monkeypatch.chdir(tmp_path / "proj")
    assert extract(".").title == "proj" and extract("sub/..").title == "proj"
    assert extract(str(tmp_path / "proj") + "/").title == "proj"
    monkeypatch.chdir(tmp_path / "proj" / "sub")
    assert extract("..").title == "proj" and extract("..").note.startswith("proj: 1 file")


def test_kvdesks_own_data_folder_is_never_read_as_a_document(tmp_path):
    data = tmp_path / "proj" / "data"
    data.mkdir(parents=True)
    (data / "model-hashes.json").write_text("{}\n")
    (tmp_path / "proj" / "notes.md").write_text("notes\n")
    found = extract(tmp_path / "proj", avoid=[data])
    assert found.text == "File: notes.md\nnotes" and found.left_out == [
        {"path": "data/", "why": "kvdesk's own data"}]
    with pytest.raises(DocumentError, match="data: kvdesk's own data folder, not a document"):
        extract(data, avoid=[data])


def test_a_folder_holding_kvdesks_data_is_unchanged_by_a_store_write(tmp_path):
    """The change check and the re-read leave kvdesk's data folder out, as attach does: a
    store write inside the folder is no change, and its file-read text is the attached one."""
    import threading

    from desktop_app.chat.library import Library
    from desktop_app.errors import Cancelled
    from store import Store

    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.txt").write_text("hello project\n")
    store = Store(root / "kvdata")
    found = extract(root, avoid=[store.data_dir])
    doc = store.add_document(found.content_hash, found.title, found.text, type="folder",
                             source_path=found.source)
    stamp = folders.stamp(root, [store.data_dir])
    store.add_document("0" * 64, "later", "later", type="text")  # (a write after the attach)
    (store.data_dir / "later.json").write_text("{}\n")
    future = doc.created + 1000
    os.utime(store.data_dir / "later.json", (future, future))
    os.utime(store.data_dir, (future, future))
    assert folders.stamp(root, [store.data_dir]) == stamp  # (no whole re-read at each listing)
    assert not documents.changed_since(found.source, found.content_hash, doc.created,
                                       avoid=[store.data_dir])
    assert Library(store).changed_files([doc.id]) == []
    again = documents.stored(doc, read=True, avoid=[store.data_dir])
    assert again.source == found.source and again.text == found.text
    stop = threading.Event()
    stop.set()  # (Cancel pressed: the re-read stops, never taken for a failed one)
    with pytest.raises(Cancelled):
        documents.stored(doc, read=True, avoid=[store.data_dir], cancel=stop)
    store.close()


def test_a_link_never_reorders_a_folders_files(tmp_path):
    """A name that is not UTF-8 keeps its place when a link is added: one order, by bytes."""
    root = tmp_path / "ord"
    root.mkdir()
    (root / "cafz.txt").write_text("z\n")
    (root / os.fsdecode(b"caf\xe9.txt")).write_text("e\n")
    (root / "sub").mkdir()
    (root / "sub" / "b.txt").write_text("b\n")
    before = extract(root)
    (root / "zlink.txt").symlink_to("cafz.txt")  # (read anyway: left out)
    after = extract(root)
    assert [h[3] for h in after.headings] == ["cafz.txt", "caf\\xe9.txt", "sub/b.txt"]
    assert after.content_hash == before.content_hash


def test_a_long_walk_says_how_far_it_is_and_stops_when_cancelled(tmp_path, monkeypatch):
    import threading

    from desktop_app.errors import Cancelled

    root = tmp_path / "many"
    for d in range(3):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(40):
            (root / f"d{d}" / f"{f}.txt").write_text(f"file {f}\n")
    monkeypatch.setattr(folders, "PROGRESS_S", 0)
    seen: list[tuple[int, int]] = []
    found = extract(root, progress=lambda done, total: seen.append((done, total)))
    assert folders.file_count(found.text) == 120
    walking = [done for done, total in seen if total == 0]
    assert walking == list(range(1, len(walking) + 1)) and len(walking) == 123
    assert (119, 120) in seen
    cancel = threading.Event()

    def stop_at(done, total):
        if done == 10:
            cancel.set()
    with pytest.raises(Cancelled):
        extract(root, progress=stop_at, cancel=cancel)
    assert len([1 for done, total in seen if total == 0]) == 123  # (the first walk's only)


def test_gitignore_rules_as_git_reads_them(tmp_path):
    rules = Ignore("**/build\ndoc/*.txt\n\\#notes.md\nlogs/**\n/a/**/z\n[!x]y.c\n")
    assert rules.ignores("build", True) and rules.ignores("src/build", True)
    assert not rules.ignores("mybuild", True) and not rules.ignores("src/rebuild", True)
    assert rules.ignores("doc/x.txt", False) and not rules.ignores("doc/sub/x.txt", False)
    assert rules.ignores("#notes.md", False)
    assert rules.ignores("logs/a/b.txt", False) and not rules.ignores("logs", True)
    assert rules.ignores("a/z", False) and rules.ignores("a/b/c/z", False)
    assert rules.ignores("ay.c", False) and not rules.ignores("xy.c", False)
    assert not rules.ignores("a/y.c", False) and Ignore("a.txt  \n").ignores("a.txt", False)
    # `attach src/` in a repository: its root's .gitignore and the nested ones apply
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".gitignore").write_text("*.gen\n")
    (repo / "src" / "proj" / "gen").mkdir(parents=True)
    (repo / "src" / "proj" / ".gitignore").write_text("gen/\n")
    (repo / "src" / "proj" / "gen" / "out.txt").write_text("GENJUNK\n")
    (repo / "src" / "x.gen").write_text("generated\n")
    (repo / "src" / "main.py").write_text("print(1)\n")
    found = extract(repo / "src")
    assert found.text == "File: main.py\nprint(1)"
    assert {"path": "x.gen", "why": "ignored by .gitignore"} in found.left_out
    assert {"path": "proj/gen/", "why": "ignored by .gitignore"} in found.left_out


def test_the_cli_names_a_folder_attached_as_dot_and_counts_a_walk_without_a_total(
        tmp_path, monkeypatch, fake_app):
    from click.testing import CliRunner

    from desktop_app.cli import cli
    from desktop_app.results import AttachResult

    class Engine:
        levels = ()  # (no codec kernels to wait for)

        def attach(self, path, *, progress, **options):
            progress(Progress("extract", 12345, 0, "proj"))  # (still walking: no total)
            return AttachResult(1, "proj", 5, 5, 0.1, 0.1, 10, {"high": 1}, reused=True)

        def __getattr__(self, name):
            return lambda *args, **kwargs: False

    fake_app(Engine)
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    for path in (".", "../proj/"):
        result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "attach",
                                          "--no-server", path])
        assert result.exit_code == 0, (result.output, result.exception)
        assert "proj: extract: 12,345 found so far" in result.stderr
        assert "[1] proj:" in result.stdout and "the same text as" not in result.stdout
