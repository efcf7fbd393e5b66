"""The turn a regenerate replaces (`chat.library.Library.superseding`), no model: out of the
history only as the regenerating thread reads it, replaced only by the turn that thread adds."""

from __future__ import annotations

import threading

from desktop_app.chat.library import Library
from store import Store


def test_a_superseded_turn_is_hidden_only_from_the_thread_regenerating_it(tmp_path):
    with Store(tmp_path / "data") as store:
        store.register_model("m", "/models/m.gguf", {})
        library = Library(store)
        chat = store.create_chat("c")
        turn = dict(model="m", question_tokens=[1], answer_tokens=[2])
        store.add_turn(chat.id, "q", "first answer", **turn)
        last = library.last_turn(chat.id)
        seen_elsewhere = []
        with library.superseding(chat.id, [m.id for m in last]):
            assert library.history(chat.id) == []
            # A background pass reading the chat meanwhile sees it as stored.
            reader = threading.Thread(target=lambda: seen_elsewhere.append(
                [m.text for m in library.history(chat.id)]))
            reader.start()
            reader.join()
            library.add_turn(chat.id, "q", "second answer", docs=[], **turn)
        assert seen_elsewhere == [["q", "first answer"]]
        assert [m.text for m in library.history(chat.id)] == ["q", "second answer"]
