"""A data directory kvdesk cannot use, or can only read: a clear StoreError, never a traceback,
and reading (listing, verifying) still works where nothing can be written, writing nothing."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import sys

import pytest
from test_store_helpers import open_store, put_entry

from store import Store, StoreError
from store.errors import DamagedError, DataDirError, ReadOnlyError


def test_a_file_in_place_of_the_data_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(DataDirError, match="is a file, not a folder"):
        Store(tmp_path / "f")
    with pytest.raises(DataDirError, match="part of its path is a file"):
        Store(tmp_path / "f" / "sub")


def test_a_data_directory_the_system_cannot_create_is_one_clear_error(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(DataDirError, match="a link that leads to no folder"):
        Store(tmp_path / "loop")
    with pytest.raises(DataDirError, match="cannot be created: Too many levels of symbolic"):
        Store(tmp_path / "loop" / "sub")
    with pytest.raises(DataDirError, match="cannot be created: File name too long"):
        Store(tmp_path / ("a" * 300))


def test_a_file_that_is_not_a_database(tmp_path):
    (tmp_path / "kvdesk.sqlite").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(DataDirError, match="cannot be opened as a kvdesk store .*Restore it "
                                           "from a backup, or move it aside"):
        Store(tmp_path)


@pytest.mark.parametrize("size", [0, 3000, 200_000])
def test_a_truncated_database_says_what_to_do_and_what_is_lost(tmp_path, size):
    """It said only "cannot be opened as a kvdesk store (database disk image is malformed)";
    a file cut to 0 bytes was opened as a new, empty store, every chat and document gone
    without a word (and `verify` said "all intact")."""
    with open_store(tmp_path) as store:
        for i in range(40):
            doc = store.add_document(f"h{i}", f"Doc {i}", "text " * 500, type="txt")
            put_entry(store, range(1000 * i, 1000 * i + 300), document_id=doc.id)
    os.truncate(tmp_path / "kvdesk.sqlite", size)
    with pytest.raises(DataDirError) as refused:
        Store(tmp_path)
    why = ("it is empty: 0 bytes, though this folder held a store" if size == 0 else
           "database disk image is malformed")
    assert str(refused.value) == (
        f"{tmp_path / 'kvdesk.sqlite'} cannot be opened as a kvdesk store ({why}). Restore it "
        "from a backup, or move it aside: kvdesk then starts an empty store, without the chats "
        "and document list it held (caches are computed again)")
    (tmp_path / "kvdesk.sqlite").rename(tmp_path / "aside.sqlite")
    with Store(tmp_path) as store:  # (as the message says)
        assert store.documents() == []


def test_a_database_cut_to_nothing_is_refused_without_its_reserves_too(tmp_path):
    """(The guard asked for the reserve, which a disk without room for it never has, a full
    disk spends, or a user deletes to make room: the empty file then opened as a new store.)"""
    with open_store(tmp_path) as store:
        store.add_document("h", "Doc", "text", type="txt")
    for name in ("reserve", "reserve-words"):
        (tmp_path / name).unlink(missing_ok=True)
    os.truncate(tmp_path / "kvdesk.sqlite", 0)
    with pytest.raises(DataDirError, match="it is empty: 0 bytes"):
        Store(tmp_path)


def test_an_empty_database_file_in_a_folder_that_held_no_store_is_a_new_store(tmp_path):
    """(A first run that stopped as SQLite made the file, before the schema and the reserve.)"""
    (tmp_path / "kvdesk.sqlite").touch()
    with Store(tmp_path) as store:
        assert store.documents() == []


@pytest.fixture
def filled(tmp_path):
    with open_store(tmp_path) as store:
        doc = store.add_document("h", "Doc", "text", type="txt")
        put_entry(store, range(300), document_id=doc.id)
    return tmp_path


def _read_only_store(path, monkeypatch) -> Store:
    # As root, permission bits do not stop writes: stand for a read-only mount at the one
    # place the store asks.
    real = os.access
    monkeypatch.setattr("store.datadir.db.os.access",
                        lambda p, mode: False if mode & os.W_OK else real(p, mode))
    return Store(path)


def test_a_read_only_store_reads_and_refuses_writes_clearly(filled, monkeypatch):
    with _read_only_store(filled, monkeypatch) as store:
        assert store.read_only
        assert [d.title for d in store.documents()] == ["Doc"]
        assert store.verify()["corrupt"] == [] and store.verify()["chunks"] > 0
        assert store.longest_prefix("model-a", range(400)).n_tokens == 300
        assert store.register_model("model-b", "/b.gguf", {}) is None
        with pytest.raises(ReadOnlyError, match="read-only"):
            store.add_document("h2", "Other", "text", type="txt")
        with pytest.raises(ReadOnlyError):
            store.gc(0)


def test_an_empty_read_only_directory(tmp_path, monkeypatch):
    with pytest.raises(DataDirError, match="read-only and holds no kvdesk data"):
        _read_only_store(tmp_path, monkeypatch)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the permission bits say")
def test_permission_bits_make_it_read_only(filled):
    mode = filled.stat().st_mode
    os.chmod(filled, stat.S_IRUSR | stat.S_IXUSR)
    try:
        with Store(filled) as store:
            assert store.read_only and store.documents()
            with pytest.raises(StoreError):
                store.create_chat("x")
    finally:
        os.chmod(filled, mode)


# Root passes permission bits by its capabilities: the command line is run without the ones
# that override them, so a read-only directory is read-only to it as to anyone.
SETPRIV = shutil.which("setpriv")
WITHOUT_OVERRIDES = [SETPRIV, "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def as_user(args: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return args
    if SETPRIV is None:
        pytest.skip("running as root without setpriv (util-linux): permission bits cannot "
                    "be made to apply")
    return WITHOUT_OVERRIDES + args


def kvdesk(data_dir, *args) -> subprocess.CompletedProcess:
    return subprocess.run(as_user([sys.executable, "-m", "desktop_app", "--data-dir",
                                   str(data_dir), *args]),
                          capture_output=True, text=True, timeout=300)


def make_read_only(data_dir) -> dict[str, tuple[int, int]]:
    """chmod a-w the directory and its files; what it holds (name: size, mtime) afterwards."""
    for f in data_dir.iterdir():
        os.chmod(f, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    os.chmod(data_dir, stat.S_IRUSR | stat.S_IXUSR)
    probe = subprocess.run(as_user(["touch", str(data_dir / "probe")]), capture_output=True)
    if probe.returncode == 0:
        pytest.skip("the permission bits do not stop this user from writing")
    return listing(data_dir)


def listing(data_dir) -> dict[str, tuple[int, int]]:
    return {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in data_dir.iterdir()}


@pytest.fixture
def library(tmp_path):
    """A data directory with a document, its cache (under some model) and a chat; made
    writable again afterwards, so it can be cleaned up."""
    data = tmp_path / "data"
    with open_store(data) as store:
        doc = store.add_document("h", "Doc", "text", type="txt")
        put_entry(store, range(300), document_id=doc.id)
        chat = store.create_chat("About the doc", [doc.id])
        store.add_message(chat.id, "user", "hi")
    yield data
    os.chmod(data, stat.S_IRWXU)
    for f in data.iterdir():
        os.chmod(f, stat.S_IRUSR | stat.S_IWUSR)


@pytest.mark.model  # `docs` loads the model: its fingerprint says which caches are current
def test_a_read_only_directory_lists_and_verifies_writing_nothing(library):
    with open_store(library) as store:  # (no message to tokenize: nothing written before)
        store.create_chat("Not asked yet", [1])
    before = make_read_only(library)
    chats = kvdesk(library, "chats", "--json")
    assert chats.returncode == 0, chats.stderr
    assert sorted((c["title"], c["messages"]) for c in json.loads(chats.stdout)) == [
        ("About the doc", 1), ("Not asked yet", 0)]
    docs = kvdesk(library, "docs", "--json")
    assert docs.returncode == 0, docs.stderr
    assert [d["title"] for d in json.loads(docs.stdout)] == ["Doc"]
    verified = kvdesk(library, "verify", "--json")
    assert verified.returncode == 0, verified.stderr
    report = json.loads(verified.stdout)
    assert (report["entries"], report["corrupt"], report["missing"]) == (1, [], [])
    # Writing is refused, saying why.
    refused = kvdesk(library, "rm", "chat", "1")
    assert refused.returncode == 1 and refused.stderr.startswith("Error: the data directory")
    assert "read-only" in refused.stderr and "Traceback" not in refused.stderr
    # A question too, before its answer is computed (it could not be kept).
    asked = kvdesk(library, "ask", "--chat", "2", "hi", "--no-server", "--max-tokens", "2")
    assert asked.returncode == 1 and asked.stdout == "" and "read-only" in asked.stderr
    # A server, which stores every chat and cache it makes, is refused before it serves.
    serve = kvdesk(library, "serve", "--port", "0", "--ollama-port", "0")
    assert serve.returncode == 1 and "Traceback" not in serve.stderr, serve.stderr
    assert "read-only: a server stores chats and caches there" in serve.stderr
    assert listing(library) == before  # no journal, no shared-memory file, nothing touched


def test_a_read_only_directory_verifies_damage_it_cannot_repair(library):
    conn = sqlite3.connect(library / "kvdesk.sqlite")
    with conn:
        conn.execute("DELETE FROM kv_chunks WHERE chunk_index = 1 AND level = 'compact'")
    conn.close()
    before = make_read_only(library)
    verified = kvdesk(library, "verify", "--json")
    assert verified.returncode == 1
    assert json.loads(verified.stdout)["missing"] == [
        {"entry": 1, "chunk": 1, "level": "compact"}]
    repair = kvdesk(library, "verify", "--repair")
    assert repair.returncode == 1 and "Traceback" not in repair.stderr
    assert "read-only" in repair.stderr and "nothing can be repaired there" in repair.stderr
    assert listing(library) == before


def test_a_read_only_copy_of_a_store_in_use_reads_its_log(library, tmp_path):
    """Commits still in the write-ahead log (a copy taken while kvdesk ran) are read through
    it; without its shared-memory file they cannot be, and that is said."""
    live = Store(library)  # holds the log open: nothing is checkpointed into the database
    try:
        live.create_chat("Only in the log")
        copy = tmp_path / "copy"
        copy.mkdir()
        for f in library.iterdir():
            if f.is_file():
                shutil.copy(f, copy / f.name)
    finally:
        live.close()
    assert (copy / "kvdesk.sqlite-wal").stat().st_size > 0
    make_read_only(copy)
    chats = kvdesk(copy, "chats", "--json")
    assert chats.returncode == 0, chats.stderr
    assert {c["title"] for c in json.loads(chats.stdout)} == {"About the doc", "Only in the log"}
    os.chmod(copy, stat.S_IRWXU)
    (copy / "kvdesk.sqlite-shm").unlink()
    make_read_only(copy)
    refused = kvdesk(copy, "chats")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "kvdesk.sqlite-wal" in refused.stderr and "open it once where it can be written" \
        in refused.stderr
    os.chmod(copy, stat.S_IRWXU)


def _damage(data_dir, table: str, garbage: bytes = b"\xff" * 200) -> None:
    """Overwrite the cells of a table's root page, as a rotting sector would."""
    path = data_dir / "kvdesk.sqlite"
    conn = sqlite3.connect(path)
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                           (table,)).fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size + 8)
        f.write(garbage)


def test_a_damaged_table_is_found_at_open_and_nothing_more_is_written(filled):
    with open_store(filled) as store:
        store.create_chat("About the doc", [1])
    _damage(filled, "chats")
    with Store(filled) as store:
        # SQLite would list rows of nonsense from that page; the store says it is damaged.
        assert store.damage and "table chats" in store.damage and store.read_only
        assert [d.title for d in store.documents()] == ["Doc"]  # what is intact still reads
        assert all(c.title is not None for c in store.chats())
        with pytest.raises(DamagedError, match="is damaged .*writes nothing more to it"):
            store.add_document("h2", "Other", "text", type="txt")
        report = store.verify()
        assert report["database"] and report["corrupt"] == [] and report["chunks"] > 0


def test_damage_a_read_runs_into_is_a_store_error_and_stops_every_write(filled, monkeypatch):
    _damage(filled, "kv_entries")
    monkeypatch.setattr("store.datadir.db.Connections.check",
                        lambda self: None)  # (damage after open)
    with Store(filled) as store:
        assert store.damage is None
        with pytest.raises(DamagedError, match="malformed"):
            store.longest_prefix("model-a", range(400))
        assert store.damage and store.read_only
        with pytest.raises(DamagedError):
            store.add_document("h2", "Other", "text", type="txt")
        assert store.verify()["database"]


def test_the_command_line_on_a_damaged_store_says_so_once_without_a_traceback(library):
    _damage(library, "chats")
    listed = kvdesk(library, "chats", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    assert listed.stderr.startswith("Warning: the store ") and "is damaged" in listed.stderr
    collected = kvdesk(library, "gc", "--json")  # it would write
    assert collected.returncode == 1 and "Traceback" not in collected.stderr
    assert json.loads(collected.stdout)["kind"] == "DamagedError"
    verified = kvdesk(library, "verify")
    assert verified.returncode == 1 and "the database file is damaged" in verified.stdout
    assert "Traceback" not in verified.stderr
    # Refused before anything is computed (its answer could not be stored).
    asked = kvdesk(library, "ask", "1", "hi", "--no-server")
    assert asked.returncode == 1 and asked.stderr.count("is damaged") == 1  # warned, once
    assert asked.stderr.splitlines()[-1] == \
        "Error: this command cannot run here, for the reason warned of above"
    assert "recompute" not in asked.stderr and "Traceback" not in asked.stderr


def test_verify_of_a_damaged_store_it_warned_of_ends_with_a_short_error(library):
    """(Its last line repeated the warning's ~400 characters as an Error.)"""
    _damage(library, "chats")
    for args in ((), ("--json",)):
        verified = kvdesk(library, "verify", *args)
        assert verified.returncode == 1 and verified.stderr.count("is damaged (") == 1
        assert verified.stderr.splitlines()[-1] == \
            "Error: the database file is damaged, as warned of above", verified.stderr
    report = json.loads(verified.stdout)  # (complete: what SQLite's check found, and more)
    assert report["database"] and "entries" in report and "calibrations" in report


@pytest.mark.model  # `docs` loads the model: its fingerprint says which caches are current
def test_damage_in_the_cache_index_alone_still_lists_the_chats_and_documents(library):
    """The KV entries' table is only caches: damaged, the chats and documents still list
    (the probe's `chats` and `docs` refused, and only moving the file aside was offered)."""
    _damage(library, "kv_entries", random.Random(0).randbytes(4000))  # (the whole page)
    for what, title in (("chats", "About the doc"), ("docs", "Doc")):
        listed = kvdesk(library, what, "--json")
        assert listed.returncode == 0, listed.stderr
        assert [x["title"] for x in json.loads(listed.stdout)] == [title]
        assert "is damaged" in listed.stderr and "Traceback" not in listed.stderr
    (doc,) = json.loads(kvdesk(library, "docs", "--json").stdout)
    assert doc["status"] == "damaged"


def test_damage_in_a_chunks_pages_is_a_damaged_chunk_and_a_damaged_file(tmp_path):
    with open_store(tmp_path) as store:
        with store.write_entry("model-a", range(256), levels=["high"]) as writer:
            writer.put_chunk(0, "high", bytes(range(256)) * 64)  # 16 KB: overflow pages
    path = tmp_path / "kvdesk.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    try:
        pages = [p for (p,) in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'kv_chunks' AND pagetype = 'overflow' "
            "ORDER BY pageno")]
    except sqlite3.OperationalError:
        pytest.skip("this SQLite has no dbstat table to find a chunk's pages with")
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    with open(path, "r+b") as f:  # the overflow chain's next-page pointer, past the file
        f.seek((pages[0] - 1) * page_size)
        f.write(b"\x7f\xff\xff\xff")
    with Store(tmp_path) as store:
        with pytest.raises(StoreError):  # never a raw sqlite3 error
            store.read_chunk(1, 0, "high")
        assert store.damage and store.read_only
        report = store.verify()
        assert report["database"] and report["corrupt"] == [
            {"entry": 1, "chunk": 0, "level": "high", "new": True}]


def test_verify_names_the_table_of_a_page_too_damaged_for_sqlites_whole_check(library):
    """SQLite's check of the whole file can itself fail ("malformed"): the warning promises
    that `verify` says where, so each table is checked alone."""
    with open_store(library) as store:
        for _ in range(40):
            store.add_message(1, "user", "hi there " * 20)
    _damage(library, "messages", random.Random(1).randbytes(2000))
    with Store(library) as store:
        found = store.verify()["database"]
    assert any(line.startswith("table messages: ") for line in found), found


# A rotten byte inside a stored JSON value (`{` for `[`) passes SQLite's page checks: it is
# found where the value is read, or by `verify`, as damage of the file.
ROTTEN_VALUES = {
    "levels": "UPDATE kv_entries SET levels = '{' || substr(levels, 2) WHERE id = 1",
    "speeds": "UPDATE settings SET value = '{bad' WHERE key = 'engine.speeds'",
    "stats": "UPDATE messages SET stats = '{bad' WHERE id = 1",
}


def _rot(data_dir, *which: str) -> None:
    with open_store(data_dir) as store:  # (values for the rot to meet)
        store.set_setting("engine.speeds", {"read_MBps": 5.0})
        store.update_message(1, stats={"n_tokens": 1})
    with sqlite3.connect(data_dir / "kvdesk.sqlite") as conn:
        for name in which:
            conn.execute(ROTTEN_VALUES[name])
    conn.close()


def test_a_rotten_json_value_a_read_meets_is_damage_of_the_file(library):
    _rot(library, "levels")
    with Store(library) as store:
        assert store.damage is None  # (SQLite's check finds nothing)
        assert [d.title for d in store.documents()] == ["Doc"]
        with pytest.raises(DamagedError, match="the levels of KV entry 1 is malformed JSON"):
            store.entries()
        assert store.read_only
        with pytest.raises(DamagedError, match="writes nothing more to it"):
            store.create_chat("Another")
    _rot(library, *ROTTEN_VALUES)
    with Store(library) as store:
        assert store.messages(1)[0].stats is None  # the message reads, its stats gone
        assert "the stats of message 1" in store.damage and store.read_only
    with Store(library) as store:
        found = store.verify()["database"]
        assert [line.split(" is ")[0] for line in found] == [
            "table kv_entries: the levels of 1", "table settings: the value of 'engine.speeds'",
            "table messages: the stats of 1"], found
        assert store.damage


@pytest.mark.parametrize("which", ROTTEN_VALUES)
def test_the_command_line_warns_of_a_rotten_json_value_without_a_traceback(library, which):
    _rot(library, which)
    for args in (("chats", "--json"), ("export", "1"), ("verify",), ("verify", "--repair")):
        ran = kvdesk(library, *args)
        assert "Traceback" not in ran.stderr, ran.stderr
        if args[0] == "verify":  # (the rotten value is found whichever command read it)
            assert ran.returncode == 1 and "the database file is damaged" in ran.stdout
            assert ran.stderr.count("is damaged (") == 1, ran.stderr
        else:
            assert ran.returncode == 0, ran.stderr
    if which != "stats":  # (read by every command that lists the caches)
        listed = kvdesk(library, "chats", "--json")
        assert listed.stderr.startswith("Warning: the store ") and "malformed JSON" in \
            listed.stderr
        assert [c["title"] for c in json.loads(listed.stdout)] == ["About the doc"]
    exported = kvdesk(library, "export", "1")
    assert "hi" in exported.stdout
    assert ("malformed JSON" in exported.stderr) == (which != "levels")  # (reads no entry)


def test_verify_repair_is_refused_in_a_read_only_directory_whatever_is_damaged(library):
    """A rotten chunk is not set aside where nothing can be written: the repair found
    nothing to do and exited 0, the damage still there."""
    conn = sqlite3.connect(library / "kvdesk.sqlite")
    with conn:
        conn.execute("UPDATE kv_chunks SET data = zeroblob(length(data))"
                     " WHERE chunk_index = 1 AND level = 'compact'")
    conn.close()
    before = make_read_only(library)
    repair = kvdesk(library, "verify", "--repair")
    assert repair.returncode == 1 and "Traceback" not in repair.stderr, repair.stderr
    assert "read-only" in repair.stderr and "nothing can be repaired there" in repair.stderr
    assert listing(library) == before


def test_verify_repair_that_leaves_damage_behind_fails(library, monkeypatch, capsys):
    """(It exited 0 whenever a repair had run, whatever the repair could not fix.)"""
    from types import SimpleNamespace

    from desktop_app.app import App
    from desktop_app.cli import main

    conn = sqlite3.connect(library / "kvdesk.sqlite")
    with conn:
        conn.execute("DELETE FROM kv_chunks WHERE chunk_index = 1 AND level = 'compact'")
    conn.close()
    nothing = {"repaired": [], "reencoded": [], "dropped": [], "deleted_entries": [],
               "recovered_calibrations": [], "removed_calibrations": [], "messages": []}
    monkeypatch.setattr(App, "engine", property(lambda self: SimpleNamespace(
        repair=lambda **kw: nothing)))  # (one that could recompute nothing)
    with pytest.raises(SystemExit) as exited:
        main(["--data-dir", str(library), "verify", "--repair"])
    assert exited.value.code == 1
    assert "1 chunks or codec calibrations still need repairing" in capsys.readouterr().out


def test_a_data_directory_kvdesk_makes_is_closed_to_other_users(tmp_path):
    """(It was 0755 under the usual umask, its database 0644: every local user could read
    the documents' text and the chats.) One that exists is left as it is."""
    old = os.umask(0o022)
    try:
        with Store(tmp_path / "new" / "data"):
            pass
        (tmp_path / "mine").mkdir(mode=0o755)
        with Store(tmp_path / "mine"):
            pass
    finally:
        os.umask(old)
    assert (tmp_path / "new" / "data").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "mine").stat().st_mode & 0o777 == 0o755
