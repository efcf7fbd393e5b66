"""End to end with the real engine and the default model: attach a short document, ask,
restart the window, reopen the chat, ask again; the answer appears each time."""

from __future__ import annotations

import pytest

from desktop_app import settings as settings_mod
from desktop_app.app import App
from ui.main_window import MainWindow

pytestmark = pytest.mark.model
SLOW_MS = 300_000  # the real model on two CPU cores


def e2e_settings() -> settings_mod.Settings:
    # No calibration: it would run for minutes beside the answers this test waits for.
    return settings_mod.load().with_overrides(n_ctx=2048, calibrate_automatically=False)


def start(qtbot, app: App) -> MainWindow:
    window = MainWindow(lambda: app.engine, app.settings)
    qtbot.addWidget(window)
    with qtbot.waitSignals([window.engine_ready, window.chats_changed,
                            window.documents_changed], timeout=SLOW_MS):
        pass
    return window


def ask(qtbot, window: MainWindow, question: str):
    with qtbot.waitSignal(window.answer_done, timeout=SLOW_MS) as blocker:
        window.send(question)
    result = blocker.args[0]
    assert result is not None, window.info.text()
    assert result.answer.strip()
    assert window.chat_view.transcript()[-1] == ("assistant", result.answer)
    return result


def test_attach_ask_restart_reopen_ask(qtbot, tmp_path):
    app = App(e2e_settings())
    window = start(qtbot, app)
    assert window.windowTitle() == f"{app.model_path.name} \u2014 kvdesk"  # which model answers
    doc = tmp_path / "cats.txt"
    doc.write_text("Cats sleep for about sixteen hours a day. "
                   "The oldest known cat lived to be thirty-eight.\n")
    with qtbot.waitSignal(window.attach_done, timeout=SLOW_MS) as blocker:
        window.attach_files([str(doc)])
    assert blocker.args[0].title == "cats.txt", blocker.args[0]
    qtbot.waitUntil(lambda: bool(window.doc_list.checked_ids()), timeout=SLOW_MS)
    first = ask(qtbot, window, "How long do cats sleep?")
    window.close()
    app.close()

    app = App(e2e_settings())
    window = start(qtbot, app)
    assert first.chat_id in [c.chat_id for c in window.chats]
    with qtbot.waitSignals([window.restored, window.messages_loaded], timeout=SLOW_MS):
        window.open_chat(first.chat_id)
    assert window.info.text().startswith("restored ")
    assert window.chat_view.transcript()[:2] == [("user", "How long do cats sleep?"),
                                                 ("assistant", first.answer)]
    second = ask(qtbot, window, "And how old was the oldest cat?")
    assert second.chat_id == first.chat_id
    window.close()
    app.close()
