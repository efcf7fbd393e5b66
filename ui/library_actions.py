"""The main window's library actions: attaching files (dialog, drop, progress rows,
cancel), deleting documents, and renaming, deleting and exporting chats.

A mixin of `MainWindow` (ui.main_window), which owns the widgets and the state it uses.
Attach jobs run on the "attach" lane, one document at a time in their own model context,
so the chat stays usable meanwhile; the rest run on the "misc" lane.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from desktop_app.results import AttachResult

from .formatting import attach_notices


class LibraryMixin:
    def choose_files(self) -> None:
        if self.engine is None:
            return
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Attach documents", str(Path.home()),
            "Documents (*.txt *.md *.pdf *.html *.htm *.rst *.py *.json *.csv);;All files (*)")
        self.attach_files(paths)

    def attach_files(self, paths: list[str]) -> None:
        """Compute each document's cache on the attach thread, one after the other; the chat
        stays usable meanwhile (the engine gives attach its own model context)."""
        if self.engine is None:
            return
        for path in paths:
            self._attach(Path(path))

    def _attach(self, path: Path) -> None:
        row = self.doc_list.add_row(path.name, self.colors.error)
        engine = self.engine
        job = self.runner.start("attach", lambda job: engine.attach(
            str(path), progress=job.signals.progress.emit, cancel=job.cancel))

        def cancel() -> None:
            job.cancel.set()
            row.phase.setText("cancelling…")

        def finished(result: AttachResult) -> None:
            row.deleteLater()
            notices = attach_notices(result)
            self.statusBar().showMessage(
                "; ".join(notices) or f"{result.title}: {result.kept_tokens:,} tokens ready", 8000)
            if notices:
                self._say("; ".join(notices))
            if self.chat_id is None:  # a document attached while starting a chat joins it
                self._check_next.add(result.doc_id)
            self.refresh_documents()
            self.attach_done.emit(result)

        def failed(message: str) -> None:
            row.show_error(message)
            self.attach_done.emit(message)

        def cancelled() -> None:
            row.deleteLater()
            self.attach_done.emit("cancelled")

        row.cancel_clicked.connect(cancel)
        job.signals.progress.connect(row.show_progress)
        job.signals.finished.connect(finished)
        job.signals.failed.connect(failed)
        job.signals.cancelled.connect(cancelled)

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
            self.new_chat()
        self.runner.start("misc", lambda job: self.engine.delete_chat(chat_id),
                          finished=lambda _: self.refresh_chats(),
                          failed=lambda msg: self._say(msg, True))

    def export_chat(self, chat_id: int, fmt: str) -> None:
        self.runner.start("misc", lambda job: self.engine.export_chat(chat_id, fmt),
                          finished=lambda text: self._save_export(text, fmt),
                          failed=lambda msg: self._say(msg, True))

    def _save_export(self, text: str, fmt: str) -> None:
        suffix = ".md" if fmt == "markdown" else ".json"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"chat{suffix}",
                                              f"{fmt.title()} (*{suffix})")
        if path:
            Path(path).write_text(text, encoding="utf-8")
            self.statusBar().showMessage(f"Exported to {path}", 5000)

    def _confirm(self, question: str) -> bool:
        answer = QMessageBox.question(self, "kvdesk", question)
        return answer == QMessageBox.StandardButton.Yes
