"""A chat that fills its context, in the window: how full it is said when it is opened, and
"Continue in a new chat" offered there and where a question is refused as full."""

from __future__ import annotations

from dataclasses import replace

from ui_fixtures import engine_fixture, window_fixture  # noqa: F401 - fixtures

from desktop_app.errors import ChatFullError

FULL = ("the chat is full: 8,202 tokens of a 8,192-token context; start a new chat over the "
        "same documents (this chat's turns do not go with it)")


def opened(qtbot, window, chat_id: int) -> None:
    with qtbot.waitSignal(window.restored, timeout=5000):
        window.open_chat(chat_id)
    qtbot.waitUntil(lambda: window.quality.toolTip() != "")


def test_a_question_refused_as_full_offers_a_new_chat_over_the_same_documents(
        qtbot, window, engine):
    chat = next(c for c in engine.chats() if len(c.doc_ids) == 2)
    opened(qtbot, window, chat.chat_id)
    assert not window.continue_button.isVisibleTo(window)  # (room left: not offered)
    engine.fail_next["ask"] = ChatFullError(FULL, tuple(chat.doc_ids))
    with qtbot.waitSignal(window.answer_done, timeout=5000):
        window.send("And the third one?")
    assert window.info.text() == FULL
    qtbot.waitUntil(lambda: window.continue_button.isVisibleTo(window))
    window.continue_button.click()
    assert window.chat_id is None and set(window.doc_list.checked_ids()) == set(chat.doc_ids)
    assert window.prompt.toPlainText() == "And the third one?"  # (to send: not sent)
    assert "that chat's turns do not go with it" in window.info.text()
    assert not window.continue_button.isVisibleTo(window)


def test_a_chat_opened_nearly_full_says_so_and_offers_a_new_chat(qtbot, window, engine,
                                                                 monkeypatch):
    chat = engine.chats()[0]
    estimate = engine.estimate
    room = ("this chat fills 7,000 of the 8,192-token context (85 %): 1,192 tokens are left "
            "for its next questions and answers, then start a new chat over the same documents")
    monkeypatch.setattr(engine, "estimate", lambda chat_id=None, doc_ids=(): replace(
        estimate(chat_id=chat_id, doc_ids=doc_ids), notes=[room] if chat_id == chat.chat_id
        else []))
    opened(qtbot, window, chat.chat_id)
    qtbot.waitUntil(lambda: window.continue_button.isVisibleTo(window))
    assert window.fit_note.isVisibleTo(window) and room in window.fit_note.text()
    window.new_chat()
    assert not window.continue_button.isVisibleTo(window)


def test_a_chat_its_documents_fill_is_refused_without_offering_a_new_chat_over_them(
        qtbot, window, engine):
    """(A new chat over documents that fill most of the context is as full at once: the
    refusal carries no documents to go on with, and the window offers none.)"""
    chat = next(c for c in engine.chats() if len(c.doc_ids) == 2)
    opened(qtbot, window, chat.chat_id)
    engine.fail_next["ask"] = ChatFullError("the chat is full: its documents alone take about "
                                            "7,000 of the 8,192 tokens", ())
    with qtbot.waitSignal(window.answer_done, timeout=5000):
        window.send("And the third one?")
    qtbot.wait(50)
    assert not window.continue_button.isVisibleTo(window)


def test_the_answer_that_takes_a_chat_past_80_percent_offers_a_new_chat(qtbot, window, engine,
                                                                        monkeypatch):
    """(Only a reopen or a refusal showed it: the window's room is estimated again after each
    answer.)"""
    chat = engine.chats()[0]
    opened(qtbot, window, chat.chat_id)
    assert not window.continue_button.isVisibleTo(window)
    estimate, ask, answered = engine.estimate, engine.ask, []
    room = ("this chat fills 7,000 of the 8,192-token context (85 %): 1,192 tokens are left "
            "for its next questions and answers, then start a new chat over the same documents")
    monkeypatch.setattr(engine, "estimate", lambda chat_id=None, doc_ids=(): replace(
        estimate(chat_id=chat_id, doc_ids=doc_ids), notes=[room] if answered else []))
    # (the turn that crosses 80 %: the chat is that full once it is answered)
    monkeypatch.setattr(engine, "ask", lambda *a, **k: answered.append(1) or ask(*a, **k))
    with qtbot.waitSignal(window.answer_done, timeout=5000):
        window.send("One more?")
    qtbot.waitUntil(lambda: window.continue_button.isVisibleTo(window))
