"""Checksums: a flipped byte in a stored chunk is caught on read and listed by verify()."""

from __future__ import annotations

import sqlite3

import pytest
from test_store_helpers import open_store, payload, put_entry

from store import CorruptChunkError


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
        report = store.verify()
        assert report["corrupt"] == [{"entry": entry.id, "chunk": 1, "level": "compact"}]
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
