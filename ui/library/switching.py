"""The main window's conversations: a new chat, a past one opened and restored, and which
documents are ticked for each.

A mixin of `MainWindow` (ui.main_window), which owns the widgets and the state it uses. Each
switch bumps the view's serial number, so that replies for the chat left behind are not
drawn into the one shown. A chat's own documents are shown ticked (they cannot change); a new
chat's ticks are kept while another chat is shown, for the next new chat.
"""

from __future__ import annotations

from desktop_app.options import RestoreOptions
from desktop_app.results import Progress

from ..text.formatting import in_window_terms, restore_line, shortened
from .attach_rows import PHASE_WORDS


class SwitchingMixin:
    def _ticks(self) -> set[int]:
        """The documents ticked: a chat's own (not to be changed), or a new chat's choice."""
        if self.chat_id is None:
            return self._new_chat_ticks
        chat = self._current_chat()  # (a chat just created is not listed yet: as ticked)
        return set(chat.doc_ids) if chat else set(self.doc_list.checked_ids())

    def _switch(self, chat_id: int | None) -> int:
        if self.chat_id is None:  # leaving a new chat: its ticks wait for the next one
            self._new_chat_ticks = set(self.doc_list.checked_ids())
        self.chat_id = chat_id
        self.doc_list.set_checked(self._ticks())
        self.serial += 1
        if self.reopen_job is not None:
            self.reopen_job.cancel.set()
            self.reopen_job = None
        self.chat_list.select(chat_id)
        self.doc_list.set_checkable(chat_id is None)
        self._say("")
        self._update_header()
        self._update_estimate()
        return self.serial

    def new_chat(self) -> None:
        if self.engine is None:
            return
        self._switch(None)
        self.chat_view.set_messages([])
        self.prompt.setFocus()

    def _show_estimate(self, asked) -> None:
        """The slider's estimate (`asked`: ((chat id, document ids), the estimate)); for a new
        chat, which of the documents ticked the context cannot hold together, in the words
        its answer will use (the engine's)."""
        (chat_id, doc_ids), estimate = asked
        if chat_id != self.chat_id or (chat_id is None
                                        and doc_ids != self.doc_list.checked_ids()):
            return  # (the chat or the ticks changed since: their own estimate follows)
        self.quality.set_estimate(estimate)
        if chat_id is None:
            self._fit_notes = (doc_ids, list(estimate.notes))
        else:  # (how full the chat is, from 80 %)
            self._room_notes = (chat_id, list(estimate.notes))
        self._show_fit()

    def _show_fit(self) -> None:
        """A new chat's documents the context cannot hold, said only while they are being
        chosen (its answers say it after); a chat's room, from 80 % full, with "Continue in a
        new chat" (also where its question was refused as full)."""
        ticked, notes = self._fit_notes  # (those of other ticks wait for their estimate)
        shown = notes if self.chat_id is None and ticked == self.doc_list.checked_ids() else []
        chat, room = self._room_notes
        if self.chat_id is not None:
            shown = room if chat == self.chat_id else []
        self.fit_note.setText(in_window_terms("\n".join(f"⚠ {note}" for note in shown)))
        self.fit_note.setStyleSheet(f"color: {self.colors.error}")
        self.fit_note.setVisible(bool(shown))
        self.continue_button.setVisible(self.chat_id is not None and (
            bool(shown) or self._refused_in == self.chat_id))

    def continue_in_new_chat(self) -> None:
        """A new chat over the documents of the chat shown, ticked, with the question it
        refused (if it did) typed in again; its turns do not go with it, and it says so."""
        chat = self._current_chat()
        if chat is None or self.engine is None or self.generation is not None:
            return
        unsaved = self._unsaved  # (a question refused in this view: not stored)
        question = unsaved[1] if unsaved is not None and unsaved[0] == self.serial else ""
        self._new_chat_ticks = set(chat.doc_ids)  # (what the new chat's switch ticks)
        self.new_chat()
        if question:
            self.prompt.setPlainText(question)
        self._say(f"A new chat over the documents of “{shortened(chat.title)}”: that chat's "
                  "turns do not go with it" + ("; its last question is typed in again, to "
                                               "send" if question else ""))

    def _new_chat_docs_changed(self) -> None:
        if self.chat_id is None:
            self._update_header()
            self._update_estimate()

    def open_chat(self, chat_id: int) -> None:
        """Show a past chat and restore its cache into the model, so the next answer is quick."""
        if chat_id == self.chat_id or self.engine is None:
            return
        serial = self._switch(chat_id)
        # (opened from a chat search's result: shown at the message found, not at its end)
        self._finding = (serial, self.chat_list.searched_in(chat_id))
        self.chat_view.set_messages([])
        self._load_messages(serial)
        if self.answering is not None and self.answering.chat_id == chat_id:
            return  # its answer is coming: the context holds the chat when it is there
        self._say("restoring…")
        level = self.quality.level()
        job = self.runner.start("chat", lambda job: self.engine.reopen(
            chat_id, restore=RestoreOptions(level=level), progress=job.signals.progress.emit,
            cancel=job.cancel), progress=lambda p: self._show_progress(serial, p),
            finished=lambda report: self._reopened(serial, report),
            failed=lambda msg: self._failed_in_view(serial, msg))
        self.reopen_job = job

    def _failed_in_view(self, serial: int, message: str) -> None:
        if serial == self.serial:
            self._say(message, True)

    def _show_progress(self, serial: int, p: Progress, answer: bool = False) -> None:
        """A phase's percent, on the line above the conversation (cleared when it ends). An
        answer's phase at 100% is over, and what comes next may say nothing: after a
        restore, the model reads the question (the passages quoted with it too), which can
        take many seconds: said, not "restoring… 100%"."""
        if serial != self.serial or not p.total:
            return
        if answer and p.done >= p.total:
            text = ("reading the question…" if p.phase in ("restore", "recompute")
                    else "preparing the answer…")
        else:
            text = f"{PHASE_WORDS.get(p.phase, p.phase)}… {100 * p.done // p.total}%"
        self._say(text)
        self._progress_shown = True

    def _reopened(self, serial: int, report) -> None:
        if serial == self.serial:
            self._say(restore_line(report))
            self.reopen_job = None
            self.restored.emit(report)
