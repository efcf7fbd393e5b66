"""Checks: a flipped byte, a chunk moved to another place or a chunk row deleted is caught on read
and by verify(), quarantined (never read again), repaired or dropped; so is an entry whose codec
calibration is missing or damaged."""

from __future__ import annotations

import sqlite3

import pytest
from test_store_helpers import FP, open_store, payload, put_entry

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
            "database": [], "entries": 2, "chunks": 8, "bytes": entry.nbytes + other.nbytes,
            "corrupt": [], "missing": [], "calibrations": [], "abandoned": [],
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


def swap(store, a: tuple[int, int, str], b: tuple[int, int, str], *,
         columns=("nbytes", "checksum", "sha256", "data")) -> None:
    """Exchange two chunk rows' contents behind the store's back (as a careless tool or a bug
    would): by default everything but their place, hashes included."""
    conn = sqlite3.connect(store.path)
    q = f"SELECT {', '.join(columns)} FROM kv_chunks WHERE entry_id = ? AND chunk_index = ?" \
        " AND level = ?"
    row_a, row_b = conn.execute(q, a).fetchone(), conn.execute(q, b).fetchone()
    u = f"UPDATE kv_chunks SET {', '.join(c + ' = ?' for c in columns)} WHERE entry_id = ?" \
        " AND chunk_index = ? AND level = ?"
    with conn:
        conn.execute(u, (*row_b, *a))
        conn.execute(u, (*row_a, *b))
    conn.close()


def test_a_valid_chunk_put_in_another_ones_place_is_caught(tmp_path):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        swap(store, (entry.id, 0, "lossless"), (entry.id, 1, "lossless"),
             columns=("nbytes", "data"))
        for chunk in (0, 1):
            with pytest.raises(CorruptChunkError):
                store.read_chunk(entry.id, chunk, "lossless")
        assert sorted(store.quarantined()) == [(entry.id, 0, "lossless"), (entry.id, 1, "lossless")]


@pytest.mark.parametrize("where", ["two entries", "two chunks", "two levels"])
def test_whole_rows_moved_hashes_and_all_are_caught(tmp_path, where):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        other = put_entry(store, range(5000, 5600))
        a, b = {"two entries": ((entry.id, 0, "lossless"), (other.id, 0, "lossless")),
                "two chunks": ((entry.id, 0, "lossless"), (entry.id, 1, "lossless")),
                "two levels": ((entry.id, 2, "lossless"), (entry.id, 2, "compact"))}[where]
        swap(store, a, b)
        report = store.verify()
        assert sorted((c["entry"], c["chunk"], c["level"]) for c in report["corrupt"]) == \
            sorted([a, b])
        for chunk in (a, b):
            with pytest.raises(NotFoundError, match="quarantined"):
                store.read_chunk(*chunk)
        # Every other chunk still reads, and the moved ones are set right by a repair.
        assert store.read_chunk(entry.id, 1, "compact") == payload(256, 512, "compact")
        for entry_id, chunk, level in (a, b):
            span = store.spans(entry_id)[chunk]
            store.repair_chunk(entry_id, chunk, level,
                               payload(span.token_start, span.token_end, level))
        assert store.verify()["corrupt"] == []


def test_the_crc_column_is_not_what_is_checked(tmp_path):
    """It held a CRC-32 of bytes that end with their own CRC (one number for every codec
    blob): new rows do not fill it, and nothing reads it."""
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(300))
        conn = sqlite3.connect(store.path)
        with conn:
            assert conn.execute("SELECT DISTINCT checksum FROM kv_chunks").fetchall() == [(0,)]
            conn.execute("UPDATE kv_chunks SET checksum = 12345")
        conn.close()
        assert store.read_chunk(entry.id, 0, "compact") == payload(0, 256, "compact")
        assert store.verify()["corrupt"] == []


def delete_row(store, entry_id: int, chunk: int, level: str) -> None:
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute("DELETE FROM kv_chunks WHERE entry_id = ? AND chunk_index = ? AND"
                     " level = ?", (entry_id, chunk, level))
    conn.close()


def test_a_deleted_chunk_row_is_missing_damaged_and_can_be_put_back(tmp_path):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        other = put_entry(store, range(5000, 5100))
        delete_row(store, entry.id, 1, "compact")
        delete_row(store, entry.id, 2, "compact")
        report = store.verify()
        assert report["corrupt"] == [] and report["chunks"] == 6
        assert report["missing"] == [{"entry": entry.id, "chunk": 1, "level": "compact"},
                                     {"entry": entry.id, "chunk": 2, "level": "compact"}]
        assert store.damaged([entry.id, other.id]) == {entry.id: 2}
        assert (entry.id, 1, "compact") not in store.chunk_sizes([entry.id])
        with pytest.raises(NotFoundError, match="not stored"):
            store.read_chunk(entry.id, 1, "compact")
        # Put back (what `verify --repair` does once it has recomputed it): whole again.
        store.repair_chunk(entry.id, 1, "compact", payload(256, 512, "compact"))
        assert store.read_chunk(entry.id, 1, "compact") == payload(256, 512, "compact")
        assert store.missing() == [(entry.id, 2, "compact")]
        # Nothing is put where the entry has no chunk, or at a level it does not list.
        with pytest.raises(NotFoundError):
            store.repair_chunk(entry.id, 7, "compact", b"x")
        with pytest.raises(NotFoundError):
            store.repair_chunk(entry.id, 2, "high", b"x")


@pytest.mark.parametrize("foreign_keys", [False, True], ids=["rows-left", "rows-cascaded"])
def test_a_deleted_span_row_never_lets_the_next_chunk_stand_in_its_place(tmp_path,
                                                                        foreign_keys):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        conn = sqlite3.connect(store.path)
        conn.execute(f"PRAGMA foreign_keys = {int(foreign_keys)}")
        with conn:
            conn.execute("DELETE FROM kv_spans WHERE entry_id = ? AND chunk_index = 1",
                         (entry.id,))
        conn.close()
        # The match stops where the chunks stop following on: chunk 2 is not read as chunk 1.
        match = store.longest_prefix(FP, range(700))
        assert match.n_tokens == 256 and [s.chunk_index for s in match.spans] == [0]
        assert store.missing() == [(entry.id, 1, "compact"), (entry.id, 1, "lossless")]
        assert store.damaged([entry.id]) == {entry.id: 2}
        assert store.restore_spans(entry.id) == [1] and store.restore_spans(entry.id) == []
        if foreign_keys:  # its chunks went with it: they are missing until stored again
            assert store.missing() == [(entry.id, 1, "compact"), (entry.id, 1, "lossless")]
            for level in ("compact", "lossless"):
                store.repair_chunk(entry.id, 1, level, payload(256, 512, level))
        assert store.missing() == [] and store.verify()["corrupt"] == []
        assert store.read_chunk(entry.id, 1, "compact") == payload(256, 512, "compact")
        assert store.longest_prefix(FP, range(700)).n_tokens == 600


def test_a_missing_or_damaged_calibration_is_reported_and_counted(tmp_path):
    with open_store(tmp_path) as store:
        cal = store.put_calibration(FP, b"calibration bytes")
        spare = store.put_calibration(FP, b"another calibration")
        entry = put_entry(store, range(600), calibration=cal)
        plain = put_entry(store, range(5000, 5100))
        assert [c["state"] for c in store.verify()["calibrations"]] == ["ok", "ok"]
        assert store.damaged([entry.id, plain.id]) == {}
        conn = sqlite3.connect(store.path)
        with conn:
            conn.execute("UPDATE calibrations SET data = ? WHERE id = ?", (b"rotten", cal))
        report = store.verify()
        by_id = {c["id"]: c for c in report["calibrations"]}
        assert by_id[cal] == {"id": cal, "model": FP, "state": "damaged", "entries": 1}
        assert by_id[spare]["state"] == "ok" and by_id[spare]["entries"] == 0
        # Every chunk of an entry that needs it is unreadable: 3 chunks at 2 levels.
        assert store.damaged([entry.id, plain.id]) == {entry.id: 6}
        assert store.unusable_calibrations() == {cal}
        with conn:
            conn.execute("DELETE FROM calibrations WHERE id = ?", (cal,))
        conn.close()
        assert {c["id"]: c["state"] for c in store.verify()["calibrations"]} == {
            cal: "missing", spare: "ok"}
        # Once its chunks are encoded again with another calibration, the entry says so.
        store.set_entry_calibration(entry.id, spare)
        assert store.unusable_calibrations() == set() and store.damaged([entry.id]) == {}
        with pytest.raises(NotFoundError):
            store.set_entry_calibration(entry.id, cal)


def test_verify_finds_and_quarantines_and_drop_removes(tmp_path):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        child = put_entry(store, range(700), parent_id=entry.id)
        flip_byte(store, entry.id, 2, "compact")
        report = store.verify()
        assert report["corrupt"] == [{"entry": entry.id, "chunk": 2, "level": "compact",
                                      "new": True}]
        assert store.quarantined() == [(entry.id, 2, "compact")]
        # Another level is left: only the bad level goes, from the whole entry, which then
        # holds every chunk at every level it lists (nothing is missing).
        assert store.drop_level(entry.id, "compact") == []
        dropped = store.entry(entry.id)
        assert dropped.levels == ("lossless",) and dropped.nbytes < entry.nbytes
        assert store.verify()["corrupt"] == [] and store.missing() == []
        assert store.read_chunk(entry.id, 2, "lossless") == payload(512, 600, "lossless")
        # The last level: the entry cannot be read any more, nor what extends it.
        assert store.drop_level(entry.id, "lossless") == [entry.id, child.id]
        assert store.entries() == []


def test_one_entrys_damaged_chunks_are_listed_without_the_others(tmp_path):
    """A question's passage healed (`repair.heal`) scanned every chunk of the store for its
    own: quarantined and missing are asked of its entry only."""
    from types import SimpleNamespace

    from desktop_app.kv import repair

    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        other = put_entry(store, range(9000, 9100))
        for e in (entry, other):
            flip_byte(store, e.id, 0, "compact")
            with pytest.raises(CorruptChunkError):
                store.read_chunk(e.id, 0, "compact")
        with sqlite3.connect(store.path) as conn:
            conn.execute("DELETE FROM kv_chunks WHERE chunk_index = 0 AND level = 'lossless'")
        assert store.quarantined([entry.id]) == [(entry.id, 0, "compact")]
        assert store.quarantined([]) == [] and len(store.quarantined()) == 2
        assert store.missing([other.id]) == [(other.id, 0, "lossless")]
        asked = []

        class Spy:
            def quarantined(self, ids=None):
                asked.append(ids)
                return []

            missing = quarantined

            def unusable_calibrations(self):
                return set()

            def entry(self, entry_id):
                raise NotFoundError("gone")

        rt = SimpleNamespace(fingerprint=FP)
        repair.heal(Spy(), rt, SimpleNamespace(resolver=lambda fp: None), entry.id)
        assert asked == [[entry.id], [entry.id]]


def test_replace_levels_puts_every_chunk_at_the_new_levels_in_place(tmp_path):
    """An entry encoded again at other levels: all of it at once, or nothing (a chunk or a
    level missing is refused and the entry left as it was)."""
    store = open_store(tmp_path / "data")
    entry = put_entry(store, list(range(10)), levels=("lossless",), chunk_size=4)
    spans = store.spans(entry.id)
    chunks = {(s.chunk_index, "balanced"): payload(s.token_start, s.token_end, "balanced")
              for s in spans}
    with pytest.raises(ValueError, match="every chunk"):
        store.replace_levels(entry.id, ("balanced",), dict(list(chunks.items())[1:]), None)
    with pytest.raises(NotFoundError):
        store.replace_levels(entry.id, ("balanced",), chunks, "no-such-calibration")
    assert store.entry(entry.id).levels == ("lossless",)
    assert store.read_chunk(entry.id, 0, "lossless") == payload(0, 4, "lossless")
    store.replace_levels(entry.id, ("balanced",), chunks, None)
    now = store.entry(entry.id)
    assert now.levels == ("balanced",) and now.nbytes == sum(map(len, chunks.values()))
    assert [store.read_chunk(entry.id, s.chunk_index, "balanced") for s in spans] == [
        chunks[s.chunk_index, "balanced"] for s in spans]
    with pytest.raises(NotFoundError):
        store.read_chunk(entry.id, 0, "lossless")
    assert not store.verify()["missing"]
