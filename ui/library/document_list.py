"""The sidebar's documents: those attached (filtered by their titles, once there are many),
ticked for the next new chat, with the progress of those still computing (`attach_rows`).

These widgets display what they are given and turn clicks into signals; they never call the
engine (the main window does, on worker threads).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.results import STATUS_WORDS, DocumentInfo, counted, size_text

from .. import theme
from ..text.formatting import LEVEL_LINES
from .attach_rows import AttachRow, RowsArea

ID_ROLE = Qt.ItemDataRole.UserRole  # a row's document id
FILTER_FROM = 10  # documents listed from which their titles can be filtered


class DocumentList(QWidget):
    """Attached documents; the checked ones go into the next new chat. A filter by title shows
    once there are many (a checked document filtered out stays checked)."""

    attach_requested = Signal()
    delete_requested = Signal(int, str)  # doc id, title
    checked_changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        heading = QLabel("<b>Documents</b>")
        self.attach_button = QToolButton(toolTip="Attach documents…  (Ctrl+O)",
                                         accessibleName="Attach documents", autoRaise=True)
        self.attach_button.clicked.connect(self.attach_requested)
        top = QHBoxLayout()
        top.addWidget(heading, 1)
        self.rows_area = RowsArea()
        self.rows_area.hide()
        self.rows = self.rows_area.rows
        self.clear_button = QToolButton(text="Clear failed", autoRaise=True, visible=False,
                                        toolTip="Dismiss every attach that failed")
        self.clear_button.clicked.connect(self.clear_failed)
        top.addWidget(self.clear_button)
        self.filter = QLineEdit(placeholderText="Filter documents", clearButtonEnabled=True,
                                visible=False, accessibleName="Filter documents")
        self.filter.textChanged.connect(self._filter)
        self.list = QListWidget(accessibleName="Documents")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        # Delete on a row asks to delete its document, as the row's menu does
        QShortcut(QKeySequence.StandardKey.Delete, self.list,
                  lambda: self._delete(self.list.currentItem())).setContext(
            Qt.ShortcutContext.WidgetShortcut)  # (PySide's constructor drops a context given)
        # A row's facts wrap under its title: a narrow sidebar cuts none of them off.
        self.list.setWordWrap(True)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemChanged.connect(lambda _item: self.checked_changed.emit())
        # (the attach hint only once documents are listed: attaching needs the model loaded)
        self.hint = theme.muted_label()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.attach_button)
        layout.addLayout(top)
        layout.addWidget(self.rows_area)
        layout.addWidget(self.filter)
        layout.addWidget(self.list)
        layout.addWidget(self.hint)

    def set_documents(self, docs: list[DocumentInfo], checked: set[int],
                      stopped: dict[int, str] | None = None, as_text: bool = False) -> None:
        """`stopped`: why the background pass left a document's passages without their KV;
        `as_text`: the model keeps none until its codec is calibrated (said on their rows)."""
        scrolled, current = self.list.verticalScrollBar().value(), self.list.currentRow()
        kept = self.list.currentItem().data(ID_ROLE) if self.list.currentItem() else None
        self.list.blockSignals(True)
        self.list.clear()
        for doc in docs:
            size = sum(doc.cache_bytes.values())
            status = STATUS_WORDS.get(doc.status, doc.status)
            tokens = (counted(doc.tokens, "token") if doc.kept_tokens == doc.tokens
                      else f"{doc.kept_tokens:,} of {counted(doc.tokens, 'token')}")
            if doc.passages:  # too long for the context: answered from its passages' KV
                tokens = counted(doc.tokens, "token")
                status = f"{doc.passages_cached:,} of {doc.passages:,} passages cached"
                if doc.passages_cached < doc.passages and (stopped or {}).get(doc.doc_id):
                    status += f" — stopped: {stopped[doc.doc_id]}"
                if as_text:  # (0 of them, and no pass: why, on a line of its own)
                    status += "\nread as text until the codec is calibrated"
            item = QListWidgetItem(f"{doc.title}\n{tokens} · {size_text(size)} · {status}")
            item.setData(ID_ROLE, doc.doc_id)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if doc.doc_id in checked
                               else Qt.CheckState.Unchecked)
            if doc.file_changed:  # answers use the text attached, not the file's new one
                item.setText(f"{item.text()} · file changed since")
            item.setToolTip("\n".join(
                [doc.title, f"{doc.type}, {tokens}"]
                + [f"{level}: {size_text(n)}" for level, n in doc.cache_bytes.items()]
                + ([LEVEL_LINES.get(doc.levels, doc.levels)] if doc.levels else [])
                + ([doc.changed_words.capitalize() + ": questions use the text attached "
                    "then. " + (f"Document {doc.newer} holds the new text."
                                if doc.newer is not None else
                                f"Attach the {'folder' if doc.type == 'folder' else 'file'} "
                                "again to use the new text.")]
                   if doc.file_changed else [])))
            self.list.addItem(item)
        self._filter()
        # A refresh moves neither the cursor nor the view: the cursor stays on its document,
        # or, that one deleted, on the row that took its place (a keyboard user goes on there).
        rows = [self.list.item(i).data(ID_ROLE) for i in range(self.list.count())]
        if current >= 0 and rows:
            self.list.setCurrentRow(rows.index(kept) if kept in rows
                                    else min(current, len(rows) - 1))
        self.list.verticalScrollBar().setValue(scrolled)
        self.list.blockSignals(False)
        self.filter.setVisible(len(docs) >= FILTER_FROM or bool(self.filter.text()))
        self.hint.setText("Attach files with the paperclip or drop them on the window.")
        self.hint.setVisible(not docs)

    def _filter(self) -> None:
        needle = self.filter.text().strip().casefold()
        for i in range(self.list.count()):
            item = self.list.item(i)
            item.setHidden(needle not in item.text().split("\n")[0].casefold())

    def show_note(self, text: str) -> None:
        """`text` in place of the attach hint, while no documents can be listed nor attached."""
        self.hint.setText(text)
        self.hint.show()

    def checked_ids(self) -> list[int]:
        return [self.list.item(i).data(ID_ROLE) for i in range(self.list.count())
                if self.list.item(i).checkState() == Qt.CheckState.Checked]

    def set_checked(self, doc_ids: set[int]) -> None:
        self.list.blockSignals(True)
        for i in range(self.list.count()):
            item = self.list.item(i)
            item.setCheckState(Qt.CheckState.Checked if item.data(ID_ROLE) in doc_ids
                               else Qt.CheckState.Unchecked)
        self.list.blockSignals(False)

    def set_checkable(self, enabled: bool) -> None:
        """Checking documents only means something while a new chat is being started."""
        for i in range(self.list.count()):
            item = self.list.item(i)
            flags = item.flags()
            item.setFlags(flags | Qt.ItemFlag.ItemIsUserCheckable if enabled
                          else flags & ~Qt.ItemFlag.ItemIsUserCheckable)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        side = self.parentWidget() or self
        self.rows_area.setMaximumHeight(max(side.height() // 3, 60))

    def add_row(self, title: str, error_color: str) -> AttachRow:
        row = AttachRow(title, error_color, self.rows_area.widget())
        self.rows.addWidget(row)
        row.dismissed.connect(lambda: self.remove_row(row))
        row.failed.connect(self._rows_changed)
        self._rows_changed()
        return row

    def remove_row(self, row: AttachRow) -> None:
        """A row done with: attached, cancelled, or its error dismissed."""
        self.rows.removeWidget(row)
        row.hide()
        row.deleteLater()
        self._rows_changed()

    def attach_rows(self) -> list[AttachRow]:
        return [self.rows.itemAt(i).widget() for i in range(self.rows.count())]

    def clear_failed(self) -> None:
        for row in self.attach_rows():
            if row.error:
                self.remove_row(row)

    def _rows_changed(self) -> None:
        rows = self.attach_rows()
        self.rows_area.setVisible(bool(rows))
        failed = sum(bool(r.error) for r in rows)
        self.clear_button.setText(f"Clear {failed} failed")
        self.clear_button.setVisible(failed >= 2)
        self.rows_area.updateGeometry()

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        menu = QMenu(self)
        menu.addAction("Delete document and its cache", lambda: self._delete(item)).setShortcut(
            QKeySequence.StandardKey.Delete)  # (shown: the key works on the row)
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def _delete(self, item: QListWidgetItem | None) -> None:
        if item is not None and item.data(ID_ROLE) is not None:
            self.delete_requested.emit(item.data(ID_ROLE), item.text().split("\n")[0])
