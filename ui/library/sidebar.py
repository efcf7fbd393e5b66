"""The sidebar's chat list: past chats grouped by date with a search of their titles and
messages (the documents are `document_list`'s).

These widgets display what they are given and turn clicks into signals; they never call the
engine (the main window does, on worker threads).
"""

from __future__ import annotations

import datetime as dt

from PySide6.QtCore import QEvent, QItemSelectionModel, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLineEdit,
    QMenu,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop_app.results import ChatInfo

from .. import theme

GROUPS = ("Today", "Yesterday", "Previous 7 days", "Older")
ID_ROLE = Qt.ItemDataRole.UserRole
TITLE_ROLE = Qt.ItemDataRole.UserRole + 1  # the chat's own title, whatever is displayed
BLENDED_MARK = "≈"
SEARCH_DELAY_MS = 250  # typing pauses this long before the messages are searched


def date_group(timestamp: float, now: float) -> str:
    """Which of GROUPS a chat last updated at `timestamp` falls in, in local time."""
    days = (dt.date.fromtimestamp(now) - dt.date.fromtimestamp(timestamp)).days
    if days <= 0:
        return "Today"
    if days == 1:
        return "Yesterday"
    return "Previous 7 days" if days <= 7 else "Older"


class ChatTree(QTreeWidget):
    """The chats under their date headings; the keyboard moves from chat to chat, over the
    headings (they open nothing)."""

    _UP = (QAbstractItemView.CursorAction.MoveUp, QAbstractItemView.CursorAction.MovePageUp,
           QAbstractItemView.CursorAction.MovePrevious)

    def moveCursor(self, action, modifiers):
        index = super().moveCursor(action, modifiers)
        step = self.indexAbove if action in self._UP else self.indexBelow
        while index.isValid() and index.siblingAtColumn(0).data(ID_ROLE) is None:
            index = step(index)
        return index if index.isValid() else self.currentIndex()

    def heading_font(self) -> QFont:
        """A date heading's font: bold, a tenth smaller than the chats'."""
        font = theme.scaled(self.font(), 0.9)
        font.setBold(True)
        return font

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        # (an item's font is its own, not the list's: a larger text, View ▸ Larger text,
        # reaches the headings only so)
        if event.type() == QEvent.Type.FontChange:
            for i in range(self.topLevelItemCount()):
                self.topLevelItem(i).setFont(0, self.heading_font())


class ChatList(QWidget):
    chat_selected = Signal(int)
    rename_requested = Signal(int, str)  # chat id, current title
    delete_requested = Signal(int)
    export_requested = Signal(int, str)  # chat id, "markdown" | "json"
    search_requested = Signal(str)  # the messages to be searched for it (`set_found`)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        # (each list and box named for a screen reader: a placeholder is no name)
        self.search = QLineEdit(placeholderText="Search chats  (Ctrl+K)", clearButtonEnabled=True,
                                accessibleName="Search chats")
        self.tree = ChatTree(headerHidden=True, rootIsDecorated=False, indentation=8,
                             columnCount=2, accessibleName="Chats")
        # The blended mark has a column of its own: eliding a long title cannot hide it.
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        # Chats asking alike start alike: a long title keeps its end (and its number) in view
        self.tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        # Said in place of the list while there is none to show (no model loaded)
        self.note = theme.muted_label()
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.search)
        layout.addWidget(self.note)
        layout.addWidget(self.tree)
        self._chats: list[ChatInfo] = []
        self._now: float | None = None
        self._selected: int | None = None
        self._follow = False  # whether the chat selected is to take the cursor when listed
        self._found: tuple[str, dict[int, str]] = ("", {})  # (searched for, what was found)
        self._searching = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._searching.timeout.connect(self._search)
        self.search.textChanged.connect(self._rebuild)
        self.search.textChanged.connect(self._searching.start)
        self.tree.itemClicked.connect(self._clicked)
        # Enter opens the chat under the keyboard's cursor; moving the cursor does not (an
        # open restores the chat's cache into the model)
        self.tree.itemActivated.connect(self._clicked)
        self.tree.customContextMenuRequested.connect(self._menu)
        # Delete on a row asks to delete its chat, as the row's menu does
        QShortcut(QKeySequence.StandardKey.Delete, self.tree, self._delete_current).setContext(
            Qt.ShortcutContext.WidgetShortcut)  # (PySide's constructor drops a context given)

    def set_chats(self, chats: list[ChatInfo], now: float | None = None) -> None:
        self.note.hide()
        changed, self._chats, self._now = chats != self._chats, chats, now
        self._rebuild()
        if changed:  # (a chat's new messages may hold what is searched for)
            self._search()

    def set_found(self, text: str, found: dict[int, str]) -> None:
        """The chats whose messages hold `text` (`EngineAPI.search_chats`), shown while it is
        what the search field says; a search for what it said before, ended late, is
        dropped (it would hide what the latest found)."""
        if text == self._needle():
            self._found = (text, found)
            self._rebuild()

    def searched_in(self, chat_id: int) -> str:
        """What the search field says, where `chat_id`'s messages were found holding it (its
        chat opened from the result shows the message), else ""."""
        needle = self._needle()
        return needle if needle and self._found[0] == needle and self._found[1].get(
            chat_id) else ""

    def _search(self) -> None:
        if needle := self._needle():
            self.search_requested.emit(needle)

    def _needle(self) -> str:
        """What the search field says, its spaces as the search reads them (one between
        words: "opening  hours" finds "Opening hours")."""
        return spaced(self.search.text())

    def select(self, chat_id: int | None) -> None:
        """Highlight `chat_id` (None: no chat) without emitting chat_selected; a chat newly
        shown also takes the keyboard's cursor, once it is listed."""
        if chat_id != self._selected:
            self._follow = chat_id is not None
        self._selected = chat_id
        self.tree.clearSelection()
        for item in self._chat_items():
            if item.data(0, ID_ROLE) == chat_id:
                if self._follow:
                    self.tree.setCurrentItem(item)
                    self._follow = False
                item.setSelected(True)
                self.tree.scrollToItem(item)

    def visible_titles(self) -> dict[str, list[str]]:
        """Group name -> chat titles, as displayed (for tests and accessibility checks)."""
        return {self.tree.topLevelItem(i).text(0): [
            self.tree.topLevelItem(i).child(j).text(0)
            for j in range(self.tree.topLevelItem(i).childCount())]
            for i in range(self.tree.topLevelItemCount())}

    def _chat_items(self):
        for i in range(self.tree.topLevelItemCount()):
            group = self.tree.topLevelItem(i)
            for j in range(group.childCount()):
                yield group.child(j)

    def _rebuild(self) -> None:
        needle = self._needle()
        found = self._found[1] if self._found[0] == needle else {}
        now = self._now if self._now is not None else dt.datetime.now().timestamp()
        place = self._place()
        self.tree.clear()
        groups: dict[str, QTreeWidgetItem] = {}
        shown = numbered(self._chats)
        for chat in self._chats:  # already most recent first
            if needle and needle.casefold() not in spaced(chat.title).casefold() and \
                    chat.chat_id not in found:
                continue
            name = date_group(chat.updated, now)
            if name not in groups:
                header = QTreeWidgetItem([name])
                header.setFlags(Qt.ItemFlag.ItemIsEnabled)  # a heading: not selectable
                header.setFont(0, self.tree.heading_font())
                header.setFirstColumnSpanned(True)
                groups[name] = header
            blended = chat.kv_mode == "blended"
            # (where a message holds what is searched for: the words around it, under the title)
            quote = f"\n“{_from_word(found[chat.chat_id], needle)}”" if found.get(
                chat.chat_id) else ""
            item = QTreeWidgetItem([shown[chat.chat_id] + quote, BLENDED_MARK if blended else ""])
            item.setData(0, ID_ROLE, chat.chat_id)
            item.setData(0, TITLE_ROLE, chat.title)
            mode = {"blended": f"\n{BLENDED_MARK} answered from its documents' caches "
                    "blended; the exact context is being computed",
                    "exact": "\nexact context cached"}
            tip = (f"{chat.title}\n{chat.messages} messages" + mode.get(chat.kv_mode or "", "")
                   + quote)
            item.setToolTip(0, tip)
            item.setToolTip(1, tip)
            groups[name].addChild(item)
        for name in GROUPS:
            if name in groups:
                self.tree.addTopLevelItem(groups[name])
                groups[name].setExpanded(True)
        self._return_to(*place)
        self.select(self._selected)

    def _place(self) -> tuple[object, int]:
        """The keyboard's cursor in the list: its row's chat id (a heading: its name), and
        its position among the chats."""
        current = self.tree.currentItem()
        if current is None:
            return None, -1
        rows = list(self._chat_items())
        return _key(current), rows.index(current) if current in rows else -1

    def _return_to(self, key: object, position: int) -> None:
        """Put the cursor back where `_place` found it after a rebuild, without selecting (a
        chat gone: the one that took its place), so that keys and the menu key go on from
        there."""
        items = [self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount())]
        rows = list(self._chat_items())
        item = next((i for i in rows + items if _key(i) == key),
                    rows[min(position, len(rows) - 1)] if rows and position >= 0 else None)
        if item is not None:
            self.tree.selectionModel().setCurrentIndex(
                self.tree.indexFromItem(item), QItemSelectionModel.SelectionFlag.NoUpdate)

    def _clicked(self, item: QTreeWidgetItem) -> None:
        if (chat_id := item.data(0, ID_ROLE)) is not None:
            self._open(chat_id)

    def _open(self, chat_id: int) -> None:
        self._selected, self._follow = chat_id, True
        self.chat_selected.emit(chat_id)

    def _menu(self, pos) -> None:
        item = self.tree.itemAt(pos)
        chat_id = item.data(0, ID_ROLE) if item else None
        if chat_id is None:
            return
        self._chat_menu(chat_id, item.data(0, TITLE_ROLE)).exec(
            self.tree.viewport().mapToGlobal(pos))

    def _chat_menu(self, chat_id: int, title: str) -> QMenu:
        menu = QMenu(self)
        menu.addAction("Open", lambda: self._open(chat_id))
        menu.addSeparator()
        menu.addAction("Rename…", lambda: self.rename_requested.emit(chat_id, title))
        menu.addAction("Export as Markdown…",
                       lambda: self.export_requested.emit(chat_id, "markdown"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(chat_id, "json"))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete_requested.emit(chat_id)).setShortcut(
            QKeySequence.StandardKey.Delete)  # (shown: the key works on the row)
        return menu

    def _delete_current(self) -> None:
        item = self.tree.currentItem()
        if item is not None and item.data(0, ID_ROLE) is not None:
            self.delete_requested.emit(item.data(0, ID_ROLE))


def _key(item: QTreeWidgetItem) -> object:
    """What tells a row apart across rebuilds: its chat's id, or a heading's name."""
    chat_id = item.data(0, ID_ROLE)
    return item.text(0) if chat_id is None else chat_id


def spaced(text: str) -> str:
    return " ".join(text.split())


def _from_word(line: str, needle: str) -> str:
    """`line` from `needle` on: a narrow list elides a row's middle, where the words found
    would otherwise be."""
    at = line.casefold().find(needle.casefold())
    return line if at <= 0 else "…" + line[at:]


def numbered(chats: list[ChatInfo]) -> dict[int, str]:
    """Each chat's title as the list shows it: chats of the same title told apart by their
    number in the order they were started, "… (2)", "… (3)" (the first keeps its title), a
    number skipped where a chat's own title already reads so ("Report (2)"): no two rows
    read alike."""
    taken = {chat.title for chat in chats}
    last: dict[str, int] = {}
    shown = {}
    for chat in sorted(chats, key=lambda c: c.chat_id):
        if chat.title not in last:
            last[chat.title] = 1
            shown[chat.chat_id] = chat.title
            continue
        n = last[chat.title] + 1
        while f"{chat.title} ({n})" in taken:
            n += 1
        last[chat.title] = n
        shown[chat.chat_id] = f"{chat.title} ({n})"
        taken.add(shown[chat.chat_id])
    return shown
