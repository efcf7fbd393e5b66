"""The main window on the scripted FakeEngine: chats, streaming answers, attach, reopen,
settings. Every wait is on a signal or a condition, never a sleep."""

from __future__ import annotations

import html
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QApplication, QMessageBox
from ui_fixtures import (
    edit_settings,
    engine_fixture,  # noqa: F401 (a fixture)
    open_window,
    text_file,
    window_fixture,  # noqa: F401 (a fixture)
)

from desktop_app import settings as settings_mod
from desktop_app.errors import RuntimeStateError
from desktop_app.options import GenerationOptions
from desktop_app.results import Progress
from desktop_app.settings import Settings
from ui.main_window import MainWindow
from ui.settings.settings_dialog import SettingsDialog, needs_restart
from ui.testing import FakeEngine


def activate(qtbot, window):
    """Window shortcuts (Ctrl+K, Esc...) only reach the active window."""
    with qtbot.waitActive(window):
        window.show()
        window.activateWindow()


def ask(qtbot, window, text="What is attention?"):
    with qtbot.waitSignal(window.answer_done, timeout=5000) as blocker:
        window.send(text)
    return blocker.args[0]


def test_chats_are_grouped_by_date_and_searchable(qtbot, window):
    assert window.chat_list.visible_titles() == {
        "Today": ["What is multi-head attention?"],
        "Yesterday": ["Summarize the release notes"],
        "Previous 7 days": ["Compare the two documents"],
        "Older": ["Positional encodings"],
    }
    activate(qtbot, window)
    qtbot.keyClick(window, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(window.chat_list.search.hasFocus)
    window.chat_list.search.setText("release")
    assert window.chat_list.visible_titles() == {"Yesterday": ["Summarize the release notes"]}
    assert window.doc_list.list.count() == 2
    assert "6,120 tokens" in window.doc_list.list.item(0).text()


def test_the_chat_search_finds_what_was_said_in_a_chat_not_only_its_title(qtbot, window,
                                                                          engine):
    """A chat is found by a word of its messages (typed, then looked for off the GUI thread),
    the words around it under its title."""
    chat = next(c for c in engine._chats.values() if c.title == "Positional encodings")
    engine._add_message(chat, "user", "And the zebra crossing?", chat.updated)
    window.chat_list.search.setText("zebra")
    assert window.chat_list.visible_titles() == {}  # (no title holds it)
    qtbot.waitUntil(lambda: window.chat_list.visible_titles() == {
        "Older": ["Positional encodings\n“…zebra crossing?”"]}, timeout=5000)
    assert engine.last_call("search_chats") == ("search_chats", "zebra")
    window.chat_list.search.setText("zebra c")  # what was found for "zebra" is not shown
    assert window.chat_list.visible_titles() == {}
    qtbot.waitUntil(lambda: window.chat_list.visible_titles() != {}, timeout=5000)
    window.chat_list.search.clear()
    assert len(window.chat_list.visible_titles()) == 4


def test_the_title_names_the_model_once_it_is_loaded(qtbot, engine):
    window = MainWindow(lambda: engine, Settings())
    qtbot.addWidget(window)
    assert window.windowTitle() == "kvdesk"  # while the model loads
    qtbot.waitUntil(lambda: window.engine is not None)
    assert window.windowTitle() == f"{engine.model_name} \u2014 kvdesk"


def test_an_upgrades_note_is_shown_once_the_engine_is_ready(qtbot, engine, tmp_path):
    """(Dropped prompt caches were only logged: a window's user was never told.)"""
    from test_store_helpers import back_to_version_10, open_store, put_entry

    from desktop_app.app import App

    with open_store(tmp_path / "data") as store:
        put_entry(store, range(500, 800))
    back_to_version_10(tmp_path / "data")
    app = App(Settings(data_dir=str(tmp_path / "data")))
    window = MainWindow(lambda: app.store and engine, app.settings, start_notes=app.take_notes)
    qtbot.addWidget(window)
    qtbot.waitUntil(lambda: window.engine is not None)
    assert window.info.text() == (
        "Note: 1 cached prompt of the local API (stored /v1/responses conversations' KV among "
        "them) made by an older kvdesk was dropped: each is computed again at its next use")
    assert app.take_notes() == []  # said once
    app.close()


def test_sources_of_a_deleted_document_still_name_it(qtbot, window, engine):
    engine.delete_document(1)  # (another process, or the command line)
    with qtbot.waitSignal(window.documents_changed, timeout=5000):
        window.refresh_documents()
    assert window.chat_view.doc_titles == {1: "Attention Is All You Need.pdf (deleted)",
                                           2: "release-notes.md"}


def test_an_answer_streams_into_a_new_chat_about_the_ticked_document(qtbot, window, engine):
    engine.token_s = 0.01  # slower than the view's redraw interval, so it redraws in between
    window.doc_list.list.item(0).setCheckState(Qt.CheckState.Checked)
    seen = []
    window.chat_view.textChanged.connect(lambda: seen.append(window.chat_view.transcript()[-1]))
    result = ask(qtbot, window, "What does it say?")
    assert engine.last_call("ask")[:4] == ("ask", "What does it say?", None, [1])
    assert result.answer.startswith("You asked: *What does it say?*")
    # The answer grew on screen in pieces before it was complete.
    partial = [text for role, text in seen if role == "assistant" and text != result.answer]
    assert len({*partial}) > 2
    assert window.chat_view.transcript()[-2:] == [("user", "What does it say?"),
                                                  ("assistant", result.answer)]
    assert window.chat_id == result.chat_id
    assert "restored 6,120 tokens" in window.info.text()
    qtbot.waitUntil(lambda: "What does it say?" in str(window.chat_list.visible_titles()))


def test_a_new_chat_about_several_documents_is_one_ask(qtbot, window, engine):
    for i in range(2):
        window.doc_list.list.item(i).setCheckState(Qt.CheckState.Checked)
    result = ask(qtbot, window)
    assert engine.last_call("ask")[2:4] == (None, [1, 2])
    assert not any(c[0] == "new_chat" for c in engine.calls)  # the engine creates the chat
    assert window.chat_id == result.chat_id


def test_enter_sends_and_shift_enter_adds_a_line(qtbot, window, engine):
    qtbot.keyClicks(window.prompt, "first line")
    qtbot.keyClick(window.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.prompt, "second")
    assert window.prompt.toPlainText() == "first line\nsecond"
    with qtbot.waitSignal(window.answer_done, timeout=5000):
        qtbot.keyClick(window.prompt, Qt.Key.Key_Return)
    assert window.prompt.toPlainText() == ""
    assert engine.last_call("ask")[:4] == ("ask", "first line\nsecond", None, [])


def test_a_question_is_prepared_while_it_is_typed(qtbot, window, engine):
    window.doc_list.list.item(0).setCheckState(Qt.CheckState.Checked)
    window.quality.set_level("balanced")
    qtbot.keyClicks(window.prompt, "What is multi")
    qtbot.waitUntil(lambda: any(c[0] == "prepare" for c in engine.calls), timeout=3000)
    assert engine.last_call("prepare") == ("prepare", "What is multi", None, [1], "balanced")
    # Another pause, another draft; sending stops the next one from starting.
    qtbot.keyClicks(window.prompt, "-head attention?")
    qtbot.waitUntil(lambda: engine.last_call("prepare")[1] == "What is multi-head attention?",
                    timeout=3000)
    ask(qtbot, window, window.prompt.toPlainText())
    drafts = sum(c[0] == "prepare" for c in engine.calls)
    qtbot.wait(2 * 300)
    assert sum(c[0] == "prepare" for c in engine.calls) == drafts


def test_escape_stops_a_streaming_answer(qtbot, window, engine):
    activate(qtbot, window)
    engine.token_s = 0.05
    window.send("a slow one")
    qtbot.waitUntil(lambda: len(window.chat_view.transcript()[-1][1]) > 10, timeout=5000)
    assert window.send_button.text() == "Stop"
    with qtbot.waitSignal(window.answer_done, timeout=5000) as blocker:
        qtbot.keyClick(window, Qt.Key.Key_Escape)
    assert blocker.args == [None]
    role, text = window.chat_view.transcript()[-1]
    assert role == "assistant" and text.startswith("You asked")
    assert "stopped" in window.chat_view.toPlainText()
    assert window.send_button.text() == "Send"


def test_regenerate_replaces_the_last_answer(qtbot, window, engine):
    first = ask(qtbot, window, "q")
    with qtbot.waitSignal(window.answer_done, timeout=5000) as blocker:
        window.chat_view.anchorClicked.emit(QUrl("kvdesk:regenerate"))
    assert engine.last_call("regenerate")[:2] == ("regenerate", first.chat_id)
    answers = [t for role, t in window.chat_view.transcript() if role == "assistant"]
    assert answers == [blocker.args[0].answer] and "(again)" in answers[0]


def test_copy_links_put_the_message_and_the_code_on_the_clipboard(qtbot, window):
    result = ask(qtbot, window, "q")
    window.chat_view.anchorClicked.emit(QUrl("kvdesk:copy/1"))
    assert QApplication.clipboard().text() == result.answer
    window.chat_view.anchorClicked.emit(QUrl("kvdesk:code/1/0"))
    assert QApplication.clipboard().text().startswith("def restore(chunks):")


def test_opening_a_past_chat_restores_it_at_the_slider_level(qtbot, window, engine):
    chat = engine.chats()[2]  # "Compare the two documents"
    window.quality.set_level("compact")
    with qtbot.waitSignals([window.restored, window.messages_loaded], timeout=5000):
        window.chat_list.chat_selected.emit(chat.chat_id)
    assert ("reopen", chat.chat_id, "compact") in engine.calls
    assert window.info.text().startswith("restored 7,")
    assert "chunks:" in window.info.text() and "compact" in window.info.text()
    assert [r for r, _ in window.chat_view.transcript()] == ["user", "assistant"]
    assert "Attention Is All You Need.pdf, release-notes.md" in window.header.text()
    # The next question goes to that chat, at the same level.
    ask(qtbot, window, "and then?")
    assert engine.last_call("ask")[:5] == ("ask", "and then?", chat.chat_id, [], "compact")


def test_a_late_reply_never_lands_in_another_chat(qtbot, window, engine):
    first, second = engine.chats()[0], engine.chats()[1]
    engine.hold["messages"] = release = threading.Event()
    loaded = []
    window.messages_loaded.connect(lambda: loaded.append(window.chat_view.transcript()))
    window.open_chat(first.chat_id)
    window.open_chat(second.chat_id)
    release.set()
    qtbot.waitUntil(lambda: not window.runner.active, timeout=5000)
    assert len(loaded) == 1 and loaded[0][0] == ("user", second.title)
    assert ("reopen", second.chat_id, "high") in engine.calls


def test_an_answer_streaming_in_a_chat_left_and_come_back_to_is_shown_where_it_got_to(
        qtbot, window, engine):
    """Switching chats while an answer streamed lost that turn from the view: coming back,
    neither the question nor its answer was shown, even after it ended."""
    first, second = engine.chats()[0], engine.chats()[1]
    with qtbot.waitSignals([window.restored, window.messages_loaded], timeout=5000):
        window.open_chat(first.chat_id)
    engine.token_s = 0.05
    window.send("What is attention?")
    qtbot.waitUntil(lambda: len(window.chat_view.transcript()[-1][1]) > 5, timeout=5000)
    window.open_chat(second.chat_id)  # away while it streams: its reopen waits for it
    window.stop()
    assert window.statusBar().currentMessage() == "Stopping the answer in another chat…"
    window.generation.cancel.clear()  # (not stopped after all: the test goes on)
    reopens = sum(c[0] == "reopen" for c in engine.calls)
    with qtbot.waitSignal(window.messages_loaded, timeout=5000):
        window.open_chat(first.chat_id)
    shown = window.chat_view.transcript()
    assert shown[-2] == ("user", "What is attention?") and shown[-1][1], shown
    assert window.chat_view.streaming
    with qtbot.waitSignal(window.answer_done, timeout=10000) as done:
        pass
    answer = done.args[0].answer
    assert window.chat_view.transcript()[-2:] == [("user", "What is attention?"),
                                                  ("assistant", answer)]
    qtbot.waitUntil(lambda: not window.runner.active, timeout=5000)
    # (the context holds the chat once its answer is there: no restore queued behind it)
    assert sum(c[0] == "reopen" for c in engine.calls) == reopens
    assert 'href="kvdesk:regenerate"' in window.chat_view._html[-1]
    # Away until it ends: the chat shown again is the one stored, turn and all.
    engine.token_s = 0.001
    window.send("And then?")
    window.open_chat(second.chat_id)
    qtbot.waitUntil(lambda: window.generation is None and not window.runner.active,
                    timeout=10000)
    with qtbot.waitSignal(window.messages_loaded, timeout=5000):
        window.open_chat(first.chat_id)
    assert window.chat_view.transcript()[-2][1] == "And then?"


def test_the_documents_ticked_are_the_chats_own_and_a_new_chats_choice_comes_back(
        qtbot, window, engine):
    """A past chat showed the ticks left from the new chat being set up, not its documents,
    and a refresh of the list cleared them."""
    report, notes = (d.doc_id for d in engine.documents())
    window.doc_list.set_checked({notes})  # chosen for a new chat
    summary = engine.chats()[1]  # "Summarize the release notes"
    with qtbot.waitSignals([window.restored, window.messages_loaded], timeout=5000):
        window.open_chat(engine.chats()[2].chat_id)  # "Compare the two documents"
    assert set(window.doc_list.checked_ids()) == {report, notes}
    with qtbot.waitSignals([window.restored, window.messages_loaded], timeout=5000):
        window.open_chat(summary.chat_id)
    assert window.doc_list.checked_ids() == [notes] == summary.doc_ids
    with qtbot.waitSignal(window.documents_changed, timeout=5000):
        window.refresh_documents()
    assert window.doc_list.checked_ids() == [notes]
    window.open_chat(engine.chats()[0].chat_id)  # about the paper only
    assert window.doc_list.checked_ids() == [report]
    window.new_chat()
    assert window.doc_list.checked_ids() == [notes]  # the new chat's choice, as it was


def test_quality_tooltip_shows_the_estimate_for_the_chat(qtbot, window, engine):
    with qtbot.waitSignal(window.restored, timeout=5000):
        window.open_chat(engine.chats()[0].chat_id)
    qtbot.waitUntil(lambda: "6,120 cached tokens" in window.quality.toolTip())
    tip = window.quality.toolTip()
    assert all(level in tip for level in engine.levels) and "ms" in tip and "MB" in tip
    # (probe 120 took `high` for the answer a re-read gives)
    assert "Only lossless answers exactly as reading the text again would" in tip


def test_attaching_several_files_shows_progress_and_clear_errors(qtbot, window, engine,
                                                                  tmp_path):
    engine.step_s = 0.01
    progress = []
    paths = [text_file(tmp_path, "a.txt"), str(tmp_path / "pic.png"),
             text_file(tmp_path, "long.txt", words=9000)]
    (tmp_path / "pic.png").write_bytes(b"\x89PNG")
    done = []
    window.attach_done.connect(done.append)
    window.attach_files(paths)
    rows = [window.doc_list.rows.itemAt(i).widget() for i in range(3)]
    rows[0].bar.valueChanged.connect(progress.append)
    qtbot.waitUntil(lambda: len(done) == 3, timeout=10000)
    assert progress and max(progress) == 100
    assert "this is a PNG image" in rows[1].phase.text()  # the failed row stays, with why
    assert "only the first 8,192 of 11,700 tokens fit" in window.info.text()
    qtbot.waitUntil(lambda: window.doc_list.list.count() == 4)
    # Documents attached while starting a chat are ticked for it.
    titles = {d.doc_id: d.title for d in window.documents}
    assert [titles[i] for i in window.doc_list.checked_ids()] == ["a.txt", "long.txt"]


def test_attaches_that_fail_at_once_each_end_with_their_error(qtbot, window, tmp_path):
    """A job's signals are connected before it runs: one that fails within microseconds
    (an unsupported file) still reaches its row."""
    (tmp_path / "pic.png").write_bytes(b"\x89PNG")
    done = []
    window.attach_done.connect(done.append)
    for _ in range(12):
        window.attach_files([str(tmp_path / "pic.png")])
    qtbot.waitUntil(lambda: len(done) == 12, timeout=10000)
    rows = [window.doc_list.rows.itemAt(i).widget() for i in range(12)]
    assert all("this is a PNG image" in row.phase.text() for row in rows)


def test_failed_attaches_scroll_show_their_whole_error_and_clear_at_once(qtbot, window,
                                                                          engine, tmp_path):
    """However many fail, the window keeps its size and the lists their room; each row is as
    tall as its wrapped error; "Clear N failed" dismisses them all."""
    window.show()
    size = window.size()
    why = ("bad.pdf: the file cannot be read as a PDF: it does not begin as a PDF does, so it "
           "may be damaged or another kind of file renamed; attach the original again")
    (tmp_path / "bad.pdf").write_text("x")
    done = []
    window.attach_done.connect(done.append)
    for n in range(1, 13):  # (one at a time: each fails once)
        engine.fail_next["attach"] = RuntimeStateError(why)
        window.attach_files([str(tmp_path / "bad.pdf")])
        qtbot.waitUntil(lambda n=n: len(done) == n, timeout=5000)
    rows = [window.doc_list.rows.itemAt(i).widget() for i in range(12)]
    assert [row.phase.text() for row in rows] == [why] * 12
    # (once laid out: each label as tall as its text wrapped at its width)
    qtbot.waitUntil(lambda: all(row.phase.height() >= row.phase.heightForWidth(
        row.phase.width()) > 2 * row.fontMetrics().height() for row in rows), timeout=3000)
    side = window.doc_list.parentWidget()
    assert window.size() == size
    assert window.doc_list.rows_area.height() <= side.height() // 3 + 1
    assert window.doc_list.list.height() >= 80 and window.chat_list.tree.height() >= 80
    clear = window.doc_list.clear_button
    assert clear.isVisible() and clear.text() == "Clear 12 failed"
    clear.click()
    assert window.doc_list.attach_rows() == [] and not window.doc_list.rows_area.isVisible()
    assert not clear.isVisible()


def test_cancelling_an_attach(qtbot, window, engine, tmp_path):
    engine.step_s = 0.05
    window.attach_files([text_file(tmp_path, "a.txt")])
    row = window.doc_list.rows.itemAt(0).widget()
    qtbot.waitUntil(lambda: row.bar.value() > 0, timeout=5000)
    with qtbot.waitSignal(window.attach_done, timeout=5000) as blocker:
        row.button.click()
    assert blocker.args == ["cancelled"]
    assert not any(c[0] == "attach" and c[1] != "a.txt" for c in engine.calls)


def test_the_user_can_chat_while_a_document_computes(qtbot, window, engine, tmp_path):
    engine.hold["attach"] = release = threading.Event()
    attached = []
    window.attach_done.connect(attached.append)
    window.attach_files([text_file(tmp_path, "big.txt")])
    result = ask(qtbot, window, "meanwhile?")
    assert result is not None and not attached
    with qtbot.waitSignal(window.attach_done, timeout=5000):
        release.set()


def test_dropped_files_are_attached(qtbot, window, engine, tmp_path):
    data = QMimeData()
    data.setUrls([QUrl.fromLocalFile(text_file(tmp_path, "dropped.md"))])
    event = QDropEvent(QPoint(10, 10), Qt.DropAction.CopyAction, data,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(window.attach_done, timeout=5000) as blocker:
        window.dropEvent(event)
    assert blocker.args[0].title == "dropped.md"


def test_a_folder_chosen_in_the_file_menu_is_attached_as_one_document(qtbot, window, engine,
                                                                      tmp_path, monkeypatch):
    folder = tmp_path / "notes"
    folder.mkdir()
    text_file(folder, "a.md")
    monkeypatch.setattr("ui.library.library_actions.QFileDialog.getExistingDirectory",
                        lambda *a: str(folder))
    [action] = [a for a in window.menuBar().actions()[0].menu().actions()
                if a.text() == "Attach a &folder…"]
    with qtbot.waitSignal(window.attach_done, timeout=5000) as blocker:
        action.trigger()
    assert blocker.args[0].title == "notes"


def test_a_chat_opened_from_a_search_result_shows_the_message_found(qtbot, window, engine):
    """Not the chat's end (probe117 F8): the view scrolls to the words found, selected."""
    chat = next(c for c in engine._chats.values() if c.title == "Positional encodings")
    engine._add_message(chat, "user", "Remember the codeword CEDAR-03.", chat.updated)
    for i in range(60):
        engine._add_message(chat, ("user", "assistant")[i % 2], f"Turn {i}: " + "words " * 40,
                            chat.updated)
    activate(qtbot, window)
    window.chat_list.search.setText("CEDAR-03")
    qtbot.waitUntil(lambda: "CEDAR-03" in str(window.chat_list.visible_titles()), timeout=5000)
    with qtbot.waitSignal(window.messages_loaded, timeout=5000):
        window.open_chat(chat.chat_id)
    qtbot.wait(100)  # (the page laid out: the view stays at the message)
    bar = window.chat_view.verticalScrollBar()
    assert window.chat_view.textCursor().selectedText() == "CEDAR-03"
    assert 0 < bar.maximum() and bar.value() < bar.maximum() // 4


def test_a_questions_job_is_freed_once_it_is_answered_or_has_failed(qtbot, window, engine,
                                                                    monkeypatch):
    """(Each question's job was kept until the window closed: the slot that ends a failed
    one read `job.error`, a cycle through a Qt connection; probe 121b.)"""
    import gc
    import weakref

    asked, start = [], window.runner.start

    def keeping(lane, work, **slots):
        job = start(lane, work, **slots)
        asked.extend([weakref.ref(job)] if lane == "chat" else [])
        return job

    monkeypatch.setattr(window.runner, "start", keeping)
    assert ask(qtbot, window) is not None
    engine.fail_next["ask"] = KeyError("oops")
    assert ask(qtbot, window) is None
    qtbot.waitUntil(lambda: not window.runner.active, timeout=5000)
    gc.collect()
    assert len(asked) >= 2 and [job() for job in asked] == [None] * len(asked)


def test_user_errors_show_their_message_and_bugs_a_short_one(qtbot, window, engine):
    engine.fail_next["ask"] = RuntimeStateError("the context is full; start a new chat")
    assert ask(qtbot, window) is None
    assert window.info.text() == "the context is full; start a new chat"
    engine.fail_next["ask"] = KeyError("oops")
    assert ask(qtbot, window) is None
    assert window.info.text() == "Unexpected error: KeyError: 'oops'"
    assert "Traceback" not in window.chat_view.toPlainText()
    engine.fail_next["ask"] = MemoryError("Unable to allocate 133. MiB for an array with ...")
    assert ask(qtbot, window) is None
    assert window.info.text().startswith("not enough memory for this work (133 MiB could not "
                                         "be allocated): close other programs, or give kvdesk "
                                         "a smaller context (Settings ▸ Context size)")
    # Told by more than red: bold, named an error to a screen reader, and copied from the
    # keyboard (probe 111's F10)
    assert window.info.accessibleName() == "Error" and "bold" in window.info.styleSheet()
    assert window.info.textInteractionFlags() & Qt.TextInteractionFlag.TextSelectableByKeyboard
    assert window.info.focusPolicy() == Qt.FocusPolicy.StrongFocus  # (a Tab stop)
    window._say("restored 12 tokens")
    assert window.info.accessibleName() == "Status" and window.info.styleSheet() == ""


def test_a_model_that_cannot_load_is_explained(qtbot):
    def broken():
        raise RuntimeStateError("no model at /nowhere.gguf")

    window = MainWindow(broken, Settings())
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.engine_failed, timeout=5000):
        pass
    assert "no model at /nowhere.gguf" in window.info.text()
    assert not window.prompt.isEnabled()
    # where the conversation would be: why nothing can be asked, not the welcome's attach hint
    shown = window.chat_view.toPlainText()
    assert shown.startswith("No model is loaded") and "no model at /nowhere.gguf" in shown
    assert "paperclip" not in shown


def test_without_a_model_the_lists_say_the_chats_and_documents_are_kept(qtbot, tmp_path):
    """Not an empty sidebar a user could take for their chats lost, nor an attach hint while
    attaching is off."""
    def broken():
        raise RuntimeStateError("no model named gemma-9")

    window = MainWindow(broken, Settings(data_dir=str(tmp_path)))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.engine_failed, timeout=5000):
        pass
    note = window.chat_list.note
    assert not note.isHidden() and str(tmp_path) in note.text()
    assert "they show here once a model loads" in note.text()
    hint = window.doc_list.hint
    assert "paperclip" not in hint.text() and not window.doc_list.attach_button.isEnabled()



def test_a_data_folder_this_kvdesk_cannot_open_is_the_folder_s_problem_not_the_model_s(
        qtbot, tmp_path):
    """(A store written by a newer kvdesk read "The model could not be loaded: ... Check
    Settings", and the lists waited for "a model" to load.)"""
    import sqlite3

    from store import Store

    Store(tmp_path).close()
    with sqlite3.connect(tmp_path / "kvdesk.sqlite") as conn:
        conn.execute("PRAGMA user_version = 99")  # (as a newer kvdesk leaves it)
    conn.close()
    window = MainWindow(lambda: Store(tmp_path), Settings(data_dir=str(tmp_path)))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.engine_failed, timeout=5000):
        pass
    said = window.info.text()
    assert said.startswith(f"This kvdesk cannot open its data folder, {tmp_path}: store schema "
                           "version 99 is newer")
    assert "newer kvdesk last used it" in said and "nothing in it was changed" in said
    assert "model" not in said and "stay in it as they are" in said
    assert "which this kvdesk cannot open" in window.chat_list.note.text()
    assert "model" not in window.chat_list.note.text()
    assert window.doc_list.hint.text() == "Attaching needs a data folder this kvdesk can open."
    shown = window.chat_view.toPlainText()
    assert shown.startswith("The data folder cannot be opened") and "paperclip" not in shown
    (tmp_path / "kvdesk.sqlite").write_bytes(b"not a database " * 512)  # damaged past opening
    window = MainWindow(lambda: Store(tmp_path), Settings(data_dir=str(tmp_path)))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.engine_failed, timeout=5000):
        pass
    said = window.info.text()
    assert "cannot be opened as a kvdesk store" in said and "Nothing in it was changed" in said
    assert "model" not in said and "newer" not in said

def test_a_long_or_marked_up_title_never_widens_the_window_nor_renders(qtbot, window, engine,
                                                                       monkeypatch):
    chat = engine.chats()[0]
    with qtbot.waitSignal(window.restored, timeout=5000):
        window.open_chat(chat.chat_id)
    title = "<i>Ship</i> & " + "a very long title " * 200
    monkeypatch.setattr("ui.library.library_actions.QInputDialog.getText",
                        lambda *a, **k: (title, True))
    with qtbot.waitSignal(window.chats_changed, timeout=5000):
        window.chat_list.rename_requested.emit(chat.chat_id, chat.title)
    assert "&lt;i&gt;Ship&lt;/i&gt; &amp; a very long" in window.header.text()
    assert len(window.header.text()) < 600
    assert window.header.toolTip().startswith(f"<p>{html.escape(title.strip())}</p>")
    assert window.minimumSizeHint().width() < 1000  # (3,137 px: it could not be made smaller)
    row = window.doc_list.add_row("x" * 400 + ".txt", "red")
    assert row.minimumSizeHint().width() < 600 and row.title.toolTip().startswith("x" * 400)


def test_a_right_to_left_title_never_turns_the_documents_line_around(qtbot, window, engine,
                                                                    monkeypatch):
    """(An Arabic chat title made the header one right-to-left paragraph: its second line
    read "txt.عقد_الإيجار about".)"""
    from PySide6.QtGui import QTextDocument

    rename_first_chat(qtbot, window, engine, monkeypatch, "ما مدة عقد الإيجار؟")
    laid_out = QTextDocument()
    laid_out.setHtml(window.header.text())
    block, directions = laid_out.begin(), {}
    while block.isValid():
        block.layout()  # (a block's direction is found as it is laid out)
        directions[block.text()] = block.textDirection()
        block = block.next()
    about = [way for text, way in directions.items() if "about " in text]
    assert about == [Qt.LayoutDirection.LeftToRight], directions


def rename_first_chat(qtbot, window, engine, monkeypatch, title: str):
    """Open the first chat and rename it `title` through its menu's dialog; return it."""
    chat = engine.chats()[0]
    with qtbot.waitSignal(window.restored, timeout=5000):
        window.open_chat(chat.chat_id)
    monkeypatch.setattr("ui.library.library_actions.QInputDialog.getText",
                        lambda *a, **k: (title, True))
    with qtbot.waitSignal(window.chats_changed, timeout=5000):
        window.chat_list.rename_requested.emit(chat.chat_id, chat.title)
    return chat


def test_rename_delete_and_new_chat(qtbot, window, engine, monkeypatch):
    chat = rename_first_chat(qtbot, window, engine, monkeypatch, "Renamed")
    assert "Renamed" in window.header.text()
    monkeypatch.setattr("ui.library.library_actions.QMessageBox.question",
                        lambda *a, **k: QMessageBox.StandardButton.Yes)
    with qtbot.waitSignal(window.chats_changed, timeout=5000):
        window.chat_list.delete_requested.emit(chat.chat_id)
    assert window.chat_id is None and "Renamed" not in str(window.chat_list.visible_titles())
    window.doc_list.list.item(0).setCheckState(Qt.CheckState.Checked)
    ask(qtbot, window)
    assert window.chat_id is not None
    activate(qtbot, window)
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.chat_id is None)
    assert "New chat" in window.header.text()


def test_export_writes_the_engine_text(qtbot, window, engine, monkeypatch, tmp_path):
    target, offered = tmp_path / "out.md", []

    def save_as(parent, caption, name, filters):
        offered.append(name)
        return str(target), ""

    monkeypatch.setattr("ui.library.library_actions.QFileDialog.getSaveFileName", save_as)
    chat = engine.chats()[0]
    window.chat_list.export_requested.emit(chat.chat_id, "markdown")
    qtbot.waitUntil(target.exists, timeout=5000)
    assert target.read_text().startswith(f"# {chat.title}")
    assert offered == ["What is multi-head attention.md"]  # named after the chat (was chat.md)


def settings_edited(monkeypatch, edit, answer) -> list[str]:
    """The Settings dialog made to run `edit` and its questions answered `answer`: the
    questions asked, as they come."""
    monkeypatch.setattr("ui.main_window.SettingsDialog.exec", edit)
    asked: list[str] = []
    monkeypatch.setattr("ui.main_window.QMessageBox.question",
                        lambda *a, **k: asked.append(a[2]) or answer)
    return asked


def test_settings_persist_and_an_engine_change_asks_to_restart(qtbot, window, monkeypatch,
                                                              tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")

    def edit(dialog: SettingsDialog) -> int:
        dialog.theme.setCurrentIndex(dialog.theme.findData("dark"))
        dialog.budget.setValue(3.5)
        dialog.model.setEditText(str(model))
        dialog.accept()
        return dialog.result()

    asked = settings_edited(monkeypatch, edit, QMessageBox.StandardButton.Yes)
    with qtbot.waitSignal(window.restart_requested, timeout=2000) as blocker:
        window.open_settings()
    # It names what changed that needs the restart (not the theme, applied already), and
    # that No keeps it saved, for the next start (probe 118 took No for "do not save")
    assert len(asked) == 1 and asked[0].startswith(
        "Changed: Model. The change is saved, and takes effect when the engine restarts. "
        "Restart it now? (No: the next time kvdesk starts.)")
    saved = settings_mod.load()
    assert blocker.args[0].model == saved.model
    assert (saved.theme, saved.storage_budget_gb, saved.model) == ("dark", 3.5, str(model))
    assert window.colors.text == "#e6edf3"


def test_the_restart_question_says_it_stops_a_calibration_running(qtbot, window, monkeypatch):
    """(Probe 118 changed the model while the codec calibrated: nothing said it would stop.)"""
    def edit(dialog: SettingsDialog) -> int:
        dialog.n_ctx.setValue(1024)
        dialog.accept()
        return dialog.result()

    asked = settings_edited(monkeypatch, edit, QMessageBox.StandardButton.No)
    said = ("Changed: Context size. The change is saved, and takes effect when the engine "
            "restarts. Restart it now? (No: the next time kvdesk starts.)")
    for job in (None, SimpleNamespace(cancel=threading.Event())):  # (none running, one)
        window.calibration_job = job
        window.settings = window.settings.with_values(n_ctx=None)
        window.open_settings()
    assert asked == [said, said + " Restarting stops the codec's calibration now running: "
                     "what it measured is kept for its next run."]


def test_saved_settings_leave_the_environments_values_out_and_a_new_budget_applies_now(
        qtbot, window, engine, monkeypatch):
    monkeypatch.setenv("KVDESK_N_CTX", "2048")
    window.settings = settings_mod.load()  # as a window started with it set

    def edit(dialog: SettingsDialog) -> int:
        dialog.budget.setValue(0.5)
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr("ui.main_window.SettingsDialog.exec", edit)
    window.open_settings()
    saved = settings_mod.saved_settings()
    assert saved.storage_budget_gb == 0.5 and saved.n_ctx is None  # (was written: 2048)
    qtbot.waitUntil(lambda: engine.budget_gb == 0.5, timeout=2000)  # (was at the next start)


def test_answer_settings_keep_only_what_the_user_set_and_reach_the_engine(
        qtbot, window, engine, monkeypatch):
    def edit(dialog: SettingsDialog) -> int:
        spins = dialog.generation.spins
        # Nothing set: every value reads "default" (the model's or kvdesk's applies).
        assert all(s.text() == "default" for s in spins.values())
        spins["temperature"].setValue(0.3)
        spins["repeat_penalty"].setValue(1.15)
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr("ui.main_window.SettingsDialog.exec", edit)
    window.open_settings()
    expected = GenerationOptions(temperature=0.3, repeat_penalty=1.15)
    assert settings_mod.load().generation == expected
    assert engine.generation_defaults == expected  # the next answer uses them, no restart

    before = settings_mod.load().with_values(
        generation={"temperature": 0.3, "presence_penalty": 0.5})
    dialog = SettingsDialog(before)
    qtbot.addWidget(dialog)
    assert dialog.generation.spins["temperature"].value() == 0.3
    dialog.generation.spins["temperature"].setValue(-1)  # back to the lowest: "default"
    # One not shown (the presence penalty) is kept; none of them restarts the engine.
    assert dialog.result_settings().generation == GenerationOptions(presence_penalty=0.5)
    assert not needs_restart(before, dialog.result_settings())


def test_the_settings_dialog_refuses_a_missing_model(qtbot):
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    dialog.model.setEditText("/no/such/model.gguf")
    dialog.accept()
    assert dialog.result() == 0 and dialog.error.text() == (
        "Model: /no/such/model.gguf: no such model file, nor a model found on this computer")


def test_the_settings_dialog_refuses_a_file_as_the_data_folder(qtbot, tmp_path):
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    (tmp_path / "notes.txt").write_text("x")
    dialog.data_dir.setText(str(tmp_path / "notes.txt"))
    dialog.accept()  # (the next start blamed the model)
    assert dialog.result() == 0 and "a file, not a folder" in dialog.error.text()


def test_the_settings_dialog_edits_the_shared_cache(qtbot):
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    assert dialog.bucket.text() == "" and dialog.auto_pull.isChecked()
    dialog.bucket.setText("Not A Bucket")
    dialog.accept()
    assert dialog.result() == 0 and "not a bucket name" in dialog.error.text()
    assert dialog.error.text().startswith("Bucket: ")  # its label, not remote_bucket
    dialog.bucket.setText("team-kv")
    dialog.endpoint.setText("http://minio.lan:9000")
    dialog.prefix.setText("team-a")
    dialog.auto_push.setChecked(True)
    dialog.accept()
    new = dialog.result_settings()
    assert dialog.result() == 1
    assert (new.remote_bucket, new.remote_endpoint_url, new.remote_prefix,
            new.remote_auto_push) == ("team-kv", "http://minio.lan:9000", "team-a", True)
    assert needs_restart(Settings(), new)


def test_the_settings_dialog_keeps_lossless_only_when_asked(qtbot):
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    assert not dialog.keep_lossless.isChecked()
    dialog.keep_lossless.setChecked(True)
    new = dialog.result_settings()
    assert new.keep_lossless and needs_restart(Settings(), new)  # the engine's levels change


def test_the_settings_dialog_edits_long_documents_passages(qtbot):
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    assert dialog.passage_level.currentData() == "balanced"
    assert dialog.passages_background.isChecked()
    assert dialog.result_settings() == Settings()  # shown as they are, nothing changed
    dialog.passage_level.setCurrentIndex(dialog.passage_level.findData("compact"))
    dialog.passages_background.setChecked(False)
    new = dialog.result_settings()
    assert (new.passage_level, new.passages_in_background) == ("compact", False)
    assert needs_restart(Settings(), new)  # the engine keeps passages as it was built to


def test_the_settings_start_and_stop_the_local_api(qtbot, engine, monkeypatch):
    from ui.testing import FakeLocalAPI

    api = FakeLocalAPI()
    window = open_window(qtbot, engine, Settings(server_enabled=True, server_port=8777),
                         local_api=api)
    qtbot.waitUntil(lambda: "8777" in window.api_label.text(), timeout=3000)
    assert api.calls == [("start", 8777, 11434, ())]

    def move_ollama(dialog):  # a server setting restarts the server with it, not the engine
        dialog.ollama_port.setValue(0)
        dialog.origins.setText("http://localhost:3000; http://127.0.0.1:5173")

    edit_settings(monkeypatch, move_ollama)
    with qtbot.waitSignal(window.local_api_changed, timeout=3000):
        window.open_settings()
    assert api.calls[-1] == ("start", 8777, None, ("http://localhost:3000",
                                                   "http://127.0.0.1:5173"))

    edit_settings(monkeypatch, lambda dialog: dialog.serve.setChecked(False))
    with qtbot.waitSignal(window.local_api_changed, timeout=3000) as blocker:
        window.open_settings()
    assert blocker.args == [None] and window.api_label.text() == ""
    assert api.calls[-1] == ("stop",) and not settings_mod.load().server_enabled


def model_file(tmp_path, name, source="folder", status="supported", arch="llama"):
    from desktop_app.results import ModelFile

    return ModelFile(name, str(tmp_path / (name if name.endswith(".gguf") else f"{name}.gguf")),
                     source, 1, arch, 270_000_000, "Q4_K_M", 32768, 3072, None, None, status,
                     {"refused": "recurrent memory"}.get(status, "tested"))


def found_models(tmp_path):
    return [model_file(tmp_path, "default", "kvdesk"),
            model_file(tmp_path, "llama3.2:3b", "ollama"),
            model_file(tmp_path, "mamba:latest", "ollama", "refused", "mamba")]


def test_the_settings_offer_the_models_found_and_say_why_some_cannot_be_used(qtbot, tmp_path):
    dialog = SettingsDialog(Settings(), models=found_models(tmp_path))
    qtbot.addWidget(dialog)
    items = dialog.model.model()
    assert [dialog.model.itemText(i) for i in range(dialog.model.count())] == [
        "default (built in)", "llama3.2:3b", "mamba:latest"]
    assert not items.item(2).isEnabled() and "refused: recurrent memory" in \
        items.item(2).toolTip()
    assert dialog.model.currentText() == ""  # the built-in default
    assert "llama" in dialog.model_about.text() and "(kvdesk)" in dialog.model_about.text()
    dialog.model.activated.emit(1)
    assert dialog.model.currentText() == "llama3.2:3b"
    assert "0.3B parameters, Q4_K_M, 32,768-token context" in dialog.model_about.text()
    dialog.n_ctx.setValue(0)
    folders = tmp_path / "a", tmp_path / "b"
    for folder in folders:
        folder.mkdir()
    dialog.folders.setText(f"{folders[0]}; {folders[1]}")
    dialog.accept()
    assert dialog.result() == 1
    new = dialog.result_settings()
    assert (new.model, new.n_ctx, new.model_folders) == ("llama3.2:3b", None,
                                                         tuple(map(str, folders)))
    dialog.model.activated.emit(0)
    assert dialog.result_settings().model is None


def test_a_model_set_by_the_name_the_command_line_takes_is_found(qtbot, tmp_path):
    """README's `--model gemma-3-270m-q4_k_m` (the file's stem, any case) in settings.json:
    the dialog found no such model and refused every OK, a theme change too."""
    gguf = model_file(tmp_path, "gemma-3-270m-q4_k_m.gguf")
    dialog = SettingsDialog(Settings(model="Gemma-3-270M-Q4_K_M"), models=[gguf])
    qtbot.addWidget(dialog)
    assert "0.3B parameters" in dialog.model_about.text()
    dialog.accept()
    assert dialog.result() == 1, dialog.error.text()


def test_settings_list_the_models_off_the_gui_thread(qtbot, engine, tmp_path, monkeypatch):
    listed = []

    def list_models():
        listed.append(threading.current_thread() is threading.main_thread())
        return found_models(tmp_path)

    window = MainWindow(lambda: engine, Settings(), list_models=list_models)
    qtbot.addWidget(window)
    qtbot.waitSignal(window.engine_ready, timeout=5000)
    shown = []
    monkeypatch.setattr("ui.main_window.SettingsDialog.exec",
                        lambda dialog: shown.append(dialog.model.count()) or 0)
    window.open_settings()
    qtbot.waitUntil(lambda: shown == [3], timeout=5000)
    assert listed == [False]


def test_documents_of_another_model_are_prefilled_in_the_background(qtbot, engine, window):
    assert window.prefill_button.isHidden()
    engine.switch_model()
    with qtbot.waitSignal(window.documents_changed, timeout=5000):
        window.refresh_documents()
    assert not window.prefill_button.isHidden()
    assert window.prefill_button.text() == "Prefill 2 documents for this model"
    with qtbot.waitSignals([window.attach_done, window.attach_done], timeout=5000):
        window.prefill_button.click()
    assert sorted(c[1] for c in engine.calls if c[0] == "prefill") == sorted(
        d.doc_id for d in engine.documents())
    qtbot.waitUntil(lambda: all(d.status == "ready" for d in window.documents), timeout=5000)
    assert window.prefill_button.isHidden()
    assert window.doc_list.checked_ids() == []  # prefilled, not ticked for a new chat


def _passages(qtbot, window, engine):
    """Set the first document's cached passages (of 40) by hand, and fire the poll's timer
    by hand (no test waits on its seconds)."""
    from dataclasses import replace

    (doc_id, info), *_ = engine._docs.items()

    def shows(n):
        return f"{n} of 40 passages cached" in window.doc_list.list.item(0).text()

    def set_to(n):
        engine._docs[doc_id] = replace(info, passages=40, passages_cached=n)

    def polled(n):
        set_to(n)
        with qtbot.waitSignal(window.documents_changed, timeout=5000):
            window._poll_documents()
        assert shows(n)

    set_to(3)
    window.refresh_documents()
    qtbot.waitUntil(lambda: shows(3) and window.doc_poll.isActive())
    return set_to, polled


def test_the_document_list_follows_the_background_passes_until_every_passage_has_its_kv(
        qtbot, window, engine):
    """One look that found the counts standing still (the pass held up by a chat's turn or a
    calibration) stopped the following for good: the list froze at "93 of 527" until a
    restart. It now looks less often while they stand still, and stops only when done."""
    _, polled = _passages(qtbot, window, engine)
    polled(10)  # the background pass moves: followed on
    assert window.doc_poll.isActive() and window.doc_poll.interval() == 5000
    polled(10)  # held up: still followed, less often
    polled(10)
    assert window.doc_poll.isActive() and window.doc_poll.interval() == 20000
    for _ in range(5):
        polled(10)
    assert window.doc_poll.interval() == 60000  # (a pass stopped by a full budget: cheap)
    polled(25)  # going again: followed closely again
    assert window.doc_poll.isActive() and window.doc_poll.interval() == 5000
    polled(40)
    assert not window.doc_poll.isActive()  # all cached: nothing left to follow


def test_without_the_background_pass_the_document_list_follows_the_answers(qtbot, engine):
    window = open_window(qtbot, engine, Settings(passages_in_background=False))
    set_to, polled = _passages(qtbot, window, engine)
    polled(10)  # questions read passages: followed while the counts move
    assert window.doc_poll.isActive()
    polled(10)  # nothing moves them now: no endless polling
    assert not window.doc_poll.isActive()
    set_to(14)  # an answer reads passages: the list looks again after it
    ask(qtbot, window)
    qtbot.waitUntil(lambda: "14 of 40 passages cached" in window.doc_list.list.item(0).text())


def test_a_source_is_shown_in_its_document(qtbot, window, engine):
    from dataclasses import replace

    from PySide6.QtCore import QUrl

    from desktop_app.results import MessageInfo

    (doc_id, info), *_ = engine._docs.items()
    engine._docs[doc_id] = replace(info, passages=200, passages_cached=200)
    window.refresh_documents()
    qtbot.waitUntil(lambda: "200 of 200" in window.doc_list.list.item(0).text())
    source = {"passage_id": 150, "document_id": doc_id, "index": 50, "score": 1.0,
              "text": "Passage 50 of the document.", "lines": [501, 509], "heading": ["Part"]}
    window.chat_view.set_messages([MessageInfo(1, "user", "Where?", 0.0),
                                   MessageInfo(2, "assistant", "There.", 0.0,
                                               {"sources": [source]})])
    window.chat_view._link(QUrl("kvdesk:source/1/0"))
    assert "Show it in its document" in window.chat_view.toPlainText()
    window.chat_view._link(QUrl("kvdesk:document/1/0"))
    qtbot.waitUntil(lambda: getattr(window, "document_view", None) is not None)
    view = window.document_view
    assert "passages 21-81 of 200, around lines 501-509" in view.span.text()
    assert "Passage 50 of the document." in view.text.toPlainText()
    assert view.text.verticalScrollBar().value() > 0  # scrolled to it, not left at the top
    view.close()


def test_a_deleted_documents_source_is_shown_without_a_link_into_it(qtbot, window, engine):
    from PySide6.QtCore import QUrl

    from desktop_app.results import MessageInfo, Source

    doc_id = engine.documents()[0].doc_id
    source = {"passage_id": 150, "document_id": doc_id, "index": 50, "score": 1.0,
              "text": "Passage 50 of the document.", "lines": [501, 509], "heading": ["Part"]}
    messages = [MessageInfo(1, "user", "Where?", 0.0),
                MessageInfo(2, "assistant", "There.", 0.0, {"sources": [source]})]
    engine.delete_document(doc_id)  # (another window, or `kvdesk rm doc`)
    with qtbot.waitSignal(window.documents_changed, timeout=5000):
        window.refresh_documents()
    window.chat_view.set_messages(messages)
    window.chat_view._link(QUrl("kvdesk:source/1/0"))
    text = window.chat_view.toPlainText()
    assert "Passage 50 of the document." in text and "(document removed)" in text
    assert "Show it in its document" not in text
    # Asked for all the same: said where a restore report cannot overwrite it.
    window._say("restored 6,120 tokens")
    said: list[str] = []  # (the status bar's: the codec's calibration may say its end next)
    window.statusBar().messageChanged.connect(said.append)
    with qtbot.waitSignal(window.documents_changed, timeout=5000):
        window.show_in_document(Source.from_dict(source))
    assert window.info.text() == "restored 6,120 tokens"
    assert "That document is no longer attached." in said


def test_a_chat_over_several_documents_names_each_sources_document(qtbot, window, engine):
    """As `kvdesk ask` and the exports do: its passages all from one of them, still named."""
    chats = {c.title: c for c in engine.chats()}
    titles = {d.doc_id: d.title for d in engine.documents()}
    for name in ("Compare the two documents", "What is multi-head attention?"):
        chat = chats[name]
        source = {"passage_id": 1, "document_id": chat.doc_ids[0], "index": 4, "score": 1.0,
                  "text": "A passage.", "lines": [40, 44], "heading": []}
        engine._add_message(chat, "user", "Where?", chat.updated)
        engine._add_message(chat, "assistant", "There.", chat.updated, {"sources": [source]})
        with qtbot.waitSignal(window.messages_loaded, timeout=5000):
            window.open_chat(chat.chat_id)
        qtbot.waitUntil(lambda: "Sources:" in window.chat_view.toPlainText())
        named = f"[1] {titles[chat.doc_ids[0]]} #4, lines 40-44" in window.chat_view.toPlainText()
        assert named == (len(chat.doc_ids) > 1), window.chat_view.toPlainText()


def test_ticked_documents_the_context_cannot_hold_together_are_said_before_asking(
        qtbot, window, engine):
    """In the words the answer then says them; worked out on a worker (engine.estimate)."""
    docs = {d.title: d.doc_id for d in engine.documents()}
    window.show()
    window.new_chat()
    assert not window.fit_note.isVisible()
    window.doc_list.set_checked(set(docs.values()))
    window.doc_list.checked_changed.emit()
    qtbot.waitUntil(window.fit_note.isVisible, timeout=5000)
    said = engine.estimate(doc_ids=list(docs.values())).notes
    assert said == ["release-notes.md: only its first 1,048 of 1,480 tokens are read in this "
                    "chat, the rest does not fit the context (a larger context in the "
                    "settings reads more of it)"]
    assert window.fit_note.text() == f"⚠ {said[0]}"
    assert [c for c in engine.calls if c[0] == "estimate"][-1][1:] == (
        None, sorted(docs.values()))
    window.doc_list.set_checked({docs["release-notes.md"]})  # one fits: nothing to say
    window.doc_list.checked_changed.emit()
    qtbot.waitUntil(lambda: not window.fit_note.isVisible(), timeout=5000)
    window.doc_list.set_checked(set(docs.values()))
    window.doc_list.checked_changed.emit()
    qtbot.waitUntil(window.fit_note.isVisible, timeout=5000)
    window.open_chat(engine.chats()[0].chat_id)  # a chat's answers say it
    assert not window.fit_note.isVisible()


def test_a_damaged_store_is_said_as_soon_as_the_window_opens(qtbot):
    damaged = FakeEngine(step_s=0.002, token_s=0.001).seed()
    damaged.damage = "the store X is damaged (table chats: ...)"
    window = open_window(qtbot, damaged)
    assert window.info.text() == damaged.damage



def test_a_list_a_damaged_store_cannot_read_says_so_in_its_place(qtbot):
    """(The documents' table among the damage: the Documents pane stayed empty, without a
    word, as if the documents were gone.)"""
    from store import DamagedError

    damaged = FakeEngine(step_s=0.002, token_s=0.001).seed()
    damaged.damage = "the store X is damaged (database disk image is malformed)"
    damaged.fail_next["documents"] = DamagedError(damaged.damage)
    window = MainWindow(lambda: damaged, Settings())
    qtbot.addWidget(window)
    hint = window.doc_list.hint
    qtbot.waitUntil(lambda: not hint.isHidden(), timeout=5000)
    assert hint.text().startswith("These could not be read from the data folder")
    assert window.info.text() == damaged.damage
    with qtbot.waitSignal(window.documents_changed, timeout=5000):
        window.refresh_documents()  # read again: listed
    assert hint.isHidden() and window.doc_list.list.count() == 2

@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_close_the_window_as_its_close_button_does(qtbot, engine, signum):
    from ui.main import _closing_on_signals

    window = open_window(qtbot, engine)
    window.show()
    before = signal.getsignal(signum)
    with _closing_on_signals(window):
        os.kill(os.getpid(), signum)
        qtbot.waitUntil(lambda: not window.isVisible(), timeout=3000)
    assert signal.getsignal(signum) is before


def test_a_signal_closes_the_window_while_a_dialog_is_open_over_it(qtbot, engine):
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QDialog

    from ui.main import _closing_on_signals

    window = open_window(qtbot, engine)
    window.show()
    dialog = QDialog(window)
    guard = []  # (so that a regression fails instead of waiting forever)
    timeout = QTimer(singleShot=True, interval=10_000)
    timeout.timeout.connect(lambda: (guard.append(True), dialog.reject()))
    with _closing_on_signals(window):
        QTimer.singleShot(300, lambda: os.kill(os.getpid(), signal.SIGTERM))
        timeout.start()
        dialog.exec()  # (its own event loop: returns once the signal closed it)
        qtbot.waitUntil(lambda: not window.isVisible(), timeout=3000)
    timeout.stop()  # (never to fire in a later test, at a dialog deleted by then)
    assert not guard


def test_an_attachs_note_is_shown_at_once_and_kept_under_its_row(qtbot, window):
    row = window.doc_list.add_row("book.txt", "red")
    row.show_progress(Progress("split", 0, 10, "book.txt",
                               note="book.txt: 291,532 tokens, longer than the context"))
    assert "longer than the context" in row.phase.text()  # (shown only at the end before)
    row.show_progress(Progress("split", 5, 10, "book.txt"))
    assert "50%" in row.phase.text() and "longer than the context" in row.phase.text()



def test_a_chat_search_answered_after_the_window_is_gone_is_dropped(qtbot, engine,
                                                                    monkeypatch):
    window = MainWindow(lambda: engine, Settings())  # (not the fixture's: this one is deleted)
    with qtbot.waitSignals([window.engine_ready, window.chats_changed,
                            window.documents_changed], timeout=5000):
        pass
    # (the search comes back after the window is deleted: asked as it closes, by the search
    # field's typing pause)
    monkeypatch.setattr(engine, "search_chats", lambda text: time.sleep(0.1) or {1: text})
    window.close()
    window.search_chats("attention")
    window.deleteLater()
    qtbot.wait(300)  # (an error in Qt's event loop fails the test)
