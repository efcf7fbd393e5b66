"""A chat that fills its context: told as it fills, refused once a question leaves no room for
an answer (nothing stored), with what goes on (a new chat over its documents), on every path."""

from __future__ import annotations

import pytest
from test_engine import DOC, make_engine

from desktop_app.chat.turns import MIN_ANSWER_TOKENS, check_room
from desktop_app.errors import ChatFullError, EngineError
from desktop_app.options import GenerationOptions
from desktop_app.server.client import _raise
from desktop_app.server.failures import error_of


def test_a_chat_is_told_as_it_fills_then_refused_without_storing_an_empty_answer(
        tmp_path, model_path, model_hash):
    eng = make_engine(tmp_path / "data", model_path, model_hash, n_ctx=320)
    try:
        (tmp_path / "doc.txt").write_text(DOC)
        doc = eng.attach(tmp_path / "doc.txt").doc_id
        short = GenerationOptions(max_tokens=4, temperature=0)
        first = eng.ask("Remember these words: " + "alpha beta " * 40, doc_ids=[doc],
                        generation=short)
        chat = first.chat_id
        said = [m for m in first.messages if m.startswith("this chat now fills")]
        assert said == [f"this chat now fills {eng.runtime.n_tokens} of the 320-token context "
                        f"({100 * eng.runtime.n_tokens // 320} %): another turn like this one "
                        "does not fit; start a new chat over the same documents (this chat's "
                        "turns do not go with it)"]
        progress = []
        turns = [eng.ask("Next word?", chat_id=chat, generation=short, progress=progress.append)]
        # (the question alone was computed: the progress does not count the turns held)
        assert progress and all(p.total < 20 for p in progress if p.phase == "recompute")
        while not any("now fills" in m for m in turns[-1].messages):
            turns.append(eng.ask("Next word?", chat_id=chat, generation=short))
        assert "(9" in next(m for m in turns[-1].messages if "now fills" in m)  # 90 %: once
        stored, asked = len(eng.messages(chat)), 0
        # (the last question fits the context, but leaves no room for an answer: refused, not
        # answered with nothing and stored)
        with pytest.raises(ChatFullError, match="the chat is full: .* start a new chat over "
                           "the same documents") as refused:
            for asked in range(4):  # noqa: B007 - (how many were answered, after)
                eng.ask("Next word?", chat_id=chat, generation=short)
        assert refused.value.doc_ids == (doc,)
        messages = eng.messages(chat)
        assert len(messages) == stored + 2 * asked and all(m.text for m in messages)
        full = "it is full, and a question in it is refused; start a new chat over the same"
        assert any(full in m for m in eng.reopen(chat).messages)
        assert any(full in m for m in eng.estimate(chat_id=chat).notes)
    finally:
        eng.close()
        eng.store.close()


def test_an_answer_needs_only_the_room_it_asks_for():
    check_room(320, 290, 10, 1, [], max_tokens=12)  # 12 left: enough for 12
    with pytest.raises(ChatFullError, match="too few left for an answer"):
        check_room(320, 290, 10, 1, [], max_tokens=512)
    with pytest.raises(EngineError, match="with room for an answer: shorten it"):
        check_room(320, 290, 10, None, [], max_tokens=MIN_ANSWER_TOKENS)


def test_a_servers_refusal_keeps_the_chats_documents_for_the_command_line():
    status, body = error_of(ChatFullError("the chat is full: ...", (2, 5)))
    assert status == 400 and body["error"]["code"] == "chat_full"
    with pytest.raises(ChatFullError) as refused:
        _raise(status, body["error"])
    assert refused.value.doc_ids == (2, 5) and str(refused.value) == "the chat is full: ..."


def test_documents_that_take_most_of_the_context_get_advice_that_helps():
    """(A new chat over the same documents was offered where they alone took most of the
    context: as full after one answer, a circle.) A larger context or shorter answers
    instead, and no documents to go on with; a document read from its passages (longer than
    the context) does not count."""
    from types import SimpleNamespace

    from desktop_app.chat.turns import filling

    big, book = SimpleNamespace(id=1, n_tokens=300), SimpleNamespace(id=2, n_tokens=90_000)
    with pytest.raises(ChatFullError, match="its documents alone take about 300 of the 512 "
                       "tokens.*a larger context") as refused:
        check_room(512, 500, 10, 1, [big], max_tokens=64)
    assert refused.value.doc_ids == ()
    with pytest.raises(ChatFullError, match="start a new chat over the same") as refused:
        check_room(512, 500, 10, 1, [book], max_tokens=64)
    assert refused.value.doc_ids == (2,)
    said, = filling(512, 400, 430, [big])
    assert "about 2 more turns like this one fit, then its documents alone take" in said
    said, = filling(512, 400, 440, [book])
    assert "about 1 more turn like this one fits, then start a new chat" in said
