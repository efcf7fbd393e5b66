"""The transcript widget on its own: streamed answers are redrawn in place."""

from __future__ import annotations

from desktop_app.results import MessageInfo
from ui.chat_view import ChatView


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
