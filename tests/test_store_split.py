"""An entry split at one of its chunk boundaries: chunks moved with their bytes unchanged, the
rest extending the new entry, lookups and checks as before; what cannot be split, refused."""

from __future__ import annotations

import sqlite3

import pytest
from test_store_helpers import FP, LEVELS, open_store, orphans, payload, put_entry

from store import CorruptChunkError


@pytest.fixture
def store(tmp_path):
    with open_store(tmp_path) as store:
        yield store


def test_a_split_moves_the_chunks_and_the_rest_extends_the_new_entry(store):
    entry = put_entry(store, range(600), chunk_size=64)
    before = {(s.token_start, level): store.read_chunk(entry.id, s.chunk_index, level)
              for s in store.spans(entry.id) for level in LEVELS}
    head = store.split_entry(entry.id, 192)
    rest = store.entry(entry.id)
    assert (head.token_start, head.token_end, head.parent_id) == (0, 192, None)
    assert (rest.token_start, rest.token_end, rest.parent_id) == (192, 600, head.id)
    assert rest.prefix_hash == entry.prefix_hash  # its name: the hash of all its tokens
    after = {(s.token_start, level): store.read_chunk(e.id, s.chunk_index, level)
             for e in (head, rest) for s in store.spans(e.id) for level in LEVELS}
    assert after == before  # every chunk, its bytes unchanged, at its place
    assert after[(64, "compact")] == payload(64, 128, "compact")
    assert [s.chunk_index for s in store.spans(rest.id)] == list(range(7))
    assert head.nbytes + rest.nbytes == entry.nbytes
    assert store.tokens(head.id) == list(range(192)) and store.tokens(rest.id) == list(range(600))
    shared = store.longest_prefix(FP, [*range(192), 7, 7], touch=False)
    assert shared.parent.id == head.id and shared.n_tokens == 192
    whole = store.longest_prefix(FP, range(600), touch=False)
    assert [e.id for e in whole.entries] == [head.id, rest.id] and whole.n_tokens == 600
    report = store.verify()
    assert report["corrupt"] == [] and report["missing"] == [] and orphans(store) == {}


def test_both_parts_hold_the_documents_the_entry_held(store):
    """(An API conversation over [A, B] split where a later request parts from it: B's part
    stayed behind once B was deleted.)"""
    a, b = (store.add_document(h, h.upper(), h, type="txt") for h in ("a", "b"))
    entry = put_entry(store, range(600), chunk_size=64, holds=[a.id, b.id])
    head = store.split_entry(entry.id, 192)
    store.delete_document(b.id)
    assert [e.id for e in store.entries() if e.id in (head.id, entry.id)] == []
    assert orphans(store) == {}


def test_what_cannot_be_split_there_is_refused_and_left_as_it_was(store, tmp_path):
    entry = put_entry(store, range(600), chunk_size=64)
    for at in (0, 100, 600, 700):  # not inside it, or not at a chunk's end
        with pytest.raises(ValueError):
            store.split_entry(entry.id, at)
    doc = store.add_document("h", "Doc", "text", type="txt")
    document_entry = put_entry(store, range(1000, 1300), chunk_size=64, document_id=doc.id)
    with pytest.raises(ValueError):  # a document's entry is found by its document: kept whole
        store.split_entry(document_entry.id, 1064)
    conn = sqlite3.connect(store.path)
    with conn:  # a damaged chunk in the part that would move
        conn.execute("UPDATE kv_chunks SET data = ? WHERE entry_id = ? AND chunk_index = 1"
                     " AND level = 'compact'", (b"rot" * 20, entry.id))
    conn.close()
    with pytest.raises(CorruptChunkError):
        store.split_entry(entry.id, 192)
    assert store.entry(entry.id) == entry and len(store.entries()) == 2
