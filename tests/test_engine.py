"""The engine end to end on the real default model, with short documents and small chunks."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
import types

import pytest

from desktop_app.chat import attaching
from desktop_app.chat.documents import DocumentError
from desktop_app.engine import Engine
from desktop_app.errors import Cancelled, EngineError
from desktop_app.kv.levels import DEFAULT_LEVELS, EXACT
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from desktop_app.results import size_text
from desktop_app.validation import InvalidValue
from store import DamagedError, DiskFullError, NotFoundError, Store
from store import tokens as tokens_mod

EVERY_LEVEL = (*DEFAULT_LEVELS, EXACT)

pytestmark = pytest.mark.model

DOC = """The lighthouse at Cape Morrow was built in 1871 from granite quarried on the island.
Its lamp burned whale oil until 1902, then kerosene, and it was electrified in 1938.
The keeper's cottage became a museum in 1979. The tower is 31 metres tall and its light
can be seen 40 kilometres out to sea. A storm in 1956 broke the lantern glass; it was
replaced the following spring with glass made in Birmingham."""
QUESTION = "When was the lighthouse electrified?"


def make_engine(data_dir, model_path, model_hash, *, flash_attn=True, n_ctx=1024,
                levels=EVERY_LEVEL):
    def factory():
        return Runtime(model_path, model_hash=model_hash, n_ctx=n_ctx, flash_attn=flash_attn)

    # Every level, lossless included (opt-in in the app): the exactness tests read it.
    return Engine(Store(data_dir), factory, chunk_tokens=64, levels=levels)


def close(eng: Engine) -> None:
    eng.close()
    eng.store.close()


def ask(eng: Engine, question: str, *, doc: int | None = None, chat: int | None = None,
        tokens: int = 16, seed: int | None = None, **restore):
    """One turn, in chat `chat` or a new chat about `doc`; keyword arguments of RestoreOptions.

    Deterministic, so answers can be compared: greedy (with the default penalties), or the
    default sampling under `seed`.
    """
    return eng.ask(question, chat_id=chat, doc_ids=[doc] if doc is not None else [],
                   restore=RestoreOptions(**restore), generation=deterministic(tokens, seed))


def deterministic(tokens: int, seed: int | None = None) -> GenerationOptions:
    return GenerationOptions(max_tokens=tokens, temperature=0 if seed is None else None,
                             seed=seed)


@pytest.fixture(scope="module")
def engine(tmp_path_factory, model_path, model_hash):
    eng = make_engine(tmp_path_factory.mktemp("engine"), model_path, model_hash)
    yield eng
    close(eng)


@pytest.fixture
def new_engine(tmp_path, model_path, model_hash):
    """make_engine(**options) on a data directory of this test's own; closed afterwards."""
    made = []

    def make(data_dir=tmp_path / "data", **options):
        made.append(make_engine(data_dir, model_path, model_hash, **options))
        return made[-1]

    yield make
    for eng in made:
        close(eng)


@pytest.fixture(scope="module")
def doc_id(engine, tmp_path_factory):
    path = tmp_path_factory.mktemp("docs") / "lighthouse.txt"
    path.write_text(DOC)
    return engine.attach(path).doc_id


def test_a_file_edited_while_it_is_attached_is_said_changed(engine, tmp_path, monkeypatch):
    """(Its record's time, taken after the read, the prefill's wait and the model's load,
    hid an edit made meanwhile: the old text kept, no change said.)"""
    from desktop_app.chat import documents

    path = tmp_path / "race.txt"
    path.write_text("The pearl is PEARL-5. " * 20)
    extract = documents.extract

    def edited_after_read(*args, **kwargs):
        found = extract(*args, **kwargs)
        path.write_text("The pearl is PEARL-6. " * 20)  # (the user saves meanwhile)
        # (and the attach goes on 5 s later: a model loading, another attach before it)
        monkeypatch.setattr(engine.store, "_clock", lambda: time.time() + 5)
        return found

    monkeypatch.setattr(documents, "extract", edited_after_read)
    doc_id = engine.attach(path).doc_id
    monkeypatch.undo()
    assert {d.doc_id: d for d in engine.documents()}[doc_id].file_changed


def test_attach_stores_every_level(engine, doc_id):
    (info,) = [d for d in engine.documents() if d.doc_id == doc_id]
    assert info.status == "ready" and info.tokens > 50
    assert set(info.cache_bytes) == set(engine.levels)
    assert info.kept_tokens == info.tokens  # a short document: all of it fits
    entry = engine.store.document_entry(doc_id, engine.fingerprint)
    raw = entry.token_end * engine.runtime.layout.kv_bytes_per_token  # its whole prefix, fp16
    assert info.cache_bytes["compact"] < info.cache_bytes["high"] < info.cache_bytes["lossless"]
    assert info.cache_bytes["lossless"] < raw


def test_reattach_reuses_the_cache(engine, doc_id, tmp_path):
    copy = tmp_path / "same-text.txt"
    copy.write_text(DOC)
    entries = len(engine.store.entries())
    res = engine.attach(copy)
    assert res.reused and res.doc_id == doc_id and res.prefill_s == 0
    assert len(engine.store.entries()) == entries


def test_lossless_answers_exactly_like_recomputing(engine, doc_id):
    engine.runtime.reset()
    cached = ask(engine, QUESTION, doc=doc_id, level="lossless", tokens=24)
    fresh = ask(engine, QUESTION, doc=doc_id, no_cache=True, tokens=24)
    assert cached.recomputed_tokens == 0 and set(cached.chunk_levels) == {"lossless"}
    assert fresh.recomputed_tokens > 0 and set(fresh.chunk_levels) == {"text"}
    assert cached.answer == fresh.answer
    assert "1938" in cached.answer


def test_lossless_samples_exactly_like_recomputing_under_a_seed(engine, doc_id):
    """The default sampling (temperature, top-k/p, min-p, penalties) seeded: token for token."""
    assert engine.sampling().options.temperature > 0
    engine.runtime.reset()
    cached = ask(engine, QUESTION, doc=doc_id, level="lossless", tokens=24, seed=11)
    fresh = ask(engine, QUESTION, doc=doc_id, no_cache=True, tokens=24, seed=11)
    assert set(cached.chunk_levels) == {"lossless"} and set(fresh.chunk_levels) == {"text"}
    assert cached.answer == fresh.answer


def test_chat_turns_reuse_the_document_and_reopen(engine, doc_id):
    first = ask(engine, "What was the lamp burning before 1902?", doc=doc_id, tokens=16)
    chat = first.chat_id
    doc_entry = engine.store.document_entry(doc_id, engine.fingerprint)
    chat_entries = [e for e in engine.store.entries() if e.chat_id == chat]
    assert chat_entries and all(e.parent_id is not None for e in chat_entries)
    assert chat_entries[0].parent_id == doc_entry.id  # document chunks reused, not copied

    second = ask(engine, "How tall is the tower?", chat=chat, tokens=16)
    assert second.chat_id == chat and second.tokens_generated > 0
    engine.runtime.reset()  # as after a restart: nothing in the context
    report = engine.reopen(chat)
    assert report.recomputed_tokens == 0
    assert report.tokens == engine.runtime.n_tokens
    assert [m.role for m in engine.messages(chat)] == ["user", "assistant"] * 2
    third = ask(engine, "And the museum?", chat=chat, tokens=12)
    # The context was already loaded by reopen: nothing read, nothing recomputed.
    assert third.bytes_read == 0 and third.chunk_levels == [] and third.recomputed_tokens == 0


def test_a_reopen_that_finds_no_cache_of_the_chat_says_why_it_computes(engine, doc_id):
    """(A chat evicted under the storage budget took 9 s to reopen, not 0.1 s, and nothing
    said why.)"""
    chat = ask(engine, "What was the lamp burning before 1902?", doc=doc_id, tokens=4).chat_id
    for entry in [e for e in engine.store.entries() if e.chat_id == chat]:  # (as evicted)
        with contextlib.suppress(NotFoundError):
            engine.store.delete_entry(entry.id)
    reopened_computing(engine, chat, "not stored under this model (evicted under the storage "
                                     "budget, or not kept when it was last answered)")
    engine.runtime.reset()
    assert not any("not stored under" in m for m in engine.reopen(chat).messages)  # (kept)
    for entry in [e for e in engine.store.entries() if e.chat_id == chat]:
        with contextlib.suppress(NotFoundError):
            engine.store.delete_entry(entry.id)
    engine.runtime.reset()  # (and --no-cache computes it as asked: no news to say why)
    asked = ask(engine, "And after?", chat=chat, tokens=2, no_cache=True)
    assert not any("not stored under" in m for m in asked.messages), asked.messages


def test_a_chat_whose_cache_is_another_models_says_so(engine, doc_id):
    """(A chat continued under a second model was told its cache was "evicted under the
    storage budget, or not kept": it was kept, under the model that answered it.)"""
    chat = ask(engine, "Who kept the lamp lit?", doc=doc_id, tokens=4).chat_id
    engine.store.register_model("another-model", "/other.gguf", {})
    with sqlite3.connect(engine.store.path) as db:  # (as answered under the other model)
        db.execute("UPDATE kv_entries SET model = 'another-model' WHERE chat_id = ?", (chat,))
    db.close()
    reopened_computing(engine, chat, "stored under another model only (which answered it "
                                     "before; a model cannot read another's cache)")


def reopened_computing(engine, chat: int, why: str) -> None:
    """Reopened from an empty context, `chat` computes some of its tokens, saying `why`."""
    engine.runtime.reset()
    report = engine.reopen(chat)
    n = report.recomputed_tokens
    assert n > 0 and (f"this chat's own cache is {why}: {n:,} of its {report.tokens:,} tokens "
                      "were computed from its text") in report.messages, report.messages


def test_a_question_typed_ahead_is_computed_before_it_is_sent(engine, doc_id):
    question = "How tall is the tower?"
    rt = engine.runtime
    plain_chat = engine.new_chat([doc_id]).chat_id
    rt.reset()
    plain = ask(engine, question, chat=plain_chat, tokens=12)

    chat = engine.new_chat([doc_id]).chat_id
    rt.reset()
    context = engine.prefix_tokens([doc_id])
    # Drafting brings the chat's context in, then only its finished words.
    report = engine.prepare("How tall is the to", chat_id=chat)
    assert report is not None and report.recomputed_tokens == 0
    ahead = rt.tokens[len(context):]
    assert rt.tokens[: len(context)] == context and ahead
    assert "How tall" in rt.detokenize(ahead)
    assert engine.prepare("How tall is the to", chat_id=chat) is None  # nothing new
    assert rt.tokens[len(context):] == ahead
    # An edited draft: what no longer matches is dropped, not kept.
    engine.prepare("What was the lamp burning before", chat_id=chat)
    sent = ask(engine, question, chat=chat, tokens=12)
    assert sent.bytes_read == 0 and sent.chunk_levels == []
    assert sent.answer == plain.answer


def test_a_draft_sent_unchanged_answers_without_computing_anything(engine, doc_id, monkeypatch):
    question = "How tall is the tower?"
    plain_chat = engine.new_chat([doc_id]).chat_id
    engine.runtime.reset()
    plain = ask(engine, question, chat=plain_chat, tokens=12)
    chat = engine.new_chat([doc_id]).chat_id
    engine.prepare(question + "  ", chat_id=chat)
    evaluated, before_first = [], []
    monkeypatch.setattr(engine.runtime.llm, "eval", lambda toks, f=engine.runtime.llm.eval: (
        evaluated.extend(toks), f(toks)))
    sent = engine.ask(question, chat_id=chat, generation=deterministic(12),
                      on_token=lambda _: before_first.append(len(evaluated)))
    assert before_first[0] == 0  # the first token came from the draft's logits
    assert sent.answer == plain.answer


def test_a_draft_for_a_chat_not_yet_created(engine, doc_id):
    engine.runtime.reset()
    cancel = threading.Event()
    cancel.set()
    assert engine.prepare("When was", doc_ids=[doc_id], cancel=cancel) is None
    assert engine.runtime.n_tokens == 0  # a superseded draft does nothing
    report = engine.prepare("When was the lamp", doc_ids=[doc_id])
    assert report is not None and report.chunk_levels
    res = ask(engine, "When was the lamp electrified?", doc=doc_id, tokens=8)
    assert res.bytes_read == 0 and res.chunk_levels == []


def test_a_chat_about_two_documents_reuses_the_first_ones_cache(engine, doc_id, tmp_path):
    other = tmp_path / "ferry.txt"
    other.write_text("The ferry to Cape Morrow leaves at 07:15 and 16:40 every weekday.")
    other_id = engine.attach(other, levels=["high"]).doc_id
    chat = engine.new_chat([doc_id, other_id])
    assert chat.title == "New chat"
    res = ask(engine, "When does the ferry leave?", chat=chat.chat_id, tokens=20)
    assert "07:15" in res.answer or "16:40" in res.answer
    assert res.chunk_levels[0] != "text"  # the lighthouse document came from its cache
    assert res.blended["mode"] == "blended" and res.blended["reused_tokens"] > 0
    assert engine.exactness.idle.wait(300)  # the exact context, computed in the background
    (entry,) = [e for e in engine.store.entries() if e.chat_id == chat.chat_id]
    assert entry.parent_id == engine.store.document_entry(doc_id, engine.fingerprint).id
    assert engine.chats()[0].title == "When does the ferry leave?"
    est = engine.estimate(doc_ids=[doc_id, other_id])
    assert est.tokens > engine.estimate(doc_ids=[doc_id]).tokens


def test_forced_and_throttled_levels(engine, doc_id):
    chat = ask(engine, QUESTION, doc=doc_id, tokens=4).chat_id
    forced = engine.reopen(chat, restore=RestoreOptions(level="compact"))
    assert set(forced.chunk_levels) == {"compact"}, (forced.chunk_levels, forced.messages)
    # A slow link and a tight budget: the adaptive choice must step down from the best level.
    slow = engine.reopen(chat, restore=RestoreOptions(budget_ms=30, bandwidth_MBps=5))
    assert "lossless" not in slow.chunk_levels
    relaxed = engine.reopen(chat, restore=RestoreOptions(budget_ms=60_000))
    assert set(relaxed.chunk_levels) == {"lossless"}
    with pytest.raises(EngineError, match="unknown level"):
        engine.reopen(chat, restore=RestoreOptions(level="nonsense"))


def test_a_question_while_the_codec_compiles_recomputes_or_waits(engine, doc_id, monkeypatch):
    """Kernels still compiling (a bundle on a CPU its cache does not fit): a question is
    answered by recomputing or by waiting for them, whichever is expected sooner, and says so."""
    from desktop_app.results import COMPILING, PrepState

    def compiling(left_s):
        return lambda: PrepState(COMPILING, 3, 10, "encode high", 5.0, left_s, 3)

    monkeypatch.setattr(engine.contexts, "codec_state", compiling(1000.0))
    res = ask(engine, "Who built the lighthouse?", doc=doc_id, level="high", tokens=2)
    assert set(res.chunk_levels) == {"text"} and res.recomputed_tokens > 0
    assert any("was being prepared" in m and "recomputed from text" in m for m in res.messages)
    waited = []
    monkeypatch.setattr(engine.contexts, "codec_state", compiling(0.001))
    monkeypatch.setattr(engine.contexts, "wait_codec", lambda: waited.append(True))
    engine.runtime.reset()  # else the context already holds the document
    res = ask(engine, "Who built the lighthouse?", doc=doc_id, level="high", tokens=2)
    assert waited and set(res.chunk_levels) == {"high"} and res.recomputed_tokens == 0
    assert any("was being prepared" in m and "waited" in m for m in res.messages)


def test_corrupt_chunk_falls_back_and_still_answers(new_engine, tmp_path):
    eng = new_engine()
    path = tmp_path / "doc.txt"
    path.write_text(DOC)
    doc_id = eng.attach(path, levels=["balanced"]).doc_id
    entry = eng.store.document_entry(doc_id, eng.fingerprint)
    with sqlite3.connect(eng.store.path) as db:
        db.execute("UPDATE kv_chunks SET data = zeroblob(nbytes) "
                   "WHERE entry_id = ? AND chunk_index = 1", (entry.id,))
    res = ask(eng, QUESTION, doc=doc_id, tokens=12)
    assert res.tokens_generated > 0
    assert res.chunk_levels[0] == "balanced" and res.chunk_levels[1] == "text"
    assert res.recomputed_tokens > 0
    assert any("recomputing from token 64" in m for m in res.messages)
    assert eng.store.verify()["corrupt"]


def test_attaching_again_at_other_levels_keeps_the_cache_and_says_so(new_engine, tmp_path):
    """It prefilled the whole document again, stored nothing (an entry of those tokens was
    there) and reported 0 bytes at the levels asked."""
    eng = new_engine()
    path = tmp_path / "doc.txt"
    path.write_text(DOC)
    first = eng.attach(path, levels=["high"])
    again = eng.attach(path, levels=["balanced"])
    assert again.reused and again.prefill_s == 0 and again.doc_id == first.doc_id
    assert again.stored_bytes == first.stored_bytes and set(again.stored_bytes) == {"high"}
    assert any("kept at high, as stored before" in w and "(balanced)" in w and
               f"`kvdesk rm doc {first.doc_id}`" in w for w in again.warnings), again.warnings


def test_other_model_fingerprint_is_never_loaded(new_engine, tmp_path):
    eng = new_engine()
    path = tmp_path / "doc.txt"
    path.write_text(DOC)
    doc_id = eng.attach(path, levels=["high"]).doc_id
    chat = ask(eng, QUESTION, doc=doc_id, tokens=8).chat_id
    close(eng)
    # Same file, other KV layout (flash attention off: V transposed): another fingerprint.
    other = new_engine(flash_attn=False)
    assert [d.status for d in other.documents()] == ["stale"]
    # The local API's prompt over it is recomputed too, and says why.
    prompt = other.complete([{"role": "user", "content": QUESTION}], documents=[doc_id],
                            generation=GenerationOptions(max_tokens=2))
    assert prompt.cached_tokens == 0 and any("another model" in m for m in prompt.messages)
    other.runtime.reset()
    # A new chat about it caches it under this model first (once, said), and reads that.
    res = ask(other, QUESTION, doc=doc_id, tokens=8)
    assert res.messages[0] == (f"document {doc_id} was cached under another model: its "
                               "cache for this one is computed and stored now, once")
    assert "text" not in res.chunk_levels and res.bytes_read > 0
    assert [d.status for d in other.documents()] == ["ready"]
    again = ask(other, "How tall is the tower?", doc=doc_id, tokens=8)
    assert again.recomputed_tokens == 0 and "text" not in again.chunk_levels
    # The first chat's messages were tokenized under the first model only: this one
    # tokenizes them again from their text, says so, and answers (never reusing ids).
    more = ask(other, "And the museum?", chat=chat, tokens=8)
    assert any(m.startswith("2 messages of this chat had") and "tokenized again" in m
               for m in more.messages)
    assert other.store.message_tokens(chat, other.fingerprint)
    # What it computed is kept under this model: a reopen restores it all.
    other.runtime.reset()
    assert other.reopen(chat).recomputed_tokens == 0


@pytest.mark.parametrize("damage", ["cut", "empty", "past the vocabulary"])
def test_a_message_whose_stored_tokens_are_damaged_is_tokenized_again(engine, doc_id, damage):
    """A message's text is the truth: stored tokens cut short, emptied or naming ids past the
    vocabulary are never sent to the model; the turn is tokenized again from its text, said."""
    chat = ask(engine, QUESTION, doc=doc_id, tokens=4).chat_id
    first = engine.messages(chat)[0].message_id
    want = engine.store.message_tokens(chat, engine.fingerprint)[first]
    bad = {"cut": tokens_mod.encode(want)[:-1], "empty": b"",
           "past the vocabulary": tokens_mod.encode([*want[:-1], 1 << 30])}[damage]
    with sqlite3.connect(engine.store.path) as conn:
        conn.execute("UPDATE message_tokens SET tokens = ? WHERE message_id = ?", (bad, first))
    engine.runtime.reset()
    back = engine.reopen(chat)
    assert any(m.startswith("1 message of this chat had no usable tokens") and
               "tokenized again" in m for m in back.messages)
    assert engine.store.message_tokens(chat, engine.fingerprint)[first] == want
    assert ask(engine, "Thanks.", chat=chat, tokens=2).answer is not None


def test_a_chats_tokens_held_are_taken_as_they_are_not_rendered_again(engine, doc_id,
                                                                      monkeypatch):
    """(Each turn rendered the whole chat through its template for every message: 0.26 s a
    turn at 139 messages, growing as the square of the chat's length.)"""
    chat = ask(engine, QUESTION, doc=doc_id, tokens=4).chat_id
    ask(engine, "And then?", chat=chat, tokens=2)
    rendered = []
    real = engine.runtime.render_chat
    monkeypatch.setattr(engine.runtime, "render_chat",
                        lambda *a, **k: rendered.append(1) or real(*a, **k))
    _, tokens, notes = engine.session.conversation(engine.runtime, chat)
    assert rendered == [] and notes == [] and len(tokens) > 0


def test_cancelled_attach_keeps_nothing(new_engine, tmp_path):
    eng = new_engine()
    path = tmp_path / "long.txt"
    path.write_text(DOC * 3)
    stop = threading.Event()

    def progress(p):
        if p.phase == "prefill" and p.done >= 128:
            stop.set()

    with pytest.raises(Cancelled):
        eng.attach(path, progress=progress, cancel=stop)
    assert eng.store.documents() == [] and eng.store.entries() == []
    assert eng.store.verify()["chunks"] == 0


def test_a_slow_shared_cache_is_not_counted_as_the_prefills_time(new_engine, tmp_path,
                                                                 monkeypatch):
    """(A shared cache that hangs until its timeout made a 379-token prefill '33 s', and the
    prefill speed measured from it, which plans restores, 10x too slow.) The hang is an hour
    on attach's clock, so that no load on the machine can blur it."""
    eng = new_engine()
    pull, hung = eng.attacher.sharing.pull_for_attach, []
    # (attach's own `time`: the process's clock is left alone)
    monkeypatch.setattr(attaching, "time", types.SimpleNamespace(
        perf_counter=lambda: time.perf_counter() + 3600 * len(hung)))

    def slow(*args, **kw):
        hung.append(True)
        return pull(*args, **kw)

    eng.attacher.sharing.pull_for_attach = slow
    path = tmp_path / "short.txt"
    path.write_text(DOC)
    attached = eng.attach(path)
    assert hung and attached.prefill_s < 3600
    assert eng.speeds.prefill_tps > attached.kept_tokens / 3600


def test_a_document_deleted_while_it_is_attached_is_said_so(new_engine, tmp_path):
    """(The probe's `rm doc` during an attach ended it with "Error: no document 11".)"""
    eng = new_engine()
    pull = eng.attacher.sharing.pull_for_attach

    def deleted_first(fingerprint, tokens, levels, document_id, **kw):
        eng.delete_document(document_id)
        return pull(fingerprint, tokens, levels, document_id, **kw)

    eng.attacher.sharing.pull_for_attach = deleted_first
    path = tmp_path / "short.txt"
    path.write_text(DOC)
    with pytest.raises(EngineError, match=r"short.txt: deleted \(document 1\) while it was "
                                          "being attached: nothing of it is stored"):
        eng.attach(path)
    assert eng.store.documents() == [] and eng.store.entries() == []


def test_a_document_deleted_during_a_new_chats_first_answer_keeps_the_chat(new_engine,
                                                                          tmp_path):
    """(The probe's `rm doc` during a new chat's first answer: the answer streamed, then
    "Error: no document 12" and no chat.) Kept as a chat whose document is deleted since."""
    eng = new_engine()
    path = tmp_path / "short.txt"
    path.write_text(DOC)
    doc = eng.attach(path).doc_id
    deleted = []

    def delete_first(_):
        if not deleted:
            deleted.append(eng.delete_document(doc))

    result = eng.ask("What was the lamp burning before 1902?", doc_ids=[doc],
                     generation=deterministic(8), on_token=delete_first)
    assert deleted and result.answer and result.chat_id
    assert f"this turn's cache is not stored: document {doc} is deleted" in result.messages
    assert [m.role for m in eng.messages(result.chat_id)] == ["user", "assistant"]
    assert [c.chat_id for c in eng.chats()] == [result.chat_id]
    again = eng.ask("And after?", chat_id=result.chat_id, generation=deterministic(4))
    # named, as a chat's document deleted later is (its title read before the answer)
    assert f"document {doc} (short.txt) of this chat was deleted: the chat goes on without " \
        "it" in again.messages
    assert "Documents: short.txt (deleted)" in eng.export_chat(result.chat_id)



def test_a_question_about_a_document_still_attaching_or_killed_says_why_it_computes(
        new_engine):
    """(The probe's nightly job asked a document another process was still attaching, and
    one whose attach was killed: each took a full prefill, and nothing said why.)"""
    from test_store_helpers import dead_pid

    eng = new_engine()
    under_way = eng.store.add_document("h1", "under way.txt", DOC, type="text", attaching=True)
    killed = eng.store.add_document("h2", "killed.txt", DOC + " The end.", type="text",
                                    attaching=True)
    with contextlib.closing(sqlite3.connect(eng.store.path)) as conn, conn:
        conn.execute("UPDATE documents SET attach_pid = ? WHERE id = ?", (dead_pid(), killed.id))
    said = {doc.id: eng.ask(QUESTION, doc_ids=[doc.id], generation=deterministic(2)).messages
            for doc in (under_way, killed)}
    assert f"document {under_way.id} is still being attached: its text was computed for this " \
        "question" in said[under_way.id]
    assert f"document {killed.id}'s attach did not finish (stopped or killed): its text was " \
        "computed for this question" in said[killed.id]
    # Cached by that question (its chat's), the next one reads it and says nothing of it.
    again = eng.ask(QUESTION, doc_ids=[killed.id], generation=deterministic(2))
    assert not any("attach" in m for m in again.messages), again.messages


def test_bad_input(engine, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DocumentError):
        engine.attach(tmp_path / "empty.txt")
    with pytest.raises(EngineError, match="no chat"):
        ask(engine, "hi", chat=9999)
    with pytest.raises(InvalidValue, match="question: it is empty"):
        ask(engine, "   ")
    with pytest.raises(EngineError, match="unknown level"):
        engine.attach(tmp_path / "empty.txt", levels=["nope"])
    chats = len(engine.chats())
    with pytest.raises(EngineError, match="unknown level"):
        ask(engine, "hi", doc=None, level="bogus")
    assert len(engine.chats()) == chats  # no empty chat left behind


def attached_at_two_levels(new_engine, tmp_path):
    """(an engine, DOC attached at balanced and compact, its entry)."""
    eng = new_engine()
    path = tmp_path / "doc.txt"
    path.write_text(DOC)
    doc_id = eng.attach(path, levels=["balanced", "compact"]).doc_id
    return eng, doc_id, eng.store.document_entry(doc_id, eng.fingerprint)


def test_a_corrupt_chunk_at_a_forced_level_is_read_at_another_and_set_aside(new_engine,
                                                                            tmp_path):
    eng, doc_id, entry = attached_at_two_levels(new_engine, tmp_path)
    with sqlite3.connect(eng.store.path) as db:
        db.execute("UPDATE kv_chunks SET data = zeroblob(nbytes) WHERE entry_id = ? AND "
                   "chunk_index = 1 AND level = 'balanced'", (entry.id,))
    first = ask(eng, QUESTION, doc=doc_id, tokens=4, level="balanced")
    assert first.chunk_levels[1] == "compact" and first.recomputed_tokens == 0
    assert any("checksum" in m and "read at 'compact' instead" in m for m in first.messages)
    assert any(m.startswith("1 of ") and "failed its check at 'balanced'" in m
               for m in first.messages), first.messages
    # Set aside: the next restore does not try it again, and docs says it is damaged.
    eng.runtime.reset()
    again = ask(eng, QUESTION, doc=doc_id, tokens=4, level="balanced")
    assert again.chunk_levels[1] == "compact" and not any("checksum" in m
                                                          for m in again.messages)
    # Said as damaged, with its repair, as on the first read: it is stored at 'balanced'.
    assert not any("not stored" in m for m in again.messages), again.messages
    assert any(m.startswith("1 of ") and "damaged at 'balanced'" in m
               and "kvdesk verify --repair" in m for m in again.messages), again.messages
    (info,) = eng.documents()
    assert info.damaged_chunks == 1 and info.kept_tokens <= info.tokens
    report = eng.repair()
    assert report["repaired"] == [{"entry": entry.id, "chunk": 1, "level": "balanced"}]
    assert eng.store.verify()["corrupt"] == [] and eng.documents()[0].damaged_chunks == 0
    eng.runtime.reset()
    fixed = ask(eng, QUESTION, doc=doc_id, tokens=4, level="balanced")
    assert set(fixed.chunk_levels) == {"balanced"}


def test_a_level_note_counts_the_chunks_recomputed_after_it(new_engine, tmp_path):
    """A chunk read at another level, then one readable at none (recomputed from there): the
    note counts every chunk of the restore, not only the ones read."""
    eng, doc_id, entry = attached_at_two_levels(new_engine, tmp_path)
    with sqlite3.connect(eng.store.path) as db:
        (n_chunks,) = db.execute("SELECT COUNT(DISTINCT chunk_index) FROM kv_chunks WHERE "
                                 "entry_id = ?", (entry.id,)).fetchone()
        db.execute("UPDATE kv_chunks SET data = zeroblob(nbytes) WHERE entry_id = ? AND "
                   "((chunk_index = 0 AND level = 'balanced') OR chunk_index = 1)",
                   (entry.id,))
    assert n_chunks > 2
    res = ask(eng, QUESTION, doc=doc_id, tokens=4, level="balanced")
    assert res.chunk_levels[0] == "compact" and res.recomputed_tokens > 0
    assert any(m.startswith("recomputing from token") for m in res.messages), res.messages
    assert f"1 of {n_chunks} chunks failed its check at 'balanced': read at compact " \
        "instead; `kvdesk verify --repair` computes it again" in res.messages, res.messages


def test_a_forced_level_not_stored_is_said_and_lossless_stays_exact(new_engine, tmp_path):
    eng = new_engine()
    path = tmp_path / "doc.txt"
    path.write_text(DOC)
    doc_id = eng.attach(path, levels=["high"]).doc_id
    lossy = ask(eng, QUESTION, doc=doc_id, tokens=4, level="compact")
    assert set(lossy.chunk_levels) == {"high"}
    assert any("not stored at 'compact'" in m for m in lossy.messages)
    assert not any("failed their check" in m for m in lossy.messages)  # none was damaged
    exact = ask(eng, QUESTION, doc=doc_id, tokens=8, level="lossless")
    assert set(exact.chunk_levels) == {"text"} and exact.recomputed_tokens > 0
    assert any("exact KV is opt-in" in m for m in exact.messages)
    assert exact.answer == ask(eng, QUESTION, doc=doc_id, tokens=8, no_cache=True).answer


def test_a_cache_kept_exact_alone_is_read_exact_with_no_note_at_every_turn(new_engine,
                                                                           tmp_path):
    """(A sliding-window model's caches are lossless alone until its codec is calibrated:
    every question from the window's slider at `high` said "... not stored at 'high': read
    at lossless instead".)"""
    eng = new_engine()
    path = tmp_path / "doc.txt"
    path.write_text(DOC)
    doc_id = eng.attach(path, levels=[EXACT]).doc_id
    res = ask(eng, QUESTION, doc=doc_id, tokens=4, level="high")
    assert set(res.chunk_levels) == {EXACT} and res.recomputed_tokens == 0
    assert not any("not stored at" in m for m in res.messages), res.messages


def test_a_stored_lossless_level_is_read_though_the_app_does_not_store_it(new_engine,
                                                                           tmp_path):
    """What is stored counts, not the keep_lossless setting: a document attached with
    `--levels lossless,...` by an app storing the default levels is read at lossless."""
    eng = new_engine(levels=DEFAULT_LEVELS)
    path = tmp_path / "doc.txt"
    path.write_text(DOC)
    doc_id = eng.attach(path, levels=[EXACT, "high"]).doc_id
    exact = ask(eng, QUESTION, doc=doc_id, tokens=8, level=EXACT)
    assert set(exact.chunk_levels) == {EXACT} and exact.recomputed_tokens == 0
    assert not any("opt-in" in m for m in exact.messages)
    assert exact.answer == ask(eng, QUESTION, doc=doc_id, tokens=8, no_cache=True).answer
    # "auto" still chooses among the app's own levels.
    eng.runtime.reset()
    assert set(ask(eng, QUESTION, doc=doc_id, tokens=4).chunk_levels) == {"high"}


def test_a_question_longer_than_the_context_says_so_not_that_a_new_chat_is_full(new_engine):
    eng = new_engine()
    with pytest.raises(EngineError, match=r"the question is [\d,]+ tokens, with the [\d,]+ "
                       r"before it \(the system prompt and documents\) too long for the"):
        eng.ask("zebra quantum lattice " * 1500, doc_ids=[],
                generation=GenerationOptions(max_tokens=1))


def test_a_question_that_fits_alone_but_not_after_its_document_says_so(new_engine, tmp_path):
    eng = new_engine()
    long = tmp_path / "long.txt"
    long.write_text(DOC * 5)  # (~620 tokens with the system prompt)
    doc = eng.attach(long).doc_id
    with pytest.raises(EngineError, match=r"the question is [\d,]+ tokens, with the [\d,]+ "
                       r"before it \(the system prompt and documents\) too long .* or ask "
                       r"about fewer or shorter documents"):  # (it said "start a new chat")
        eng.ask("zebra lattice " * 240, doc_ids=[doc],  # (~480 tokens: under half the context)
                generation=GenerationOptions(max_tokens=1))


def test_a_full_disk_keeps_the_answer_and_says_its_cache_is_not_stored(engine, doc_id,
                                                                      monkeypatch):
    def full(*args, **kwargs):
        raise DiskFullError("the disk holding the data directory D is full")

    monkeypatch.setattr(engine.session.kv, "store_chat", full)
    result = ask(engine, "What was the lamp burning before 1902?", doc=doc_id, tokens=8)
    assert "this turn's cache is not stored: the disk holding the data directory D is full" \
        in result.messages
    assert [m.role for m in engine.messages(result.chat_id)] == ["user", "assistant"]
    # the local API's conversation too, through the same keeping
    monkeypatch.setattr(engine.session.kv, "store_prefix", full)
    monkeypatch.setattr(engine.completions, "min_cache_tokens", 0)
    done = engine.complete([{"role": "user", "content": "What did the lamp burn?"}],
                           documents=[doc_id], generation=deterministic(4))
    assert not done.stored and "this conversation's cache is not stored: the disk holding " \
        "the data directory D is full" in done.messages


@pytest.mark.parametrize("error, said", [
    (DiskFullError("the disk is full"), "the answer given is not stored, nor its question "
     "(nor a chat made for them): the disk is full"),
    (DamagedError("the database file D is damaged"), "this turn is not stored: the database "
     "file D is damaged"),
])
def test_an_answer_whose_turn_cannot_be_stored_is_given_saying_so(engine, doc_id, monkeypatch,
                                                                  error, said):
    """(A full disk's, or a store found damaged, ended as an error after the answer streamed,
    exit 1, and `--json` lost the answer; a vanished data directory's gave it.)"""
    def refused(*args, **kwargs):
        raise error

    monkeypatch.setattr(engine.store, "start_chat", refused)
    chats = len(engine.chats())
    result = ask(engine, "What was the lamp burning before 1902?", doc=doc_id, tokens=4)
    assert result.answer and not result.stored and result.chat_id == 0
    assert said in result.messages and len(engine.chats()) == chats


def test_storing_a_cache_that_evicts_others_says_which(new_engine, tmp_path):
    eng = new_engine()
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text(DOC)
    second.write_text(DOC.replace("lamp", "lantern"))
    one = eng.attach(first, levels=["compact"])
    assert not any("evicted" in w for w in one.warnings)
    eng.store.budget_bytes = sum(one.stored_bytes.values()) + 1000  # room for one document
    two = eng.attach(second, levels=["compact"])
    (said,) = [w for w in two.warnings if "evicted" in w]
    assert said.startswith("storing this evicted the least recently used caches to keep "
                           "within the storage budget")
    assert f"document {one.doc_id} (first.txt)" in said
    assert said.endswith("they are computed again when next used")
    assert eng.store.document_entry(one.doc_id, eng.fingerprint) is None
    # a cache larger than the whole budget (the chat's, at every level) is not stored, and
    # evicts nothing for nothing
    before = {e.id for e in eng.store.entries()}
    res = ask(eng, QUESTION, doc=two.doc_id, tokens=8)
    budget = size_text(eng.store.budget_bytes)
    assert any(f"is larger than the whole storage budget of {budget}" in m and "it is not stored, "
               "and nothing else was evicted for it" in m for m in res.messages), res.messages
    assert not any("storing this evicted" in m for m in res.messages)
    assert {e.id for e in eng.store.entries()} == before
    # an attach too (it failed with "no KV entry N")
    third = tmp_path / "third.txt"
    third.write_text(DOC.replace("lamp", "beacon"))
    big = eng.attach(third)  # (at every level: larger than the budget)
    assert any("larger than the whole storage budget" in w for w in big.warnings)
    assert sum(big.stored_bytes.values()) == 0 and {e.id for e in eng.store.entries()} == before
    # and says what would fit, from the sizes it measured (it said nothing of a way out)
    (fits,) = [w for w in big.warnings if "fits" in w]
    assert "the document is attached all the same" in fits and "(exit status 0)" in fits
    assert "stored at compact alone it fits" in fits and "`--levels compact`" in fits, fits
    # the local API's prompt cache too: not stored, said, nothing evicted
    eng.completions.min_cache_tokens = 0  # (this prompt is short)
    done = eng.complete([{"role": "user", "content": DOC + QUESTION}],
                        generation=GenerationOptions(max_tokens=2))
    assert not done.stored and any("larger than the whole storage budget" in m
                                   for m in done.messages), done.messages
    assert {e.id for e in eng.store.entries()} == before
    # a budget changed while running (the window's settings) applies at once
    assert eng.set_storage_budget(1e-6)["evicted_entries"] and eng.store.entries() == []
    assert eng.store.budget_bytes == 1000


def test_an_answer_stopped_is_kept_and_stored_as_stopped(engine, doc_id):
    cancel, seen = threading.Event(), []

    def on_token(text):
        seen.append(text)
        if len(seen) == 3:
            cancel.set()  # the user stops it (Esc, Ctrl-C)

    res = engine.ask(QUESTION, doc_ids=[doc_id], generation=deterministic(40),
                     on_token=on_token, cancel=cancel)
    assert res.finish_reason == "cancelled" and res.answer
    (_, answer) = engine.messages(res.chat_id)
    assert answer.text == res.answer and answer.stats["finish_reason"] == "cancelled"


def test_a_regenerate_replaces_the_last_turn_only_once_its_new_one_is_stored(engine, doc_id):
    """Stopped or failed before its answer is stored, a regenerate leaves the chat as it was:
    the turn it was to replace is not lost; answered, the new turn takes its place."""
    first = ask(engine, "What was the lamp burning before 1902?", doc=doc_id, tokens=8)
    second = ask(engine, "How tall is the tower?", chat=first.chat_id, tokens=8)
    before = [(m.role, m.text) for m in engine.messages(first.chat_id)]

    def fail(report):
        raise RuntimeError("interrupted before the first token")

    with pytest.raises(RuntimeError, match="interrupted"):
        engine.regenerate(first.chat_id, on_restore=fail, generation=deterministic(8))
    assert [(m.role, m.text) for m in engine.messages(first.chat_id)] == before
    # Stopped once the context is ready, before the answer began: nothing is stored.
    stopped = threading.Event()
    with pytest.raises(Cancelled, match="before the answer began"):
        engine.regenerate(first.chat_id, cancel=stopped, generation=deterministic(8),
                          on_restore=lambda report: stopped.set())
    assert [(m.role, m.text) for m in engine.messages(first.chat_id)] == before
    stopped = threading.Event()
    with pytest.raises(Cancelled, match="before the answer began"):  # nor a question so
        engine.ask("And the museum?", chat_id=first.chat_id, cancel=stopped,
                   on_restore=lambda report: stopped.set())
    assert [(m.role, m.text) for m in engine.messages(first.chat_id)] == before
    assert [(m.role, m.text) for m in engine.messages(first.chat_id)] == before
    again = engine.regenerate(first.chat_id, generation=deterministic(8, seed=3))
    after = engine.messages(first.chat_id)
    assert [(m.role, m.text) for m in after] == [*before[:2], ("user", before[2][1]),
                                                   ("assistant", again.answer)]
    assert second.answer == before[3][1]


def test_a_short_prompt_takes_nothing_from_an_unrelated_entry_that_begins_alike(engine,
                                                                                  doc_id):
    """A prompt sharing only the system prompt and a header with a stored entry (here the
    document's) computes those few tokens, exactly, rather than read them lossy from it: its
    answer does not depend on what else the store holds."""
    reports = []
    engine.runtime.reset()  # as after a restart
    engine.complete([{"role": "user", "content": "Write a story about a dragon."}],
                    generation=deterministic(2), on_restore=reports.append)
    assert reports[0].bytes_read == 0 and "text" in reports[0].chunk_levels


def test_a_clients_next_turn_computes_only_what_it_adds(new_engine):
    """A client of the local API sends the whole conversation each turn: the context holds
    all of it but the new turn, exactly, and keeps it (nothing read, nothing recomputed but
    what the turn adds), where it recomputed everything or read a lossy copy back."""
    eng = new_engine(levels=("balanced",))
    first = [{"role": "user", "content": "When was the lighthouse electrified?"}]
    done = eng.complete(first, generation=deterministic(8))
    reports = []
    later = eng.complete([*first, {"role": "assistant", "content": done.text},
                          {"role": "user", "content": "How tall is the tower?"}],
                         generation=deterministic(4), on_restore=reports.append)
    (report,) = reports
    assert report.bytes_read == 0 and report.chunk_levels == []
    assert later.cached_tokens >= done.prompt_tokens and report.recomputed_tokens > 0
    # the note counts as `usage` does: the cached tokens of the whole prompt
    assert report.messages[0].startswith(f"the model already held {later.cached_tokens:,} of "
                                         f"its {later.prompt_tokens:,} tokens")
    eng.runtime.reset()
    recomputed = eng.complete([*first, {"role": "assistant", "content": done.text},
                               {"role": "user", "content": "How tall is the tower?"}],
                              generation=deterministic(4), restore=RestoreOptions(no_cache=True))
    assert recomputed.text == later.text  # kept exactly


def test_kv_read_back_lossy_is_never_stored_again_as_computed(new_engine, monkeypatch):
    """The local API's prompt cache: requests sharing a long system prompt, each with its own
    question, read the shared part back from the first request's entry. Storing it again
    (encoded from the context that had read it back) made an entry of lossy KV labelled at
    every level: through the API after a restart, a 6,091-token prompt at `high` answered
    nothing. Now the first request's entry is split where they part, its chunks moved with
    their bytes, and each request's own entry extends the shared part."""
    eng = new_engine(levels=("balanced",))
    eng.completions.min_cache_tokens = 0
    system = {"role": "system", "content": DOC * 2}  # several 64-token chunks
    first = [system, {"role": "user", "content": "When was the lighthouse electrified?"}]
    done = eng.complete(first, generation=deterministic(4))
    (entry,) = eng.store.entries()
    computed = [eng.store.read_chunk(entry.id, s.chunk_index, "balanced")
                for s in eng.store.spans(entry.id)]
    for question in ("How tall is the tower?", "What broke the lantern glass?"):
        later = eng.complete([system, {"role": "user", "content": question}],
                             generation=deterministic(4))
        assert later.cached_tokens > 64 and later.stored
    entries = eng.store.entries()
    (shared,) = [e for e in entries if e.parent_id is None]
    assert len(entries) == 4 and all(e.parent_id == shared.id for e in entries
                                     if e is not shared)
    assert [eng.store.read_chunk(shared.id, s.chunk_index, "balanced")
            for s in eng.store.spans(shared.id)] == computed[:len(eng.store.spans(shared.id))]
    # Where the part read back cannot be split off (a document's entry is kept whole), what
    # came back lossy is not stored again: nothing is.
    def refuse(entry_id, at):
        raise ValueError("kept whole")

    monkeypatch.setattr(eng.store, "split_entry", refuse)
    other = {"role": "system", "content": DOC.replace("lamp", "beacon") * 2}
    assert eng.complete([other, {"role": "user", "content": "Who lit it?"}],
                        generation=deterministic(4)).stored
    eng.runtime.reset()  # as after a restart: the shared part is read back, lossy
    again = eng.complete([other, {"role": "user", "content": "How tall is the tower?"}],
                         generation=deterministic(4))
    assert again.cached_tokens > 64 and not again.stored
    going_on = eng.complete([*first, {"role": "assistant", "content": done.text},
                             {"role": "user", "content": "And who kept it?"}],
                            generation=deterministic(4))
    assert going_on.stored and going_on.cached_tokens >= entry.token_end - 1


def test_closing_stops_both_background_passes_before_waiting_for_either(tmp_path):
    """The passage pass waits for the background context the exact pass holds: closing must
    cancel the exact pass before waiting for the passage pass, or the close lasts as long as
    the exact pass's whole prefill (77 s measured on a chat of 2,793 tokens)."""
    eng = Engine(Store(tmp_path / "data"), lambda: None)
    holding = threading.Event()

    def exact_pass(chat_id):  # holds the background context, slice after slice
        with eng.exactness.attach_lock:
            holding.set()
            while True:
                eng.exactness.yield_to_turns()  # Cancelled once closing
                eng.exactness.cancel.wait(0.01)

    waiting = threading.Event()

    def passage_pass(doc_id):
        eng.passage_fill.yield_to_turns()
        waiting.set()
        with eng.passage_fill.attach_lock:  # waits for the exact pass
            pass

    eng.exactness.work, eng.passage_fill.work = exact_pass, passage_pass
    eng.exactness.request(1)
    holding.wait(5)
    eng.passage_fill.request(1)
    waiting.wait(5)  # (closed before, it would stop at its yield, whatever the order)
    closing = threading.Thread(target=eng.close, daemon=True)
    closing.start()
    closing.join(10)
    assert not closing.is_alive()
    eng.store.close()
