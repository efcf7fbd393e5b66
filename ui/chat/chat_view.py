"""The conversation: a transcript rendered from Markdown that grows while an answer streams,
and the input box under it.

The transcript is one QTextBrowser. Finished messages are rendered once and kept as HTML; while
an answer streams, tokens are buffered and the page is redrawn at most every RENDER_MS, so a
fast model cannot flood the GUI thread with redraws. Actions (copy, copy code, regenerate) are
links in the page.

These widgets never call the engine; they emit signals and show what they are given.
"""

from __future__ import annotations

import html

from PySide6.QtCore import QEvent, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QGuiApplication, QKeyEvent, QKeySequence, QTextCursor, QTextDocument
from PySide6.QtWidgets import QPlainTextEdit, QTextBrowser, QWidget

from desktop_app.results import BEST, EARLIER, MessageInfo, Source

from ..text.formatting import answer_note
from ..text.markdown import LIGHT, Colors, render

RENDER_MS = 40

WELCOME = """
<p style="font-size:x-large"><b>Ask about your documents</b></p>
<p>Attach files with the paperclip or drop them on the window; kvdesk reads each one once and keeps
its compressed cache, so reopening a chat later answers at once.</p>
<p>Enter sends, Shift+Enter adds a line, Esc stops an answer, Ctrl+N starts a new chat,
Ctrl+K searches chats.</p>
"""


class ChatView(QTextBrowser):
    regenerate_requested = Signal()
    copied = Signal(str)  # what was put on the clipboard: "message" | "code"
    in_document = Signal(object)  # a Source to show in its document

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("Conversation")
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._link)
        self.colors: Colors = LIGHT
        self._messages: list[MessageInfo] = []
        self._notes: dict[int, str] = {}  # message index -> a muted line under it (stats)
        self._html: list[str] = []  # rendered finished messages
        self._code: list[list[str]] = []  # per message, its code blocks' text
        self._streaming: str | None = None  # the answer being generated, or None
        self._blank = WELCOME  # what an empty conversation shows
        self._timer = QTimer(self, singleShot=True, interval=RENDER_MS)
        self._timer.timeout.connect(self._render_streaming)
        self._stream_at = 0  # where the streaming answer starts in the document
        self._open_source: tuple[int, int] | None = None  # (message, source) shown in full
        self.doc_titles: dict[int, str] = {}  # names a source's document among several
        self.attached: set[int] | None = None  # the documents still attached (None: unknown)
        self.chat_docs: tuple[int, ...] = ()  # the documents of the chat shown
        # Whether the view follows the end of the page as it grows: the user is at the end
        # (or has just opened the chat), not reading further up; else where they read is
        # kept. The page is laid out after setHtml returns, a piece at a time, so both are
        # applied again as its range grows.
        self._follow = True
        self._rendering = False
        self._reading_at = 0
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._grown)
        self._render()

    # -- what the window tells it -----------------------------------------------------------

    def set_doc_titles(self, titles: dict[int, str], attached: set[int] | None = None) -> None:
        """The documents' titles, which sources over several documents name, and which of them
        are still attached (a deleted one's source is not offered in its document)."""
        if titles != self.doc_titles or attached != self.attached:
            self.doc_titles, self.attached = titles, attached
            self._sources_changed()

    def set_chat_documents(self, doc_ids) -> None:
        """The documents the chat shown is about: over several, each source names its own,
        whichever documents an answer's sources come from."""
        if tuple(doc_ids) != self.chat_docs:
            self.chat_docs = tuple(doc_ids)
            self._sources_changed()

    def _sources_changed(self) -> None:
        if self._streaming is None and any((m.stats or {}).get("sources")
                                            for m in self._messages):
            self.set_messages(self._messages, dict(self._notes))

    def set_colors(self, colors: Colors) -> None:
        self.colors = colors
        self.set_messages(self._messages, dict(self._notes))

    def set_messages(self, messages: list[MessageInfo], notes: dict[int, str] | None = None,
                     ) -> None:
        self._messages = list(messages)
        self._notes = dict(notes or {})
        self._streaming = None
        self._open_source = None  # a source shown belongs to the chat it was opened in
        self._follow = True  # a chat opens at its end
        self._html, self._code = [], []
        for i in range(len(self._messages)):
            self._render_message(i)
        self._render()

    def show_found(self, text: str) -> bool:
        """Scroll to the last place the page holds `text` (in any case), found by a chat
        search, and select it there, marked; the view stays there as the page is laid out.
        False where it holds none (the search found the chat's title)."""
        found = self.document().find(text, self.document().characterCount(),
                                     QTextDocument.FindFlag.FindBackward)
        if found.isNull():
            return False
        self.setTextCursor(found)
        self._follow = False  # (not the chat's end, where a chat opens)
        self.ensureCursorVisible()
        self._reading_at = self.verticalScrollBar().value()
        return True

    def add_user_message(self, text: str) -> None:
        self._append(MessageInfo(message_id=-1, role="user", text=text, created=0.0))

    def begin_answer(self) -> None:
        self._streaming = ""
        self._render()

    def append_token(self, piece: str) -> None:
        if self._streaming is None:
            return
        self._streaming += piece
        if not self._timer.isActive():
            self._timer.start()

    def end_answer(self, text: str | None = None, note: str = "",
                   cited: dict | None = None) -> None:
        """Finish the streamed answer: `text` is the final answer (None: what streamed so far),
        `note` a muted line under it, `cited` what it was given over a long document
        (AskResult's "sources", "read_whole" and "evidence")."""
        final = text if text is not None else (self._streaming or "")
        self._streaming = None
        self._timer.stop()
        if final or note:
            self._append(MessageInfo(message_id=-1, role="assistant", text=final, created=0.0,
                                     stats=cited if cited and any(cited.values()) else None),
                         note)
        else:
            self._render()

    def drop_last_answer(self, with_question: bool = False) -> None:
        """Remove the last assistant message (it is being regenerated), and the question
        before it too `with_question` (it is asked again, as a new question)."""
        dropped = False
        for role in ("assistant", "user") if with_question else ("assistant",):
            if self._messages and self._messages[-1].role == role:
                for store in (self._messages, self._html, self._code):
                    store.pop()
                self._notes.pop(len(self._messages), None)
                dropped = True
        if dropped:
            self._render()

    @property
    def streaming(self) -> bool:
        return self._streaming is not None

    def transcript(self) -> list[tuple[str, str]]:
        """(role, text) of every message shown, the streaming one included."""
        shown = [(m.role, m.text) for m in self._messages]
        return shown + ([("assistant", self._streaming)] if self._streaming is not None else [])

    # -- rendering --------------------------------------------------------------------------

    def _append(self, message: MessageInfo, note: str = "") -> None:
        cited = self._cited_docs()
        self._messages.append(message)
        if note:
            self._notes[len(self._messages) - 1] = note
        # the previous last message loses its "regenerate" link; all, their sources naming
        # their documents, once an answer's come from one of another document
        again = len(self._html) if self._cited_docs() - cited - set(self.chat_docs) else 1
        for i in range(max(0, len(self._html) - again), len(self._html)):
            self._render_message(i)
        self._render_message(len(self._messages) - 1)
        self._render()

    def _render_message(self, i: int) -> None:
        m, c = self._messages[i], self.colors
        rendered = render(m.text, c, code_link=lambda j: f"kvdesk:code/{i}/{j}")
        last_answer = i == len(self._messages) - 1 and m.role == "assistant"
        links = [f'<a href="kvdesk:copy/{i}" style="color:{c.muted}">copy</a>']
        if last_answer:
            links.append(f'<a href="kvdesk:regenerate" style="color:{c.muted}">regenerate</a>')
        # (a stored answer has no note of the live one's: its stats say what stays true)
        note = self._notes.get(i) or (answer_note(m.stats) if m.role == "assistant"
                                      and "tokens_generated" in (m.stats or {}) else "")
        footer = (f'<p style="color:{c.muted};font-size:small">'
                  + (f"{html.escape(note)} · " if note else "") + " · ".join(links) + "</p>")
        page = self._message_html(m.role, rendered.html, self._sources_html(i) + footer)
        if i < len(self._html):
            self._html[i], self._code[i] = page, rendered.code_blocks
        else:
            self._html.append(page)
            self._code.append(rendered.code_blocks)

    def _sources_html(self, i: int) -> str:
        """An answer over a long document's sources: the documents it was given whole, by
        title, and a link to each passage; the one clicked shown in full under them, with
        where it is in the document."""
        stats = self._messages[i].stats or {}
        sources = [Source.from_dict(d) for d in stats.get("sources") or ()]
        wholes = [f"{html.escape(d['title'])} (read whole)" for d in stats.get("read_whole") or ()]
        if not sources and not wholes:
            return ""
        c = self.colors
        # Over several documents (the chat's, or those any of its answers' sources are from: a
        # document deleted since), every answer's sources name theirs, these ones too.
        several = bool(wholes) or len({*self.chat_docs, *self._cited_docs()}) > 1

        def where(s: Source) -> str:  # its number too, as the exports say it: two passages
            # on one page differ ("safety_report.pdf #464, page 67")
            title = self.doc_titles.get(s.document_id, f"document {s.document_id}")
            return f"{f'{title} ' if several else ''}#{s.index}, {s.location}"

        # (a passage an earlier question retrieved, still in the context: said, not hidden;
        # its nearest heading says what it is about, as `kvdesk ask` prints the whole path)
        # Numbered in the order the model read them (as the CLI and the exports number
        # them): the one retrieval scored above the others for this question is marked, [1]
        # being often not it.
        best = Source.best(sources)
        links = [f'<a href="kvdesk:source/{i}/{j}" style="color:{c.muted}">'
                 + ("<b>" if j == best else "") + f"[{j + 1}] "
                 f"{html.escape(where(s))}{f' {html.escape(s.heading[-1])}' if s.heading else ''}"
                 f"{f' ({EARLIER})' if s.earlier else ''}"
                 + (f" ({BEST})</b>" if j == best else "") + "</a>"
                 for j, s in enumerate(sources)]
        out = (f'<p style="color:{c.muted};font-size:small">Sources: '
               f'{" · ".join([*wholes, *links])}</p>')
        # What the question's turn quoted of them (the CLI and the exports say it too), and
        # from which of them: the lines that name what it asks about.
        for quote in stats.get("evidence") or ():
            flat = " ".join(quote.split())
            among = [j for j, s in enumerate(sources) if flat in " ".join(s.text.split())]
            out += (f'<p style="color:{c.muted};font-size:small">Quoted with the question'
                    + (f" from [{among[0] + 1}]" if among else "")
                    + f": “{html.escape(flat)}”</p>")
        if self._open_source is not None and self._open_source[0] == i \
                and self._open_source[1] < len(sources):
            s = sources[self._open_source[1]]
            place = " › ".join([*s.heading, where(s)])
            # pre-wrap: a passage of code keeps its indentation, long lines still wrap
            link = f"kvdesk:document/{i}/{self._open_source[1]}"
            gone = self.attached is not None and s.document_id not in self.attached
            out += (f'<blockquote style="color:{c.muted}"><b>{html.escape(place)}</b>'
                    f'<div style="white-space:pre-wrap">{html.escape(s.text)}</div>'
                    + ("<p><i>(document removed)</i></p>" if gone else
                       f'<p><a href="{link}" style="color:{c.link}">Show it in its document</a>'
                       "</p>") + "</blockquote>")
        return out

    def _cited_docs(self) -> set[int]:
        """The documents the sources of the chat's answers come from."""
        return {d["document_id"] for m in self._messages
                for d in (m.stats or {}).get("sources") or ()}

    def _message_html(self, role: str, body: str, footer: str) -> str:
        c = self.colors
        who = "You" if role == "user" else "kvdesk"
        head = f'<p style="color:{c.muted};font-size:small"><b>{who}</b></p>'
        if role == "user":
            return (f'<table width="100%" cellpadding="8" cellspacing="0" bgcolor="{c.user_bg}">'
                    f"<tr><td>{head}{body}{footer}</td></tr></table><p></p>")
        return f"{head}{body}{footer}"

    def _scrolled(self, value: int) -> None:
        if not self._rendering:  # the user's scrolling, not a page being replaced
            self._follow = value >= self.verticalScrollBar().maximum() - 4
            self._reading_at = value

    def _grown(self, _low: int, high: int) -> None:
        # (a value clamped by a range not grown yet is not the user's)
        was, self._rendering = self._rendering, True
        try:
            self.verticalScrollBar().setValue(high if self._follow
                                              else min(self._reading_at, high))
        finally:
            self._rendering = was

    def show_blank(self, heading: str | None = None, text: str = "") -> None:
        """What an empty conversation shows: `heading` and `text` (why nothing can be asked),
        or the welcome (None)."""
        self._blank = WELCOME if heading is None else (
            f'<p style="font-size:x-large"><b>{html.escape(heading)}</b></p>'
            f"<p>{html.escape(text)}</p>")
        self._render()

    def _render(self) -> None:
        """Lay out every finished message, then the answer being streamed, if any."""
        parts = list(self._html) or ([] if self._streaming is not None else [self._blank])
        self._rendering = True
        try:
            self.setHtml(f'<div style="color:{self.colors.text}">{"".join(parts)}</div>')
        finally:
            self._rendering = False
        self._stream_at = self.document().characterCount() - 1
        if self._streaming is not None:
            self._render_streaming()
        else:
            self._grown(0, self.verticalScrollBar().maximum())

    def _render_streaming(self) -> None:
        """Replace only the streamed answer at the end of the document.

        Re-setting the whole transcript on every tick made each redraw cost as much as the
        conversation is long (55 ms seen on a long chat); editing the tail keeps it small.
        """
        if self._streaming is None:
            return
        body = render(self._streaming, self.colors).html if self._streaming else ""
        thinking = f'<p style="color:{self.colors.muted}">▍</p>'
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._stream_at)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        self._rendering = True
        try:
            cursor.insertHtml(f'<div style="color:{self.colors.text}">'
                              f'{self._message_html("assistant", body, thinking)}</div>')
        finally:
            self._rendering = False
        self._grown(0, self.verticalScrollBar().maximum())

    def _link(self, url: QUrl) -> None:
        target = url.toString().removeprefix("kvdesk:")
        kind, _, rest = target.partition("/")
        if kind == "regenerate":
            self.regenerate_requested.emit()
        elif kind == "copy":
            QGuiApplication.clipboard().setText(self._messages[int(rest)].text)
            self.copied.emit("message")
        elif kind == "source":  # a second click on the same source hides it
            shown = tuple(map(int, rest.split("/")))
            before = self._open_source
            self._open_source = None if before == shown else shown
            for i in {x[0] for x in (before, self._open_source) if x is not None}:
                self._render_message(i)
            self._render()
        elif kind == "document":
            i, j = map(int, rest.split("/"))
            self.in_document.emit(Source.from_dict(self._messages[i].stats["sources"][j]))
        elif kind == "code":
            i, j = map(int, rest.split("/"))
            QGuiApplication.clipboard().setText(self._code[i][j])
            self.copied.emit("code")


class PromptEdit(QPlainTextEdit):
    """The input box: Enter sends, Shift+Enter adds a line."""

    submitted = Signal(str)
    # Window shortcuts that a text edit would otherwise take for itself (Ctrl+K deletes to
    # the end of the line in Qt's editing keys).
    WINDOW_KEYS = (QKeySequence("Ctrl+K"), QKeySequence("Ctrl+N"))

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setPlaceholderText("Ask about your documents…   Enter sends, Shift+Enter adds a line")
        self.setAccessibleName("Question")  # (a placeholder is no name to a screen reader)
        self.setTabChangesFocus(True)
        self._fit_height()

    def _fit_height(self) -> None:
        """Four lines of its font, whatever its size."""
        margins = self.contentsMargins().top() + self.contentsMargins().bottom()
        self.setFixedHeight(4 * self.fontMetrics().lineSpacing() + margins
                            + 2 * int(self.document().documentMargin()))

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._fit_height()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ShortcutOverride and QKeySequence(
                event.keyCombination()) in self.WINDOW_KEYS:
            event.ignore()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            text = self.toPlainText().strip()
            if text:
                self.submitted.emit(text)
            return
        super().keyPressEvent(event)
