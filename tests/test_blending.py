"""Chats over several documents from their cached KV: alignment of a document inside its own
prefix, a blended answer never stored, the exact context computed in the background (then
answers equal a prefill's token for token), cancelling and deleting meanwhile."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from desktop_app.engine import Engine
from desktop_app.errors import Cancelled
from desktop_app.kv.blending import _runs, align, leading
from desktop_app.kv.levels import DEFAULT_LEVELS, EXACT
from desktop_app.model.kvstate import in_position_order
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from store import Store

EVERY_LEVEL = (*DEFAULT_LEVELS, EXACT)

DOCS = {
    "ferry.txt": "The ferry to Cape Morrow leaves at 07:15 and 16:40 on weekdays. On "
                 "Saturdays it sails once, at 10:00. The crossing takes fifty minutes. " * 4,
    "museum.txt": "The keeper's cottage became a museum in 1979. It keeps the logbooks, a "
                  "brass telescope and a barometer that still works. Entry is free. " * 4,
    "tower.txt": "The tower is 31 metres tall and its light can be seen 40 kilometres out to "
                 "sea. A storm in 1956 broke the lantern glass. " * 4,
}
QUESTION = "When does the Saturday ferry leave, and what does the museum keep?"


def test_align_finds_the_header_and_the_document_after_the_system_prompt():
    stored = [1, 2, 3, 50, 51, 52, 9, 9, *range(100, 120), 7]
    part = [1, 2, 3, *range(100, 120), 8, 8]
    assert align(part, stored) == [(0, 0, 3), (3, 8, 20)]
    assert align([5, 6], stored) == []  # nothing in common: nothing reused
    assert _runs(np.array([0, 1, 1, 0, 1], bool)) == [(1, 3), (4, 5)]
    assert list(leading(0.1)(100, 50)) == list(range(100, 105))


@pytest.fixture
def engine(tmp_path, model_path, model_hash):
    def factory():
        return Runtime(model_path, model_hash=model_hash, n_ctx=2048, flash_attn=True)

    eng = Engine(Store(tmp_path / "data"), factory, chunk_tokens=64, blend_fraction=0.15,
                 levels=EVERY_LEVEL)
    ids = []
    for name, text in DOCS.items():
        (tmp_path / name).write_text(text)
        ids.append(eng.attach(tmp_path / name).doc_id)
    eng.doc_ids = ids
    yield eng
    eng.close()
    eng.store.close()


# Greedy (with the default penalties): answers that can be compared token for token.
GREEDY = GenerationOptions(max_tokens=16, temperature=0)


def ask(eng, **kw):
    return eng.ask(QUESTION, generation=GREEDY, **kw)


def test_a_blended_chat_answers_then_becomes_exact(engine):
    first = ask(engine, doc_ids=engine.doc_ids)
    assert first.documents == engine.doc_ids
    blended = first.blended
    assert blended["mode"] == "blended" and blended["reused_tokens"] > 0
    assert 0 < blended["recomputed_tokens"] < blended["reused_tokens"]
    # what was computed in place (and the question's tokens) is timed apart from the reading
    assert first.recompute_s > 0 and first.restore_s > 0
    assert first.answer
    chat = first.chat_id
    # Until the background pass stores the exact context, nothing of this chat is stored.
    assert engine.exactness.idle.wait(300)
    entries = [e for e in engine.store.entries() if e.chat_id == chat]
    assert entries, "the exact context was not stored"
    assert {c.chat_id: c.kv_mode for c in engine.chats()}[chat] == "exact"
    # Exact now: read whole (auto: at lossless, the best level stored); at lossless, a reopen
    # and the next answer equal a prefill of the same prompt (the chat's own KV computed again
    # from where its first document's entry leaves a whole slice: `exactprefix`).
    engine.runtime.reset()
    assert engine.reopen(chat).recomputed_tokens == 0
    report = engine.reopen(chat, restore=RestoreOptions(level="lossless"))
    assert report.blended["mode"] == "exact"
    exact = ask(engine, chat_id=chat, restore=RestoreOptions(level="lossless"))
    assert exact.blended["mode"] == "exact"
    # The same question asked again over the same history, every token computed from text.
    redo = engine.regenerate(chat, restore=RestoreOptions(no_cache=True), generation=GREEDY)
    assert redo.answer == exact.answer


def test_the_estimate_of_a_chat_still_blended_reads_its_documents_from_their_caches(engine):
    engine.exactness.stop()  # the chat stays blended: no exact copy of it is stored
    chat = ask(engine, doc_ids=engine.doc_ids).chat_id
    assert not [e for e in engine.store.entries() if e.chat_id == chat]
    est = engine.estimate(chat_id=chat)
    entries = [engine.store.document_entry(d, engine.fingerprint).id for d in engine.doc_ids]
    sizes = engine.store.entry_level_bytes(entries).values()
    # every document's own cache is read (not only the first's, the rest computed from text)
    assert est.bytes["balanced"] == sum(s["balanced"] for s in sizes)
    assert est.seconds["balanced"] < est.seconds["text"] / 2
    # an exact restore never blends: the first document's cache read, the others computed
    assert est.bytes[EXACT] == engine.store.entry_level_bytes(entries[:1])[entries[0]][EXACT]
    assert est.seconds[EXACT] > est.seconds["balanced"]


def test_documents_the_context_cannot_hold_together_are_kept_as_passages_and_said(engine):
    """Documents attached whole that do not fit the context together are not read cut short
    (tests/test_longdoc_fit.py has the answers): the chat's first question keeps those it
    cannot read whole as passages, said before asking, with the answer, on the local API."""
    rt = engine.runtime
    docs = [engine.library.document(i) for i in engine.doc_ids]
    assert engine.prompter.layout(rt, docs).notes == []
    first = len(engine.prompter.layout(rt, docs[:1]).tokens)
    second = len(engine.prompter.layout(rt, docs[:2]).tokens) - first
    engine.prompter._reserve = rt.n_ctx - first - second // 2  # room for half the second
    cut, left_out = engine.prompter.layout(rt, docs).notes  # (what reading them whole would)
    assert cut.startswith("museum.txt: only its first ") and " tokens are read" in cut
    assert left_out.startswith("tower.txt: not read in this chat")
    # said before asking, as the window does when they are ticked
    (said,) = engine.estimate(doc_ids=engine.doc_ids).notes
    assert said.startswith("ferry.txt, museum.txt and tower.txt: do not fit this chat's ")
    assert said.endswith("split into passages at this chat's first question, which reads "
                         "those retrieved for it")
    first_answer = ask(engine, doc_ids=engine.doc_ids)
    (kept,) = [m for m in first_answer.messages if "split into passages now" in m]
    assert kept.startswith("ferry.txt, museum.txt and tower.txt:") and first_answer.sources
    assert cut not in first_answer.messages and left_out not in first_answer.messages
    engine.runtime.reset()
    reopened = engine.reopen(first_answer.chat_id).messages
    assert cut not in reopened and left_out not in reopened
    api = engine.complete([{"role": "user", "content": QUESTION}],
                          documents=engine.doc_ids, generation=GREEDY)
    assert api.sources and not any("split into passages" in m for m in api.messages)


def test_deleting_a_later_document_drops_the_chats_cache_and_the_chat_goes_on(engine):
    """The exact context of a chat over three documents holds the second's KV in the chat's
    own entry: deleting that document deletes the entry (it could never be read again); the
    chat reopens from what is left, says why, and its next answer is stored again."""
    chat = ask(engine, doc_ids=engine.doc_ids).chat_id
    assert engine.exactness.idle.wait(300)
    assert [e for e in engine.store.entries() if e.chat_id == chat]
    engine.delete_document(engine.doc_ids[1])
    assert not [e for e in engine.store.entries() if e.chat_id == chat]
    assert engine.store.gc()["freed_bytes"] == 0
    engine.runtime.reset()
    report = engine.reopen(chat)
    assert report.tokens and report.recomputed_tokens > 0
    assert any("was deleted: the chat goes on without it" in m for m in report.messages)
    again = ask(engine, chat_id=chat)
    assert again.answer and again.documents == [engine.doc_ids[0], engine.doc_ids[2]]
    assert engine.exactness.idle.wait(300)
    assert [e for e in engine.store.entries() if e.chat_id == chat]


def deleting_first(engine, deleted: list, call):
    """`call`, the second document deleted before its first run."""
    def wrapped(*args, **kw):
        if not deleted:
            deleted.append(engine.doc_ids[1])
            engine.delete_document(engine.doc_ids[1])
        return call(*args, **kw)

    return wrapped


def stored_as_it_is(engine, chat: int) -> bool:
    """Whether the chat's context as it is now is stored exactly, and nothing longer."""
    _, tokens, _ = engine.session.conversation(engine.runtime, chat)
    return engine.store.longest_prefix(engine.fingerprint, tokens, touch=False).n_tokens == \
        len(tokens) and all(e.token_end <= len(tokens) for e in engine.store.entries()
                            if e.chat_id == chat)


def test_an_exact_pass_over_a_document_deleted_meanwhile_computes_the_chat_as_it_is(engine):
    """(The context it computed holds the deleted document's KV: stored, it is an entry no
    reopen could ever read.)"""
    deleted = []
    engine.exactness.yield_to_turns = deleting_first(engine, deleted,
                                                     engine.exactness.yield_to_turns)
    chat = ask(engine, doc_ids=engine.doc_ids).chat_id
    assert engine.exactness.idle.wait(300) and deleted
    assert stored_as_it_is(engine, chat)


def test_a_document_deleted_as_a_cache_holding_it_is_stored_is_in_no_entry(engine):
    """Deleted after the exact pass last read the chat, as it stores it: the chat is computed
    as it is now. Deleted during an answer: that turn's cache is not stored, and says why."""
    deleted = []
    engine.session.kv.store_chat = deleting_first(engine, deleted, engine.session.kv.store_chat)
    chat = ask(engine, doc_ids=engine.doc_ids).chat_id
    assert engine.exactness.idle.wait(300) and deleted
    assert stored_as_it_is(engine, chat)

    def delete_last(_):
        if len(deleted) == 1:
            deleted.append(engine.doc_ids[2])
            engine.delete_document(engine.doc_ids[2])

    again = ask(engine, chat_id=chat, on_token=delete_last)
    assert again.answer and len(deleted) == 2
    assert f"this turn's cache is not stored: document {deleted[1]} is deleted" in \
        again.messages
    assert not [e for e in engine.store.entries() if e.chat_id == chat]


def test_an_api_request_over_several_documents_is_blended_from_their_caches(engine):
    """As a chat's first answer is: each later document's own cache moved into place (the
    probe's second document was computed whole, 1,645 tokens, 43 s), and never stored."""
    done = engine.complete([{"role": "user", "content": QUESTION}], documents=engine.doc_ids,
                           generation=GREEDY)
    blended = done.report.blended
    assert blended["mode"] == "blended" and blended["reused_tokens"] > 0
    assert done.report.recomputed_tokens < done.report.tokens / 2 and done.text
    assert not done.stored
    assert any("blended from their own caches" in m for m in done.messages)


def test_a_clients_next_turn_over_documents_keeps_what_the_model_holds(engine):
    """A client's conversation over one document or several, sent whole again with its next
    turn: the model holds all of it but that turn and keeps it (it read a lossy copy back,
    or blended the documents again, once requests named their documents to the restore)."""
    asked = [{"role": "user", "content": QUESTION}]
    for docs in (engine.doc_ids[:1], engine.doc_ids):
        engine.runtime.reset()
        done = engine.complete(asked, documents=docs, generation=GREEDY)
        reports = []
        engine.complete([*asked, {"role": "assistant", "content": done.text},
                         {"role": "user", "content": "And then?"}], documents=docs,
                        generation=GREEDY, on_restore=reports.append)
        assert reports[0].bytes_read == 0, (docs, reports[0].messages)
        assert "the model already held" in reports[0].messages[0]


def test_an_api_conversation_over_a_deleted_document_leaves_no_cache(engine):
    """Computed exactly (never blended), a local API conversation over [A, B] is stored as an
    entry extending A's that names no chat: deleting B deletes it."""
    engine.session.blend_fraction = 1
    done = engine.complete([{"role": "user", "content": QUESTION}], documents=engine.doc_ids[:2],
                           generation=GREEDY)
    assert done.stored
    roots = {d: engine.store.document_entry(d, engine.fingerprint).id for d in engine.doc_ids}
    assert {e.id for e in engine.store.entries()} > set(roots.values())
    engine.delete_document(engine.doc_ids[1])
    assert {e.id for e in engine.store.entries()} == {roots[engine.doc_ids[0]],
                                                      roots[engine.doc_ids[2]]}


def test_a_later_documents_keys_are_turned_to_their_place_in_the_chat(engine):
    """The first layer's keys depend only on each token and its position: a blended prefix
    read losslessly holds them as a prefill of the same tokens does, at every position (each
    later document's reused keys turned from their place in its own entry to the chat's).
    (Asked at `lossless` a chat is never blended; a budget that leaves time for it reads the
    lossless copies.)"""
    held = []

    def capture(report):
        rt = engine.runtime
        held.append((rt.tokens, in_position_order(rt.capture().sections[0]).keys[0],
                     report.chunk_levels))

    first = ask(engine, doc_ids=engine.doc_ids, restore=RestoreOptions(budget_ms=600_000),
                on_restore=capture)
    assert first.blended["mode"] == "blended" and first.blended["reused_tokens"] > 0
    assert set(held[0][2]) == {EXACT}
    assert engine.exactness.idle.wait(300)
    tokens, blended, _ = held[0]
    rt = engine.runtime
    rt.reset()
    rt.prefill(tokens)
    exact = in_position_order(rt.capture().sections[0]).keys[0].astype(np.float32)
    err = np.abs(blended.astype(np.float32) - exact).max(axis=1)  # per position
    assert err.max() <= 0.02 * np.abs(exact).max(), int(np.argmax(err))


def test_one_document_chats_are_not_blended(engine):
    one = ask(engine, doc_ids=engine.doc_ids[:1])
    assert one.blended is None and one.documents == engine.doc_ids[:1]


def test_cancelling_a_blend_keeps_nothing_and_a_deleted_document_is_computed(engine):
    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled):
        ask(engine, doc_ids=engine.doc_ids, cancel=stop)
    assert not [e for e in engine.store.entries() if e.chat_id is not None]
    # A later document's cache gone (evicted): its part is computed, the rest still reused.
    entry = engine.store.document_entry(engine.doc_ids[2], engine.fingerprint)
    engine.store.delete_entry(entry.id)
    res = ask(engine, doc_ids=engine.doc_ids)
    assert res.blended["mode"] == "blended" and res.answer
    engine.delete_document(engine.doc_ids[1])  # deleted while made exact: nothing half-written
    assert engine.exactness.idle.wait(300)
    assert engine.store.verify()["corrupt"] == []


def test_a_context_that_cannot_blend_is_computed_exactly(engine, no_second_sequence):
    """llama.cpp refusing the blend's two-sequence context: the chat is answered from an
    exact context, said so, and the engine keeps answering."""
    first = ask(engine, doc_ids=engine.doc_ids)
    assert first.blended["mode"] == "exact" and first.answer
    assert any("two sequences" in m and "exactly instead" in m for m in first.messages)
    again = ask(engine, chat_id=first.chat_id)  # not tried again: no note, an answer
    assert again.answer and not any("two sequences" in m for m in again.messages)


def test_an_exact_context_larger_than_the_storage_budget_is_never_said_stored(engine):
    engine.store.budget_bytes = 1  # (smaller than any entry: the next write evicts all)
    first = ask(engine, doc_ids=engine.doc_ids)
    assert first.blended["mode"] == "blended"
    engine.exactness.request(first.chat_id)
    assert not engine.exactness.finish(first.chat_id)
    assert engine.exactness.too_big(first.chat_id)
    assert {c.chat_id: c.kv_mode for c in engine.chats()}[first.chat_id] == "blended"
