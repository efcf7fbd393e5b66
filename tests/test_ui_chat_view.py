"""The transcript widget on its own: streamed answers are redrawn in place."""

from __future__ import annotations

from desktop_app.results import MessageInfo
from ui.chat.chat_view import ChatView


def test_a_streamed_answer_is_redrawn_in_place(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_messages([MessageInfo(1, "user", "First question", 0.0),
                       MessageInfo(2, "assistant", "First answer", 0.0)])
    view.add_user_message("Second question")
    view.begin_answer()
    for piece in ["Streamed", " **answer**", " here"]:
        view.append_token(piece)
        qtbot.wait(60)  # longer than the redraw interval: each piece gets its own redraw
    qtbot.waitUntil(lambda: "Streamed answer here" in view.toPlainText())
    text = view.toPlainText()
    assert text.count("Streamed") == 1  # replaced, never appended twice
    assert text.index("First answer") < text.index("Second question") < text.index("Streamed")
    view.end_answer()
    assert view.toPlainText().count("Streamed answer here") == 1
    assert not view.streaming


def test_an_answer_over_passages_lists_its_sources_and_a_click_shows_one(qtbot):
    from PySide6.QtCore import QUrl

    view = ChatView()
    qtbot.addWidget(view)
    sources = [{"passage_id": 7, "document_id": 1, "index": 3, "text": "The ferry leaves at 10.",
                "score": 0.03, "heading": ["Timetable"], "lines": [12, 14]},
               {"passage_id": 9, "document_id": 1, "index": 5, "text": "Page two's passage.",
                "score": 0.02, "heading": [], "page": 2}]
    view.set_messages([MessageInfo(1, "user", "When?", 0.0),
                       MessageInfo(2, "assistant", "At 10.", 0.0, {"sources": sources})])
    text = view.toPlainText()
    assert ("Sources: [1] #3, lines 12-14 Timetable (best match) · [2] #5, page 2"  # its
            in text)  # nearest heading; the best of several marked
    assert "The ferry leaves" not in text  # listed, not shown, until clicked
    view._link(QUrl("kvdesk:source/1/0"))
    assert "Timetable › #3, lines 12-14" in view.toPlainText()
    assert "The ferry leaves at 10." in view.toPlainText()
    view._link(QUrl("kvdesk:source/1/1"))  # another one replaces it
    assert "Page two's passage." in view.toPlainText()
    assert "The ferry leaves" not in view.toPlainText()
    view._link(QUrl("kvdesk:source/1/1"))  # clicked again: hidden
    assert "Page two's passage." not in view.toPlainText()
    # A streamed answer's sources come with its end.
    view.add_user_message("And on Sundays?")
    view.begin_answer()
    view.end_answer("Not at all.", "1 token", {"sources": sources[:1], "read_whole": []})
    assert view.toPlainText().count("Sources: [1] #3, lines 12-14 Timetable") == 2
    # A document read whole beside the passages is named first, by its title, the passages
    # then by theirs
    view.set_doc_titles({1: "Guide"})
    view.add_user_message("And the notes?")
    view.begin_answer()
    view.end_answer("Six.", "", {"sources": sources[:1],
                                 "read_whole": [{"document_id": 2, "title": "Notes"}]})
    assert "Sources: Notes (read whole) · [1] Guide #3, lines 12-14" in view.toPlainText()
    # A passage an earlier question retrieved, still in the context, is said to be
    view.add_user_message("And?")
    view.begin_answer()
    view.end_answer("Yes.", "", {"sources": [{**sources[0], "earlier": True}]})
    assert "Sources: [1] #3, lines 12-14 Timetable (an earlier question's)" in view.toPlainText()


def test_an_answer_marks_its_best_source_and_shows_what_its_question_quoted_of_which(qtbot):
    """The probe's L1 and L5: the passage holding the answer was [8] of 8, unmarked, and the
    window never showed the quote the CLI and the exports show."""
    view = ChatView()
    qtbot.addWidget(view)
    sources = [{"passage_id": n, "document_id": 1, "index": n, "text": text, "score": score,
                "heading": [], "lines": [n, n]}
               for n, text, score in ((53, "def quote(s):", 4.4),
                                      (130, "A doctest of difflib.", 4.0),
                                      (431, "x = 1\n# The release manager is Ingrid.", 21.3))]
    view.set_messages([MessageInfo(1, "user", "Who?", 0.0), MessageInfo(
        2, "assistant", "Ingrid.", 0.0, {"sources": sources,
                                         "evidence": ["# The release manager is  Ingrid."]})])
    text = view.toPlainText()
    assert "[1] #53, line 53 · [2] #130, line 130 · [3] #431, line 431 (best match)" in text
    assert "Quoted with the question from [3]: “# The release manager is Ingrid.”" in text


def test_a_source_shown_keeps_its_indentation_and_stays_with_its_chat(qtbot):
    from PySide6.QtCore import QUrl

    view = ChatView()
    qtbot.addWidget(view)
    code = {"passage_id": 1, "document_id": 1, "index": 0, "text": "def f(x):\n    return x",
            "score": 1.0, "lines": [3, 4]}
    other = {**code, "passage_id": 2, "index": 1, "text": "Plain prose.", "lines": [9, 9]}
    view.set_messages([MessageInfo(1, "user", "What is f?", 0.0),
                       MessageInfo(2, "assistant", "A function.", 0.0,
                                   {"sources": [other, code]})])
    view._link(QUrl("kvdesk:source/1/1"))
    assert "\n    return x" in view.toPlainText()
    # Another chat, whose answer has fewer sources, opens with none shown.
    view.set_messages([MessageInfo(5, "user", "Again?", 0.0),
                       MessageInfo(6, "assistant", "Yes.", 0.0, {"sources": [other]})])
    assert "Yes." in view.toPlainText() and "Plain prose." not in view.toPlainText()
    # Over several documents, a source says which one it is in.
    view.set_messages([MessageInfo(7, "user", "Both?", 0.0),
                       MessageInfo(8, "assistant", "Both.", 0.0, {"sources": [
                           other, {**code, "document_id": 2}]})])
    assert "[1] document 1 #1, line 9" in view.toPlainText()  # (before the list has loaded)
    view.set_doc_titles({1: "manual.pdf", 2: "notes.md"})
    assert "[1] manual.pdf #1, line 9 · [2] notes.md #0, lines 3-4" in view.toPlainText()


def test_a_long_document_says_how_many_passages_have_their_kv(qtbot):
    from desktop_app.results import DocumentInfo
    from ui.library.document_list import DocumentList

    docs = DocumentList()
    qtbot.addWidget(docs)
    docs.set_documents([DocumentInfo(1, "Book", "text", 291_532, 0, {}, "passages", 0.0,
                                     passages=1_204, passages_cached=310)], set())
    assert "291,532 tokens" in docs.list.item(0).text()
    assert "310 of 1,204 passages cached" in docs.list.item(0).text()
    assert docs.list.wordWrap()  # the row's facts wrap in a narrow sidebar, never cut off


def test_the_view_follows_the_end_unless_the_user_reads_further_up(qtbot):
    """An answer that ended, was stopped or regenerated in a chat longer than the view was
    left below the fold with the view back near the top (the page is laid out after it is
    set, so scrolling to its end at once reached the end of a page not laid out yet)."""
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 300)
    view.show()
    qtbot.waitExposed(view)
    long = "word " * 300
    view.set_messages([MessageInfo(i, role, long if role == "assistant" else f"q{i}", 0.0)
                       for i in range(12) for role in ("user", "assistant")])
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())  # opened
    view.add_user_message("Next?")
    view.begin_answer()
    view.append_token(long)
    view.end_answer()
    qtbot.wait(50)
    assert bar.value() == bar.maximum() > 0
    # Read further up, the page stays there when it is redrawn (a source opened, an answer
    # ending); back at the end, it follows again.
    bar.setValue(bar.maximum() // 3)
    reading = bar.value()
    view.add_user_message("And?")
    view.begin_answer()
    view.append_token(long)
    view.end_answer()
    qtbot.wait(50)
    assert bar.value() == reading < bar.maximum()
    bar.setValue(bar.maximum())
    view.end_answer("One more.")
    qtbot.wait(50)
    assert bar.value() == bar.maximum()


def test_a_stored_answer_keeps_the_parts_of_its_note_that_stay_true(qtbot):
    """Reopened, an answer cut at the token limit said only "copy · regenerate": its length
    and why it stopped are in its stats; its speed was the machine's then, and its notes
    were the status bar's (of that restore, mostly)."""
    view = ChatView()
    qtbot.addWidget(view)
    note = "2 of the 5 passages retrieved left out: no room in the context"
    stats = {"tokens_generated": 48, "ttft_s": 24.68, "finish_reason": "length",
             "messages": [note]}
    view.set_messages([MessageInfo(1, "user", "How much?", 0.0),
                       MessageInfo(2, "assistant", "The budget is", 0.0, stats)])
    text = view.toPlainText()
    assert "48 tokens · stopped at the token limit: it may be cut short · copy · regenerate" \
        in text and note not in text
    assert "tokens/s" not in text and "first token" not in text
    view.set_messages([MessageInfo(1, "user", "How much?", 0.0),
                       MessageInfo(2, "assistant", "All of it.", 0.0,
                                   {"tokens_generated": 3, "finish_reason": "stop",
                                    "model": "gemma-3-270m-q4_k_m.gguf"})])
    assert "3 tokens · gemma-3-270m-q4_k_m.gguf · copy · regenerate" in view.toPlainText()
