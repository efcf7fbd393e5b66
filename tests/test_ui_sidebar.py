"""The sidebar's chat list on its own: what a chat's row shows and what its menu hands on."""

from __future__ import annotations

from PySide6.QtWidgets import QMenu

from desktop_app.results import ChatInfo
from ui.sidebar import ChatList


class RenameAtOnce(QMenu):
    """Stands for the context menu: instead of showing itself, it picks Rename…"""

    def exec(self, *args):
        next(a for a in self.actions() if a.text() == "Rename…").trigger()


def test_a_blended_chat_shows_its_mark_beside_a_long_title_and_renames_from_the_title(
        qtbot, monkeypatch):
    title = "Budget question about the quarterly figures " * 4
    chats = ChatInfo(1, title, [1, 2], 2, 0.0, 0.0, kv_mode="blended")
    chat_list = ChatList()
    qtbot.addWidget(chat_list)
    chat_list.resize(220, 400)
    chat_list.set_chats([chats], now=0.0)
    chat_list.show()
    qtbot.waitExposed(chat_list)
    assert chat_list.visible_titles() == {"Today": [title]}
    item = chat_list.tree.topLevelItem(0).child(0)
    # The mark sits in a column a long title cannot push out of view.
    assert "≈" in item.text(1) and "≈" in item.toolTip(1)
    row = chat_list.tree.visualItemRect(item).intersected(chat_list.tree.viewport().rect())
    assert chat_list.tree.columnWidth(1) >= chat_list.fontMetrics().horizontalAdvance("≈")
    assert chat_list.tree.columnViewportPosition(1) + chat_list.tree.columnWidth(1) \
        <= row.right() + 1
    monkeypatch.setattr("ui.sidebar.QMenu", RenameAtOnce)
    with qtbot.waitSignal(chat_list.rename_requested) as renamed:
        chat_list._menu(chat_list.tree.visualItemRect(item).center())
    assert renamed.args == [1, title]
