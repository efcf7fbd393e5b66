"""How an answer ends on screen (finished, failed or stopped): what it leaves above the
conversation, and what a stopped answer that the engine never stored offers. On the
scripted FakeEngine; every wait is on a signal or a condition."""

from __future__ import annotations

import threading
from dataclasses import replace

from PySide6.QtCore import Qt, QUrl
from ui_fixtures import engine_fixture, open_window, window_fixture  # noqa: F401


def tick_first(window) -> None:
    window.doc_list.list.item(0).setCheckState(Qt.CheckState.Checked)


def held_after_restore(engine) -> threading.Event:
    """The fake's restore ends at 100%, then waits for the event returned, as the engine's
    ask then reads the question before its first token (silently: no progress)."""
    release = threading.Event()
    restore = engine._restore

    def restore_then_hold(*args):
        report = restore(*args)
        release.wait(10)
        return report

    engine._restore = restore_then_hold
    return release


def test_a_stopped_answer_leaves_no_progress_on_screen(qtbot, window, engine):
    """Esc during an answer left "computing the passages' cache… 12%" above the chat."""
    tick_first(window)
    engine.step_s = 0.2  # a slow restore: stopped during it
    window.send("What does it say?")
    qtbot.waitUntil(lambda: "restoring…" in window.info.text(), timeout=5000)
    with qtbot.waitSignal(window.answer_done, timeout=5000):
        window.stop()
    assert "%" not in window.info.text() and "restoring" not in window.info.text()
    assert "stopped" in window.chat_view.toPlainText()


def test_a_restore_at_100_percent_says_the_question_is_being_read(qtbot, window, engine):
    """"restoring… 100%" stayed up for 20-37 s while the model read the question."""
    tick_first(window)
    release = held_after_restore(engine)
    with qtbot.waitSignal(window.answer_done, timeout=10000):
        window.send("What does it say?")
        qtbot.waitUntil(lambda: window.info.text() == "reading the question…", timeout=5000)
        release.set()
    assert window.info.text().startswith("restored")  # the restore's line, once it is known


def test_a_failed_answer_replaces_its_progress_with_why(qtbot, window, engine):
    tick_first(window)
    release = held_after_restore(engine)
    step = engine._step

    def step_or_fail(cancel, pause=None):  # the first token's step fails
        if pause == engine.token_s:
            raise RuntimeError("the disk went away")
        step(cancel, pause)

    engine._step = step_or_fail
    with qtbot.waitSignal(window.answer_done, timeout=10000):
        window.send("What does it say?")
        qtbot.waitUntil(lambda: window.info.text() == "reading the question…", timeout=5000)
        release.set()
    assert "the disk went away" in window.info.text()


def stop_before_the_first_token(qtbot, window, engine, question: str) -> None:
    engine.step_s = 0.2  # a slow restore: stopped during it
    window.send(question)
    qtbot.waitUntil(lambda: "restoring…" in window.info.text(), timeout=5000)
    with qtbot.waitSignal(window.answer_done, timeout=5000):
        window.stop()
    engine.step_s = 0.002


def test_a_new_chats_answer_stopped_before_it_began_is_asked_again_by_regenerate(
        qtbot, window, engine):
    """Stopped before its first token, a new chat's question created no chat, and its
    "regenerate" link did nothing: it asks the question again, in a new chat as before."""
    tick_first(window)
    stop_before_the_first_token(qtbot, window, engine, "What does it say?")
    assert window.chat_id is None
    assert "stopped (not saved)" in window.chat_view.toPlainText()
    assert 'href="kvdesk:regenerate"' in window.chat_view._html[-1]
    # typed since, and a tick changed: neither is the stopped question's
    window.prompt.setPlainText("a draft")
    window.doc_list.list.item(0).setCheckState(Qt.CheckState.Unchecked)
    with qtbot.waitSignal(window.answer_done, timeout=5000) as done:
        window.chat_view.anchorClicked.emit(QUrl("kvdesk:regenerate"))
    result = done.args[0]
    assert window.prompt.toPlainText() == "a draft"
    assert engine.last_call("ask")[:4] == ("ask", "What does it say?", None, [1])
    assert window.chat_id == result.chat_id
    assert window.chat_view.transcript() == [("user", "What does it say?"),
                                             ("assistant", result.answer)]


def test_a_past_chats_answer_stopped_before_it_began_is_asked_again_not_the_one_before(
        qtbot, window, engine):
    """In a past chat, the link regenerated the turn before the stopped one (the engine
    stored nothing of it): it asks the stopped question again, the turn before kept."""
    chat = engine.chats()[0]
    with qtbot.waitSignals([window.restored, window.messages_loaded], timeout=5000):
        window.open_chat(chat.chat_id)
    before = window.chat_view.transcript()
    stop_before_the_first_token(qtbot, window, engine, "And then?")
    with qtbot.waitSignal(window.answer_done, timeout=5000) as done:
        window.chat_view.anchorClicked.emit(QUrl("kvdesk:regenerate"))
    assert not any(c[0] == "regenerate" for c in engine.calls)
    assert engine.last_call("ask")[:3] == ("ask", "And then?", chat.chat_id)
    assert window.chat_view.transcript() == [*before, ("user", "And then?"),
                                             ("assistant", done.args[0].answer)]
    assert [m.text for m in engine.messages(chat.chat_id)][:len(before)] == [t for _, t in before]


def test_a_regenerate_stopped_before_it_began_shows_the_chat_as_stored(qtbot, window, engine):
    """A regenerate stopped before its first token stores nothing and the turn it was to
    replace stays: the view shows the chat as stored, that turn back in place, so that its
    "regenerate" acts on the turn that is last."""
    chat = engine.chats()[0]
    with qtbot.waitSignals([window.restored, window.messages_loaded], timeout=5000):
        window.open_chat(chat.chat_id)
    before = window.chat_view.transcript()
    engine.step_s = 0.2  # a slow restore: stopped during it
    window.regenerate()
    qtbot.waitUntil(lambda: "restoring…" in window.info.text(), timeout=5000)
    with qtbot.waitSignals([window.answer_done, window.messages_loaded], timeout=5000):
        window.stop()
    stored = [(m.role, m.text) for m in engine.messages(chat.chat_id)]
    assert window.chat_view.transcript() == stored == before


def test_an_answer_over_a_document_cached_for_another_model_lists_it_again(qtbot, window,
                                                                            engine):
    """(After a model switch the list still said "cached for another model only" once the
    chat's answer had cached the document for this one.)"""
    engine.switch_model()
    window.refresh_documents()
    qtbot.waitUntil(lambda: window.documents and window.documents[0].status == "stale")
    tick_first(window)
    listed = sum(c[0] == "documents" for c in engine.calls)
    with qtbot.waitSignal(window.answer_done, timeout=10000):
        window.send("What does it say?")
    qtbot.waitUntil(lambda: sum(c[0] == "documents" for c in engine.calls) > listed)


def test_a_new_chats_answer_that_could_not_be_stored_leaves_a_new_chat(qtbot, window, engine):
    """An answer given but not stored (a full disk, the data folder gone) has no chat: the
    view stays a new chat, saying why, not one of an id 0 no question could go to."""
    tick_first(window)
    ask = engine.ask

    def unstored(question, **kwargs):
        result = ask(question, **kwargs)
        engine._chats.pop(result.chat_id)
        return replace(result, chat_id=0, stored=False, messages=[
            "this turn is not stored: the data directory D was removed or moved"])

    engine.ask = unstored
    with qtbot.waitSignal(window.answer_done, timeout=10000):
        window.send("What does it say?")
    assert window.chat_id is None and "this turn is not stored" in window.info.text()
    assert "The document says" in window.chat_view.toPlainText()
    assert "(not saved)" in window.chat_view.toPlainText()  # (as a stopped turn's)
    engine.ask = ask  # (the disk has room again) regenerating asks it again, in a new chat
    with qtbot.waitSignal(window.answer_done, timeout=10000):
        window.regenerate()
    assert window.chat_id is not None and engine.messages(window.chat_id)[0].text == \
        "What does it say?"
