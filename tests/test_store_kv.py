"""KV entries: chunked writes, invisibility until complete, longest-prefix lookup, chains."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store_helpers import FP, LEVELS, open_store, orphans, payload, put_entry

from store import IncompleteEntryError, NotFoundError, Span


def passages(*texts):
    """Passages of these texts, as store.add_passages takes them."""
    return [SimpleNamespace(index=i, text=t, start=0, end=len(t), page=None, lines=(1, 1),
                            heading=(), tokens=3) for i, t in enumerate(texts)]


@pytest.fixture
def store(tmp_path):
    with open_store(tmp_path) as store:
        yield store


def test_chunks_cover_the_entry_and_read_back_per_level(store):
    entry = put_entry(store, range(600))
    assert (entry.token_start, entry.token_end, entry.n_chunks) == (0, 600, 3)
    assert entry.levels == LEVELS
    assert store.read_chunk(entry.id, 2, "compact") == payload(512, 600, "compact")
    assert store.read_chunk(entry.id, 0, "lossless") == payload(0, 256, "lossless")
    assert entry.nbytes == sum(
        len(payload(s, e, lv)) for s, e in [(0, 256), (256, 512), (512, 600)] for lv in LEVELS
    )
    with pytest.raises(NotFoundError):
        store.read_chunk(entry.id, 3, "compact")
    assert store.tokens(entry.id) == list(range(600))


def test_an_entry_is_invisible_until_finished_and_gone_if_aborted(store):
    writer = store.write_entry(FP, range(300), levels=["raw"])
    writer.put_chunk(0, "raw", b"first")
    assert store.longest_prefix(FP, range(300)).n_tokens == 0
    with pytest.raises(NotFoundError):
        store.read_chunk(writer.entry_id, 0, "raw")
    with pytest.raises(IncompleteEntryError):
        writer.finish()
    with pytest.raises(ValueError):
        writer.put_chunk(2, "raw", b"no such chunk")
    with pytest.raises(RuntimeError), writer:
        raise RuntimeError("prefill failed")
    assert store.usage_bytes() == 0
    assert store.entries() == []


def test_a_chat_entry_extends_its_document_entry_without_copying(store):
    document = put_entry(store, range(1000))
    chat_tokens = list(range(1000)) + list(range(7000, 7300))
    chat = put_entry(store, chat_tokens, parent_id=document.id, levels=["lossless"])
    assert (chat.token_start, chat.token_end, chat.n_chunks) == (1000, 1300, 2)
    match = store.longest_prefix(FP, chat_tokens + [1, 2, 3])
    assert [e.id for e in match.entries] == [document.id, chat.id]
    assert match.n_tokens == 1300 and match.parent.id == chat.id
    assert [(s.entry_id, s.token_start, s.token_end) for s in match.spans] == [
        (document.id, 0, 256), (document.id, 256, 512), (document.id, 512, 768),
        (document.id, 768, 1000), (chat.id, 1000, 1256), (chat.id, 1256, 1300),
    ]  # fmt: skip
    assert store.tokens(chat.id) == chat_tokens
    assert store.usage_bytes() == document.nbytes + chat.nbytes


def test_a_partly_matching_entry_yields_its_matching_chunks(store):
    entry = put_entry(store, range(1000))
    edited = list(range(700)) + [99_999] * 50
    match = store.longest_prefix(FP, edited)
    assert match.n_tokens == 512
    assert match.spans == (Span(entry.id, 0, 0, 256), Span(entry.id, 1, 256, 512))
    assert match.parent is None  # a new entry would have to start from token 0


def test_the_parent_must_prefix_the_tokens_and_belong_to_the_model(store):
    parent = put_entry(store, range(300))
    with pytest.raises(ValueError, match="do not start with"):
        store.write_entry(FP, [5] * 400, levels=["raw"], parent_id=parent.id)
    store.register_model("model-b", "/b", {})
    with pytest.raises(ValueError, match="another model"):
        store.write_entry("model-b", range(400), levels=["raw"], parent_id=parent.id)
    with pytest.raises(ValueError, match="nothing to store"):
        store.write_entry(FP, range(300), levels=["raw"], parent_id=parent.id)


def test_models_do_not_share_entries(store):
    put_entry(store, range(600))
    store.register_model("model-b", "/b", {})
    assert store.longest_prefix("model-b", range(600)).n_tokens == 0


def test_two_writers_of_the_same_prefix_end_with_one_entry(store):
    first = store.write_entry(FP, range(300), levels=["raw"], document_id=None)
    second = store.write_entry(FP, range(300), levels=["raw"], document_id=None)
    for writer in (first, second):
        for span in writer.spans:
            writer.put_chunk(span.chunk_index, "raw", b"x" * 10)
    assert second.finish().id == second.entry_id
    assert first.finish().id == second.entry_id
    assert [e.id for e in store.entries()] == [second.entry_id]
    assert store.usage_bytes() == 20


def test_lookup_marks_the_chain_used(tmp_path):
    now = [1000.0]
    with open_store(tmp_path, clock=lambda: now[0]) as store:
        root = put_entry(store, range(300))
        child = put_entry(store, range(600), parent_id=root.id)
        now[0] = 2000.0
        store.longest_prefix(FP, range(600))
        assert [store.entry(e).last_used for e in (root.id, child.id)] == [2000.0, 2000.0]
        now[0] = 3000.0
        store.longest_prefix(FP, range(600), touch=False)
        assert store.entry(root.id).last_used == 2000.0


# Sequences over a tiny alphabet share long prefixes, which is what the lookup must untangle.
token_lists = st.lists(st.integers(0, 2), min_size=1, max_size=40)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stored=st.lists(st.tuples(token_lists, token_lists), max_size=5), query=token_lists)
def test_longest_prefix_matches_brute_force(tmp_path_factory, stored, query):
    chunk = 4
    with open_store(tmp_path_factory.mktemp("kv")) as store:
        covered = {0}  # token counts a brute-force search could reuse
        for head, tail in stored:
            root = put_entry(store, head, chunk_size=chunk, levels=["raw"])
            put_entry(store, head + tail, parent_id=root.id, chunk_size=chunk, levels=["raw"])
            for start, tokens in ((0, head), (len(head), head + tail)):
                stops = range(start + chunk, len(tokens) + chunk, chunk)
                ends = [min(end, len(tokens)) for end in stops]
                covered |= {end for end in ends if query[:end] == tokens[:end]}
        match = store.longest_prefix(FP, query)
        assert match.n_tokens == max(covered)
        assert [t for s in match.spans for t in range(s.token_start, s.token_end)] == list(
            range(match.n_tokens)
        )
        if match.entries:
            assert store.tokens(match.entries[-1].id)[: match.n_tokens] == query[: match.n_tokens]


def test_deleting_an_entry_deletes_the_entries_extending_it(store):
    root = put_entry(store, range(300))
    child = put_entry(store, range(600), parent_id=root.id)
    grandchild = put_entry(store, range(700), parent_id=child.id)
    other = put_entry(store, range(9000, 9100))
    assert store.delete_entry(child.id) == [child.id, grandchild.id]
    assert [e.id for e in store.entries()] == [root.id, other.id]
    assert store.longest_prefix(FP, range(700)).n_tokens == 300
    assert orphans(store) == {}


def test_a_tail_chunk_continues_a_match_for_a_while(tmp_path):
    with open_store(tmp_path) as store:
        root = put_entry(store, range(600))
        child = put_entry(store, [*range(600), *range(1000, 1100)], parent_id=root.id)
        # The query stops inside chunk 1 of the root: it is the tail, 44 tokens into it.
        match = store.longest_prefix(FP, range(300), tail_minimum=32)
        assert match.n_tokens == 256 and match.tail.chunk_index == 1
        assert match.tail_match == 44 and match.tail_tokens == tuple(range(256, 512))
        # Diverging sooner than the minimum: no tail.
        assert store.longest_prefix(FP, [*range(270), *[7] * 50], tail_minimum=32).tail is None
        # Past the root's end, the tail is the first chunk of an entry extending it.
        match = store.longest_prefix(FP, [*range(600), *range(1000, 1050), 5],
                                     tail_minimum=32)
        assert match.n_tokens == 600 and match.tail.entry_id == child.id
        assert match.tail_match == 50
        # Nothing matched at all: a root entry's first chunk can still be the tail.
        match = store.longest_prefix(FP, [*range(100), 9], tail_minimum=32)
        assert match.n_tokens == 0 and match.tail.entry_id == root.id
        assert match.tail_match == 100
        assert store.longest_prefix(FP, range(300)).tail is None  # only when asked for


def test_a_window_is_stored_beside_the_chunks_and_never_matched(store):
    tokens = list(range(700))
    entry = put_entry(store, tokens, window_start=700 - 512)
    # The chunks of its own tokens, then the window's parts, numbered after them.
    assert [(s.chunk_index, s.token_start, s.token_end) for s in store.spans(entry.id)] == [
        (0, 0, 256), (1, 256, 512), (2, 512, 700)]
    windows = store.windows([entry.id, 999])
    assert list(windows) == [entry.id]
    assert [(s.chunk_index, s.token_start, s.token_end) for s in windows[entry.id]] == [
        (3, 188, 444), (4, 444, 700)]
    assert store.read_chunk(entry.id, 4, "compact") == payload(444, 700, "compact")
    assert entry.n_chunks == 3
    assert entry.nbytes == sum(len(payload(s, e, lv)) for s, e in
                               [(0, 256), (256, 512), (512, 700), (188, 444), (444, 700)]
                               for lv in LEVELS)
    match = store.longest_prefix(FP, tokens + [5])
    assert match.n_tokens == 700 and [s.chunk_index for s in match.spans] == [0, 1, 2]
    # A query that ends inside the window matches the chunks, never a window part.
    assert store.longest_prefix(FP, tokens[:444]).n_tokens == 256


def test_an_entry_is_complete_only_with_its_window(store):
    writer = store.write_entry(FP, range(300), levels=["raw"], window_start=100)
    for span in writer.spans:
        writer.put_chunk(span.chunk_index, "raw", b"kv")
    with pytest.raises(IncompleteEntryError):
        writer.finish()
    writer.put_chunk(writer.windows[0].chunk_index, "raw", b"window")
    assert writer.finish().token_end == 300
    with pytest.raises(ValueError, match="window"):
        store.write_entry(FP, range(10), levels=["raw"], window_start=10)


def test_passages_with_kv_are_counted_by_their_text(store):
    """A passage whose text another passage (or document) shares has the same KV: a document
    counts every passage whose text has a named passage entry, whichever document stored it."""
    a = store.add_document("a", "A", "x y x", type="text")
    b = store.add_document("b", "B", "y z", type="text")
    store.add_passages(a.id, passages("x", "y", "x"))
    store.add_passages(b.id, passages("y", "z"))
    y = put_entry(store, range(10), document_id=a.id, passage=True)
    assert store.passage_entries(FP) == {}  # unnamed: stored by an older kvdesk
    y = store.name_passage(y, "y")
    assert store.name_passage(y, "y") == y
    assert store.passage_entries(FP) == {a.id: 1, b.id: 1}
    x = store.name_passage(put_entry(store, range(20, 30), document_id=b.id, passage=True), "x")
    assert store.passage_entries(FP) == {a.id: 3, b.id: 1}
    assert {d: sorted(set(held.values())) for d, held in store.passage_kv(FP).items()} == {
        a.id: [y.id, x.id], b.id: [y.id]}
    assert store.passage_entries("model-b") == {}
    # A document's own entry is never named as a passage's.
    doc_entry = put_entry(store, range(40, 50), document_id=b.id)
    assert store.name_passage(doc_entry, "z").passage_hash is None
    assert store.passage_entries(FP) == {a.id: 3, b.id: 1}


def test_deleting_a_document_hands_its_shared_passage_kv_to_another(store):
    a = store.add_document("a", "A", "x y", type="text")
    c = store.add_document("c", "C", "y", type="text", attaching=True)  # not attached yet
    b = store.add_document("b", "B", "y z", type="text")
    store.add_passages(a.id, passages("x", "y"))
    store.add_passages(b.id, passages("y", "z"))
    store.add_passages(c.id, passages("y"))
    x = store.name_passage(put_entry(store, range(10), document_id=a.id, passage=True), "x")
    y = store.name_passage(put_entry(store, range(20, 30), document_id=a.id, passage=True), "y")
    store.delete_document(a.id)
    # x was A's alone: gone with it; y is B's too: kept, now B's (C's attach may never end)
    assert [(e.id, e.document_id) for e in store.entries()] == [(y.id, b.id)]
    assert store.passage_entries(FP) == {b.id: 1, c.id: 1}
    assert x.id not in [e.id for e in store.entries()]
