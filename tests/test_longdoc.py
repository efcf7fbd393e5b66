"""Answering over a long document's passages: each passage's KV computed once, on its own,
and reused (no recompute) the next time; answers name their sources; follow-ups keep the
chat's passages while they fit; a reopen in another process lays out the same passages.

The retrieval here is a scripted index (word overlap) over passages written by the test, so
these tests check the KV and the context, not the ranking (tests/test_passages* do that)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from desktop_app.engine import Engine
from desktop_app.model.prompts import passage_layout, passage_prefix
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions
from store import Store

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


class ScriptedIndex:
    """Passages of one document, ranked by the words they share with the query."""

    def __init__(self, doc_id: int, texts: list[str], k: int = 2):
        self.doc_id, self.k = doc_id, k
        self.passages = [SimpleNamespace(passage_id=100 + i, document_id=doc_id, index=i,
                                         text=t, page=None, lines=(3 * i + 1, 3 * i + 3),
                                         heading=("Island guide",)) for i, t in enumerate(texts)]
        self.queries: list[str] = []

    def counts(self) -> dict[int, int]:
        return {self.doc_id: len(self.passages)}

    def retrieve(self, document_ids, query, k):
        self.queries.append(query)
        words = set(re.findall(r"\w+", query.lower()))
        scored = [(len(words & set(re.findall(r"\w+", p.text.lower()))), p)
                  for p in self.passages if p.document_id in document_ids]
        best = sorted(scored, key=lambda sp: -sp[0])[:min(k, self.k)]
        return [SimpleNamespace(**vars(p), score=float(s)) for s, p in best if s]


@pytest.fixture
def make_engine(tmp_path, model_path, model_hash):
    engines = []

    def make(store=None, index=None):
        store = store or Store(tmp_path / "data")
        if index is None:
            doc = store.add_document("h" * 64, "Island guide", "\n\n".join(PASSAGES),
                                     type="text")
            index = ScriptedIndex(doc.id, PASSAGES)
        eng = Engine(store, lambda: Runtime(model_path, model_hash=model_hash, n_ctx=2048,
                                            flash_attn=True),
                     chunk_tokens=64, blend_fraction=0.15, passages=index)
        eng.index = index
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()
    engines[0].store.close()


def passage_entries(eng):
    return {e.id: e for e in eng.store.entries() if e.passage}


def test_passage_kv_is_computed_once_then_read_back(make_engine):
    eng = make_engine()
    doc = eng.index.doc_id
    q = "When does the Saturday ferry leave, and what does the museum keep?"
    first = eng.ask(q, doc_ids=[doc], generation=GREEDY)
    # The answer names its passages: the ferry's and the museum's, in document order.
    assert [s["passage_id"] for s in first.sources] == [100, 101]
    assert first.sources[0]["text"] == PASSAGES[0]
    assert first.sources[0]["lines"] == [1, 3] and "page" not in first.sources[0]
    assert any("2 passage(s) retrieved for the first time" in m for m in first.messages)
    stored = passage_entries(eng)
    assert len(stored) == 2
    assert {e.levels for e in stored.values()} == {("balanced",)}  # one level, not every one
    assert eng.store.passage_entries(eng.fingerprint) == {doc: 2}
    rt = eng.runtime
    own = [len(passage_prefix(rt, t).tokens) for t in PASSAGES[:2]]
    assert first.recomputed_tokens >= sum(own)  # computed: each on its own, then the blend

    # A new chat retrieving the same passages reads them back: nothing computed again but
    # the blend's share of the second passage.
    eng.runtime.reset()  # (else the context still holds them, and is kept)
    second = eng.ask(q, doc_ids=[doc], generation=GREEDY)
    assert second.chat_id != first.chat_id
    assert passage_entries(eng).keys() == stored.keys()
    assert not any("for the first time" in m for m in second.messages)
    assert second.blended["mode"] == "blended" and second.blended["reused_tokens"] > 0
    assert second.recomputed_tokens < 0.5 * own[1]
    assert second.chunk_levels and "text" not in second.chunk_levels


def test_follow_ups_keep_the_chats_passages_and_a_reopen_lays_them_out(make_engine):
    eng = make_engine()
    doc = eng.index.doc_id
    first = eng.ask("What does the museum keep?", doc_ids=[doc], generation=GREEDY)
    chat = first.chat_id
    assert 101 in [s["passage_id"] for s in first.sources]
    follow = eng.ask("And when do puffins nest on the cliffs?", chat_id=chat,
                     generation=GREEDY)
    ids = [s["passage_id"] for s in follow.sources]
    # This question's passage joins; the museum's stays, room allowing; document order.
    assert 103 in ids and 101 in ids and ids == sorted(ids)
    # The query is the question and the chat's recent turns.
    assert "What does the museum keep?" in eng.index.queries[-1]
    _, tokens, _ = eng.session.conversation(eng.runtime, chat)
    layout = passage_layout(eng.runtime, [s["text"] for s in follow.sources])
    assert tuple(tokens[:len(layout.tokens)]) == layout.tokens

    # Another process (a fresh engine on the same store) remembers the chat's passages.
    again = make_engine(store=eng.store, index=eng.index)
    _, reopened, _ = again.session.conversation(again.runtime, chat)
    assert reopened == tokens
    report = again.reopen(chat)
    assert report.tokens == len(tokens)


def test_a_question_nothing_matches_is_answered_from_the_system_prompt_alone(make_engine):
    eng = make_engine()
    out = eng.ask("Zyx?", doc_ids=[eng.index.doc_id], generation=GREEDY)
    assert out.sources == [] and out.answer is not None


def test_the_local_api_answers_from_passages_and_names_them(make_engine):
    eng = make_engine()
    messages = [{"role": "user", "content": "What does the museum keep?"}]
    first = eng.complete(messages, documents=[eng.index.doc_id], generation=GREEDY)
    assert 101 in [s["passage_id"] for s in first.sources]
    assert passage_entries(eng)  # computed on first retrieval, and kept
    eng.runtime.reset()
    again = eng.complete(messages, documents=[eng.index.doc_id], generation=GREEDY)
    assert again.sources == first.sources
    assert again.cached_tokens >= len(passage_prefix(eng.runtime, PASSAGES[1]).tokens)
