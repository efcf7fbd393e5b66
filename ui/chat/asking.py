"""The main window's questions: typed ahead, sent, streamed back, stopped, regenerated.

A mixin of `MainWindow` (ui.main_window), which owns the widgets and the state it uses:
the engine, the runner, the chat shown and its serial number. Every engine call runs on the
"chat" lane, one at a time, in the order the user asked for them. An answer goes on while
the user looks at another chat: coming back, they see it where it got to, still streaming
(the engine stores the question with its answer, so the chat's stored messages lack both
until it ends), or the chat as stored once it has ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from desktop_app.errors import ChatFullError
from desktop_app.options import RestoreOptions
from desktop_app.results import AskResult

from ..text.formatting import answer_stats, notes_text
from ..workers import Job


@dataclass
class Answering:
    """The question being answered, in which chat (None: a new one), and what came so far."""

    chat_id: int | None
    question: str
    text: str = ""
    doc_ids: tuple[int, ...] = ()  # a new chat's documents


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
        self._ask(text, self.doc_list.checked_ids())

    def _ask(self, text: str, doc_ids: list[int]) -> None:
        """Ask `text` in the chat shown, or in a new chat over `doc_ids` (the prompt and the
        ticks left as they are)."""
        self._unsaved = None  # (a stopped turn shown before is no longer the last)
        self.chat_view.add_user_message(text)
        chat_id, level, engine = self.chat_id, self.quality.level(), self.engine

        self._generate(text, lambda job: engine.ask(
            text, chat_id=chat_id, doc_ids=[] if chat_id is not None else doc_ids,
            restore=RestoreOptions(level=level), on_token=job.signals.token.emit,
            on_restore=job.signals.restored.emit, progress=job.signals.progress.emit,
            cancel=job.cancel), new_turn=True, doc_ids=doc_ids)

    def regenerate(self) -> None:
        if self.engine is None or self.generation is not None:
            return
        unsaved, self._unsaved = self._unsaved, None
        if unsaved is not None and unsaved[0] == self.serial:
            # The engine stored neither the question nor its stopped (or failed) answer:
            # regenerating it is asking it again where it was asked (engine.regenerate
            # redoes the stored turn before it, and has no chat to work on in a new one).
            self.chat_view.drop_last_answer(with_question=True)
            self._ask(unsaved[1], list(unsaved[2]))  # (what was typed since stays typed)
            return
        if self.chat_id is None:
            return
        question = next((t for role, t in reversed(self.chat_view.transcript())
                         if role == "user"), "")
        self.chat_view.drop_last_answer()
        chat_id, level, engine = self.chat_id, self.quality.level(), self.engine
        self._generate(question, lambda job: engine.regenerate(
            chat_id, restore=RestoreOptions(level=level), on_token=job.signals.token.emit,
            on_restore=job.signals.restored.emit, progress=job.signals.progress.emit,
            cancel=job.cancel))

    def stop(self) -> None:
        if self.generation is not None:
            self.generation.cancel.set()
            self.statusBar().showMessage("Stopping…" if self.answer_serial == self.serial
                                         else "Stopping the answer in another chat…", 2000)

    def _load_messages(self, serial: int) -> None:
        """Show the chat's stored messages (and the answer coming in it, if one is)."""
        chat_id = self.chat_id
        self.runner.start("misc", lambda job: self.engine.messages(chat_id),
                          finished=lambda msgs: self._show_messages(serial, msgs),
                          failed=lambda msg: self._say(msg, True))

    def _show_messages(self, serial: int, messages) -> None:
        if serial != self.serial:
            return
        self.chat_view.set_messages(messages)
        if self._finding[0] == serial and self._finding[1]:  # (once: not at each reload)
            self.chat_view.show_found(self._finding[1])
        self._finding = (-1, "")
        answering = self.answering
        coming = answering is not None and answering.chat_id is not None \
            and answering.chat_id == self.chat_id
        # Its turn stored already (the answer's cache is being stored): shown as stored.
        stored = coming and [m.role for m in messages[-2:]] == ["user", "assistant"] \
            and messages[-2].text == answering.question
        if coming and not stored:
            self.chat_view.add_user_message(answering.question)
            self.chat_view.begin_answer()
            self.chat_view.append_token(answering.text)
            self.answer_serial = serial
        self.messages_loaded.emit()

    def _generate(self, question: str, work: Callable[[Job], AskResult],
                  new_turn: bool = False, doc_ids: list[int] = ()) -> None:
        """Run `work`, an ask (`new_turn`, in a new chat over `doc_ids`) or a regenerate,
        streaming its answer into view."""
        answering = self.answering = Answering(self.chat_id, question,
                                               doc_ids=tuple(doc_ids))
        self.answer_serial = self.serial
        started = time.perf_counter()
        first_token: list[float] = []

        def token(piece: str) -> None:
            if not first_token:
                first_token.append(time.perf_counter())
            answering.text += piece
            if self.answer_serial == self.serial:
                self.chat_view.append_token(piece)

        def left_behind(chat_id: int | None) -> None:
            """The answer's chat is shown, but in a view opened since: shown as stored."""
            if chat_id is not None and chat_id == self.chat_id:
                self._load_messages(self.serial)

        def finished(result: AskResult) -> None:
            generation_s = time.perf_counter() - (first_token or [started])[0]
            self.answering = None
            if self.answer_serial != self.serial:
                left_behind(result.chat_id)
            else:
                if not result.stored:
                    if new_turn:  # (regenerating it asks it again, as a turn never stored)
                        self._unsaved = (self.serial, answering.question, answering.doc_ids)
                # (the engine created the chat for this question, unless it could not be
                # stored: then the view stays a new chat, its documents still to tick)
                elif self.chat_id is None:
                    self._new_chat_ticks = set(self.doc_list.checked_ids())
                    self.chat_id = result.chat_id
                    self.doc_list.set_checkable(False)
                self.chat_view.end_answer(
                    result.answer, answer_stats(result, generation_s)
                    + ("" if result.stored else " (not saved)"),
                    {"sources": result.sources, "read_whole": result.read_whole,
                     "evidence": result.evidence})
                if not result.stored and not new_turn:  # the turn it was to replace stands
                    self._load_messages(self.serial)
                self._clear_progress()
                if result.messages:
                    self._say(notes_text(result.messages))
            self.refresh_chats()
            self._generation_over(result)

        def ended(note: str, error: bool = False) -> None:
            self.answering = None
            # ("Continue in a new chat" offered: not where its documents alone fill it; the
            # job read as `self.generation`, this one until it is over: a slot holding it
            # would keep it for good, `ui.workers`)
            failure = getattr(self.generation, "error", None)
            if isinstance(failure, ChatFullError) and failure.doc_ids:
                self._refused_in = answering.chat_id
            if self.answer_serial != self.serial:
                left_behind(answering.chat_id)
            else:
                if new_turn:
                    # Nothing of this turn was stored (a stop during the answer returns what
                    # came, stored): said, and its "regenerate" link asks the question again.
                    self._unsaved = (self.serial, answering.question, answering.doc_ids)
                self.chat_view.end_answer(None, f"{note} (not saved)" if new_turn else note)
                if not new_turn:  # a regenerate stopped: the turn it was to replace is
                    self._load_messages(self.serial)  # still stored, shown back in place
                self._clear_progress()  # a stopped phase's percent is not left on screen
                if error:
                    self._say(note, True)
            self.refresh_chats()
            self._generation_over(None)

        self.chat_view.begin_answer()
        job = self.runner.start(
            "chat", work, finished=finished, failed=lambda msg: ended(msg, error=True),
            token=token, restored=lambda report: self._reopened(self.answer_serial, report),
            progress=lambda p: self._show_progress(self.answer_serial, p, answer=True),
            cancelled=lambda: ended("stopped"))
        self.generation = job
        self.send_button.setText("Stop")
        self.send_button.setToolTip("Stop the answer  (Esc)")

    def _clear_progress(self) -> None:
        """An answer's end leaves no progress line up (a restore line or a note stays)."""
        if self._progress_shown:
            self._say("")

    def _generation_over(self, result: AskResult | None) -> None:
        self.generation = None
        self._update_estimate()  # (the chat grew: how full it is now, from 80 %)
        self.send_button.setText("Send")
        self.send_button.setToolTip("")
        # A question gives the passages it read their KV, and a document cached for another
        # model only (or not at all) a cache for this one: the list says it at once.
        if any(d.passages_cached < d.passages or d.status not in ("ready", "passages")
               for d in self.documents):
            self.refresh_documents()
        self.answer_done.emit(result)
