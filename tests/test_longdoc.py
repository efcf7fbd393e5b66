"""Answering over a long document's passages: each passage's KV computed once, on its own,
and reused (no recompute) the next time; answers name their sources; follow-ups keep the
chat's passages while they fit; a reopen in another process lays out the same passages.

The passages are written by the test, one paragraph each, and retrieved by the real
retrieval (tests/test_passages.py checks its ranking); these tests check the KV and the
context."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import replace
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest

from desktop_app.chat.attaching import _count
from desktop_app.chat.longdoc import own
from desktop_app.engine import Engine
from desktop_app.errors import Cancelled, EngineError
from desktop_app.kv.blending import repeats
from desktop_app.model import llamacalls
from desktop_app.model.kvstate import in_position_order
from desktop_app.model.llamacalls import pieces
from desktop_app.model.prompts import passage_head, passage_layout, passage_prefix
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from desktop_app.results import Source
from desktop_app.tools import written
from store import BudgetFullError, Store
from store.shared import sync

PASSAGES = [
    "The ferry to Cape Morrow leaves at 07:15 and 16:40 on weekdays. On Saturdays it sails "
    "once, at 10:00. The crossing takes fifty minutes.",
    "The keeper's cottage became a museum in 1979. It keeps the logbooks, a brass telescope "
    "and a barometer that still works. Entry is free.",
    "The tower is 31 metres tall and its light can be seen 40 kilometres out to sea. A storm "
    "in 1956 broke the lantern glass.",
    "Puffins nest on the western cliffs from April to August. Walkers must keep to the "
    "marked path between the lighthouse and the bay.",
    "The island's only shop sells bread, stamps and maps. It closes at noon on Sundays and "
    "is run by the harbour master's family.",
]
GREEDY = GenerationOptions(max_tokens=8, temperature=0)


def add_long_document(store: Store) -> int:
    """A document kept as the passages above (as attach keeps one longer than the context),
    each on lines of its own."""
    doc = store.add_document("h" * 64, "Island guide", "\n\n".join(PASSAGES), type="text")
    store.add_passages(doc.id, [
        SimpleNamespace(index=i, text=t, start=0, end=len(t), page=None,
                        lines=(2 * i + 1, 2 * i + 1), heading=("Island guide",), tokens=40)
        for i, t in enumerate(PASSAGES)])
    return doc.id


@pytest.fixture
def make_engine(tmp_path, model_path, model_hash):
    engines = []

    def make(store=None, **options):
        store = store or Store(tmp_path / "data")
        eng = Engine(store, lambda: Runtime(model_path, model_hash=model_hash, n_ctx=2048,
                                            flash_attn=True),
                     chunk_tokens=64, blend_fraction=0.15, **options)
        eng.session.longdocs.top_k = 2  # (all five would fit this context)
        eng.doc = store.passage_counts() and next(iter(store.passage_counts())) \
            or add_long_document(store)
        eng.ids = {p.index: p.id for p in store.passages(eng.doc)}
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()
    engines[0].store.close()


def passage_entries(eng):
    return {e.id: e for e in eng.store.entries() if e.passage}


# lossless: a passage level the app does not store documents at is read back too.
@pytest.mark.parametrize("level", ["balanced", "lossless"])
def test_passage_kv_is_computed_once_then_read_back(make_engine, level):
    eng = make_engine(passage_level=level)
    doc = eng.doc
    q = "When does the Saturday ferry leave, and what does the museum keep?"
    seen = []
    first = eng.ask(q, doc_ids=[doc], generation=GREEDY, progress=seen.append)
    # Each passage computed is said before it is (the window showed nothing for seconds).
    assert [(p.done, p.total) for p in seen if p.phase == "passages"] == [(0, 2), (1, 2)]
    # The answer names its passages: the ferry's and the museum's, in document order.
    assert [s["passage_id"] for s in first.sources] == [eng.ids[0], eng.ids[1]]
    assert first.sources[0]["text"] == PASSAGES[0]
    assert first.sources[0]["lines"] == [1, 1] and "page" not in first.sources[0]
    assert any("2 passage(s) with no stored KV" in m for m in first.messages)
    stored = passage_entries(eng)
    assert len(stored) == 2
    assert {e.levels for e in stored.values()} == {(level,)}  # one level, not every one
    # Each extends one entry of the passages' system prompt, stored once: not its own copy.
    (head,) = {eng.store.entry(e.parent_id) for e in stored.values()}
    assert eng.store.tokens(head.id) == list(passage_head(eng.runtime))
    assert head.parent_id is None and head.levels == (level,) and not head.passage
    assert all(e.token_start == head.token_end for e in stored.values())
    assert eng.store.passage_entries(eng.fingerprint) == {doc: 2}
    rt = eng.runtime
    own = [len(passage_prefix(rt, t).tokens) for t in PASSAGES[:2]]
    # Both passages computed for this question: every token of its prefix was computed (each
    # passage on its own, then the blend's share and the question); the local API's test
    # below checks that nothing is counted twice (cached tokens 0, not below).
    assert first.recomputed_tokens >= len(passage_layout(rt, PASSAGES[:2]).tokens)

    # A new chat retrieving the same passages reads them back: nothing computed again but
    # the blend's share of the second passage.
    eng.runtime.reset()  # (else the context still holds them, and is kept)
    second = eng.ask(q, doc_ids=[doc], generation=GREEDY)
    assert second.chat_id != first.chat_id
    assert passage_entries(eng).keys() == stored.keys()
    assert not any("with no stored KV" in m for m in second.messages)
    assert second.blended["mode"] == "blended" and second.blended["reused_tokens"] > 0
    assert second.recomputed_tokens < 0.5 * own[1]
    assert second.chunk_levels and "text" not in second.chunk_levels
    assert level in second.chunk_levels
    # Asked at a level passages are not stored at (the window's slider at "high"): read at
    # theirs, the setting's, with no note on every answer; the chunk levels say what it was.
    eng.runtime.reset()
    higher = eng.ask(q, doc_ids=[doc], generation=GREEDY, restore=RestoreOptions(level="high"))
    assert not any("not stored at" in m for m in higher.messages), higher.messages
    assert len(higher.chunk_levels) > 1 and set(higher.chunk_levels) == {level}


def test_passages_stored_after_the_passage_level_changes_extend_the_same_head(make_engine):
    """(Each passage stored after a change of `passage_level` was a root holding its own copy
    of the passages' system prompt: the head was held at the old level only.)"""
    eng = make_engine(passage_level="balanced")
    eng.ask("When does the Saturday ferry leave?", doc_ids=[eng.doc], generation=GREEDY)
    before = passage_entries(eng)
    (head_id,) = {e.parent_id for e in before.values()}
    eng.close()
    eng = make_engine(eng.store, passage_level="high")
    eng.ask("How tall is the tower, and when do puffins nest?", doc_ids=[eng.doc],
            generation=GREEDY)
    added = {i: e for i, e in passage_entries(eng).items() if i not in before}
    assert added and {e.parent_id for e in added.values()} == {head_id}
    assert {e.levels for e in added.values()} == {("high",)}
    assert set(eng.store.entry(head_id).levels) == {"balanced", "high"}
    # The passages stored before still read back from the head at their level.
    eng.runtime.reset()
    again = eng.ask("When does the Saturday ferry leave?", doc_ids=[eng.doc], generation=GREEDY)
    assert not any("with no stored KV" in m for m in again.messages), again.messages
    assert passage_entries(eng).keys() == {*before, *added}


def test_the_sentence_a_question_quotes_comes_from_its_passages_kv(make_engine):
    """A blend takes the KV of what the question's turn quotes from where the passages hold
    it, keys turned to the quote's place: read losslessly, the first layer's keys (which
    depend only on each token and its position) are a prefill's at every position."""
    eng = make_engine(passage_level="lossless")
    q = "When does the Saturday ferry leave, and what does the museum keep?"
    first = eng.ask(q, doc_ids=[eng.doc], generation=GREEDY)
    assert len(first.sources) == 2 and first.evidence, first.evidence
    held = []

    def capture(report):
        rt = eng.runtime
        kv = in_position_order(rt.capture().sections[0])
        held.append((rt.tokens, kv.keys[0], kv.values[0]))

    counts = {}
    for repeat in (False, True):
        eng.session.blender.repeat = repeat
        eng.runtime.reset()
        again = eng.ask(q, doc_ids=[eng.doc], generation=GREEDY, on_restore=capture)
        assert again.evidence == first.evidence and again.blended["mode"] == "blended"
        counts[repeat] = again.blended["quoted_tokens_reused"], again.recomputed_tokens
    assert any("quoted tokens taken from the KV of the text they quote" in m
               for m in again.messages)
    # The quote's tokens but its first are not computed; the context's count is the same.
    assert counts[False][0] == 0 and counts[True][0] >= 8, counts
    assert counts[False][1] == counts[True][1], counts
    tokens, *blended = held[-1]
    rt = eng.runtime
    rt.reset()
    rt.prefill(tokens)
    kv = in_position_order(rt.capture().sections[0])
    for got, exact in zip(blended, (kv.keys[0], kv.values[0]), strict=True):  # values: per token
        exact = exact.astype(np.float32)
        err = np.abs(got.astype(np.float32) - exact).max(axis=1)
        assert err.max() <= 0.02 * np.abs(exact).max(), int(np.argmax(err))


def test_repeats_finds_the_runs_a_turn_copies_from_the_layout():
    layout = [*range(100, 140)]
    after = [1, 2, *range(105, 117), 3, *range(120, 126), 4]  # 12 repeated, then only 6
    assert repeats(layout, after) == [(2, 5, 12)]
    assert repeats(layout, after, minimum=6) == [(2, 5, 12), (15, 20, 6)]
    assert repeats(layout, [1, 2, 3]) == []


def test_a_question_naming_something_rare_is_given_the_passages_that_hold_it(make_engine):
    eng = make_engine()
    longdocs, rt = eng.session.longdocs, eng.runtime
    longdocs.top_k = 5  # all of them, were they not focused
    docs = [eng.store.document(eng.doc)]
    # "island" is in every passage, "shop", "sells" and "maps" in one: that one alone.
    chosen, _ = longdocs.pick(rt, docs, "Which island shop sells maps?", [], 0)
    assert [s.passage_id for s in chosen] == [eng.ids[4]]
    # Every word of this one is rare here (in three passages at most): no fused ranking to
    # cut, every passage sharing a word with it, in document order.
    chosen, _ = longdocs.pick(rt, docs, "When does the Saturday ferry leave, and what does "
                              "the museum keep?", [], 0)
    assert [s.passage_id for s in chosen] == [eng.ids[0], eng.ids[1], eng.ids[3]]
    with pytest.raises(EngineError, match="the query is empty"):  # not "no passage matches"
        eng.passages(eng.doc, query="  ")


def add_passages(store: Store, title: str, texts: list[str]) -> int:
    doc = store.add_document(title[0] * 64, title, "\n\n".join(texts), type="text")
    store.add_passages(doc.id, [
        SimpleNamespace(index=i, text=t, start=0, end=len(t), page=None, lines=(i + 1, i + 1),
                        heading=(title,), tokens=30) for i, t in enumerate(texts)])
    return doc.id


def test_a_name_only_the_second_document_holds_is_read_from_it(make_engine):
    """Two long documents: one's passages scored raw BM25 (no rare word of the question in
    it), the other's fused on the rare name it holds. Sorted by those scores together, the
    first took every place and the passage naming the reactor was never read."""
    eng = make_engine()
    store, longdocs = eng.store, eng.session.longdocs
    plants = ["Plant", "Station", "Works", "Yard", "Site"]
    manual = add_passages(store, "Manual", [
        f"{p} {i}: in an emergency, the duty officer keeps the emergency procedures and "
        f"the shutdown code." for i, p in enumerate(plants)])
    reactors = ["Alder", "Birch", "Tamsin", "Cedar", "Rowan"]
    report = add_passages(store, "Report", [
        f"Reactor {r}: its shutdown code is {4000 + 7 * i}." for i, r in enumerate(reactors)])
    tamsin = next(p.id for p in store.passages(report) if "Tamsin" in p.text)
    question = "What is the emergency shutdown code for reactor Tamsin?"
    for order in ([manual, report], [report, manual]):
        hits = longdocs._hits(order, question, [])
        assert [s.passage_id for s in hits] == [tamsin], hits
    # With no rare word, the documents' passages are ranked together by BM25 over one
    # index: the report's for its reactors' codes, the manual's for what the officer keeps
    # (the report, sharing no word with that question, gives passages near it in meaning).
    for question, doc in (("What is the reactor shutdown code?", report),
                          ("What does the duty officer keep?", manual)):
        hits = longdocs._hits([manual, report], question, [])
        assert [s.document_id for s in hits] == [doc] * longdocs.top_k, hits


def test_a_document_holding_none_of_the_questions_words_gives_nothing_beside_one_that_does(
        make_engine):
    """Every word of "Where are the Quillfeather vault spare keys?" is rare in the two
    documents together (no focus then): the passage holding them came first, and the guide,
    holding none of them, filled the other places with passages near it in meaning."""
    eng = make_engine()
    store, longdocs = eng.store, eng.session.longdocs
    manual = add_passages(store, "Manual", [
        "The Quillfeather vault spare keys hang in the night porter's lodge.",
        *(f"Plant {i}: the duty officer checks the pumps." for i in (3, 4, 5, 6))])
    vault = next(p.id for p in store.passages(manual) if "Quillfeather" in p.text)
    for order in ([eng.doc, manual], [manual, eng.doc]):
        hits = longdocs._hits(order, "Where are the Quillfeather vault spare keys?", [])
        assert hits[0].passage_id == vault and {s.document_id for s in hits} == {manual}, hits
    # A word by which it asks ("explain") is no word of what it asks about.
    notes = add_passages(store, "Notes", [f"Explain tide table {i} to visitors." for i in range(5)])
    hits = longdocs._hits([notes, manual], "Please explain where the Quillfeather vault spare "
                          "keys are.", [])
    assert hits[0].passage_id == vault and {s.document_id for s in hits} == {manual}, hits


def test_a_follow_up_over_two_documents_reads_what_the_turns_were_about(make_engine):
    """"Who runs it now?" after a question about the museum, in a chat over the guide and a
    manual: "runs", rare in the two together by chance, took the places of the museum's
    passage, which the guide's own retrieval reads for it (the turns say what "it" is)."""
    eng = make_engine()
    store, longdocs = eng.store, eng.session.longdocs
    manual = add_passages(store, "Manual", [
        "Plant 2: the duty officer runs the emergency drill on Mondays.",
        *(f"Plant {i}: the duty officer checks the pumps." for i in (3, 4, 5, 6))])
    turns = ["When did the keeper's cottage become a museum?",
             "The keeper's cottage became a museum in 1979."]
    for order in ([eng.doc, manual], [manual, eng.doc]):
        hits = longdocs._hits(order, "Who runs it now?", turns)
        assert eng.ids[1] in [s.passage_id for s in hits], hits
    # A question naming what it asks about is still read for that alone.
    hits = longdocs._hits([eng.doc, manual], "Who runs the emergency drill?", turns)
    assert [s.document_id for s in hits][:1] == [manual], hits


def test_a_follow_up_naming_nothing_quotes_what_the_question_before_it_named(make_engine):
    """"For how much money?" after a question about a budget line quoted a sentence saying
    "much" (rare in the document by chance) as its answer's evidence. A word by which a
    question asks is no name, and a follow-up saying nothing of its own is about what the
    question before it named."""
    from desktop_app.passages.retrieve import asked_with

    assert {"much", "tell", "me", "more"} <= asked_with("Tell me how much more.")
    assert {"please", "summarize"} <= asked_with("Please summarize it.")
    assert "money" not in asked_with("For how much money?")
    # Written as a name, such a word is one: code, or capitalised past the first word.
    assert not {"any", "tell"} & asked_with("What does any() do, and who was William Tell?")
    eng = make_engine()
    longdocs = eng.session.longdocs
    docs = [eng.store.document(eng.doc)]
    sources = longdocs._hits([eng.doc], "museum keeper cottage ferry shop", [])
    before = "When did the keeper's cottage become a museum?"
    museum = "The keeper's cottage became a museum in 1979."
    quoted, _ = longdocs.evidence(docs, [], sources, "How much does it cost?", before)
    assert quoted[0] == museum, quoted
    assert longdocs.evidence(docs, [], sources, "How much does it cost?")[0] == []
    # A question saying what it asks about is quoted for that, whatever came before it.
    quoted, _ = longdocs.evidence(docs, [], sources, "Which shop sells maps?", before)
    assert quoted and not any("museum" in q for q in quoted), quoted


def test_a_name_the_document_never_holds_is_told_to_the_model_on_every_path(make_engine):
    """A question about the Harrowgate ferry, which the guide never names, was answered from
    the nearest passage; the note said so only to the user (and through the API, to no
    one). The turn now tells the model, with the reply that says it."""
    eng = make_engine()
    said = ('When does the Harrowgate ferry leave?\nThe document never mentions Harrowgate. '
            'Reply: "The document does not mention Harrowgate."')
    asked = eng.ask("When does the Harrowgate ferry leave?", doc_ids=[eng.doc],
                    generation=GREEDY)
    assert any(m.startswith("Harrowgate is named nowhere in Island guide") for m in
               asked.messages), asked.messages
    rt = eng.runtime
    assert said in rt.detokenize(eng.session.conversation(rt, asked.chat_id)[1])
    turn, _, _, notes, _ = eng.completions.prompt(
        [{"role": "user", "content": "When does the Harrowgate ferry leave?"}],
        eng.completions.documents([eng.doc]))
    assert said in turn.text and any("Harrowgate is named nowhere" in n for n in notes)
    # A name the guide holds, written as code or not, is no such name.
    assert eng.session.longdocs.quoted(rt, None, [eng.store.document(eng.doc)],
                                       "When does the `ferry` to Cape Morrow leave?")[1] == []


def test_a_new_chat_over_a_short_document_holds_no_passages_of_an_earlier_one(make_engine):
    eng = make_engine()
    over_passages = eng.ask("What does the museum keep?", doc_ids=[eng.doc], generation=GREEDY)
    assert over_passages.sources
    short = eng.store.add_document("s" * 64, "Note", "The bakery opens at six.", type="text")
    for doc_ids in ([short.id], []):
        other = eng.ask("When does the bakery open?", doc_ids=doc_ids, generation=GREEDY)
        assert other.sources == [] and not other.evidence
        later = eng.ask("And on Sundays?", chat_id=other.chat_id, generation=GREEDY)
        assert later.sources == []


def test_a_short_document_beside_a_long_one_is_read_whole_before_its_passages(make_engine):
    """A book and a page of notes in one chat: the notes are read whole, as a part of the
    chat's prefix before the passages, their KV kept as a passage's (computed once, read
    back); a follow-up, a reopen in another process and the local API lay out the same."""
    eng = make_engine()
    note = "Note: the bakery on Quay Street opens at six and sells saffron buns."
    short = eng.store.add_document("s" * 64, "Notes", note, type="text")
    whole = f"Document: Notes\n\n{note}"
    first = eng.ask("What does the museum keep?", doc_ids=[eng.doc, short.id],
                    generation=GREEDY)
    assert not any("not read" in m for m in first.messages), first.messages
    rt = eng.runtime
    sizes = [b - a for a, b in passage_layout(
        rt, [whole, *(s["text"] for s in first.sources)]).parts]
    assert f"1 document(s) read whole beside the passages: their KV computed ({sizes[0]} " \
        "tokens) and stored, as a passage's is" in first.messages, first.messages
    assert any(m.startswith("3 documents and passages blended") for m in first.messages)
    # the passages' tokens, not the document's read whole beside them
    assert any(m.startswith("2 passage(s) with no stored KV") and
               f"computed ({sum(sizes[1:])} tokens in all)" in m for m in first.messages)
    assert first.sources and {s["document_id"] for s in first.sources} == {eng.doc}
    named = [{"document_id": short.id, "title": "Notes"}]  # among the sources too
    assert first.read_whole == named
    assert eng.export_chat(first.chat_id, "markdown").count("> source: Notes (read whole)") == 1
    rt = eng.runtime
    _, tokens, _ = eng.session.conversation(rt, first.chat_id)
    layout = passage_layout(rt, [whole, *(s["text"] for s in first.sources)])
    assert tuple(tokens[:len(layout.tokens)]) == layout.tokens  # the notes first
    assert eng.session.longdocs.kv.entry(rt, whole) is not None  # its KV, kept
    eng.runtime.reset()
    again = eng.ask("What does the museum keep?", doc_ids=[eng.doc, short.id],
                    generation=GREEDY)
    assert not any("with no stored KV" in m for m in again.messages), again.messages
    assert again.recomputed_tokens < len(passage_prefix(rt, PASSAGES[1]).tokens)
    follow = eng.ask("And when does the bakery open?", chat_id=again.chat_id,
                     generation=GREEDY)
    # What the question asks of the notes, not of the guide, is quoted from them.
    assert follow.evidence == [note], follow.evidence
    docs = [eng.library.document(d) for d in (eng.doc, short.id)]
    longdocs = eng.session.longdocs
    assert longdocs.evidence(docs, longdocs.wholes(rt, docs), [], "What do the Notes say "
                             "about buns?")[0] == [note]  # not the line naming it
    # and first, beside a word the guide holds rarely ("museum": one passage)
    both = eng.ask("Is the bakery near the museum?", doc_ids=[eng.doc, short.id],
                   generation=GREEDY)
    assert both.evidence[0] == note and any("museum" in q for q in both.evidence[1:]), \
        both.evidence
    _, tokens, _ = eng.session.conversation(rt, follow.chat_id)
    other = make_engine(store=eng.store)  # another process reopens it the same way
    assert other.session.conversation(other.runtime, follow.chat_id)[1] == tokens
    assert other.reopen(follow.chat_id).tokens == len(tokens)
    assert other.ask("And the tower?", chat_id=follow.chat_id, generation=GREEDY
                     ).read_whole == named
    api = eng.complete([{"role": "user", "content": "What does the museum keep?"}],
                       documents=[eng.doc, short.id], generation=GREEDY)
    assert api.sources and not any("not read" in m for m in api.messages)
    assert api.read_whole == named
    assert api.cached_tokens >= len(passage_prefix(rt, whole).tokens) - 1


def test_a_chat_whose_document_is_deleted_says_so_and_reads_none_of_its_passages(
        make_engine):
    eng = make_engine()
    first = eng.ask("What does the museum keep?", doc_ids=[eng.doc], generation=GREEDY)
    title = eng.store.document(eng.doc).title
    assert eng.delete_document(eng.doc) == [first.chat_id]
    later = eng.ask("And the tower?", chat_id=first.chat_id, generation=GREEDY)
    assert later.sources == [] and later.documents == []
    assert f"document {eng.doc} ({title}) of this chat was deleted: the chat goes on " \
        "without it" in later.messages
    # an export names the deleted document's sources by its title
    assert f"{title} (deleted) #" in eng.export_chat(first.chat_id)
    again = eng.ask("And the shop?", chat_id=first.chat_id, generation=GREEDY)
    assert not any("deleted" in m for m in again.messages)  # said once


def test_a_chat_over_two_long_documents_goes_on_with_the_one_left(make_engine):
    eng = make_engine()
    harbour = ["The harbour office opens at 06:30 and sells ferry tickets.",
               "Fishing boats land their catch at the north quay before dawn."]
    other = eng.store.add_document("o" * 64, "Harbour guide", "\n\n".join(harbour),
                                   type="text")
    eng.store.add_passages(other.id, [
        SimpleNamespace(index=i, text=t, start=0, end=len(t), page=None, lines=(i + 1, i + 1),
                        heading=(), tokens=12) for i, t in enumerate(harbour)])
    first = eng.ask("When does the harbour office open, and what does the museum keep?",
                    doc_ids=[eng.doc, other.id], generation=GREEDY)
    assert {s["document_id"] for s in first.sources} == {eng.doc, other.id}
    # An export names each source's document by its title (a deleted one's kept for the chat).
    assert "> source: Harbour guide #" in eng.export_chat(first.chat_id)
    eng.delete_document(other.id)
    assert "> source: Harbour guide (deleted) #" in eng.export_chat(first.chat_id)
    for _ in range(2):  # in this process, and as another would read it (from its answer)
        later = eng.ask("And the museum's telescope?", chat_id=first.chat_id,
                        generation=GREEDY)
        assert later.sources and {s["document_id"] for s in later.sources} == {eng.doc}
        eng.session.longdocs._chosen.clear()
    eng.runtime.reset()
    assert eng.reopen(first.chat_id).tokens


def test_attaching_a_file_again_numbers_its_passages_by_the_file(make_engine, tmp_path):
    eng = make_engine()
    path = tmp_path / "tool.py"
    path.write_text("\n\n\n".join(f"def f{i}(x):\n    return x + {i}  # {'pad ' * 20}"
                                   for i in range(300)))
    doc = eng.attach(path).doc_id
    right = {p.id: p.lines for p in eng.store.passages(doc)}
    assert len(right) > 10 and max(b for _, b in right.values()) > 1000  # the file's lines
    eng.store.set_passage_lines([(pid, (1, 1)) for pid in right])  # as an older kvdesk did
    assert eng.attach(path).reused
    assert {p.id: p.lines for p in eng.store.passages(doc)} == right


def test_follow_ups_keep_the_chats_passages_and_a_reopen_lays_them_out(make_engine):
    eng = make_engine()
    doc = eng.doc
    first = eng.ask("What does the museum keep?", doc_ids=[doc], generation=GREEDY)
    chat = first.chat_id
    assert eng.ids[1] in [s["passage_id"] for s in first.sources]
    # The turn computed quotes the sentence naming what it asks about; the message stored
    # is the question as asked.
    asked = eng.library.history(chat)[0]
    assert asked.text == "What does the museum keep?"
    turn = eng.runtime.detokenize(eng.store.message_tokens(chat, eng.runtime.fingerprint)[
        asked.id])
    assert ("What does the museum keep?\nAnswer from these lines of the document: "
            '"The keeper\'s cottage became a museum in 1979."') in turn
    assert first.evidence == ["The keeper's cottage became a museum in 1979."]  # said so
    # An exported chat names them too.
    exported = eng.export_chat(chat)
    assert "> source: Island guide #1 \\[line 3\\] Island guide" in exported
    assert "> quoted with the question: \"The keeper's cottage" in exported
    follow = eng.ask("Tell me more.", chat_id=chat, generation=GREEDY)
    ids = [s["passage_id"] for s in follow.sources]
    # Saying nothing of its own, it keeps the museum's passage, room allowing; document order.
    assert eng.ids[1] in ids and ids == sorted(ids)
    # Those the follow-up did not retrieve itself are said to be the chat's earlier ones
    asked = [m.text for m in eng.library.history(chat)[:2]]
    fresh = {h.passage_id for h in eng.session.longdocs._hits([doc], "Tell me more.", asked)}
    assert [s["earlier"] for s in follow.sources] == [
        s["passage_id"] not in fresh for s in follow.sources]
    # Blended answers are never stored; the exact context is, in the background, as an entry
    # extending the first passage's.
    assert eng.exactness.idle.wait(300)
    (own,) = [e for e in eng.store.entries() if e.chat_id == chat]
    assert eng.store.entry(own.parent_id).passage
    _, tokens, _ = eng.session.conversation(eng.runtime, chat)
    layout = passage_layout(eng.runtime, [s["text"] for s in follow.sources])
    assert tuple(tokens[:len(layout.tokens)]) == layout.tokens

    # Another process (a fresh engine on the same store) remembers the chat's passages.
    again = make_engine(store=eng.store)
    _, reopened, _ = again.session.conversation(again.runtime, chat)
    assert reopened == tokens
    report = again.reopen(chat)
    assert report.tokens == len(tokens)


def test_a_chat_over_passages_keeps_only_the_context_its_next_turn_resumes_from(make_engine):
    eng = make_engine()
    other = eng.ask("When does the ferry leave?", doc_ids=[eng.doc], generation=GREEDY).chat_id
    assert eng.exactness.idle.wait(300)
    chat = None
    for question in ("What does the museum keep?", "Where do puffins nest?",
                     "When does the shop close?"):
        chat = eng.ask(question, doc_ids=[eng.doc], chat_id=chat, generation=GREEDY).chat_id
        assert eng.exactness.idle.wait(300)
    # Each turn blended other passages from token 0: only the last turn's context is kept.
    (own,) = [e for e in eng.store.entries() if e.chat_id == chat]
    _, tokens, _ = eng.session.conversation(eng.runtime, chat)
    assert own.token_end == len(tokens)
    assert [e for e in eng.store.entries() if e.chat_id == other]  # another chat's: untouched
    report = eng.reopen(chat)
    assert report.tokens == len(tokens) and report.recomputed_tokens == 0


def test_a_chat_entry_deleted_while_a_reopen_reads_it_is_recomputed(make_engine, monkeypatch):
    """Another process's turn drops the chat's entry a reopen is reading (it supersedes it):
    the reopen computes what it could not read, and says so, never an error."""
    eng = make_engine()
    chat = eng.ask("Where do puffins nest?", doc_ids=[eng.doc], generation=GREEDY).chat_id
    assert eng.exactness.idle.wait(300)
    (own,) = [e for e in eng.store.entries() if e.chat_id == chat]
    real, reads = eng.store.read_chunk, []

    def dropped_meanwhile(entry_id, chunk_index, level):
        reads.append(entry_id)
        if len(reads) == 2:
            eng.store.delete_entry(own.id)
        return real(entry_id, chunk_index, level)

    monkeypatch.setattr(eng.store, "read_chunk", dropped_meanwhile)
    _, tokens, _ = eng.session.conversation(eng.runtime, chat)
    report = eng.reopen(chat)
    assert len(reads) > 2 and report.tokens == len(tokens) and report.recomputed_tokens > 0
    assert any("recomput" in m or "no readable level" in m for m in report.messages), \
        report.messages


def test_a_question_stopped_before_its_answer_leaves_the_chat_its_passages(make_engine):
    eng = make_engine()
    first = eng.ask("When does the ferry to Cape Morrow leave?", doc_ids=[eng.doc],
                    generation=GREEDY)
    answered = {s["passage_id"] for s in first.sources}
    stop = threading.Event()
    with pytest.raises(Cancelled):  # stopped once its passages are in the context
        eng.ask("When do puffins nest on the cliffs?", chat_id=first.chat_id,
                generation=GREEDY, cancel=stop, on_restore=lambda report: stop.set())
    assert eng.ids[3] not in answered
    follow = eng.ask("Tell me more.", chat_id=first.chat_id, generation=GREEDY)
    # What the chat keeps from before is its stored answer's, not the stopped question's.
    assert {s["passage_id"] for s in follow.sources if s["earlier"]} <= answered
    assert eng.ids[3] not in {s["passage_id"] for s in follow.sources}


def test_a_follow_up_keeps_only_the_last_questions_passages_and_only_if_it_needs_them(
        make_engine):
    """A question naming what it asks about reads its own passages; one saying nothing of
    its own keeps those the question before it retrieved, and no question keeps what the
    ones before that found (a chat whose context only grows gets slower, and a small model
    answers from passages about what the chat has moved on from)."""
    eng = make_engine()
    specific = partial(eng.session.longdocs.retriever.specific, eng.doc)
    assert specific("What does the museum keep?") and not specific("Tell me more.")
    first = eng.ask("When does the ferry to Cape Morrow leave?", doc_ids=[eng.doc],
                    generation=GREEDY)
    second = eng.ask("What does the museum keep?", chat_id=first.chat_id, generation=GREEDY)
    assert eng.ids[1] in {s["passage_id"] for s in second.sources}
    assert not any(s["earlier"] for s in second.sources)  # the ferry's is not kept
    third = eng.ask("Tell me more.", chat_id=first.chat_id, generation=GREEDY)
    given = {s["passage_id"] for s in third.sources}
    assert {s["passage_id"] for s in third.sources if s["earlier"]} <= {
        s["passage_id"] for s in second.sources}
    assert eng.ids[0] not in given  # not the first question's
    # The earlier ones fill what room a question's own leave, up to what one retrieves.
    lds = eng.session.longdocs
    passage = {p.index: Source(p.id, eng.doc, p.index, p.text, 1.0 - p.index / 10, None,
                               p.lines) for p in eng.store.passages(eng.doc)}
    fit = partial(lds._fit, eng.runtime, budget=2000, doc_order=[eng.doc])
    assert [(s.index, s.earlier) for s in fit([passage[2]], [passage[0], passage[4]])] == [
        (0, True), (2, False)]  # top_k = 2: the best earlier one beside its own
    assert [s.index for s in fit([passage[2], passage[3]], [passage[0]])] == [2, 3]


def test_a_follow_up_naming_what_it_asks_about_is_retrieved_as_if_asked_alone(make_engine):
    """The last turns join the query of a follow-up that points back ("Does it ..."), not
    of one naming what it asks about: their words (an invented answer's too) would only add
    their passages to its own."""
    eng = make_engine()
    retriever, recent = eng.session.longdocs.retriever, [
        "What does the museum keep?", "Logbooks, a brass telescope and a barometer."]

    def read(question):
        return {h.index for h in retriever.retrieve(eng.doc, question, recent=recent, k=5,
                                                     focus=True)}

    named = "When does the Cape Morrow ferry sail on Saturdays?"
    assert read(named) == {h.index for h in retriever.retrieve(eng.doc, named, k=5,
                                                               focus=True)}
    assert 1 not in read(named)  # the museum's


def test_a_follow_up_pointing_back_keeps_what_it_points_at(make_engine):
    """"Does it stop at the Museum?" names the museum, but "it" is the ferry of the question
    before: that question's passage stays in its context."""
    eng = make_engine()
    first = eng.ask("When does the ferry to Cape Morrow leave?", doc_ids=[eng.doc],
                    generation=GREEDY)
    assert not eng.session.longdocs.retriever.specific(eng.doc, "Does it stop at the Museum?")
    follow = eng.ask("Does it stop at the Museum?", chat_id=first.chat_id, generation=GREEDY)
    assert eng.ids[0] in {s["passage_id"] for s in follow.sources}


def test_own_keeps_what_an_answers_question_retrieved_itself():
    fresh, kept = (Source(i, 1, i, f"text {i}", 0.5, earlier=e) for i, e in ((1, False),
                                                                              (2, True)))
    assert own([kept, fresh]) == [fresh]
    assert own([kept]) == [kept]  # (an answer given nothing of its own: all it was given)


def test_passage_kv_under_another_model_is_not_called_this_chats_cache(make_engine):
    """Under another model a chat over passages computes its own: that their KV exists under
    the first one is not "the cache of this chat was made under another model"."""
    eng = make_engine()
    eng.ask("What does the museum keep?", doc_ids=[eng.doc], generation=GREEDY)
    assert passage_entries(eng)
    doc = eng.library.document(eng.doc)
    assert eng.library.stale_note(None, [doc], "another-model") == []
    # nor a short document's own entry, read whole as a passage is beside it
    notes = eng.store.add_document("n" * 64, "Notes", "The bakery opens at six.", type="text")
    eng.ask("When does the bakery open?", doc_ids=[notes.id], generation=GREEDY)
    assert eng.store.document_entry(notes.id, eng.fingerprint) is not None
    assert eng.library.stale_note(None, [notes], "another-model")  # (alone: it is read)
    assert eng.library.stale_note(None, [doc, notes], "another-model") == []
    # nor, beside another model's, an entry of this model's own that a restore did not read
    # (a level it does not hold)
    entries = eng.store.entries()
    eng.store.entries = lambda: [*entries, *(replace(e, model="another-model")
                                            for e in entries)]
    assert eng.library.stale_note(None, [notes], eng.fingerprint) == []
    lossless = eng.ask("When does the bakery open?", doc_ids=[notes.id], generation=GREEDY,
                       restore=RestoreOptions(level="lossless"))
    assert lossless.recomputed_tokens and not any("another model" in m
                                                  for m in lossless.messages)


def test_a_passage_evicted_between_being_found_and_read_is_computed(make_engine, monkeypatch):
    """Under a small storage budget, the passages a question computes can evict those it
    found stored a moment before: those are computed too, never an error."""
    eng = make_engine()
    q = "When does the Saturday ferry leave, and what does the museum keep?"
    eng.ask(q, doc_ids=[eng.doc], generation=GREEDY)  # both passages get their KV
    found = passage_entries(eng)
    real = eng.store.tokens

    def evicted_meanwhile(entry_id):
        if entry_id in found:
            eng.store.gc(budget_bytes=1)
        return real(entry_id)

    monkeypatch.setattr(eng.store, "tokens", evicted_meanwhile)
    eng.runtime.reset()
    again = eng.ask(q, doc_ids=[eng.doc], generation=GREEDY)
    assert again.answer and again.recomputed_tokens > 0


def test_eviction_takes_passage_kv_and_keeps_text_and_index(make_engine):
    eng = make_engine()
    q = "What does the museum keep?"
    eng.ask(q, doc_ids=[eng.doc], generation=GREEDY)
    info = {d.doc_id: d for d in eng.documents()}[eng.doc]
    assert (info.passages, info.passages_cached) == (5, 2)
    assert info.status == "passages"  # ready for questions, with no whole-document cache
    assert set(info.cache_bytes) == {"balanced"} and info.cache_bytes["balanced"] == sum(
        e.nbytes for e in passage_entries(eng).values())
    cached = set(passage_entries(eng))
    report = eng.store.gc(budget_bytes=1)
    assert cached and set(report["evicted_entries"]) >= cached
    assert not passage_entries(eng)
    # The text and the index stay: the passages are still there and still found.
    assert len(eng.store.passages(eng.doc)) == 5
    assert [p.index for p, _ in eng.store.search_passages(eng.doc, "museum")] == [1]
    info = {d.doc_id: d for d in eng.documents()}[eng.doc]
    assert (info.passages, info.passages_cached, info.cache_bytes) == (5, 0, {})
    eng.runtime.reset()
    again = eng.ask(q, doc_ids=[eng.doc], generation=GREEDY)
    assert any("with no stored KV" in m for m in again.messages)  # computed again, said
    assert len(passage_entries(eng)) == 2


def test_storing_a_questions_passages_names_the_caches_it_evicted(make_engine):
    """The storage budget's promise holds for passage KV too: a question whose passages'
    KV pushes another document's cache out says which (it was silent)."""
    eng = make_engine()
    q = "What does the museum keep?"
    eng.ask(q, doc_ids=[eng.doc], generation=GREEDY)
    passages_bytes = sum(e.nbytes for e in passage_entries(eng).values())
    eng.store.gc(budget_bytes=1)
    notes = eng.store.add_document("n" * 64, "Notes", "The bakery opens at six.", type="text")
    eng.ask("When does the bakery open?", doc_ids=[notes.id], generation=GREEDY)
    assert eng.store.document_entry(notes.id, eng.fingerprint) is not None
    eng.store.budget_bytes = passages_bytes + 1000  # room for the passages alone
    eng.runtime.reset()
    again = eng.ask(q, doc_ids=[eng.doc], generation=GREEDY)
    assert any(m.startswith("storing this evicted") and "document" in m and "(Notes)" in m
               for m in again.messages), again.messages
    assert eng.store.document_entry(notes.id, eng.fingerprint) is None


def test_the_local_api_answers_from_passages_and_names_them(make_engine):
    eng = make_engine()
    eng.session.exact_later = True  # (a long-running engine's, which makes a chat's exact)
    messages = [{"role": "user", "content": "What does the museum keep?"}]
    first = eng.complete(messages, documents=[eng.doc], generation=GREEDY)
    # A prompt is no chat: nothing makes its blended context exact, and no note says so.
    assert any("2 passages blended" in m for m in first.messages), first.messages
    assert not any("in the background" in m for m in first.messages)
    assert eng.ids[1] in [s["passage_id"] for s in first.sources]
    assert first.cached_tokens == 0  # its passages' KV computed for it: nothing was cached
    assert passage_entries(eng)  # computed on first retrieval, and kept
    eng.runtime.reset()
    again = eng.complete(messages, documents=[eng.doc], generation=GREEDY)
    assert again.sources == first.sources
    assert not first.stored and not again.stored  # blended: approximate, never stored
    heads = {e.parent_id for e in passage_entries(eng).values()}  # (the passages' head)
    assert not [e for e in eng.store.entries() if not e.passage and e.id not in heads]
    assert again.cached_tokens >= len(passage_prefix(eng.runtime, PASSAGES[1]).tokens)
    # The last user message's turn quotes its evidence, as a chat's question does.
    turn, _, quoted, _, _ = eng.completions.prompt(messages, eng.completions.documents([eng.doc]))
    assert again.evidence == quoted == ["The keeper's cottage became a museum in 1979."]
    assert 'museum keep?\nAnswer from these lines of the document: "The keeper' in turn.text
    assert eng.completions.prompt(messages, eng.completions.documents(
        [eng.doc, eng.doc]))[0] == turn  # read once
    # The window shows a source among its neighbours in the document.
    near = eng.passages_around(eng.doc, 1, around=1)
    assert [(s.index, s.text, s.lines) for s in near] == [
        (i, PASSAGES[i], (2 * i + 1, 2 * i + 1)) for i in (0, 1, 2)]


def test_an_agents_tool_result_is_not_taken_for_the_question(make_engine):
    """A probe's agent asked a document's model, got a call, sent its result: the result,
    written as a user message, was retrieved for and told to the model as names the document
    never holds ("get_weather and call_abc123 are named nowhere"). The question before it
    is what the passages and the quote are for."""
    eng = make_engine()
    messages = written([
        {"role": "user", "content": "What does the museum keep?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc123", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc123", "content": '{"temp": 18}'}])
    turn, sources, quoted, notes, _ = eng.completions.prompt(
        messages, eng.completions.documents([eng.doc]))
    assert eng.ids[1] in [s.passage_id for s in sources]
    assert quoted == ["The keeper's cottage became a museum in 1979."]
    assert not any("named nowhere" in n for n in notes), notes
    assert "Tool result of get_weather (call call_abc123):" in turn.text


def test_an_api_conversation_keeps_its_last_questions_passages_as_a_chat_does(make_engine):
    eng = make_engine()
    eng.session.longdocs.top_k = 5  # (room for more than its own: what is kept is the rule's)
    messages = [{"role": "user", "content": "When does the Saturday ferry leave?"},
                {"role": "assistant", "content": "At 10:00."},
                {"role": "user", "content": "And what does the Museum keep?"},
                {"role": "assistant", "content": "Logbooks and a telescope."},
                {"role": "user", "content": "Which of them is older?"}]
    _, sources, _, _, _ = eng.completions.prompt(messages, eng.completions.documents([eng.doc]))
    fresh = {h.passage_id for h in eng.session.longdocs._hits(
        [eng.doc], messages[-1]["content"], [m["content"] for m in messages[:-1]])}
    given = {s.passage_id for s in sources}
    assert eng.ids[1] in given  # the museum's, its last question's (and "them")
    assert eng.ids[0] not in given - fresh  # not the ferry's, two questions back


def test_an_api_conversation_keeps_what_its_last_question_was_given(make_engine, monkeypatch):
    """Retrieved again after the messages before it, the answers too, as its request was;
    and not even looked for when the new question says what it asks about."""
    eng = make_engine()
    eng.session.longdocs.top_k = 5
    asked = [{"role": "user", "content": "Tell me about the ferry."},
             {"role": "assistant", "content": "A storm in 1956 broke the lantern glass."},
             {"role": "user", "content": "What year was that?"}]
    _, given, _, _, _ = eng.completions.prompt(asked, eng.completions.documents([eng.doc]))
    assert eng.ids[2] in {s.passage_id for s in given}  # the storm's, for the answer's words
    follow = [*asked, {"role": "assistant", "content": "In 1956."},
              {"role": "user", "content": "Is it open on Sundays?"}]
    _, sources, _, _, _ = eng.completions.prompt(follow, eng.completions.documents([eng.doc]))
    assert {s.passage_id for s in given} <= {s.passage_id for s in sources}
    looked = []
    monkeypatch.setattr(eng.session.longdocs, "asked_before", lambda *a: looked.append(a) or [])
    eng.completions.prompt([*follow[:-1], {"role": "user", "content":
                                           "When does the ferry to Cape Morrow leave?"}],
                           eng.completions.documents([eng.doc]))
    assert not looked


def test_a_text_the_document_repeats_is_read_once(make_engine):
    eng = make_engine()
    best = Source(1, eng.doc, 0, PASSAGES[0], 0.9, lines=(1, 1))
    again = Source(2, eng.doc, 3, PASSAGES[0], 0.8, lines=(7, 7))  # the same text elsewhere
    other = Source(3, eng.doc, 1, PASSAGES[1], 0.7, lines=(3, 3))
    chosen = eng.session.longdocs._fit(eng.runtime, [best, again, other], [], 10_000, [eng.doc])
    assert [s.passage_id for s in chosen] == [1, 3]


def test_kvdesk_passages_lists_a_repeated_text_once_as_a_chat_reads_it(make_engine):
    eng = make_engine()
    texts = [PASSAGES[0], PASSAGES[1], PASSAGES[0]]  # the ferry's twice, as a manual repeats
    doc = eng.store.add_document("r" * 64, "Repeats", "\n\n".join(texts), type="text")
    eng.store.add_passages(doc.id, [
        SimpleNamespace(index=i, text=t, start=0, end=len(t), page=None, lines=(i + 1, i + 1),
                        heading=(), tokens=40) for i, t in enumerate(texts)])
    listed = eng.passages(doc.id, query="When does the ferry to Cape Morrow leave?")
    assert [h.text for h in listed].count(PASSAGES[0]) == 1
    wide = eng.passages(doc.id, query="When does the ferry to Cape Morrow leave?", wide=True)
    assert [h.text for h in wide].count(PASSAGES[0]) == 2


def test_one_passage_computed_for_a_request_is_not_counted_as_cached(make_engine):
    """A single passage is not blended but restored from the entry just stored for it: the
    tokens computed for it are still the request's, not the cache's."""
    eng = make_engine()
    eng.session.longdocs.top_k = 1
    messages = [{"role": "user", "content": "Which island shop sells maps?"}]
    first = eng.complete(messages, documents=[eng.doc], generation=GREEDY)
    assert [s["passage_id"] for s in first.sources] == [eng.ids[4]]
    assert first.cached_tokens == 0, first.messages
    eng.runtime.reset()
    again = eng.complete(messages, documents=[eng.doc], generation=GREEDY)
    assert again.cached_tokens >= len(passage_prefix(eng.runtime, PASSAGES[4]).tokens) - 1
    asked = eng.ask("Which island shop sells maps?", doc_ids=[eng.doc], generation=GREEDY)
    assert asked.recomputed_tokens == 0  # (the same passage, read back)
    eng.store.gc(budget_bytes=1)  # no passage KV left: the next ask computes it again
    eng.runtime.reset()
    computed = eng.ask("Which island shop sells maps?", doc_ids=[eng.doc], generation=GREEDY)
    assert computed.recomputed_tokens >= len(passage_prefix(eng.runtime, PASSAGES[4]).tokens)


def test_a_chat_over_one_passage_is_read_at_the_passage_level_without_a_note(make_engine):
    """The window's slider names documents' and chats' levels: a passage, kept at the one
    `passage_level`, is read at it with no note, whether the chat's prefix is the passage's
    own entry or the chat's exact entry that extends it."""
    eng = make_engine()
    eng.session.longdocs.top_k = 1
    high = RestoreOptions(level="high")
    q = "Which island shop sells maps?"
    eng.ask(q, doc_ids=[eng.doc], generation=GREEDY)  # the passage's KV
    eng.runtime.reset()
    asked = eng.ask(q, doc_ids=[eng.doc], generation=GREEDY, restore=high)
    assert asked.recomputed_tokens == 0 and set(asked.chunk_levels) == {"balanced"}
    assert not any("not stored at" in m for m in asked.messages), asked.messages
    follow = eng.ask("And when does it close on Sundays?", chat_id=asked.chat_id,
                     generation=GREEDY, restore=high)
    assert eng.exactness.idle.wait(300)
    (entry,) = [e for e in eng.store.entries() if e.chat_id == follow.chat_id]
    while not entry.passage and entry.parent_id is not None:  # (the first chat's, maybe)
        entry = eng.store.entry(entry.parent_id)
    assert entry.passage  # the chat's turns extend the passage's entry (and its head)
    eng.runtime.reset()
    report = eng.reopen(follow.chat_id, restore=high)
    assert {"balanced", "high"} <= set(report.chunk_levels), report.chunk_levels
    assert not any("not stored at" in m for m in report.messages), report.messages


def test_ask_json_names_the_sources_of_an_answer_over_a_long_document(tmp_path, monkeypatch,
                                                                       model_path):
    import json
    import subprocess
    import sys

    def kvdesk(*args):
        proc = subprocess.run([sys.executable, "-m", "desktop_app", *args, "--json"],
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        return json.loads(proc.stdout)

    monkeypatch.setenv("KVDESK_N_CTX", "1024")  # so that a few pages are a long document
    topics = ["tides", "harbour", "lanterns", "gulls", "charts", "ropes", "storms", "fog"]
    paragraphs = [f"Chapter {i + 1} is about the {t} of the island. " * 12 for i, t in
                  enumerate(topics * 2)]
    paragraphs[11] += "The lighthouse keeper's cat is called Admiral Whiskers."
    book = tmp_path / "book.txt"
    book.write_text("\n\n".join(paragraphs))
    doc = kvdesk("attach", str(book))[0]
    assert doc["passages"] > 1
    question = "What is the lighthouse keeper's cat called?"
    first = kvdesk("ask", str(doc["doc_id"]), question, "--max-tokens", "8")
    assert first["sources"], first
    assert {"passage_id", "text", "lines", "score"} <= set(first["sources"][0])
    assert any("Admiral Whiskers" in s["text"] for s in first["sources"])
    listed = kvdesk("docs")[0]
    assert listed["passages"] == doc["passages"]
    assert listed["passages_cached"] == len(first["sources"])
    # The next process finds every passage's KV stored: none is computed again.
    second = kvdesk("ask", str(doc["doc_id"]), question, "--max-tokens", "8")
    assert not any("with no stored KV" in m for m in second["messages"])
    assert [s["passage_id"] for s in second["sources"]] == \
        [s["passage_id"] for s in first["sources"]]


def test_passage_kv_travels_through_the_shared_cache(tmp_path, remote_tier, model_path,
                                                     model_hash):
    def on(folder, **kw):
        store = Store(folder)
        eng = Engine(store, lambda: Runtime(model_path, model_hash=model_hash, n_ctx=2048,
                                            flash_attn=True),
                     chunk_tokens=64, blend_fraction=0.15, remote=remote_tier, **kw)
        eng.session.longdocs.top_k = 2
        eng.doc = add_long_document(store)
        return eng

    q = "When does the Saturday ferry leave, and what does the museum keep?"
    a = on(tmp_path / "a", auto_push=True)
    b = on(tmp_path / "b")
    try:
        first = a.ask(q, doc_ids=[a.doc], generation=GREEDY)
        assert any("with no stored KV" in m for m in first.messages)
        index = sync.remote_index(remote_tier, a.fingerprint)
        assert len(index) == 2  # each passage's entry shared as it was computed
        # Machine B has the same document: it takes the passages' KV from the bucket.
        other = b.ask(q, doc_ids=[b.doc], generation=GREEDY)
        assert [s["text"] for s in other.sources] == [s["text"] for s in first.sources]
        assert any("2 passage(s) taken from the shared cache" in m for m in other.messages)
        assert not any("with no stored KV" in m for m in other.messages)
        assert len(passage_entries(b)) == 2
        # A whole-store pull never takes a passage for a document.
        assert sync.pull_all(b.store, remote_tier, b.fingerprint)["pulled"] == []
        with Store(tmp_path / "c") as c:  # (and says they stay there)
            assert sync.pull_all(c, remote_tier, b.fingerprint)["passages_left"] == 2
        assert [d.title for d in b.store.documents()] == ["Island guide"]
    finally:
        for eng in (a, b):
            eng.close()
            eng.store.close()


def test_a_long_running_engine_gives_every_passage_its_kv_in_the_background(make_engine):
    eng = make_engine()
    eng.warm_up()  # the window and `kvdesk serve` do: it resumes the passage pass
    assert eng.passage_fill.idle.wait(300)
    assert eng.store.passage_entries(eng.fingerprint) == {eng.doc: 5}
    info = {d.doc_id: d for d in eng.documents()}[eng.doc]
    assert (info.passages, info.passages_cached) == (5, 5)
    # Resumable: a restart finds what is stored and computes only the rest. Entries stored
    # by a kvdesk that did not name them by their text are named as the pass finds them.
    stored = passage_entries(eng)
    dropped = next(iter(stored))
    eng.store.delete_entry(dropped)
    with sqlite3.connect(eng.store.path) as conn:
        conn.execute("UPDATE kv_entries SET passage_hash = NULL")
    assert eng.store.passage_entries(eng.fingerprint) == {}
    again = make_engine(store=eng.store)
    again.warm_up()
    assert again.passage_fill.idle.wait(300)
    now = passage_entries(again)
    assert len(now) == 5 and set(stored) - {dropped} <= set(now)
    assert again.store.passage_entries(again.fingerprint) == {again.doc: 5}
    # A question meanwhile finds them all: nothing computed.
    out = again.ask("What does the museum keep?", doc_ids=[again.doc], generation=GREEDY)
    assert not any("with no stored KV" in m for m in out.messages)


def test_the_background_pass_stops_at_the_storage_budget(make_engine):
    eng = make_engine()
    eng.store.budget_bytes = 1
    calls = []
    ensure = eng.passage_fill.kv.ensure
    eng.passage_fill.kv.ensure = lambda *a, **kw: calls.append(1) or ensure(*a, **kw)
    eng.warm_up()
    assert eng.passage_fill.idle.wait(300)
    assert len(calls) == 1  # the first one did not stay: no more are computed
    assert not passage_entries(eng)


def test_a_passage_pulled_that_does_not_fit_is_not_computed_either(make_engine):
    eng = make_engine(fill_passages=False)
    kv = eng.passage_fill.kv

    def no_room(*args, **kwargs):
        raise BudgetFullError("the shared cache's copy did not fit")

    kv.sharing.pull_passage = no_room
    prefills = []
    rt = eng.runtime
    prefill = rt.prefill
    rt.prefill = lambda *a, **kw: prefills.append(1) or prefill(*a, **kw)
    with pytest.raises(BudgetFullError):
        kv.ensure(rt, [(eng.doc, PASSAGES[0])], evict=False)
    assert not prefills and not passage_entries(eng)


def test_a_document_deleted_during_its_background_pass_ends_it_quietly(make_engine, caplog):
    eng = make_engine()
    ensure = eng.passage_fill.kv.ensure

    def deleted_meanwhile(*a, **kw):
        eng.store.delete_document(eng.doc)  # as `kvdesk rm doc` from another process
        return ensure(*a, **kw)

    eng.passage_fill.kv.ensure = deleted_meanwhile
    eng.warm_up()
    assert eng.passage_fill.idle.wait(300)
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    assert not passage_entries(eng)


def test_an_exact_ask_over_passages_answers_as_no_cache_does(make_engine):
    """Blended KV is approximate at any level (keys moved, a quote's KV copied): asked at
    `lossless`, the passages are computed as `--no-cache` does, answer for answer."""
    eng = make_engine(fill_passages=False)
    greedy = GenerationOptions(max_tokens=24, temperature=0)
    q = "When does the Saturday ferry leave, and what does the museum keep?"
    warm = eng.ask(q, doc_ids=[eng.doc], generation=greedy)  # passages get their KV
    assert warm.blended["mode"] == "blended"
    for ask in (lambda **kw: eng.ask(q, doc_ids=[eng.doc], generation=greedy, **kw),
                lambda **kw: eng.ask(q, chat_id=warm.chat_id, generation=greedy, **kw)):
        exact = ask(restore=RestoreOptions(level="lossless"))
        plain = ask(restore=RestoreOptions(no_cache=True))
        assert exact.answer == plain.answer and exact.blended["mode"] == "exact"


def test_the_background_pass_never_evicts_what_questions_used(make_engine):
    eng = make_engine(fill_passages=False)
    eng.ask("What does the museum keep?", doc_ids=[eng.doc], generation=GREEDY)
    assert eng.exactness.idle.wait(300)  # (a blended chat's exact context stored after it)
    used = set(passage_entries(eng))
    assert used and len(used) < 5
    # Room for less than one more passage: the pass stores one, finds it does not fit, drops
    # it and stops; the question's KV stays.
    again = make_engine(store=eng.store)
    again.store.budget_bytes = again.store.usage_bytes() + 100
    again.warm_up()
    assert again.passage_fill.idle.wait(300)
    assert set(passage_entries(again)) == used


def test_kill_9_during_the_background_pass_leaves_a_consistent_store_and_it_resumes(
        tmp_path, make_engine):
    import os
    import signal
    import subprocess
    import sys
    import time

    store = Store(tmp_path / "data")  # the data directory the autouse fixture names
    texts = [f"Section {i}: the bell of tower {i} rings {i + 2} times at dawn and the keeper "
             f"writes the hour in log book number {100 + i}." for i in range(12)]
    doc = store.add_document("k" * 64, "Towers", "\n\n".join(texts), type="text")
    store.add_passages(doc.id, [SimpleNamespace(index=i, text=t, start=0, end=len(t), page=None,
                                                lines=(i + 1, i + 1), heading=(), tokens=30)
                                for i, t in enumerate(texts)])
    server = subprocess.Popen([sys.executable, "-m", "desktop_app", "--n-ctx", "2048", "serve",
                               "--port", "0"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while len(passage_entries_of(store)) < 2:
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        os.kill(server.pid, signal.SIGKILL)  # mid-pass: most passages are still to compute
        server.wait(30)
    finally:
        if server.poll() is None:
            server.kill()
    done = passage_entries_of(store)
    assert 2 <= len(done) < 12
    assert store.verify()["corrupt"] == []
    store.gc()  # removes what the killed writer left half-written (never visible)
    eng = make_engine(store=store)
    eng.warm_up()
    assert eng.passage_fill.idle.wait(300)
    assert eng.store.passage_entries(eng.fingerprint)[doc.id] == 12
    assert set(done) <= set(passage_entries_of(store))


def passage_entries_of(store):
    return [e.id for e in store.entries() if e.passage]


def test_a_pdfs_sources_carry_page_numbers(tmp_path, model_path, model_hash):
    from pdf_helpers import make_pdf

    filler = "The parish records of the island list its fishing boats and their crews"
    pages = [[f"{filler}, page {n}, line {i}." for i in range(14)] for n in range(1, 9)]
    pages[5][3] = "The lighthouse keeper's dog on the island is called Captain Biscuit."
    pdf = make_pdf(tmp_path / "records.pdf", pages)
    eng = Engine(Store(tmp_path / "data"), lambda: Runtime(model_path, model_hash=model_hash,
                                                          n_ctx=1024, flash_attn=True),
                 chunk_tokens=64)
    try:
        attached = eng.attach(pdf)
        assert attached.passages > 1  # longer than this context: kept as passages
        out = eng.ask("What is the lighthouse keeper's dog called?", doc_ids=[attached.doc_id],
                      generation=GREEDY)
        found = [s for s in out.sources if "Captain Biscuit" in s["text"]]
        assert found and found[0]["page"] == 6 and "lines" not in found[0]
        assert all(isinstance(s["page"], int) for s in out.sources)
    finally:
        eng.close()
        eng.store.close()


# Line breaks in runs, before indentation and before words: a piece may end only where every
# tokenizer splits anyway.
PIECES = "".join(f"Section {i}\n\n  item {i}:\n\n\n{PASSAGES[i % len(PASSAGES)]}\n"
                 f"    code({i})\n\t\nend\n" for i in range(60))


def count_in_pieces_is_whole_count(runtime) -> None:
    """`llamacalls.pieces`: a long text and a long conversation (special tokens), tokenized a
    piece at a time, are the same tokens as in one call."""
    chat = runtime.render_chat([{"role": "user" if i % 2 else "assistant", "content": f"x {i}"}
                                for i in range(300)], add_generation_prompt=True)
    paragraphs = "\n\n".join(" ".join(PASSAGES) for _ in range(20))  # lines of 600 characters
    for text in (PIECES, chat, paragraphs):
        whole = runtime.llm.tokenize(text.encode(), add_bos=True, special=True)
        assert [t for i, p in enumerate(pieces(text, 97)) for t in runtime.llm.tokenize(
            p.encode(), add_bos=not i, special=True)] == whole
        assert runtime.tokenize(text, add_bos=True) == whole
    assert _count(runtime, PIECES, None) == len(runtime.tokenize(PIECES))
    assert runtime.tokenize("", add_bos=True) == runtime.llm.tokenize(b"", add_bos=True,
                                                                     special=True)
    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled):
        _count(runtime, PIECES, stop)


def test_a_long_text_is_counted_in_pieces_exactly_and_a_cancel_stops_it(runtime):
    assert runtime.pieces_exact
    count_in_pieces_is_whole_count(runtime)


def test_a_tokenizer_that_puts_a_space_before_each_call_is_asked_once():
    """SentencePiece vocabularies with add_space_prefix (Llama 2, Mistral) begin every call's
    tokens with one: pieces would add one at each cut."""
    calls = []

    class SpacePrefixed:
        def tokenize(self, data, add_bos, special):
            calls.append(data)
            return [0, *data]

    llm = SpacePrefixed()
    assert not llamacalls.splits_exactly(llm)
    calls.clear()
    assert llamacalls.tokenize(llm, PIECES, False, True, in_pieces=False) == [
        0, *PIECES.encode()] and len(calls) == 1


def test_docs_says_when_the_storage_budget_stopped_the_passages_kv(capsys, tmp_path):
    """`kvdesk docs`: passages left without KV because the budget is full are said, with what
    to do (the background pass only logged it)."""
    from desktop_app.cli.listings import docs
    from desktop_app.results import DocumentInfo

    def app(usage, as_text=False):
        info = DocumentInfo(1, "manual.txt", "text", 90_000, 0, {}, "passages", 0.0,
                            passages=700, passages_cached=0 if as_text else 107)
        return SimpleNamespace(data_dir=tmp_path, holds_store=True, model_missing=None,
                               engine=SimpleNamespace(
            documents=lambda: [info], fingerprint="fp", passages_as_text=lambda: as_text,
            store=SimpleNamespace(usage_bytes=lambda: usage, budget_bytes=1000,
                                  budget_cap=lambda: None,
                                  usage_by_kind=lambda: {"fp": {"passages": usage}},
                                  data_dir=tmp_path)))

    docs.callback.__wrapped__(app(995), as_json=False)
    out = capsys.readouterr()
    assert "700 passages (107 with their KV)" in out.out
    assert "storage: 995 B of the 1.0 KB budget (passages 995 B)" in out.out, out.out
    assert "the storage budget (1.0 KB) is full" in out.err and "storage_budget_gb" in out.err
    docs.callback.__wrapped__(app(500), as_json=False)
    assert "storage budget" not in capsys.readouterr().err
    # A model that keeps no passage KV until calibrated (Gemma 3): why 0 of 700 (probe M5)
    docs.callback.__wrapped__(app(0, as_text=True), as_json=False)
    assert ("700 passages (0 with their KV; read as text until this model is calibrated: "
            "kvdesk calibrate)") in capsys.readouterr().out


def test_a_follow_up_whose_passages_do_not_fit_reads_none_of_the_earlier_ones(make_engine):
    """At a small context a follow-up's passage may not fit beside the chat: the chat's
    earlier passages must not answer it in its place (the probe's furnace code answered
    from the picnic passage, with no note)."""
    eng = make_engine()
    longdocs, rt = eng.session.longdocs, eng.runtime
    earlier = Source(1, eng.doc, 0, PASSAGES[0], 0.5)
    asked = Source(2, eng.doc, 1, " ".join(PASSAGES[1:]), 0.9)
    overhead = len(passage_layout(rt, []).tokens)
    cost = {s.passage_id: len(longdocs.kv.tokens(rt, s.text)) - overhead
            for s in (earlier, asked)}
    assert cost[1] < cost[2]
    fit = partial(longdocs._fit, rt, [asked], [earlier], doc_order=[eng.doc])
    assert fit(budget=overhead + cost[2] - 1) == []  # the earlier one would have fit
    assert fit(budget=overhead + cost[2]) == [asked]
    # in document order, the earlier one said to be the chat's, not this question's
    assert fit(budget=overhead + cost[1] + cost[2]) == [replace(earlier, earlier=True), asked]


def test_a_question_whose_passages_do_not_all_fit_says_how_many(make_engine):
    eng = make_engine()
    longdocs, rt = eng.session.longdocs, eng.runtime
    docs = [eng.library.document(eng.doc)]
    q = "When does the Saturday ferry leave, and what does the museum keep?"
    overhead = len(passage_layout(rt, []).tokens)
    cost = max(len(longdocs.kv.tokens(rt, t)) - overhead for t in PASSAGES[:2])
    room = longdocs.prompter.room(rt)
    chosen, notes = longdocs.pick(rt, docs, q, [], used=room - overhead - cost)
    assert len(chosen) == 1
    assert any(n.startswith("1 of the 2 passages retrieved for this question did not fit")
               for n in notes), notes
    chosen, notes = longdocs.pick(rt, docs, q, [], used=room)
    assert chosen == [] and any("no retrieved passage fits" in n for n in notes)


def test_a_request_leaving_room_for_its_answer_gives_the_passages_less(make_engine,
                                                                       monkeypatch):
    """(Ollama's /api/chat trimmed a history to leave its answer room, and the passages took
    that room back: every turn was left out, and the answer had none anyway.)"""
    eng = make_engine()
    eng.prompter._reserve = 128  # (what the passages always leave: less than the answer's)
    seen = []
    pick = eng.session.longdocs.pick
    monkeypatch.setattr(eng.session.longdocs, "pick", lambda *a, **kw: seen.append(a[4]) or
                        pick(*a, **kw))
    docs = eng.completions.documents([eng.doc])
    messages = [{"role": "user", "content": "When does the Saturday ferry leave?"}]
    eng.completions.prompt(messages, docs, 0)
    eng.completions.prompt(messages, docs, 512)
    assert seen[1] - seen[0] == 512 - 128
