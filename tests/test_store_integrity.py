"""Checks: a flipped byte or a swapped chunk is caught on read and by verify(), quarantined
(never read again), repaired or dropped."""

from __future__ import annotations

import sqlite3

import pytest
from test_store_helpers import open_store, payload, put_entry

from store import CorruptChunkError, NotFoundError


def flip_byte(store, entry_id: int, chunk: int, level: str, offset: int = 3) -> None:
    """Corrupt a chunk in place, behind the store's back (as bit rot or a torn write would)."""
    conn = sqlite3.connect(store.path)
    (rowid,) = conn.execute(
        "SELECT id FROM kv_chunks WHERE entry_id = ? AND chunk_index = ? AND level = ?",
        (entry_id, chunk, level),
    ).fetchone()
    with conn, conn.blobopen("kv_chunks", "data", rowid) as blob:
        blob.seek(offset)
        original = blob.read(1)[0]
        blob.seek(offset)
        blob.write(bytes([original ^ 0x40]))
    conn.close()


def test_a_flipped_byte_raises_corrupt_chunk_and_verify_lists_it(tmp_path):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        other = put_entry(store, range(9000, 9100))
        assert store.verify() == {
            "entries": 2, "chunks": 8, "bytes": entry.nbytes + other.nbytes, "corrupt": [],
        }  # fmt: skip
        flip_byte(store, entry.id, 1, "compact")
        with pytest.raises(CorruptChunkError) as caught:
            store.read_chunk(entry.id, 1, "compact")
        assert (caught.value.entry, caught.value.chunk, caught.value.level) == (
            entry.id, 1, "compact",
        )  # fmt: skip
        assert store.read_chunk(entry.id, 1, "lossless") == payload(256, 512, "lossless")
        # Quarantined by that read: not read again, not offered to a restore, counted.
        with pytest.raises(NotFoundError, match="quarantined"):
            store.read_chunk(entry.id, 1, "compact")
        assert (entry.id, 1, "compact") not in store.chunk_sizes([entry.id])
        assert store.damaged([entry.id, other.id]) == {entry.id: 1}
        report = store.verify()
        assert report["corrupt"] == [{"entry": entry.id, "chunk": 1, "level": "compact",
                                      "new": False}]
        assert report["chunks"] == 8

        store.repair_chunk(entry.id, 1, "compact", payload(256, 512, "compact"))
        assert store.read_chunk(entry.id, 1, "compact") == payload(256, 512, "compact")
        assert store.verify()["corrupt"] == []


def test_a_checksum_error_survives_reopening(tmp_path):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(300))
        flip_byte(store, entry.id, 0, "lossless", offset=0)
    with open_store(tmp_path) as store:
        with pytest.raises(CorruptChunkError):
            store.read_chunk(entry.id, 0, "lossless")


def swap(store, a: tuple[int, int, str], b: tuple[int, int, str]) -> None:
    """Exchange two chunks' bytes behind the store's back (as a careless tool or a bug would)."""
    conn = sqlite3.connect(store.path)
    q = "SELECT data FROM kv_chunks WHERE entry_id = ? AND chunk_index = ? AND level = ?"
    (data_a,), (data_b,) = conn.execute(q, a).fetchone(), conn.execute(q, b).fetchone()
    u = "UPDATE kv_chunks SET data = ?, nbytes = ? WHERE entry_id = ? AND chunk_index = ? AND" \
        " level = ?"
    with conn:
        conn.execute(u, (data_b, len(data_b), *a))
        conn.execute(u, (data_a, len(data_a), *b))
    conn.close()


def test_a_valid_chunk_put_in_another_ones_place_is_caught(tmp_path):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        swap(store, (entry.id, 0, "lossless"), (entry.id, 1, "lossless"))
        for chunk in (0, 1):
            with pytest.raises(CorruptChunkError):
                store.read_chunk(entry.id, chunk, "lossless")
        assert sorted(store.quarantined()) == [(entry.id, 0, "lossless"), (entry.id, 1, "lossless")]


def test_verify_finds_and_quarantines_and_drop_removes(tmp_path):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        child = put_entry(store, range(700), parent_id=entry.id)
        flip_byte(store, entry.id, 2, "compact")
        report = store.verify()
        assert report["corrupt"] == [{"entry": entry.id, "chunk": 2, "level": "compact",
                                      "new": True}]
        assert store.quarantined() == [(entry.id, 2, "compact")]
        # Another level of that chunk is left: only the bad level goes.
        assert store.drop_chunk(entry.id, 2, "compact") == []
        assert store.verify()["corrupt"] == [] and store.entry(entry.id)
        # The last level of a chunk: the entry cannot be read any more, nor what extends it.
        assert store.drop_chunk(entry.id, 2, "lossless") == [entry.id, child.id]
        assert store.entries() == []


def test_rows_from_before_hashes_are_checked_by_crc_and_get_a_hash(tmp_path):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(300))
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    with conn:
        conn.execute("UPDATE kv_chunks SET sha256 = NULL")
    conn.close()
    with open_store(tmp_path) as store:
        assert store.read_chunk(entry.id, 0, "lossless") == payload(0, 256, "lossless")
        assert store.verify()["corrupt"] == []
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    assert conn.execute("SELECT count(*) FROM kv_chunks WHERE sha256 IS NULL").fetchone()[0] == 0
    conn.close()
