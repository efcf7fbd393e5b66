"""The main window's questions: typed ahead, sent, streamed back, stopped, regenerated.

A mixin of `MainWindow` (ui.main_window), which owns the widgets and the state it uses:
the engine, the runner, the chat shown and its serial number. Every engine call runs on the
"chat" lane, one at a time, in the order the user asked for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from desktop_app.options import RestoreOptions
from desktop_app.results import AskResult

from .formatting import answer_stats
from .workers import Job


class AskingMixin:
    def _prepare_draft(self) -> None:
        text = self.prompt.toPlainText()
        if self.engine is None or self.generation is not None or not text.strip():
            return
        if self.draft_job is not None:
            self.draft_job.cancel.set()  # superseded: it stops if it has not finished
        chat_id, doc_ids, level = self.chat_id, self.doc_list.checked_ids(), self.quality.level()
        engine, serial = self.engine, self.serial
        # Failures are left for the question itself to report, when it is sent.
        self.draft_job = self.runner.start("chat", lambda job: engine.prepare(
            text, chat_id=chat_id, doc_ids=doc_ids, restore=RestoreOptions(level=level),
            cancel=job.cancel),
            finished=lambda report: report is None or self._reopened(serial, report))

    def _send_clicked(self) -> None:
        if self.generation is not None:
            self.stop()
        else:
            self.send(self.prompt.toPlainText().strip())

    def send(self, text: str) -> None:
        if not text or self.engine is None:
            return
        if self.generation is not None:
            self.statusBar().showMessage("An answer is still coming: wait, or press Esc", 3000)
            return
        self.prompt.clear()
        self.draft_timer.stop()
        self.chat_view.add_user_message(text)
        chat_id, doc_ids, level = self.chat_id, self.doc_list.checked_ids(), self.quality.level()
        engine = self.engine

        self._generate(lambda job: engine.ask(
            text, chat_id=chat_id, doc_ids=[] if chat_id is not None else doc_ids,
            restore=RestoreOptions(level=level), on_token=job.signals.token.emit,
            on_restore=job.signals.restored.emit, progress=job.signals.progress.emit,
            cancel=job.cancel))

    def regenerate(self) -> None:
        if self.engine is None or self.chat_id is None or self.generation is not None:
            return
        self.chat_view.drop_last_answer()
        chat_id, level, engine = self.chat_id, self.quality.level(), self.engine
        self._generate(lambda job: engine.regenerate(
            chat_id, restore=RestoreOptions(level=level), on_token=job.signals.token.emit,
            on_restore=job.signals.restored.emit, progress=job.signals.progress.emit,
            cancel=job.cancel))

    def stop(self) -> None:
        if self.generation is not None:
            self.generation.cancel.set()
            self.statusBar().showMessage("Stopping…", 2000)

    def _generate(self, work: Callable[[Job], AskResult]) -> None:
        serial = self.serial
        started = time.perf_counter()
        first_token: list[float] = []

        def token(piece: str) -> None:
            if not first_token:
                first_token.append(time.perf_counter())
            if serial == self.serial:
                self.chat_view.append_token(piece)

        def finished(result: AskResult) -> None:
            generation_s = time.perf_counter() - (first_token or [started])[0]
            if serial == self.serial:
                if self.chat_id is None:  # the engine created the chat for this question
                    self.chat_id = result.chat_id
                    self.doc_list.set_checkable(False)
                self.chat_view.end_answer(result.answer, answer_stats(result, generation_s),
                                          result.sources)
                if result.messages:
                    self._say("; ".join(result.messages))
            self.refresh_chats()
            self._generation_over(result)

        def ended(note: str, error: bool = False) -> None:
            if serial == self.serial:
                self.chat_view.end_answer(None, note)
                if error:
                    self._say(note, True)
            self.refresh_chats()
            self._generation_over(None)

        self.chat_view.begin_answer()
        job = self.runner.start("chat", work, finished=finished,
                                failed=lambda msg: ended(msg, error=True))
        job.signals.token.connect(token)
        job.signals.restored.connect(lambda report: self._reopened(serial, report))
        job.signals.progress.connect(lambda p: self._show_progress(serial, p))
        job.signals.cancelled.connect(lambda: ended("stopped"))
        self.generation = job
        self.send_button.setText("Stop")
        self.send_button.setToolTip("Stop the answer  (Esc)")

    def _generation_over(self, result: AskResult | None) -> None:
        self.generation = None
        self.send_button.setText("Send")
        self.send_button.setToolTip("")
        self.answer_done.emit(result)
