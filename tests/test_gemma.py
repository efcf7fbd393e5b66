"""Gemma 3 270M end to end: a sliding-window (iSWA) model's document and chats stored as
full-attention chunks plus windows, restored exactly, falling back where they must.

One engine for the module (short document, small context, 128-token chunks); flash attention
off, the family's default (RESULTS.md, "Gemma 3 end to end")."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from codec_helpers import error_bound

import codec
from codec.calibrated.calibration import fitted
from codec.format.levels import levels
from desktop_app.engine import Engine
from desktop_app.errors import RuntimeStateError
from desktop_app.kv.levels import DEFAULT_LEVELS, EXACT
from desktop_app.model.kvstate import in_position_order
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from store import Store
from store.shared import sync

EVERY_LEVEL = (*DEFAULT_LEVELS, EXACT)

CHUNK = 128
WINDOW = 512
# ~600 tokens under Gemma's tokenizer: longer than the window, so that the window starts
# inside the document.
DOC = "\n".join(
    f"Entry {i}: the lighthouse keeper logged {3 * i + 7} ships, {i % 5} storms and a "
    f"lamp check at {i % 12 + 1} o'clock; the glass was cleaned {i % 3 + 1} times."
    for i in range(24))
QUESTION = "How many ships did the keeper log in entry 5?"
# Answered at length (a base model answers the question above in a token or two).
LONG_QUESTION = "Write out entry 5 word for word."


def make_engine(data_dir, gemma_path, n_ctx=1536, **options) -> Engine:
    def factory():
        return Runtime(gemma_path, model_hash="gemma3-270m", n_ctx=n_ctx, flash_attn=False)

    return Engine(Store(data_dir), factory, chunk_tokens=CHUNK, levels=EVERY_LEVEL, **options)


def ask(eng: Engine, question: str, *, doc=None, chat=None, tokens=16, **restore):
    return eng.ask(question, chat_id=chat, doc_ids=[doc] if doc is not None else [],
                   restore=RestoreOptions(**restore),
                   generation=GenerationOptions(max_tokens=tokens, temperature=0))


def answer_tokens(eng: Engine, chat_id: int) -> list[int]:
    """The exact token ids of the chat's last answer."""
    last = eng.messages(chat_id)[-1]
    return eng.store.message_tokens(chat_id, eng.fingerprint)[last.message_id]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, gemma_path):
    eng = make_engine(tmp_path_factory.mktemp("gemma"), gemma_path)
    yield eng
    eng.close()
    eng.store.close()


@pytest.fixture(scope="module")
def doc_id(engine, tmp_path_factory):
    path = tmp_path_factory.mktemp("docs") / "log.txt"
    path.write_text(DOC)
    # (every level, asked: uncalibrated, the model's caches are stored lossless only)
    return engine.attach(path, levels=EVERY_LEVEL).doc_id


def test_an_uncalibrated_model_keeps_its_caches_lossless_and_says_so(tmp_path, gemma_path):
    """Its document cache read at the model-independent `high` answered a port number
    wrongly that lossless answered right: until the model is calibrated nothing lossy of it
    is stored, a document's or a chat's."""
    eng = make_engine(tmp_path / "data", gemma_path)
    try:
        path = tmp_path / "log.txt"
        path.write_text(DOC)
        res = eng.attach(path)
        assert set(res.stored_bytes) == {"lossless"}
        assert any("lossless only until this model is calibrated" in w for w in res.warnings)
        out = ask(eng, "Which entry had the most storms?", doc=res.doc_id)
        assert set(out.chunk_levels) == {"lossless"} and out.recomputed_tokens == 0
        assert {tuple(e.levels) for e in eng.store.entries()} == {("lossless",)}
    finally:
        eng.close()
        eng.store.close()


def spans_of(eng: Engine, entry_id: int):
    return ([(s.token_start, s.token_end) for s in eng.store.spans(entry_id)],
            [(s.token_start, s.token_end) for s in eng.store.windows([entry_id])[entry_id]])


def test_a_document_is_stored_as_chunks_and_its_window(engine, doc_id):
    lay = engine.runtime.layout
    assert (lay.full_layers, lay.swa_layers, lay.n_swa) == (3, 15, WINDOW)
    entry = engine.store.document_entry(doc_id, engine.fingerprint)
    end = entry.token_end
    assert end > WINDOW + CHUNK
    chunks, window = spans_of(engine, entry.id)
    assert chunks[0] == (0, CHUNK) and chunks[-1][1] == end
    assert window[0] == (end - WINDOW, end - WINDOW + CHUNK) and window[-1][1] == end
    assert len(window) == WINDOW // CHUNK
    (info,) = [d for d in engine.documents() if d.doc_id == doc_id]
    assert info.status == "ready" and set(info.cache_bytes) == set(engine.levels)
    assert info.cache_bytes["compact"] < info.cache_bytes["lossless"] < lay.raw_bytes(end)


def test_lossless_answers_token_for_token_like_recomputing(engine, doc_id):
    engine.runtime.reset()
    cached = ask(engine, LONG_QUESTION, doc=doc_id, level="lossless", tokens=24)
    fresh = ask(engine, LONG_QUESTION, doc=doc_id, no_cache=True, tokens=24)
    entry = engine.store.document_entry(doc_id, engine.fingerprint)
    n_parts = entry.n_chunks + WINDOW // CHUNK
    assert cached.recomputed_tokens == 0 and cached.chunk_levels == ["lossless"] * n_parts
    assert fresh.recomputed_tokens > 0 and set(fresh.chunk_levels) == {"text"}
    assert answer_tokens(engine, cached.chat_id) == answer_tokens(engine, fresh.chat_id)
    assert cached.tokens_generated > 3


def test_a_chat_carries_its_own_window_and_reopens(engine, doc_id):
    first = ask(engine, "Which entry had the most storms?", doc=doc_id, level="lossless")
    chat = first.chat_id
    doc_entry = engine.store.document_entry(doc_id, engine.fingerprint)
    (turn1,) = [e for e in engine.store.entries() if e.chat_id == chat]
    assert turn1.parent_id == doc_entry.id  # the document's chunks shared, not copied
    _, window = spans_of(engine, turn1.id)
    assert window[0][0] == turn1.token_end - WINDOW and window[-1][1] == turn1.token_end

    # At auto, which reads the best level stored (lossless here): `lossless` asked computes
    # a chat's own turns again, as --no-cache does (test_exact_turns).
    second = ask(engine, "And how often was the glass cleaned in entry 4?", chat=chat)
    assert second.recomputed_tokens == 0 and second.chunk_levels == []  # the context was kept
    kept = answer_tokens(engine, chat)
    engine.runtime.reset()  # as after a restart
    shown = []
    report = engine.reopen(chat, progress=lambda p: shown.append((p.done, p.total)))
    assert report.recomputed_tokens == 0 and report.tokens == engine.runtime.n_tokens
    # (the window's parts come after the chunks: the progress shown never runs backwards)
    assert shown == sorted(shown) and shown[-1] == (report.tokens, report.tokens)
    assert set(report.chunk_levels) == {"lossless"}
    # The second turn asked again after a restart: the first turn's entry (its window) is
    # restored as it was computed and the question computed as it was: the same answer, token
    # for token. (Not the same as recomputing the whole chat from text: llama.cpp's one-token
    # decodes, which wrote the first answer's KV, and its batched prefill round differently.)
    engine.runtime.reset()
    again = engine.regenerate(chat, generation=GenerationOptions(max_tokens=16, temperature=0))
    assert again.recomputed_tokens == 0
    assert again.answer == second.answer and answer_tokens(engine, chat) == kept
    third = ask(engine, "Thank you.", chat=chat, tokens=8)
    assert third.tokens_generated > 0


def test_cutting_back_a_restored_window_is_refused_beyond_one_token(engine, doc_id):
    rt = engine.runtime
    engine.reopen(ask(engine, QUESTION, doc=doc_id, tokens=4).chat_id)
    n = rt.n_tokens
    assert rt.can_truncate(n - 1)  # what a restore's last token needs: its logits again
    assert not rt.can_truncate(n - 2)
    with pytest.raises(RuntimeStateError, match="sliding-window"):
        rt.truncate(n - CHUNK)


def test_a_lossy_level_stays_within_its_bound(engine, doc_id):
    chat = ask(engine, QUESTION, doc=doc_id, tokens=4).chat_id
    rt = engine.runtime
    engine.reopen(chat)  # (auto: every chunk read at lossless, the chat's own too)
    exact = rt.capture()
    engine.reopen(chat, restore=RestoreOptions(level="high"))
    lossy = rt.capture()
    # Chunk by chunk as stored: the chain's chunks, then the last entry's window parts.
    match = engine.store.longest_prefix(engine.fingerprint, rt.tokens)
    parts = engine.store.windows([match.entries[-1].id])[match.entries[-1].id]
    cfg = codec.levels()["high"]
    for section, spans in zip((0, 1), (match.spans, parts), strict=True):
        ex = in_position_order(exact.sections[section])
        lo = in_position_order(lossy.sections[section])
        assert np.array_equal(ex.positions, lo.positions)
        first = int(ex.positions[0])
        for span in spans:
            a, b = span.token_start - first, span.token_end - first
            sink = min(cfg.sink_tokens, b - a) if span.token_start == 0 else 0
            for x, xhat, kind in ((ex.keys, lo.keys, cfg.keys),
                                  (ex.values, lo.values, cfg.values)):
                x, xhat = x[:, a + sink:b], xhat[:, a + sink:b]
                err = np.abs(x.astype(np.float32) - xhat.astype(np.float32))
                assert np.all(err <= error_bound(x, xhat, kind)), (section, span)
    # (the document's chunks read lossy; the chat's own entry, whose window parts are the
    # last section, is stored lossless only while the model is not calibrated)
    assert not np.array_equal(in_position_order(exact.sections[0]).keys,
                              in_position_order(lossy.sections[0]).keys)


def test_an_unreadable_window_falls_back_to_an_earlier_entry_end(engine, doc_id):
    # A question no other test asks: its chat's tokens are its own, stored as its entry.
    first = ask(engine, "How many storms were logged in entry 7?", doc=doc_id, tokens=8,
                level="lossless")
    (turn,) = [e for e in engine.store.entries() if e.chat_id == first.chat_id]
    part = engine.store.windows([turn.id])[turn.id][-1]
    with sqlite3.connect(engine.store.path) as db:  # damaged at every level
        db.execute("UPDATE kv_chunks SET data = zeroblob(nbytes) WHERE entry_id = ? AND "
                   "chunk_index = ?", (turn.id, part.chunk_index))
    engine.runtime.reset()
    report = engine.reopen(first.chat_id)  # (auto: read at lossless, the chat's own too)
    doc_end = engine.store.document_entry(doc_id, engine.fingerprint).token_end
    # The document's entry ends with a window: the restore resumes there and recomputes the
    # chat's own tokens.
    assert report.tokens - report.recomputed_tokens == doc_end
    assert report.chunk_levels.count("lossless") == len(spans_of(engine, turn.parent_id)[0]) \
        + WINDOW // CHUNK
    assert any("cannot be restored (its window" in m for m in report.messages)
    assert any("earlier entry ends" in m for m in report.messages)
    again = ask(engine, "And in entry 6?", chat=first.chat_id, tokens=8)
    assert again.tokens_generated > 0


def test_the_shared_cache_carries_windows(engine, doc_id, remote_tier, tmp_path, gemma_path):
    entry = engine.store.document_entry(doc_id, engine.fingerprint)
    sync.push(engine.store, remote_tier, entry)
    exact = ask(engine, QUESTION, doc=doc_id, no_cache=True, tokens=16)
    other = make_engine(tmp_path / "other", gemma_path, remote=remote_tier)
    try:
        sync.pull_all(other.store, remote_tier, other.fingerprint, lazy=True)
        (doc,) = other.documents()
        streamed = ask(other, QUESTION, doc=doc.doc_id, level="lossless", tokens=16)
        assert streamed.source == "remote" and streamed.recomputed_tokens == 0
        assert answer_tokens(other, streamed.chat_id) == answer_tokens(engine, exact.chat_id)
        copy = other.store.document_entry(doc.doc_id, other.fingerprint)
        assert spans_of(other, copy.id) == spans_of(engine, entry.id)
    finally:
        other.close()
        other.store.close()


# Three documents of ~330, ~820 and ~230 tokens: their chat outgrows the 512-token window,
# and the second's own window starts inside it.
BLEND_DOCS = {
    "ferry.txt": "\n".join(f"Crossing {i}: the ferry to Cape Morrow left at {7 + i % 9}:"
                           f"{15 + i % 40} with {20 + 3 * i} passengers." for i in range(14)),
    "museum.txt": "\n".join(f"Room {i} of the keeper's museum keeps {i + 2} logbooks and a "
                            f"brass telescope from {1900 + 7 * i}." for i in range(30)),
    "tower.txt": "\n".join(f"Storey {i} of the tower is {3 + i % 4} metres tall; its window "
                           f"faces {('north', 'east', 'south', 'west')[i % 4]}."
                           for i in range(12)),
}


def test_a_blend_computing_every_later_token_equals_a_prefill_in_the_same_pieces(
        tmp_path, gemma_path):
    """The sliding-window blend's machinery (restored up to each run, the run computed, its
    KV taken back, both sections assembled): with every token of the later documents
    selected, the context is a prefill of the same tokens in the same pieces."""
    eng = make_engine(tmp_path / "data", gemma_path, n_ctx=2048, blend_fraction=0.9999,
                      background=False)
    try:
        ids = []
        for name, text in BLEND_DOCS.items():
            (tmp_path / name).write_text(text)
            ids.append(eng.attach(tmp_path / name).doc_id)
        # (a budget that leaves time to read every lossless copy: `lossless` asked is never
        # blended)
        res = eng.ask("When did crossing 3 leave, and what does room 4 keep?", doc_ids=ids,
                      restore=RestoreOptions(budget_ms=600_000),
                      generation=GenerationOptions(max_tokens=1, temperature=0))
        assert res.blended["mode"] == "blended" and res.blended["recomputed_tokens"] > WINDOW
        assert set(res.chunk_levels) == {EXACT}
        rt = eng.runtime
        got = [in_position_order(kv) for kv in rt.capture().sections]
        parts = eng.prompter.layout(rt, [eng.library.document(i) for i in ids]).parts
        assert len(parts) == 3 and parts[-1][1] > WINDOW
        tokens = list(rt.llm.input_ids[:rt.n_tokens])
        rt.reset()
        for a, b in [(0, parts[0][1]), *parts[1:], (parts[-1][1], len(tokens))]:
            rt.prefill(tokens[a:b])
        want = [in_position_order(kv) for kv in rt.capture().sections]
        assert [len(kv.positions) for kv in got] == [len(tokens), WINDOW]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.positions, w.positions)
            inside = g.positions < parts[-1][1]  # the question and answer: batched otherwise
            for kind in ("keys", "values"):
                a, b = (getattr(kv, kind)[:, inside].astype(np.float32) for kv in (g, w))
                assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max()
    finally:
        eng.close()
        eng.store.close()


FERRY = "When does the Saturday ferry leave, and what does the museum keep?"


def passages_engine(data_dir, gemma_path) -> tuple[Engine, int]:
    """An engine keeping passage KV (lossless: not calibrated), two passages read a question,
    and a long document's id (test_longdoc's)."""
    from test_longdoc import add_long_document

    eng = make_engine(data_dir, gemma_path, blend_fraction=0.15, passage_level="lossless")
    eng.session.longdocs.top_k = 2
    return eng, add_long_document(eng.store)


def test_a_long_documents_passages_are_blended_from_their_caches(tmp_path, gemma_path):
    """A sliding-window model's chat over passages: the second ask reads them back."""
    from test_longdoc import PASSAGES

    eng, doc = passages_engine(tmp_path / "data", gemma_path)
    try:
        q, greedy = FERRY, GenerationOptions(max_tokens=8, temperature=0)
        first = eng.ask(q, doc_ids=[doc], generation=greedy)
        assert [s["text"] for s in first.sources] == PASSAGES[:2]
        held = []

        def capture(report):
            rt = eng.runtime
            held.append((rt.tokens, in_position_order(rt.capture().sections[1])))

        eng.runtime.reset()
        second = eng.ask(q, doc_ids=[doc], generation=greedy, on_restore=capture)
        assert not any("with no stored KV" in m for m in second.messages)
        assert second.blended["mode"] == "blended" and second.blended["reused_tokens"] > 0
        assert second.recomputed_tokens < first.recomputed_tokens / 2
        assert second.answer
        # Gemma's first layer is a window layer, whose keys depend only on each token and
        # its position: the reused passage's, turned to its place, are a prefill's.
        tokens, window = held[0]
        rt = eng.runtime
        rt.reset()
        rt.prefill(tokens)
        exact = in_position_order(rt.capture().sections[1])
        np.testing.assert_array_equal(window.positions, exact.positions)
        want = exact.keys[0].astype(np.float32)
        err = np.abs(window.keys[0].astype(np.float32) - want).max(axis=1)
        assert err.max() <= 0.02 * np.abs(want).max(), int(np.argmax(err))
    finally:
        eng.close()
        eng.store.close()


def test_a_new_chat_over_stored_passages_resumes_where_they_end(tmp_path, gemma_path):
    """The exact pass of a chat over passages stores them as an entry of their own on the
    way, window and all: the same question asked in a new chat restores all of them and
    computes only its own turn (before, it resumed where the passages' head ends)."""
    eng, doc = passages_engine(tmp_path / "data", gemma_path)
    try:
        q, greedy = FERRY, GenerationOptions(max_tokens=8, temperature=0)
        first = eng.ask(q, doc_ids=[doc], generation=greedy)
        assert first.blended["mode"] == "blended"
        eng.exactness.request(first.chat_id)
        assert eng.exactness.finish(first.chat_id)
        prefix = eng.session.longdocs.prefix(eng.runtime, first.chat_id).tokens
        match = eng.store.longest_prefix(eng.fingerprint, prefix, touch=False)
        ends = {e.id: e.token_end for e in match.entries}
        assert len(prefix) in {ends[i] for i in eng.store.windows(ends)}
        eng.runtime.reset()
        again = eng.ask(q, doc_ids=[doc], generation=greedy)
        assert again.blended == {"reused_tokens": len(prefix), "recomputed_tokens": 0,
                                 "quoted_tokens_reused": 0, "mode": "exact"}
        assert again.answer == eng.ask(q, doc_ids=[doc], generation=greedy,
                                       restore=RestoreOptions(no_cache=True)).answer
    finally:
        eng.close()
        eng.store.close()


def test_caches_stored_lossless_before_the_calibration_are_encoded_at_its_levels(
        tmp_path, gemma_path):
    """Uncalibrated, the model's caches are stored lossless only; once a calibration is
    adopted, `relevel` encodes them at its levels from their exact KV (nothing computed): the
    chat reopens from them, every chunk at the calibrated level, and the store verifies."""
    eng = Engine(Store(tmp_path / "data"), lambda: Runtime(
        gemma_path, model_hash="gemma3-270m", n_ctx=1536, flash_attn=False),
        chunk_tokens=CHUNK, levels=("balanced",))
    try:
        path = tmp_path / "log.txt"
        path.write_text(DOC)
        doc = eng.attach(path).doc_id
        chat = ask(eng, QUESTION, doc=doc, tokens=4).chat_id
        before = eng.store.entries()
        assert len(before) == 2 and {e.levels for e in before} == {(EXACT,)}
        assert eng.relevel()["entries"] == 0  # (not calibrated: nothing to do)
        rt = eng.runtime
        rt.reset()
        rt.prefill(eng.prefix_tokens([doc]))
        sections = [in_position_order(s) for s in rt.capture().sections]
        cal = codec.Calibration(tuple(
            fitted(kv.keys, kv.values, levels()["balanced"], "balanced", 256).parts[0]
            for kv in sections), {"fingerprint": eng.fingerprint})
        eng.calibrations.adopt(cal)
        report = eng.relevel()
        assert report["entries"] == 2 and report["skipped"] == 0
        assert report["bytes_after"] < report["bytes_before"] / 2
        after = eng.store.entries()
        assert {(e.levels, e.calibration) for e in after} == {(("balanced",), cal.id)}
        assert sum(e.nbytes for e in after) == report["bytes_after"]
        found = eng.store.verify()
        assert not (found["database"] or found["corrupt"] or found["missing"])
        rt.reset()
        back = eng.reopen(chat)
        assert back.recomputed_tokens == 0 and set(back.chunk_levels) == {"balanced"}
        assert eng.relevel()["entries"] == 0  # (done once)
        # Lossless asked for under the calibration is the user's choice: kept so.
        (tmp_path / "more.txt").write_text(DOC.replace("lighthouse", "harbour"))
        kept = eng.attach(tmp_path / "more.txt", levels=[EXACT]).doc_id
        assert eng.relevel()["entries"] == 0
        assert eng.store.document_entry(kept, eng.fingerprint).levels == (EXACT,)
    finally:
        eng.close()
        eng.store.close()


@pytest.mark.parametrize("top_k", [1, 2])  # (one passage: nothing to blend, still said)
def test_an_uncalibrated_sliding_window_model_reads_its_passages_as_text(tmp_path, gemma_path,
                                                                         top_k):
    """Lossy passage KV waits for the model's calibration (`PassageKV.kept`): nothing stored,
    the passages computed from their text, an answer all the same, and the answer says why."""
    from test_longdoc import add_long_document

    eng = make_engine(tmp_path / "data", gemma_path)  # passages at `balanced`, no calibration
    try:
        eng.session.longdocs.top_k = top_k
        assert eng.passages_as_text()  # (what attach, `docs` and the window say: probe M5)
        doc = add_long_document(eng.store)
        res = eng.ask("When does the Saturday ferry leave, and what does the museum keep?",
                      doc_ids=[doc], generation=GenerationOptions(max_tokens=8, temperature=0))
        assert res.answer and len(res.sources) == top_k
        assert not [e for e in eng.store.entries() if e.passage]
        assert not any("with no stored KV" in m for m in res.messages)
        assert any("until its codec is calibrated" in m and "`kvdesk calibrate`" in m
                   for m in res.messages)
    finally:
        eng.close()
        eng.store.close()


def test_gemmas_tokenizer_counts_a_long_text_in_pieces_exactly(engine):
    from tests.test_longdoc import count_in_pieces_is_whole_count

    count_in_pieces_is_whole_count(engine.runtime)


def test_requests_sharing_a_long_system_prompt_resume_where_they_part(engine, monkeypatch):
    """A sliding-window model resumes only where a stored entry ends: the first request with a
    long system prompt stores that prompt on its own, and the next one over it, asking
    something else after a restart, resumes there (the probe's recomputed all 1,673 tokens of
    its system prompt every time)."""
    monkeypatch.setattr(engine.completions, "min_cache_tokens", 256)
    system = {"role": "system", "content": DOC}
    brief = GenerationOptions(max_tokens=4, temperature=0)
    first = engine.complete([system, {"role": "user", "content": QUESTION}], generation=brief)
    assert any("system prompt" in m and "stored on its own" in m for m in first.messages)
    # (computed in two steps, none of it counted as read: at most the start the model held)
    assert first.cached_tokens <= 1 and first.report.recomputed_tokens >= 500
    engine.runtime.reset()
    second = engine.complete([system, {"role": "user", "content": LONG_QUESTION}],
                             generation=brief)
    assert second.cached_tokens > 500 and second.report.bytes_read > 0, second.messages
    assert not any("stored on its own" in m for m in second.messages)
