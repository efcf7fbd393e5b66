"""The window from the keyboard alone, and what a screen reader is told: chats opened with
Enter, the list's cursor kept across refreshes, the widgets' accessible names and values."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAccessible, QColor, QKeySequence, QPalette, QShortcut
from PySide6.QtWidgets import QApplication, QLabel, QMessageBox
from ui_fixtures import (
    engine_fixture,  # noqa: F401 (a fixture)
    window_fixture,  # noqa: F401 (a fixture)
)

from desktop_app.settings import Settings
from ui.library.attach_rows import AttachRow
from ui.settings.settings_dialog import SettingsDialog
from ui.text.markdown import DARK, LIGHT


def activate(qtbot, window):
    """Keys only reach the active window."""
    with qtbot.waitActive(window):
        window.show()
        window.activateWindow()


def current_title(window) -> str | None:
    item = window.chat_list.tree.currentItem()
    return item.text(0) if item else None


def test_enter_opens_the_chat_under_the_cursor_and_arrows_only_move_over_the_headings(
        qtbot, window):
    activate(qtbot, window)
    tree = window.chat_list.tree
    tree.setFocus()
    qtbot.keyClick(tree, Qt.Key.Key_Home)
    assert current_title(window) == "What is multi-head attention?"  # (not "Today")
    qtbot.keyClick(tree, Qt.Key.Key_Down)
    assert current_title(window) == "Summarize the release notes"  # over "Yesterday"
    qtbot.keyClick(tree, Qt.Key.Key_Up)
    qtbot.keyClick(tree, Qt.Key.Key_Up)  # (at the first chat: "Today" is no stop)
    assert current_title(window) == "What is multi-head attention?"
    qtbot.keyClick(tree, Qt.Key.Key_Down)
    assert window.chat_id is None  # moving the cursor restores nothing
    with qtbot.waitSignal(window.restored, timeout=5000):
        qtbot.keyClick(tree, Qt.Key.Key_Return)
    assert window.chats[1].title == "Summarize the release notes"
    assert window.chat_id == window.chats[1].chat_id


def test_delete_on_a_chat_or_document_row_asks_to_delete_it(qtbot, window):
    """(Only the row's menu deleted: the Delete key did nothing.) The menus show the key."""
    activate(qtbot, window)
    tree = window.chat_list.tree
    tree.setFocus()
    qtbot.keyClick(tree, Qt.Key.Key_Home)
    window.chat_list.delete_requested.disconnect()  # (the signal alone: no dialog)
    with qtbot.waitSignal(window.chat_list.delete_requested, timeout=2000) as chat:
        qtbot.keyClick(tree, Qt.Key.Key_Delete)
    assert chat.args == [window.chats[0].chat_id]
    menu = window.chat_list._chat_menu(window.chats[0].chat_id, window.chats[0].title)
    assert menu.actions()[-1].shortcut() == QKeySequence(QKeySequence.StandardKey.Delete)
    docs = window.doc_list.list
    docs.setFocus()
    docs.setCurrentRow(1)
    window.doc_list.delete_requested.disconnect()
    with qtbot.waitSignal(window.doc_list.delete_requested, timeout=2000) as doc:
        qtbot.keyClick(docs, Qt.Key.Key_Delete)
    assert doc.args == [window.documents[1].doc_id, window.documents[1].title]


def test_the_chat_menu_opens_the_chat(qtbot, window):
    chat = window.chats[2]
    menu = window.chat_list._chat_menu(chat.chat_id, chat.title)
    assert menu.actions()[0].text() == "Open"
    with qtbot.waitSignal(window.restored, timeout=5000):
        menu.actions()[0].trigger()
    assert window.chat_id == chat.chat_id


def test_the_list_keeps_its_cursor_through_refreshes(qtbot, window):
    activate(qtbot, window)
    tree = window.chat_list.tree
    with qtbot.waitSignal(window.restored, timeout=5000):
        window.chat_list._open(window.chats[0].chat_id)
    assert current_title(window) == "What is multi-head attention?"
    tree.setFocus()
    qtbot.keyClick(tree, Qt.Key.Key_Down)  # the cursor on another chat, not opened
    with qtbot.waitSignal(window.chats_changed, timeout=5000):
        window.refresh_chats()
    assert current_title(window) == "Summarize the release notes"
    assert [i.text(0) for i in tree.selectedItems()] == ["What is multi-head attention?"]
    # A new chat asked: once listed, it has the cursor as well as the highlight.
    window.new_chat()
    with qtbot.waitSignal(window.chats_changed, timeout=5000):
        with qtbot.waitSignal(window.answer_done, timeout=5000):
            window.send("A fresh question")
    assert window.chat_id is not None
    assert tree.currentItem().data(0, Qt.ItemDataRole.UserRole) == window.chat_id


def test_deleting_the_open_chat_from_the_list_leaves_the_keyboard_there(qtbot, window,
                                                                        monkeypatch):
    monkeypatch.setattr("ui.library.library_actions.QMessageBox.question",
                        lambda *a, **k: QMessageBox.StandardButton.Yes)
    activate(qtbot, window)
    tree = window.chat_list.tree
    with qtbot.waitSignal(window.restored, timeout=5000):
        window.chat_list._open(window.chats[1].chat_id)
    tree.setFocus()
    with qtbot.waitSignal(window.chats_changed, timeout=5000):
        window.delete_chat(window.chat_id)
    assert tree.hasFocus()
    assert window.chat_id is None
    assert current_title(window) == "Compare the two documents"  # (the row that followed)


def test_the_quality_slider_says_its_name_and_its_level_in_words(qtbot, window):
    slider = window.quality.slider
    assert slider.accessibleName() == "Quality vs. load time"
    with qtbot.waitSignal(window.restored, timeout=5000):
        window.chat_list._open(window.chats[0].chat_id)
    qtbot.waitUntil(lambda: "cached tokens" in slider.accessibleDescription())
    said = slider.accessibleDescription()
    assert said.startswith(f"{window.quality.level()}. Loading this chat's ")
    assert " ms" in said and "<" not in said  # its sizes and times, as plain text
    slider.setFocus()
    qtbot.keyClick(slider, Qt.Key.Key_Left)
    assert slider.accessibleDescription().startswith(f"{window.quality.level()}. ")
    assert not said.startswith(f"{window.quality.level()}. ")
    buddies = [w.buddy() for w in window.quality.findChildren(QLabel) if w.buddy()]
    assert buddies == [slider, slider]  # "fastest load" and "best quality"


def accessible_name(widget) -> str:
    return QAccessible.queryAccessibleInterface(widget).text(QAccessible.Text.Name)


def test_the_boxes_and_lists_have_names_a_screen_reader_says(window):
    window.doc_list.filter.show()
    assert {accessible_name(w) for w in (
        window.prompt, window.chat_list.search, window.doc_list.filter, window.chat_view,
        window.chat_list.tree, window.doc_list.list)} == {
        "Question", "Search chats", "Filter documents", "Conversation", "Chats", "Documents"}


def test_an_attach_rows_button_says_what_it_does_to_which_document(qtbot):
    row = AttachRow("report.pdf", "#cf222e")
    qtbot.addWidget(row)
    assert accessible_name(row.button) == "Cancel attaching report.pdf"
    assert accessible_name(row.bar) == "Attaching report.pdf"
    row.show_error("report.pdf could not be read")
    assert accessible_name(row.button) == "Dismiss report.pdf"


def test_escape_empties_the_search_typed_in_unless_an_answer_is_coming(qtbot, window,
                                                                        engine):
    activate(qtbot, window)
    search = window.chat_list.search
    search.setFocus()
    qtbot.keyClicks(search, "rel")
    qtbot.keyClick(search, Qt.Key.Key_Escape)
    assert search.text() == ""
    engine.token_s = 0.05
    window.send("a slow one")
    qtbot.waitUntil(lambda: len(window.chat_view.transcript()[-1][1]) > 10, timeout=5000)
    search.setFocus()
    qtbot.keyClicks(search, "rel")
    with qtbot.waitSignal(window.answer_done, timeout=5000) as blocker:
        qtbot.keyClick(search, Qt.Key.Key_Escape)
    assert blocker.args == [None] and search.text() == "rel"  # stopped, nothing else


def test_the_file_menu_shows_the_keys_that_work_one_binding_each(window):
    menu = window.menuBar().actions()[0].menu()
    keys = {a.text(): a.shortcut().toString() for a in menu.actions() if not a.isSeparator()}
    assert keys["&Settings…"] and keys["&Quit"]
    if not QKeySequence.keyBindings(QKeySequence.StandardKey.Preferences):
        assert keys["&Settings…"] == "Ctrl+,"
    # (a row's Delete is its list's alone: widget shortcuts never meet)
    bound = [s.key().toString() for s in window.findChildren(QShortcut)
             if s.context() != Qt.ShortcutContext.WidgetShortcut] + [
        k.toString() for a in window.actions() for k in a.shortcuts()]
    assert len(bound) == len(set(bound)), bound


def test_at_a_large_font_the_prompt_the_level_and_the_settings_fit(qtbot, window,
                                                                  monkeypatch):
    big = window.font()
    big.setPointSize(20)
    window.setFont(big)
    prompt = window.prompt
    assert prompt.height() >= 4 * prompt.fontMetrics().lineSpacing()  # (72 px: 2 lines)
    name = window.quality.name
    assert name.minimumWidth() >= name.fontMetrics().horizontalAdvance("balanced")
    from types import SimpleNamespace

    from PySide6.QtCore import QRect
    from PySide6.QtWidgets import QBoxLayout

    full_hd = SimpleNamespace(availableGeometry=lambda: QRect(0, 0, 1920, 1040))
    monkeypatch.setattr(SettingsDialog, "screen", lambda self: full_hd)
    normal = SettingsDialog(Settings())
    qtbot.addWidget(normal)
    normal.show()
    qtbot.waitExposed(normal)
    assert normal.columns.direction() == QBoxLayout.Direction.LeftToRight  # (971 px)
    app = QApplication.instance()
    usual = app.font()
    app.setFont(big)  # (as a user's desktop sets it: every widget made from then on)
    try:
        dialog = SettingsDialog(Settings())
        qtbot.addWidget(dialog)
        dialog.show()
        qtbot.waitExposed(dialog)
    finally:
        app.setFont(usual)
    # (2046 px wide at 20 pt: its columns, one above the other, scroll within the screen)
    assert dialog.columns.direction() == QBoxLayout.Direction.TopToBottom
    assert dialog.width() <= 1920 - 40
    assert dialog.scroll.widget().minimumSizeHint().width() <= 1920 - 40


def contrast(one: str, other: str) -> float:
    """WCAG's contrast ratio of two colours."""
    def luminance(color: str) -> float:
        rgb = [c / 255 for c in QColor(color).getRgb()[:3]]
        r, g, b = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * r + 0.7152 * g + 0.0722 * b
    high, low = sorted((luminance(one), luminance(other)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_muted_text_and_the_sidebars_notes_reach_4_5_to_1(window):
    for colors, base in ((LIGHT, "#ffffff"), (DARK, "#17181a")):
        for background in (base, colors.user_bg, colors.code_bg):
            # ("You" and "copy" on a user's message: 4.05 on the light theme's)
            assert contrast(colors.muted, background) >= 4.5, (colors.muted, background)
        assert contrast(colors.comment, colors.code_bg) >= 4.5
    window.doc_list.show_note("The model could not load: nothing can be attached.")
    dialog = SettingsDialog(Settings())  # (its notes were disabled labels too)
    notes = [label for label in dialog.findChildren(QLabel)
             if label.foregroundRole() == QPalette.ColorRole.PlaceholderText]
    assert len(notes) >= 7 and all(label.isEnabled() for label in dialog.findChildren(QLabel))
    for note in (window.chat_list.note, window.doc_list.hint, *notes):
        # (disabled, a screen reader calls it unavailable; and it was 2.8:1)
        assert note.isEnabled()
        palette = note.palette()
        assert contrast(palette.color(note.foregroundRole()).name(),
                        palette.color(note.backgroundRole()).name()) >= 4.5


def test_a_platform_set_to_high_contrast_gets_white_and_yellow_on_black(qtbot, monkeypatch):
    """(Following the system read only light or dark: a high-contrast palette was painted
    over with kvdesk's own.) Every colour of the rendered messages reaches 7:1."""
    from types import SimpleNamespace

    from ui import theme
    from ui.text.markdown import HIGH_CONTRAST

    def hints(preference):
        return SimpleNamespace(styleHints=lambda: SimpleNamespace(
            colorScheme=lambda: Qt.ColorScheme.Light, accessibility=lambda: SimpleNamespace(
                contrastPreference=lambda: preference)))

    monkeypatch.setattr(theme, "QGuiApplication", hints(Qt.ContrastPreference.HighContrast))
    assert theme.resolve("system") == "high-contrast"
    assert theme.resolve("light") == "light"  # (a theme chosen is kept)
    monkeypatch.setattr(theme, "QGuiApplication", hints(Qt.ContrastPreference.NoPreference))
    assert theme.resolve("system") == "light"
    older = SimpleNamespace(styleHints=lambda: SimpleNamespace(  # (Qt before 6.10: no such hint)
        colorScheme=lambda: Qt.ColorScheme.Dark))
    monkeypatch.setattr(theme, "QGuiApplication", older)
    assert theme.resolve("system") == "dark"
    app = QApplication.instance()
    try:
        assert theme.apply(app, "high-contrast") is HIGH_CONTRAST
        palette = app.palette()
        assert palette.color(QPalette.ColorRole.Window).name() == "#000000"
        assert contrast(palette.color(QPalette.ColorRole.WindowText).name(), "#000000") >= 7
    finally:
        theme.apply(app, "light")
    c = HIGH_CONTRAST
    for color in (c.text, c.muted, c.link, c.keyword, c.string, c.comment, c.number, c.error):
        for background in ("#000000", c.user_bg, c.code_bg):
            assert contrast(color, background) >= 7, (color, background)


def test_the_document_list_keeps_its_cursor_on_its_document_or_the_row_after(qtbot):
    """(The cursor was kept by row number: the last document deleted left no row current, a
    keyboard user lost their place; a document listed above moved the cursor off its own.)"""
    from desktop_app.results import DocumentInfo
    from ui.library.document_list import ID_ROLE, DocumentList

    def doc(i):
        return DocumentInfo(i, f"doc{i}.md", "md", 100, 100, {}, "ready", 0.0)

    docs = DocumentList()
    qtbot.addWidget(docs)

    def current():
        return docs.list.currentItem().data(ID_ROLE) if docs.list.currentItem() else None

    docs.set_documents([doc(1), doc(2), doc(3)], checked=set())
    docs.list.setCurrentRow(2)
    docs.set_documents([doc(1), doc(2)], checked=set())  # (the last one deleted)
    assert current() == 2
    docs.list.setCurrentRow(0)
    docs.set_documents([doc(4), doc(1), doc(2)], checked=set())  # (a new one listed first)
    assert current() == 1
    docs.set_documents([doc(4), doc(2)], checked=set())  # (the current one deleted)
    assert current() == 2
