"""A full disk: a write that runs out of room is refused whole with one clear error and the
store stays usable; reading never needs room; freeing space (gc, deleting) works on a disk
filled to the last byte, through the reserve the store keeps (store.datadir.reserve), and gives the
space back to the file system."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import test_store_helpers
from test_store_helpers import LEVELS, ORPHAN_QUERIES, open_store, put_entry

from desktop_app.chat.library import Library
from desktop_app.errors import is_storage_fault, is_user_error
from store import DiskFullError
from store.datadir.full import disk_full
from store.datadir.reserve import NAME, RESERVE_BYTES, WORDS_BYTES, WORDS_NAME

pytestmark = pytest.mark.real_reserve


def pages_left(store, pages: int) -> None:
    """Let this thread's connection grow the database by `pages` more pages at most: SQLite
    then answers as a full disk does (SQLITE_FULL)."""
    conn = store._db.get().conn
    count = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {count + pages}")


def big(start, end, level):
    return os.urandom(100_000)


def test_a_write_without_room_is_refused_whole_and_clearly(tmp_path, monkeypatch):
    monkeypatch.setattr(test_store_helpers, "payload", big)
    with open_store(tmp_path) as store:
        kept = put_entry(store, range(100), chunk_size=50)
        pages_left(store, 30)  # ~120 KB: not the 400 KB of the next entry
        # (its disk has room: the page limit is what is full, and the error does not blame it)
        with pytest.raises(DiskFullError, match=f"SQLite ran out of room for a write to {tmp_path}"
                                                ".*or a file size limit, is full"):
            put_entry(store, range(1000, 1100), chunk_size=50)
        conn = store._db.get().conn
        assert not conn.in_transaction  # rolled back, not left open
        assert [e.id for e in store.entries()] == [kept.id]
        for name, query in ORPHAN_QUERIES.items():
            assert conn.execute(query).fetchone()[0] == 0, name
        pages_left(store, 10_000)
        again = put_entry(store, range(1000, 1100), chunk_size=50)  # usable again
        assert [e.id for e in store.entries()] == [kept.id, again.id]
    error = DiskFullError("full")
    assert is_user_error(error) and is_storage_fault(error)


def test_freed_pages_are_not_written_again_to_free_them(tmp_path):
    with open_store(tmp_path) as store:
        # SQLite's FAST: deleting a cache does not write zeros over its pages (builds that
        # default to ON would write as much as they free)
        assert store._db.get().conn.execute("PRAGMA secure_delete").fetchone()[0] == 2


def test_the_reserve_is_taken_given_back_for_a_deletion_and_taken_again(tmp_path):
    with open_store(tmp_path) as store:
        reserve = tmp_path / NAME
        assert reserve.stat().st_size == RESERVE_BYTES
        tries = []

        def deletion():
            tries.append(reserve.exists())
            if len(tries) == 1:
                raise DiskFullError("full")
            return "done"

        assert store._db.freeing(deletion) == "done"
        assert tries == [True, False]  # the second try ran with the reserve given back
        assert reserve.stat().st_size == RESERVE_BYTES  # and it is taken again after

        reserve.unlink()
        with pytest.raises(DiskFullError):  # no reserve to give: the error stands
            store._db.freeing(lambda: (_ for _ in ()).throw(DiskFullError("full")))


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB file system of its own (tmpfs: needs root)."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a small file system needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_on_a_disk_filled_to_the_last_byte_reading_and_freeing_work(small_disk, monkeypatch):
    monkeypatch.setattr(test_store_helpers, "payload",
                        lambda start, end, level: os.urandom(200_000))
    data = small_disk / "data"
    with open_store(data) as store:
        n = 0
        with pytest.raises(DiskFullError, match=f"the disk holding the data directory {data} is "
                                                r"full \(0.0 MB free\).*kvdesk gc --budget-gb"):
            while True:  # kvdesk's own caches fill the disk
                put_entry(store, range(n * 1000, (n + 1) * 1000), chunk_size=500)
                n += 1
    fill(small_disk)  # (what the write that found it full had written is deleted: its room)
    with open_store(data) as store:  # opening and reading need no room
        assert len(store.entries()) == n and store.documents() == []
        last = store.entries()[-1]  # a level dropped (`verify --repair`) frees room too
        assert store.drop_level(last.id, LEVELS[0]) == []
        assert LEVELS[0] not in store.entry(last.id).levels
        report = store.gc(budget_bytes=5 << 20)
        assert report["freed_bytes"] > 20 << 20
        assert store.verify()["corrupt"] == []
        # the space is the file system's again, and the reserve is taken again
        assert shutil.disk_usage(small_disk).free > 20 << 20
        assert (data / NAME).stat().st_size == RESERVE_BYTES
        store.delete_entry(store.entries()[0].id)
        assert store.usage_bytes() <= 5 << 20
    assert Path(data / "kvdesk.sqlite").stat().st_size < 16 << 20


def test_freed_pages_go_back_however_few_and_a_file_without_auto_vacuum_keeps_them(tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setattr(test_store_helpers, "payload", big)
    with open_store(tmp_path / "a") as store:
        entry = put_entry(store, range(100), chunk_size=50)  # ~100 pages: below a step
        store.delete_entry(entry.id)
        conn = store._db.get().conn
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
    with open_store(tmp_path / "b") as store:
        conn = store._db.get().conn
        conn.execute("PRAGMA auto_vacuum = NONE")
        conn.execute("VACUUM")  # as a file rebuilt by hand would be: nothing to reclaim with
        entry = put_entry(store, range(100), chunk_size=50)
        done = threading.Thread(target=store.delete_entry, args=(entry.id,), daemon=True)
        done.start()
        done.join(timeout=20)
        assert not done.is_alive()  # (it looped for ever on such a file)
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] > 0


def test_a_model_registered_on_a_full_disk_is_recorded_before_its_first_entry(tmp_path,
                                                                              monkeypatch):
    with open_store(tmp_path) as store:
        writes, full = store._db.write, [True]

        @contextlib.contextmanager
        def write():  # every write finds the disk full while `full`
            if full[0]:
                raise DiskFullError("full")
            with writes() as db:
                yield db

        monkeypatch.setattr(store._db, "write", write)
        assert store.register_model("model-b", "/models/b.gguf", {"n_layer": 2}) is None
        with pytest.raises(DiskFullError):  # still full: said, not a foreign-key error
            put_entry(store, range(100), fingerprint="model-b")
        full[0] = False
        entry = put_entry(store, range(100), fingerprint="model-b")
        assert entry.model == "model-b" and store.model("model-b").path == "/models/b.gguf"
        full[0] = True  # recorded as it is already: nothing is written (a full disk reads)
        assert store.register_model("model-b", "/models/b.gguf", {"n_layer": 2}).layout == {
            "n_layer": 2}


def test_a_gc_run_again_after_a_full_disk_reports_both_runs_work(tmp_path, monkeypatch):
    with open_store(tmp_path) as store:
        entries = [put_entry(store, range(n * 100, n * 100 + 100)) for n in range(3)]
        writes, count = store._db.write, [0]

        @contextlib.contextmanager
        def write():  # the disk fills once, after the first eviction committed
            count[0] += 1
            if count[0] == 4:
                raise DiskFullError("full")
            with writes() as db:
                yield db

        monkeypatch.setattr(store._db, "write", write)
        report = store.gc(budget_bytes=1)
        assert report["evicted_entries"] == [e.id for e in entries]
        assert [c["entry"] for c in report["evicted_caches"]] == [e.id for e in entries]
        assert report["freed_bytes"] == sum(e.nbytes for e in entries)


def stored(disk: Path, entries: int) -> Path:
    """A data directory on `disk` with `entries` entries of 2 MB; closed."""
    data = disk / "data"
    with open_store(data) as store:
        for n in range(entries):
            put_entry(store, range(n * 1000, (n + 1) * 1000), chunk_size=500)
    return data


def fill(disk: Path) -> None:
    """Another program takes the disk's last byte."""
    with open(disk / "filler", "wb") as f:
        with pytest.raises(OSError):
            while True:
                f.write(bytes(1 << 20))
                f.flush()
    assert shutil.disk_usage(disk).free < 1 << 20


def test_a_disk_filled_from_outside_while_closed_still_opens_reads_and_frees(small_disk,
                                                                           monkeypatch):
    monkeypatch.setattr(test_store_helpers, "payload",
                        lambda start, end, level: os.urandom(200_000))
    data = stored(small_disk, 8)
    assert (data / NAME).exists()
    fill(small_disk)
    # SQLite's shared memory cannot grow: the store gives its reserve back to open at all
    with open_store(data) as store:
        assert len(store.entries()) == 8 and store.verify()["corrupt"] == []
        assert store.gc(budget_bytes=1 << 20)["freed_bytes"] > 4 << 20
    # given back to the file system, the reserve paying for moving the pages (it frees room)
    assert shutil.disk_usage(small_disk).free > 4 << 20


def test_a_disk_full_with_no_reserve_left_still_reads_and_says_what_to_do(small_disk,
                                                                         monkeypatch):
    monkeypatch.setattr(test_store_helpers, "payload",
                        lambda start, end, level: os.urandom(200_000))
    data = stored(small_disk, 4)
    (data / NAME).unlink()  # (given to a deletion the disk was full again after)
    fill(small_disk)
    for _ in range(2):  # read read-only: reading needs no room, however often
        with open_store(data) as store:
            assert len(store.entries()) == 4 and store.verify()["corrupt"] == []
            # (not sent to `gc` and `rm`, which need the room too without the reserve)
            spent = "Free space on that disk first: kvdesk's reserve for this is spent"
            with pytest.raises(DiskFullError, match=spent):
                store.gc(budget_bytes=1 << 20)
            with pytest.raises(DiskFullError, match=spent):
                store.add_document("h", "Doc", "text", type="txt")
    (small_disk / "filler").unlink()
    with open_store(data) as store:
        assert store.gc(budget_bytes=1 << 20)["freed_bytes"] > 0


def full_but_for_the_reserve(store, monkeypatch, words: bool = False) -> None:
    """Every write finds the disk full but while the reserve (`words`: the turns' one) is
    given back (until it is taken again): what it makes room for is all the room there is."""
    writes = store._db.write
    reserve = store._db.words if words else store._db.reserve
    release = reserve.give if words else reserve.release
    make, given = reserve.make, [False]

    @contextlib.contextmanager
    def write():
        if not given[0]:
            raise DiskFullError("full")
        with writes() as db:
            yield db

    def released() -> bool:
        given[0] = release()
        return given[0]

    def made() -> None:
        given[0] = False
        make()

    monkeypatch.setattr(store._db, "write", write)
    monkeypatch.setattr(reserve, "give" if words else "release", released)
    monkeypatch.setattr(reserve, "make", made)


def test_a_turns_text_is_paid_by_its_own_reserve_and_a_cache_by_none(tmp_path, monkeypatch):
    with open_store(tmp_path) as store:
        chat = store.create_chat("Ferries")
        words = tmp_path / WORDS_NAME
        assert words.stat().st_size == WORDS_BYTES
        full_but_for_the_reserve(store, monkeypatch, words=True)
        turn = {"model": test_store_helpers.FP, "question_tokens": [1, 2],
                "answer_tokens": [3]}
        store.add_turn(chat.id, "When?", "At seven.", **turn)  # the user's words are kept
        new = store.start_chat("Ferries 2", [], "Where?", "The harbour.", **turn)
        assert [m.text for m in store.messages(chat.id)] == ["When?", "At seven."]
        assert [m.text for m in store.messages(new.id)] == ["Where?", "The harbour."]
        assert words.stat().st_size == WORDS_BYTES  # taken back at once
        assert (tmp_path / NAME).stat().st_size == RESERVE_BYTES  # never touched
        with pytest.raises(DiskFullError):  # a cache: the full disk, not the reserves' room
            put_entry(store, range(100), chat_id=chat.id)
        assert words.stat().st_size == WORDS_BYTES and store.entries() == []
        words.unlink()  # (spent): the text too is refused, whole
        with pytest.raises(DiskFullError):
            store.add_turn(chat.id, "Why?", "Tides.", **turn)
        assert len(store.messages(chat.id)) == 2


def test_a_turn_even_the_reserve_cannot_keep_says_the_answer_given_is_not_stored(
        tmp_path, monkeypatch):
    with open_store(tmp_path) as store:
        chat = store.create_chat("Ferries")
        (tmp_path / WORDS_NAME).unlink()  # (spent)
        full_but_for_the_reserve(store, monkeypatch, words=True)
        turn = {"model": test_store_helpers.FP, "question_tokens": [1], "answer_tokens": [2]}
        with pytest.raises(DiskFullError, match=r"^the answer given is not stored, nor its "
                           rf"question \(chat {chat.id} keeps its turns before it\): full"):
            Library(store).add_turn(chat.id, "Why?", "Tides.", docs=[], **turn)
        (tmp_path / WORDS_NAME).unlink()  # (this disk had room to take it again)
        with pytest.raises(DiskFullError, match=r"not stored, nor its question \(nor a chat "):
            Library(store).add_turn(None, "Why?", "Tides.", docs=[], **turn)
        assert [c.id for c in store.chats()] == [chat.id]
        assert (tmp_path / NAME).stat().st_size == RESERVE_BYTES  # rm and gc's, whole


def test_what_a_write_on_a_full_disk_left_is_deleted_through_the_reserve(tmp_path,
                                                                        monkeypatch):
    with open_store(tmp_path) as store:
        writes, count = store._db.write, [0]
        reserve = tmp_path / NAME

        @contextlib.contextmanager
        def write():  # the disk fills after the entry's first chunk
            count[0] += 1
            if count[0] > 3 and reserve.exists():
                raise DiskFullError("full")
            with writes() as db:
                yield db

        monkeypatch.setattr(store._db, "write", write)
        with pytest.raises(DiskFullError):
            put_entry(store, range(1000), chunk_size=100)
        # the chunks written before it are gone, not an unfinished write gc must remove
        conn = store._db.get().conn
        assert conn.execute("SELECT count(*) FROM kv_entries").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM kv_chunks").fetchone()[0] == 0
        assert reserve.stat().st_size == RESERVE_BYTES


def test_an_attach_on_a_disk_filled_from_outside_leaves_the_reserve_to_rm_and_gc(
        small_disk, monkeypatch):
    monkeypatch.setattr(test_store_helpers, "payload",
                        lambda start, end, level: os.urandom(200_000))
    data = stored(small_disk, 4)
    fill(small_disk)
    with open_store(data) as store:
        # opening took the reserve back but for what opening used (SQLite's shared memory)
        assert (data / NAME).stat().st_size > RESERVE_BYTES - (1 << 20)
        with pytest.raises(DiskFullError):  # a small write: the reserve pays for none
            store.create_chat("Ferries")
        chat = store.start_chat("Ferries", [], "When?", "At seven.", model=test_store_helpers.FP,
                                question_tokens=[1], answer_tokens=[2])  # a turn's: it does
        with pytest.raises(DiskFullError, match="kvdesk gc --budget-gb"):
            put_entry(store, range(10_000, 14_000), chunk_size=500)  # 8 MB of a cache
        assert (data / NAME).stat().st_size > RESERVE_BYTES - (1 << 20)
        assert len(store.entries()) == 4 and store.verify()["corrupt"] == []
        conn = store._db.get().conn
        assert conn.execute("SELECT count(*) FROM kv_entries WHERE NOT complete"
                            ).fetchone()[0] == 0
        assert [m.text for m in store.messages(chat.id)] == ["When?", "At seven."]
    with open_store(data) as store:  # another process: rm and gc work
        store.delete_entry(store.entries()[0].id)
        assert store.gc(budget_bytes=1 << 20)["freed_bytes"] > 1 << 20
    assert shutil.disk_usage(small_disk).free > 2 << 20  # (what they freed)


def test_turns_on_a_full_disk_never_spend_the_room_rm_and_gc_need(small_disk):
    data = small_disk / "data"
    with open_store(data) as store:
        first = store.start_chat("Ferries", [], "When?", "At seven.",
                                 model=test_store_helpers.FP, question_tokens=[1],
                                 answer_tokens=[2])
        fill(small_disk)
        kept, answer = 0, "word " * 40_000  # 200 KB a turn
        for n in range(100):
            with contextlib.suppress(DiskFullError):
                store.add_turn(first.id, f"Why {n}?", answer, model=test_store_helpers.FP,
                               question_tokens=[1], answer_tokens=[2])
                kept += 1
        assert (data / NAME).stat().st_size == RESERVE_BYTES  # rm and gc's, whole
        store.delete_chat(first.id)  # and they work
        store.gc(budget_bytes=1 << 20)
        assert store.chats() == []
        assert 0 < kept < 20  # what the turns' own reserve held, then refused
    assert shutil.disk_usage(small_disk).free > 2 << 20  # (what they freed)


def test_the_full_disk_error_sends_to_rm_and_gc_only_while_their_reserve_is_whole(small_disk):
    data = small_disk / "data"
    with open_store(data):
        pass
    fill(small_disk)
    path = data / "kvdesk.sqlite"
    assert "make room in kvdesk: `kvdesk gc --budget-gb N`" in str(disk_full(path))
    os.truncate(data / NAME, 64 << 10)  # (a reserve taken back only in part)
    assert "kvdesk's reserve for this is spent" in str(disk_full(path))
