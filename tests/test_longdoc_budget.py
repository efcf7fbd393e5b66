"""A long document's passage KV under a small storage budget, and a damaged passage: every
question is answered, what is stored is what the notes say, a question's own stores never
evict the passages it reads, and a damaged passage is computed again and stored (and counted
in `docs` meanwhile). The engine and passages are tests/test_longdoc.py's."""

from __future__ import annotations

import sqlite3

import test_longdoc
from test_longdoc import GREEDY, PASSAGES, passage_entries

from store.documents.passages import text_hash

make_engine = test_longdoc.make_engine  # (its fixture: an engine over the island guide)

BOTH = "When does the Saturday ferry leave, and what does the museum keep?"  # passages 0, 1
MUSEUM = "What does the museum keep?"  # passage 1


def fresh(eng, question, **kwargs):
    """`question` in a new chat, from the passages' own KV: no chat's exact prefix stored
    (a new chat over the same passages would restore it instead of blending them)."""
    assert eng.exactness.idle.wait(300)
    for e in eng.store.entries():
        if e.chat_id is not None:
            eng.store.delete_entry(e.id)
    eng.runtime.reset()
    return eng.ask(question, doc_ids=[eng.doc], generation=GREEDY, **kwargs)


def test_a_budget_smaller_than_one_passage_still_answers_and_says_nothing_was_stored(
        make_engine):
    """It failed with "no KV entry 1": the passage's entry, too large to keep, was looked up
    after it had been removed again."""
    out = nothing_stored_at_a_tiny_budget(make_engine(fill_passages=False))
    assert not any("with no stored KV" in m for m in out.messages)  # ("... and stored")


def nothing_stored_at_a_tiny_budget(eng):
    """The answer to BOTH at a budget smaller than a passage's KV, checked: answered from
    both passages, neither stored, said."""
    eng.store.budget_bytes = 1000  # a passage's KV is tens of kB
    out = fresh(eng, BOTH)
    assert out.answer and [s["passage_id"] for s in out.sources] == [eng.ids[0], eng.ids[1]]
    assert not passage_entries(eng)
    assert any(m.startswith("2 passage(s) not stored") and "larger than the whole storage "
               "budget" in m for m in out.messages), out.messages
    return out


def both_with_room_for_one(eng):
    """(the museum's passage entry, the answer to BOTH) asked at a budget that holds the
    museum's passage, stored first, or the ferry's alone, never both (their sizes measured:
    the ferry's passage is the larger)."""
    fresh(eng, BOTH)
    stored = {e.passage_hash: e for e in passage_entries(eng).values()}
    museum, ferry = stored[text_hash(PASSAGES[1])], stored[text_hash(PASSAGES[0])]
    eng.store.delete_entry(ferry.id)
    # (and the passages' head they extend)
    head = 0 if museum.parent_id is None else eng.store.entry(museum.parent_id).nbytes
    eng.store.budget_bytes = head + museum.nbytes + ferry.nbytes - 1
    return museum, fresh(eng, BOTH)


def test_a_questions_stores_never_evict_the_passages_it_reads(make_engine):
    """At a budget holding one passage, a question reading two kept the one stored and said
    "computed and stored" of the other, which evicted it on the way: the note was false and
    the question computed both."""
    eng = make_engine(fill_passages=False)
    museum, out = both_with_room_for_one(eng)
    assert out.answer
    assert set(passage_entries(eng)) == {museum.id}  # kept; the ferry's not stored
    assert any(m.startswith("1 passage(s) not stored") and "beside the passages this question"
               in m for m in out.messages), out.messages
    assert not any("with no stored KV" in m or m.startswith("storing this evicted")
                   for m in out.messages), out.messages
    assert out.blended["reused_tokens"] > 0  # the museum's part read from its KV


def flip(store, entry_id, chunk=0):
    """64 bytes of a chunk's stored bytes inverted, as rot would (the seal catches it)."""
    with sqlite3.connect(store.path) as conn:
        rowid, data = conn.execute("SELECT id, data FROM kv_chunks WHERE entry_id = ? AND"
                                   " chunk_index = ?", (entry_id, chunk)).fetchone()
        data = bytearray(data)
        data[100:164] = bytes(b ^ 0xFF for b in data[100:164])
        conn.execute("UPDATE kv_chunks SET data = ? WHERE id = ?", (bytes(data), rowid))


def test_a_damaged_passage_is_computed_again_stored_and_counted_meanwhile(make_engine):
    """A passage whose chunk failed its check was set aside and never mended: every later
    question computed it again, said "KV entry 73, chunk 0", and `docs` counted nothing."""
    eng = make_engine(fill_passages=False)
    fresh(eng, BOTH)
    museum = next(e for e in passage_entries(eng).values()
                  if e.passage_hash == text_hash(PASSAGES[1]))
    flip(eng.store, museum.id)
    first = fresh(eng, BOTH)  # the check fails: the museum's part is computed in place
    assert first.answer
    said = [m for m in first.messages if "museum" in m or "could not be read" in m]
    assert said and all("KV entry" not in m and "recomputing from token" not in m
                        for m in first.messages), first.messages
    assert any(f"passage #1 [line 3] of document {eng.doc} (Island guide)" in m
               for m in said), said
    info = {d.doc_id: d for d in eng.documents()}[eng.doc]
    assert info.damaged_chunks == 1  # counted against its document meanwhile

    second = fresh(eng, BOTH)  # computed again and stored, in place: the blend reads it
    assert any("was damaged" in m and "computed again and stored" in m
               for m in second.messages), second.messages
    assert museum.id in passage_entries(eng) and not eng.store.damaged([museum.id])
    assert {d.doc_id: d for d in eng.documents()}[eng.doc].damaged_chunks == 0
    third = fresh(eng, BOTH)
    assert not any("damaged" in m or "could not be read" in m for m in third.messages)
    assert third.blended["reused_tokens"] >= second.blended["reused_tokens"] > 0


def test_a_damaged_head_is_computed_again_and_stored_by_the_next_question(make_engine):
    """The passages' shared head set aside stayed so: every question whose first passage
    extends it recomputed from token 0, and new passages were stored on it, until `verify
    --repair`."""
    eng = make_engine(fill_passages=False)
    fresh(eng, BOTH)
    (head_id,) = {e.parent_id for e in passage_entries(eng).values()}
    assert head_id is not None
    flip(eng.store, head_id)
    first = fresh(eng, BOTH)  # the check fails: set aside, the context computed
    assert first.answer and eng.store.damaged([head_id])
    # counted against the document meanwhile (`verify` counts it; the head has no document)
    assert {d.doc_id: d for d in eng.documents()}[eng.doc].damaged_chunks == 1
    second = fresh(eng, BOTH)
    assert any("the passages' system prompt was damaged" in m and "computed again and "
               "stored" in m for m in second.messages), second.messages
    assert not eng.store.damaged([head_id])
    assert not any("recomputing from token" in m for m in second.messages), second.messages
    assert second.blended["reused_tokens"] > 0


def test_the_background_pass_says_when_the_budget_stops_it(make_engine, caplog):
    """It stopped with a line at info, which neither the window's log nor `kvdesk serve`
    shows: now a warning saying how far it got and what to do."""
    eng = make_engine()
    eng.store.budget_bytes = 1
    eng.warm_up()
    assert eng.passage_fill.idle.wait(300)
    assert any(r.levelname == "WARNING" and "stopped with 0 of its 5 passages given their KV: "
               "the storage budget" in r.getMessage() and "storage_budget_gb" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records][-5:]


def test_the_passages_shared_prompt_evicted_is_named_as_a_shared_prompt(tmp_path):
    """(A passages' head evicted, a root of no document or chat, was called "1 API prompt
    cache(s)" in a chat over a long document.)"""
    from desktop_app.kv.kvcache import KVCache
    from store import Store

    with Store(tmp_path / "data") as store:
        kv = KVCache(store, ("balanced",), 64, calibrations=None)
        (note,) = kv.eviction_notes([
            {"entry": 1, "document_id": None, "chat_id": None, "passage": False, "bytes": 10},
            {"entry": 2, "document_id": 3, "chat_id": None, "passage": True, "bytes": 90}])
    assert "1 passage(s), 1 shared prompt cache(s) (100 B)" in note, note


def test_an_eviction_note_names_every_cache_and_another_models_as_its(tmp_path):
    """Under Gemma a note named only "document 4 (delta.md)" while SmolLM2's cache of document
    2 went too: the records said no model, so a switch's evictions went unsaid as such."""
    from desktop_app.kv.kvcache import KVCache
    from store import Store

    with Store(tmp_path / "data") as store:
        store.register_model("smol", "/models/SmolLM2.gguf", {"n_layer": 2})
        beta = store.add_document("b", "beta.md", "text", type="md").id
        delta = store.add_document("d", "delta.md", "text", type="md").id
        kv = KVCache(store, ("balanced",), 64, calibrations=None)
        (note,) = kv.eviction_notes([
            {"entry": 1, "document_id": delta, "chat_id": None, "passage": False,
             "bytes": 10_300_000, "model": "gemma"},
            {"entry": 2, "document_id": beta, "chat_id": None, "passage": False,
             "bytes": 4_900_000, "model": "smol"},
            {"entry": 3, "document_id": None, "chat_id": 7, "passage": False,
             "bytes": 100_000, "model": "smol"}], "gemma")
    assert f"document {delta} (delta.md); and model SmolLM2.gguf's (not the one loaded): " \
        f"document {beta} (beta.md), 1 chat cache(s) (15.3 MB)" in note, note


def test_what_the_exact_pass_evicts_is_said_once_to_the_window_and_the_log(make_engine,
                                                                            caplog):
    """A blended chat's exact context stored in the background evicted other caches (another
    chat's exact context, passages) without a word, right after "the exact context is
    stored"."""
    eng = make_engine(fill_passages=False)
    first = fresh(eng, BOTH)
    assert eng.exactness.idle.wait(300)
    (mine,) = [e for e in eng.store.entries() if e.chat_id == first.chat_id]
    eng.store.delete_entry(mine.id)
    # Another model's cache of the document, used least recently: the one to go for it.
    eng.store.register_model("other", "/models/other.gguf", {"n_layer": 2})
    with eng.store.write_entry("other", range(300), levels=["raw"],
                               document_id=eng.doc) as writer:
        for span in writer.spans:
            writer.put_chunk(span.chunk_index, "raw", bytes(mine.nbytes))
    with sqlite3.connect(eng.store.path) as conn:
        conn.execute("UPDATE kv_entries SET last_used = 0 WHERE id = ?", (writer.entry.id,))
    eng.store.budget_bytes = eng.store.usage_bytes()
    eng.exactness.request(first.chat_id)
    assert eng.exactness.idle.wait(300)
    said = eng.exact_notes()
    assert list(said) == [first.chat_id] and len(said[first.chat_id]) == 1, said
    (note,) = said[first.chat_id]
    assert note.startswith(f"storing chat {first.chat_id}'s exact context evicted") and \
        f"model other.gguf's (not the one loaded): document {eng.doc} (Island guide)" in note
    assert any(r.levelname == "WARNING" and r.getMessage() == note for r in caplog.records)
    assert eng.exact_notes() == {}  # (once)


def set_aside(eng, text):
    """The entry of passage `text`, one of its chunks damaged and set aside as `kvdesk
    verify` does."""
    entry = next(e for e in passage_entries(eng).values() if e.passage_hash == text_hash(text))
    flip(eng.store, entry.id)
    assert eng.store.verify()["corrupt"] and eng.store.damaged([entry.id])
    return entry


def healed(out, entry_id, eng):
    """Whether answer `out` said its damaged passage was computed again and stored, and it
    was."""
    return any("was damaged" in m and "computed again and stored" in m for m in out.messages) \
        and entry_id in passage_entries(eng) and not eng.store.damaged([entry_id])


def test_a_damaged_passage_read_alone_is_computed_again_and_stored(make_engine):
    """One passage is read by a plain restore, never made ready: set aside, it was computed
    at every question ("recomputing from token 54") and never stored again."""
    eng = make_engine(fill_passages=False)
    fresh(eng, BOTH)
    museum = set_aside(eng, PASSAGES[1])
    eng.session.longdocs.top_k = 1  # (the museum's passage alone)
    first = fresh(eng, MUSEUM)
    assert [s["passage_id"] for s in first.sources] == [eng.ids[1]]
    assert healed(first, museum.id, eng), first.messages
    again = fresh(eng, MUSEUM)
    assert not any("damaged" in m or "recomputing from token" in m for m in again.messages), \
        again.messages


def test_a_damaged_passage_under_a_chats_stored_context_is_computed_again_and_stored(
        make_engine):
    """A chat's exact context stored extends its first passage's entry: that passage set
    aside, every question restored the chat's context up to it and computed the rest."""
    eng = make_engine(fill_passages=False)
    first = fresh(eng, BOTH)
    assert eng.exactness.idle.wait(300)
    assert any(e.chat_id == first.chat_id for e in eng.store.entries())  # (its exact copy)
    ferry = set_aside(eng, PASSAGES[0])
    eng.runtime.reset()  # (else the context still holds it, and is kept)
    again = eng.ask(BOTH, chat_id=first.chat_id, generation=GREEDY)
    assert healed(again, ferry.id, eng), again.messages
    assert not any("recomputing from token" in m for m in again.messages), again.messages
    assert again.blended["mode"] == "exact"  # (the chat's stored context read, not a blend)


def test_the_background_pass_computes_a_damaged_passage_again(make_engine):
    """It skipped every passage with an entry, a damaged one too."""
    eng = make_engine()
    eng.warm_up()
    assert eng.passage_fill.idle.wait(300)
    museum = set_aside(eng, PASSAGES[1])
    eng.passage_fill.request(eng.doc)  # (as a restart does)
    assert eng.passage_fill.idle.wait(300)
    assert museum.id in passage_entries(eng) and not eng.store.damaged([museum.id])
