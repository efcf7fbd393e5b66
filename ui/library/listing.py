"""The sidebar's lists read from the engine: the chats, the documents with their passages'
progress, and what to say when the store cannot list them.

A mixin of `MainWindow` (ui.main_window), which calls `refresh_chats` and `refresh_documents`
once the engine is loaded and after whatever changes a list. A list that cannot be read (a
damaged store, its table among the damage) says so in its place: an empty list would read
as chats or documents gone. It never calls the engine on the GUI thread.
"""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel

from desktop_app.passagepass import PassagePass
from desktop_app.results import ChatInfo, DocumentInfo

BLENDED_POLL_MS = 5000  # how often the chat list looks again while a chat is being made exact
PASSAGES_POLL_MAX_MS = 60000  # the longest wait between looks at passages that stand still
UNREAD = "These could not be read from the data folder: see the line above the conversation."


class ListingMixin:
    def refresh_chats(self) -> None:
        self.runner.start("misc", lambda job: (self.engine.chats(), self.engine.exact_notes()),
                          finished=self._show_chats,
                          failed=lambda msg: self._list_failed(msg, self.chat_list.note))

    def search_chats(self, text: str) -> None:
        """The chats whose messages hold `text`, for the chat list's search (`set_found`)."""
        if self.engine is not None:
            # (bound methods, not lambdas: Qt drops them with a window closed before they come)
            self.runner.start("misc", lambda job: (text, self.engine.search_chats(text)),
                              finished=self._show_found, failed=self._search_failed)

    def _show_found(self, found: tuple[str, dict[int, str]]) -> None:
        self.chat_list.set_found(*found)

    def _search_failed(self, message: str) -> None:
        self._say(message, True)

    def _show_chats(self, found: tuple[list[ChatInfo], dict[int, list[str]]]) -> None:
        chats, evicted = found
        if evicted:  # (a background store: no answer of this window carries what it evicted)
            self.statusBar().showMessage(" ".join(f"{n[:1].upper()}{n[1:]}." for ns in
                                                  evicted.values() for n in ns))
        self.chats = chats
        self.chat_list.set_chats(chats, now=self.now())
        if any(c.kv_mode == "blended" for c in chats):
            # The engine makes a blended chat exact in the background: show it when it is.
            QTimer.singleShot(BLENDED_POLL_MS, self.refresh_chats)
        self.chat_list.select(self.chat_id)
        self._update_header()
        self.chats_changed.emit()

    def _poll_documents(self) -> None:
        self.doc_poll.stop()  # (fired: its next start is decided by what this refresh shows)
        self._doc_polled = True
        self.refresh_documents()

    def refresh_documents(self) -> None:
        engine = self.engine
        self.runner.start("misc", lambda job: (engine.documents(), engine.document_titles(),
                                               engine.passage_pass(), engine.passages_as_text()),
                          finished=self._show_documents,
                          failed=lambda msg: self._list_failed(msg, self.doc_list.hint))

    def _show_documents(self, found: tuple[list[DocumentInfo], dict[int, str], PassagePass,
                                           bool]) -> None:
        docs, titles, state, as_text = found
        notes = state.notes
        self._show_pass(state)  # (the status bar's: looked at again while the pass works)
        checked = self._ticks()
        if self.chat_id is None:
            checked = {*self.doc_list.checked_ids(), *self._check_next}
        self._check_next.clear()
        before = {d.doc_id: d.passages_cached for d in self.documents}
        self.documents = docs
        # (sources of deleted documents name them too, and offer no link into them)
        self.chat_view.set_doc_titles(titles, {d.doc_id for d in docs})
        self.doc_list.set_documents(docs, checked, notes, as_text)
        self._say_stopped(docs, notes)
        stale = self._stale_documents()
        self.prefill_button.setText(f"Prefill {len(stale)} document{'s' * (len(stale) != 1)} "
                                    "for this model")
        self.prefill_button.setVisible(bool(stale))
        self.doc_list.set_checkable(self.chat_id is None)
        self._update_header()
        self._update_estimate()
        self._follow_passages(before, docs)
        self._maybe_calibrate()  # the first document attached, or those found at start
        self.documents_changed.emit()

    def _follow_passages(self, before: dict[int, int], docs: list[DocumentInfo]) -> None:
        """Look again later while passages lack their KV (one timer, restarted by any refresh
        meanwhile). The engine's background pass gives every passage its KV, but it waits
        while a chat's turn or a calibration holds the model: a look that finds the counts
        standing still must not end the following (the list would show old counts until a
        restart), it only looks less often. Without the pass, passages get their KV as
        questions read them: followed while their counts move, and after each answer."""
        pending = {d.doc_id: d.passages_cached for d in docs if d.passages_cached < d.passages}
        moved = not self._doc_polled or any(before.get(d) != n for d, n in pending.items())
        self._doc_polled = False
        if not pending or not (moved or self.settings.passages_in_background):
            return
        slower = min(2 * self.doc_poll.interval(), PASSAGES_POLL_MAX_MS)
        self.doc_poll.setInterval(BLENDED_POLL_MS if moved else slower)
        self.doc_poll.start()

    def _say_stopped(self, docs: list[DocumentInfo], notes: dict[int, str]) -> None:
        """Say once, in the status bar, that a document's background pass stopped short, and
        why (its row keeps saying it)."""
        for d in docs:
            if d.doc_id in notes and self._passage_notes.get(d.doc_id) != notes[d.doc_id]:
                self.statusBar().showMessage(
                    f"{d.title}: passage caching stopped at {d.passages_cached:,} of "
                    f"{d.passages:,} — {notes[d.doc_id]}. The rest are cached as questions read "
                    "them; a larger storage budget (Settings) caches them all")
        self._passage_notes = notes

    def _stale_documents(self) -> list[int]:
        """Documents with no cache under the loaded model but one under another."""
        return [d.doc_id for d in self.documents if d.status == "stale"]

    def _prefill_stale(self) -> None:
        self.prefill_button.hide()
        self.prefill_documents(self._stale_documents())

    def _list_failed(self, message: str, note: QLabel) -> None:
        """A list the engine could not read: said at the top, and in the list's place."""
        self._say(message, True)
        note.setText(UNREAD)
        note.show()
