"""An exported chat (`chat.library.Library.export_chat`): Markdown that shows the title, the
sources and the quotes as written, the messages as the model wrote them (no model here)."""

from __future__ import annotations

import json

from desktop_app.chat.library import Library
from desktop_app.model.prompts import title_of
from store import Store


def test_an_exported_chat_shows_its_title_sources_and_quotes_as_written(tmp_path):
    with Store(tmp_path / "data") as store:
        doc = store.add_document("h", "python_docs.md", "x", type="markdown")
        chat = store.create_chat("notes on __init__ | *args", [doc.id])
        store.add_message(chat.id, "user", "What does `__init__` do?")
        source = {"passage_id": 7, "document_id": doc.id, "index": 3, "text": "x", "score": 1.0,
                  "lines": [10, 12], "heading": ["Data model", "object.__init__"]}
        store.add_message(chat.id, "assistant", "It **initialises** the instance.",
                          {"sources": [source],
                           "evidence": ["Called by <new>, after\n  *it*. ![x](http://t.example)"]})
        exported = Library(store).export_chat(chat.id)
    assert exported.startswith("# notes on \\_\\_init\\_\\_ \\| \\*args\n\n"
                               "Documents: python\\_docs.md\n")
    assert "What does `__init__` do?" in exported  # messages are Markdown already
    assert "It **initialises** the instance." in exported
    assert ("> source: python\\_docs.md #3 \\[lines 10-12\\] Data model > "
            "object.\\_\\_init\\_\\_  \n") in exported
    assert ('> quoted with the question: "Called by \\<new>, after \\*it\\*. '
            '\\!\\[x\\](http://t.example)"  \n') in exported


def test_an_export_names_the_chats_documents_and_each_sources_document(tmp_path):
    """Markdown: a line under the title, and each source by its document's title (by its id
    once deleted); JSON: a "documents" list. The chat's documents are named even where no
    answer has sources (a chat over documents read whole)."""
    with Store(tmp_path / "data") as store:
        a, b, c = (store.add_document(h, f"{h}.txt", h, type="text") for h in "abc")
        chat = store.create_chat("three licenses", [a.id, b.id, c.id])
        store.add_message(chat.id, "user", "Which is shortest?")
        sources = [{"passage_id": i, "document_id": d.id, "index": i, "text": "x",
                    "score": 1.0, "lines": [i, i], "heading": []}
                   for i, d in enumerate((a, b), start=1)]
        store.add_message(chat.id, "assistant", "b.",
                          {"sources": sources, "documents": [a.id, b.id, c.id]})
        plain = store.create_chat("none")
        library = Library(store)
        exported = library.export_chat(chat.id)
        assert "\nDocuments: a.txt, b.txt, c.txt\n" in exported
        assert "> source: a.txt #1 \\[line 1\\]  \n> source: b.txt #2 \\[line 2\\]" in exported
        as_json = json.loads(library.export_chat(chat.id, "json"))
        assert as_json["documents"] == [{"id": d.id, "title": d.title, "deleted": False}
                                        for d in (a, b, c)]
        store.delete_document(b.id)
        exported = library.export_chat(chat.id)
        # (It was named nowhere: a chat over one whole document deleted named none at all.)
        assert "\nDocuments: a.txt, c.txt, b.txt (deleted)\n" in exported
        assert "> source: b.txt (deleted) #2" in exported  # its title kept for the chat
        assert [(d["id"], d["deleted"]) for d in json.loads(
            library.export_chat(chat.id, "json"))["documents"]] == [
                (a.id, False), (c.id, False), (b.id, True)]
        assert "Documents" not in library.export_chat(plain.id)
        assert json.loads(library.export_chat(plain.id, "json"))["documents"] == []


def test_an_answer_that_did_not_end_says_so_and_the_title_is_cut_between_words(tmp_path):
    """(The window said "stopped before its end"; the export showed the answer as whole, under
    the heading "...and how much does a ga".)"""
    asked = "How much does a ferry ticket cost,  and how much does a garage space cost here?"
    assert title_of(asked) == "How much does a ferry ticket cost, and how much does a…"
    assert title_of("x" * 100) == "x" * 57 + "…"  # one long word: cut anyway
    with Store(tmp_path / "data") as store:
        chat = store.create_chat(title_of(asked))
        store.add_message(chat.id, "user", asked)
        store.add_message(chat.id, "assistant", "A ticket costs", {"finish_reason": "cancelled"})
        store.add_message(chat.id, "user", "And the garage?")
        store.add_message(chat.id, "assistant", "Twelve", {"finish_reason": "length"})
        exported = Library(store).export_chat(chat.id)
    assert "A ticket costs\n\n*(stopped before its end)*\n" in exported
    assert "Twelve\n\n*(stopped at the token limit: it may be cut short)*\n" in exported


def test_each_answer_names_the_model_that_gave_it(tmp_path):
    """(A chat answered by two models in turn did not say which wrote which answer.)"""
    with Store(tmp_path / "data") as store:
        chat = store.create_chat("two models")
        for model in ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma_3*270m.gguf", None):
            store.add_message(chat.id, "user", "Hello?")
            store.add_message(chat.id, "assistant", "Hi.", {"model": model} if model else None)
        library = Library(store)
        exported = library.export_chat(chat.id)
        answers = json.loads(library.export_chat(chat.id, "json"))["messages"][1::2]
    assert [line for line in exported.splitlines() if line.startswith("**kvdesk")] == [
        "**kvdesk (SmolLM2-135M-Instruct.Q4\\_1.gguf):**", "**kvdesk (gemma\\_3\\*270m.gguf):**",
        "**kvdesk:**"]  # (an answer stored before the model was kept)
    assert [(a["stats"] or {}).get("model") for a in answers] == [
        "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma_3*270m.gguf", None]
