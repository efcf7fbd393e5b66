"""An exported chat (`chat.library.Library.export_chat`): Markdown that shows the title, the
sources and the quotes as written, the messages as the model wrote them (no model here)."""

from __future__ import annotations

from desktop_app.chat.library import Library
from store import Store


def test_an_exported_chat_shows_its_title_sources_and_quotes_as_written(tmp_path):
    with Store(tmp_path / "data") as store:
        chat = store.create_chat("notes on __init__ | *args")
        store.add_message(chat.id, "user", "What does `__init__` do?")
        source = {"passage_id": 7, "document_id": 1, "index": 3, "text": "x", "score": 1.0,
                  "lines": [10, 12], "heading": ["Data model", "object.__init__"]}
        store.add_message(chat.id, "assistant", "It **initialises** the instance.",
                          {"sources": [source],
                           "evidence": ["Called by <new>, after\n  *it*. ![x](http://t.example)"]})
        exported = Library(store).export_chat(chat.id)
    assert exported.startswith("# notes on \\_\\_init\\_\\_ \\| \\*args\n")
    assert "What does `__init__` do?" in exported  # messages are Markdown already
    assert "It **initialises** the instance." in exported
    assert "> source: #3 \\[lines 10-12\\] Data model > object.\\_\\_init\\_\\_  \n" in exported
    assert ('> quoted with the question: "Called by \\<new>, after \\*it\\*. '
            '\\!\\[x\\](http://t.example)"  \n') in exported
