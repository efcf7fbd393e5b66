"""The main window's library actions: attaching files and folders (dialogs, drop, progress
rows, cancel), computing documents' caches again under a new model, deleting documents, showing
a source in its document, and renaming, deleting and exporting chats.

A mixin of `MainWindow` (ui.main_window), which owns the widgets and the state it uses.
Attach jobs run on the "attach" lane, one document at a time in their own model context,
so the chat stays usable meanwhile; the rest run on the "misc" lane.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from desktop_app.results import AttachResult, Source, counted

from ..text.formatting import as_text_note, attach_notices, file_name, in_window_terms, notes_text
from .document_view import DocumentView


class LibraryMixin:
    def choose_files(self) -> None:
        if self.engine is None:
            return
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Attach documents", str(Path.home()),
            "Documents (*.txt *.md *.markdown *.rst *.pdf *.docx *.epub *.html *.htm *.xhtml "
            "*.csv *.tsv *.json *.jsonl *.py);;"
            "All files (*)")
        self.attach_files(paths)

    def choose_folder(self) -> None:
        """A folder (a code base, notes) attached as one document: its readable files, each
        under its path (`desktop_app.formats.folders`); a dropped folder is attached so too."""
        if self.engine is None:
            return
        path = QFileDialog.getExistingDirectory(self, "Attach a folder as one document",
                                                str(Path.home()))
        if path:
            self.attach_files([path])

    def attach_files(self, paths: list[str]) -> None:
        """Compute each document's cache on the attach thread, one after the other; the chat
        stays usable meanwhile (the engine gives attach its own model context)."""
        if self.engine is None:
            return
        for path in paths:
            self._attach(Path(path))

    def _attach(self, path: Path) -> None:
        engine, automatic = self.engine, self.settings.calibrate_automatically

        def work(job) -> AttachResult:
            result = engine.attach(str(path), progress=job.signals.progress.emit,
                                   cancel=job.cancel)
            if result.passages and engine.passages_as_text():  # (asked off the GUI thread)
                result = replace(result, warnings=[*result.warnings,
                                                   as_text_note(result.title, automatic)])
            return result

        self._attach_job(path.name, work, joins=True)

    def prefill_documents(self, doc_ids: list[int]) -> None:
        """Compute the documents' caches under the loaded model, in the background (after a
        model switch: their caches were made under another one)."""
        titles = {d.doc_id: d.title for d in self.documents}
        engine = self.engine
        for doc_id in doc_ids:
            self._attach_job(titles.get(doc_id, f"document {doc_id}"),
                             lambda job, doc_id=doc_id: engine.prefill(
                                 doc_id, progress=job.signals.progress.emit, cancel=job.cancel),
                             joins=False)

    def _attach_job(self, title: str, work, *, joins: bool) -> None:
        """`work` on the attach lane, shown as a progress row that can be cancelled; `joins`:
        the document joins the new chat being started."""
        row = self.doc_list.add_row(title, self.colors.error)

        def finished(result: AttachResult) -> None:
            self.doc_list.remove_row(row)
            notices = attach_notices(result)
            self.statusBar().showMessage(
                "; ".join(map(in_window_terms, notices))  # (one line: the status bar's)
                or f"{result.title}: {counted(result.kept_tokens, 'token')} ready", 8000)
            if notices:
                self._say(notes_text(notices))
            if joins and self.chat_id is None:  # attached while starting a chat: it joins it
                self._check_next.add(result.doc_id)
            self.refresh_documents()
            self.attach_done.emit(result)

        def failed(message: str) -> None:
            row.show_error(message)
            self.attach_done.emit(message)

        def cancelled() -> None:
            self.doc_list.remove_row(row)
            self.attach_done.emit("cancelled")

        job = self.runner.start("attach", work, finished=finished, failed=failed,
                                progress=row.show_progress, cancelled=cancelled)

        def cancel() -> None:
            job.cancel.set()
            row.phase.setText("cancelling…")

        row.cancel_clicked.connect(cancel)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if self.engine is not None and any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if paths:
            event.acceptProposedAction()
            self.attach_files(paths)

    def delete_document(self, doc_id: int, title: str) -> None:
        if self._confirm(f"Delete “{title}” and its cache? Chats about it keep their text."):
            self.runner.start("misc", lambda job: self.engine.delete_document(doc_id),
                              finished=lambda _: self.refresh_documents(),
                              failed=lambda msg: self._say(msg, True))

    def show_in_document(self, source: Source) -> None:
        """A source's passage among those around it in its document, in a dialog."""
        doc = next((d for d in self.documents if d.doc_id == source.document_id), None)
        if doc is None:  # (deleted since the list was drawn: by another window, or kvdesk rm)
            self.statusBar().showMessage("That document is no longer attached.", 8000)
            self.refresh_documents()  # its sources then say so, with no link
            return

        def show(passages) -> None:
            self.document_view = DocumentView(doc.title, doc.passages, passages, source,
                                              self.chat_view.colors, self)
            self.document_view.show()

        self.runner.start("misc", lambda job: self.engine.passages_around(
            source.document_id, source.index), finished=show,
            failed=lambda msg: self._say(msg, True))

    # -- chat management ------------------------------------------------------------------------

    def rename_chat(self, chat_id: int, title: str) -> None:
        new, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=title)
        if ok and new.strip():
            self.runner.start("misc", lambda job: self.engine.rename_chat(chat_id, new.strip()),
                              finished=lambda _: self.refresh_chats(),
                              failed=lambda msg: self._say(msg, True))

    def delete_chat(self, chat_id: int) -> None:
        if not self._confirm("Delete this chat and its cache?"):
            return
        if chat_id == self.chat_id:
            in_list = self.chat_list.tree.hasFocus()
            self.new_chat()
            if in_list:  # (deleted from the list: the keyboard goes on from there)
                self.chat_list.tree.setFocus()
        self.runner.start("misc", lambda job: self.engine.delete_chat(chat_id),
                          finished=lambda _: self.refresh_chats(),
                          failed=lambda msg: self._say(msg, True))

    def export_chat(self, chat_id: int, fmt: str) -> None:
        title = next((c.title for c in self.chats if c.chat_id == chat_id), "chat")
        self.runner.start("misc", lambda job: self.engine.export_chat(chat_id, fmt),
                          finished=lambda text: self._save_export(text, fmt, title),
                          failed=lambda msg: self._say(msg, True))

    def _save_export(self, text: str, fmt: str, title: str) -> None:
        suffix = ".md" if fmt == "markdown" else ".json"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", file_name(title) + suffix,
                                              f"{fmt.title()} (*{suffix})")
        if path:
            Path(path).write_text(text, encoding="utf-8")
            self.statusBar().showMessage(f"Exported to {path}", 5000)

    def _confirm(self, question: str) -> bool:
        answer = QMessageBox.question(self, "kvdesk", question)
        return answer == QMessageBox.StandardButton.Yes
