"""What the window says of long documents: why their passages stopped getting their KV, the
titles of a chat's documents (deleted ones too), which passage a source is, how far an attach
is. The window runs on the scripted FakeEngine; the engine's side, on the test model."""

from __future__ import annotations

from dataclasses import replace

import test_longdoc
from ui_fixtures import (
    engine_fixture,  # noqa: F401 (a fixture)
    window_fixture,  # noqa: F401 (a fixture)
)

from desktop_app.passagepass import PassagePass

make_engine = test_longdoc.make_engine  # (its fixture: an engine over the island guide)

BUDGET_FULL = "the storage budget (30.0 MB) is full"


def _refreshed(qtbot, window):
    with qtbot.waitSignal(window.documents_changed, timeout=5000):
        window.refresh_documents()


def test_a_passage_pass_stopped_by_the_budget_says_why_on_its_row_and_in_the_status_bar(
        qtbot, window, engine):
    """The row stayed at "60 of 630 passages cached" with no reason: the reason only went to
    the log, naming the document by its id."""
    (doc_id, info), *_ = engine._docs.items()
    engine._docs[doc_id] = replace(info, passages=630, passages_cached=60)
    engine.pass_state = PassagePass(notes={doc_id: BUDGET_FULL})
    _refreshed(qtbot, window)
    row = window.doc_list.list.item(0).text()
    assert f"60 of 630 passages cached — stopped: {BUDGET_FULL}" in row
    said = window.statusBar().currentMessage()
    assert info.title in said and BUDGET_FULL in said and "60 of 630" in said, said
    assert f"document {doc_id}" not in said
    engine.pass_state = PassagePass()  # going again (a larger budget): no reason left to show
    _refreshed(qtbot, window)
    assert "stopped" not in window.doc_list.list.item(0).text()


def test_the_engine_says_why_its_passage_pass_stopped_until_a_larger_budget_lets_it_go_on(
        make_engine, monkeypatch):
    eng = make_engine()
    resumed, resume = [], eng.passage_fill.resume
    monkeypatch.setattr(eng.passage_fill, "resume", lambda: resumed.append(1) or resume())
    eng.store.budget_bytes = 1
    eng.warm_up()  # (a long-running engine: the pass starts)
    assert eng.passage_fill.idle.wait(300)
    assert eng.passage_pass().notes == {eng.doc: "the storage budget (1 B) is full"}
    resumed.clear()
    eng.set_storage_budget(1e-9)  # smaller still: not gone on with (it computed a passage
    assert not resumed  # each time, only to stop again)
    eng.set_storage_budget(10.0)  # the window's settings: the pass goes on at once
    assert resumed
    assert eng.passage_fill.idle.wait(300)
    assert eng.passage_pass().notes == {}
    info = {d.doc_id: d for d in eng.documents()}[eng.doc]
    assert info.passages_cached == info.passages == 5


def _source(doc_id: int, index: int, **where) -> dict:
    return {"passage_id": 100 + index, "document_id": doc_id, "index": index,
            "text": f"Passage {index}.", "score": 1.0, "heading": [], **where}


def test_a_deleted_documents_chat_names_it_alike_in_its_header_and_its_sources(
        qtbot, window, engine):
    """The header said "document 2 (deleted)" while the sources said "release-notes.md
    (deleted)": the header took its titles from the documents still attached."""
    chat = next(c for c in engine.chats() if c.title == "Compare the two documents")
    report, notes = chat.doc_ids
    engine._add_message(chat, "user", "Where?", chat.updated)
    engine._add_message(chat, "assistant", "There.", chat.updated,
                        {"sources": [_source(notes, 4, lines=[40, 44])]})
    engine.delete_document(notes)
    _refreshed(qtbot, window)
    with qtbot.waitSignal(window.messages_loaded, timeout=5000):
        window.open_chat(chat.chat_id)
    qtbot.waitUntil(lambda: "Sources:" in window.chat_view.toPlainText())
    assert "release-notes.md (deleted) #4, lines 40-44" in window.chat_view.toPlainText()
    header = window.header.text()
    assert "release-notes.md (deleted)" in header and f"document {notes}" not in header, header


def test_every_answer_of_a_chat_over_several_documents_names_its_sources_documents(qtbot):
    """After a document's deletion (the chat then about the other one only), the next
    answer's sources said "[1] page 13" while the earlier ones said "plant_manual.md
    (deleted), line 9": one chat, each source named alike."""
    from desktop_app.results import MessageInfo
    from ui.chat.chat_view import ChatView

    view = ChatView()
    qtbot.addWidget(view)
    view.set_doc_titles({1: "safety_report.pdf", 2: "plant_manual.md (deleted)"})
    view.set_chat_documents([1])  # (what the chat is about since its next question)
    view.set_messages([MessageInfo(1, "user", "Code?", 0.0),
                       MessageInfo(2, "assistant", "7-7-4.", 0.0,
                                   {"sources": [_source(2, 9, lines=[9, 9])]})])
    view.add_user_message("Again?")
    view.begin_answer()
    view.end_answer("Never said.", "", {"sources": [_source(1, 30, page=13)]})
    text = view.toPlainText()
    assert "[1] plant_manual.md (deleted) #9, line 9" in text
    assert "[1] safety_report.pdf #30, page 13" in text, text
    # An answer from another document than those named so far: the earlier ones name theirs
    view.set_chat_documents([1])
    view.set_messages([MessageInfo(1, "user", "Fuel?", 0.0),
                       MessageInfo(2, "assistant", "Diesel.", 0.0,
                                   {"sources": [_source(1, 30, page=13)]})])
    assert "[1] #30, page 13" in view.toPlainText()
    view.add_user_message("Supplier?")
    view.begin_answer()
    view.end_answer("Kestrel.", "", {"sources": [_source(2, 9, lines=[9, 9])]})
    text = view.toPlainText()
    assert "[1] safety_report.pdf #30, page 13" in text and "plant_manual.md (deleted)" in text


def test_two_passages_on_one_page_are_told_apart_by_their_numbers(qtbot):
    """Both said "safety_report.pdf, page 67", where the export says #464 and #465."""
    from PySide6.QtCore import QUrl

    from desktop_app.results import MessageInfo
    from ui.chat.chat_view import ChatView

    view = ChatView()
    qtbot.addWidget(view)
    view.set_doc_titles({1: "safety_report.pdf", 2: "plant_manual.md"})
    view.set_chat_documents([1, 2])
    view.set_messages([MessageInfo(1, "user", "Who supplies its fuel?", 0.0),
                       MessageInfo(2, "assistant", "Kestrel.", 0.0, {"sources": [
                           _source(1, 464, page=67), _source(1, 465, page=67)]})])
    assert ("Sources: [1] safety_report.pdf #464, page 67 · [2] safety_report.pdf #465, "
            "page 67") in view.toPlainText()
    view._link(QUrl("kvdesk:source/1/1"))  # shown in full: where it is, its number too
    assert "safety_report.pdf #465, page 67\nPassage 465." in view.toPlainText()


def test_an_attach_reading_its_file_says_so_without_a_percent(qtbot, window):
    """It said "reading the file 100%" at once (the file read: 1 of 1), and stayed so until
    the next phase began."""
    from desktop_app.results import Progress

    row = window.doc_list.add_row("book.pdf", "red")
    row.show_progress(Progress("extract", 1, 1, "book.pdf"))
    assert row.phase.text() == "reading the file…"
    assert row.bar.maximum() == 0  # busy, not full
    row.show_progress(Progress("split", 40, 100, "book.pdf"))
    assert "40%" in row.phase.text() and row.bar.maximum() == 100 and row.bar.value() == 40
    # a folder's walk, then its files read: said as such (it said "reading the file…")
    row = window.doc_list.add_row("src", "red")
    row.show_progress(Progress("extract", 1200, 0, "src"))
    assert row.phase.text() == "looking through the folder: 1,200 found so far…"
    assert row.bar.maximum() == 0
    row.show_progress(Progress("extract", 300, 1200, "src"))
    assert row.phase.text() == "reading the folder's files 25% (300 of 1,200)"
    assert row.bar.value() == 25


def test_what_a_background_exact_pass_evicted_is_said_in_the_status_bar_once(
        qtbot, window, engine):
    """A blended chat made exact in the background evicted caches without a word: no answer
    of the window carries what that store did."""
    note = ("storing chat 3's exact context evicted the least recently used caches to keep "
            "within the storage budget of 20.0 MB: document 2 (beta.md) (4.9 MB); they are "
            "computed again when next used")
    engine.exact_said = {3: [note]}
    with qtbot.waitSignal(window.chats_changed, timeout=5000):
        window.refresh_chats()
    assert window.statusBar().currentMessage() == f"S{note[1:]}."
    assert engine.exact_said == {}  # (taken: said once)


def test_a_model_keeping_no_passage_kv_says_so_on_attach_and_on_the_rows(
        qtbot, window, engine, tmp_path, monkeypatch):
    """Gemma 3, uncalibrated, keeps no passage KV: the attach promised it in the background,
    and the row stayed at "0 of 432 passages cached" with no reason (the probe's M5)."""
    from desktop_app.results import PASSAGES_AS_TEXT

    engine.as_text = True
    plain = engine.attach
    monkeypatch.setattr(engine, "attach",
                        lambda *a, **k: replace(plain(*a, **k), passages=50))
    path = tmp_path / "book.txt"
    path.write_text("words " * 60)
    with qtbot.waitSignal(window.attach_done, timeout=10000):
        window.attach_files([str(path)])
    said = window.info.text()
    assert f"book.txt: {PASSAGES_AS_TEXT}" in said and "`" not in said, said
    (doc_id, info), *_ = engine._docs.items()
    engine._docs[doc_id] = replace(info, passages=432, passages_cached=0)
    _refreshed(qtbot, window)
    assert window.doc_list.list.item(0).text().endswith(
        "0 of 432 passages cached\nread as text until the codec is calibrated")
    engine.as_text = False  # calibrated: the reason goes
    window.refresh_documents()
    qtbot.waitUntil(lambda: "read as text" not in window.doc_list.list.item(0).text())
