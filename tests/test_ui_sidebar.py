"""The sidebar on its own: what a chat's row shows and what its menu hands on; how the
documents' check boxes look."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication, QMenu, QStyle

from desktop_app.results import ChatInfo, DocumentInfo
from ui import theme
from ui.library.document_list import DocumentList
from ui.library.sidebar import ChatList, numbered


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
    monkeypatch.setattr("ui.library.sidebar.QMenu", RenameAtOnce)
    with qtbot.waitSignal(chat_list.rename_requested) as renamed:
        chat_list._menu(chat_list.tree.visualItemRect(item).center())
    assert renamed.args == [1, title]


@pytest.mark.parametrize("look", ["dark", "light", "high-contrast"])
def test_an_unticked_document_shows_its_check_box_in_either_theme(qtbot, look):
    app = QApplication.instance()
    theme.apply(app, look)
    try:
        docs = DocumentList()
        qtbot.addWidget(docs)
        docs.resize(260, 300)
        docs.set_documents([DocumentInfo(n, f"doc{n}.md", "md", 100, 100, {}, "ready", 0.0)
                            for n in (1, 2)], checked={1})
        docs.show()
        qtbot.waitExposed(docs)
        image = docs.list.viewport().grab().toImage()
        base = docs.list.palette().color(docs.list.viewport().backgroundRole())
        box = docs.style().pixelMetric(QStyle.PixelMetric.PM_IndicatorWidth)

        def contrast(row: int) -> int:
            """The largest difference from the list's background in the row's indicator."""
            rect = docs.list.visualItemRect(docs.list.item(row))
            return max(max(abs(a - b) for a, b in zip(
                QColor(image.pixel(x, y)).getRgb()[:3], base.getRgb()[:3], strict=True))
                for x in range(rect.left(), rect.left() + box + 6)
                for y in range(rect.top(), rect.bottom()))

        assert docs.checked_ids() == [1]
        assert contrast(0) >= 60  # ticked: its mark
        assert contrast(1) >= 60, "the unticked document's check box cannot be seen"
    finally:
        theme.apply(app, "light")


def test_chats_of_the_same_long_title_are_told_apart_in_a_narrow_list(qtbot):
    """Three chats read "Who is the release manager for versi…" alike (the probe's L5)."""
    title = "Who is the release manager for version 9?"
    chat_list = ChatList()
    qtbot.addWidget(chat_list)
    chat_list.set_chats([ChatInfo(n, title, [1], 2, 0.0, 0.0) for n in (3, 2, 1)], now=0.0)
    assert chat_list.visible_titles() == {"Today": [f"{title} (3)", f"{title} (2)", title]}
    metrics, mode = chat_list.tree.fontMetrics(), chat_list.tree.textElideMode()
    width = metrics.horizontalAdvance(title) * 2 // 3  # (the sidebar's width cuts them)
    shown = {metrics.elidedText(t, mode, width) for t in chat_list.visible_titles()["Today"]}
    assert len(shown) == 3, shown


def test_a_number_a_chat_s_own_title_already_reads_is_skipped():
    """Chats "Report", "Report", "Report (2)" showed as "Report", "Report (2)", "Report (2)"."""
    def shown(*titles: str) -> list[str]:
        return list(numbered([ChatInfo(n, t, [1], 2, 0.0, 0.0)
                              for n, t in enumerate(titles, 1)]).values())

    assert shown("Report", "Report", "Report (2)") == ["Report", "Report (3)", "Report (2)"]
    assert shown("Report (2)", "Report", "Report", "Report", "Report (2)") == [
        "Report (2)", "Report", "Report (3)", "Report (4)", "Report (2) (2)"]
    rows = shown("A", "A (2)", "A", "A (2)", "A", "A (3)")
    assert len(set(rows)) == len(rows) and rows[:2] == ["A", "A (2)"]


def test_many_documents_can_be_filtered_by_title_and_a_checked_one_stays_checked(qtbot):
    """(151 documents listed, no way to find one but scrolling; the chats had a search.)"""
    docs = DocumentList()
    qtbot.addWidget(docs)

    def listed(n):
        return [DocumentInfo(i, f"doc{i:03d}.md", "md", 100, 100, {}, "ready", 0.0)
                for i in range(1, n + 1)]

    docs.set_documents(listed(3), checked=set())
    assert docs.filter.isHidden()  # (a few: nothing to filter)
    docs.set_documents(listed(150), checked={7})
    assert not docs.filter.isHidden()
    docs.filter.setText("DOC12")
    shown = [docs.list.item(i).text().split("\n")[0] for i in range(docs.list.count())
             if not docs.list.item(i).isHidden()]
    assert shown == [f"doc{n}.md" for n in range(120, 130)]
    assert docs.checked_ids() == [7]  # (filtered out, still going into the new chat)
    docs.set_documents(listed(151), checked={7})  # a refresh keeps the filter
    assert sum(not docs.list.item(i).isHidden() for i in range(docs.list.count())) == 10


def test_a_search_ended_late_never_hides_what_the_latest_found(qtbot):
    """(Two searches ran at once: the older one's results, coming last, replaced the newer's,
    and chats found by their messages vanished.) A list refreshed unchanged searches again
    only when something changed."""
    chat_list = ChatList()
    qtbot.addWidget(chat_list)
    chats = [ChatInfo(1, "Opening hours", [], 2, 0.0, 0.0), ChatInfo(2, "Budget", [], 2, 0.0, 0.0)]
    asked: list[str] = []
    chat_list.search_requested.connect(asked.append)
    chat_list.set_chats(chats, now=0.0)
    chat_list.search.setText("zebra")
    chat_list.set_found("zebra", {2: "the zebra crossing"})
    chat_list.set_found("zeb", {})  # (typed before, answered after)
    assert chat_list.visible_titles() == {"Today": ["Budget\n“…zebra crossing”"]}
    asked.clear()
    chat_list.set_chats(list(chats), now=0.0)  # (the 5 s refresh of a blended chat)
    assert asked == []
    chat_list.set_chats([chats[0], ChatInfo(2, "Budget", [], 4, 0.0, 1.0)], now=0.0)
    assert asked == ["zebra"]


def test_a_title_is_found_whatever_the_spaces_between_its_words(qtbot):
    """(The message search read "opening  hours" as "opening hours"; the title match did not,
    and a chat found by its title vanished while the messages' search ran.)"""
    chat_list = ChatList()
    qtbot.addWidget(chat_list)
    asked: list[str] = []
    chat_list.search_requested.connect(asked.append)
    chat_list.set_chats([ChatInfo(1, "Opening  hours", [], 2, 0.0, 0.0),
                         ChatInfo(2, "Budget", [], 2, 0.0, 0.0)], now=0.0)
    chat_list.search.setText(" opening hours")
    assert chat_list.visible_titles() == {"Today": ["Opening  hours"]}
    chat_list.search.setText("OPENING \t HOURS ")
    assert chat_list.visible_titles() == {"Today": ["Opening  hours"]}
    qtbot.waitUntil(lambda: "opening hours" in [a.casefold() for a in asked])
    chat_list.set_found("OPENING HOURS", {})  # (the search's answer, for what was asked)
    assert chat_list.visible_titles() == {"Today": ["Opening  hours"]}
