"""A web page's visible text, as `chat.documents` reads a web page (or an EPUB chapter:
`ebooks`): its text without scripts, styles or markup, the page's line each line of the text
starts on, and its h1-h6 headings.

It only parses the markup it is given: it never reads a file, never normalizes the text (the
caller does, `documents.html_page`) and never follows a link.
"""

from __future__ import annotations

import html.parser


class VisibleText(html.parser.HTMLParser):
    """A page's visible text, the file's line each of its lines starts on, and its h1-h6
    headings (by the lines of the text they take): a page's own headings, never a line that
    only looks like one ("# not a title" in a paragraph)."""

    SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
             "section", "article", "blockquote", "table", "ul", "ol", "hr", "dt", "dd"}
    HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        # Per line of the text: the file's line its first visible character is on (None: none)
        self.sources: list[int | None] = [None]
        self.headings: list[tuple[int, int, int, str]] = []  # (first, last line, level, title)
        self._heading: tuple[int, int, list[str]] | None = None  # (level, first line, text)
        self._skip = 0
        self._in_title = False

    def _emit(self, data: str, line: int | None = None) -> None:
        """`data` added to the text; `line`: the file's line it starts on."""
        self.parts.append(data)
        for k, segment in enumerate(data.split("\n")):
            if k:
                self.sources.append(None)
            if line is not None and self.sources[-1] is None and segment.strip():
                self.sources[-1] = line + k

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self._in_title = True
        elif tag in self.SKIP:
            self._skip += 1
        elif tag in self.BLOCK:
            # A heading holds no block: one left open ends where the next block starts (a
            # heading too), not at the end of the page with all that follows as its title.
            self._close_heading()
            self._emit("\n")
            if tag in self.HEADINGS and not self._skip:
                self._heading = (self.HEADINGS[tag], len(self.sources) - 1, [])

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        elif tag in self.SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in self.BLOCK:
            if tag in self.HEADINGS:
                self._close_heading()
            self._emit("\n")

    def _close_heading(self) -> None:
        if self._heading is not None:
            level, first, text = self._heading
            title = " ".join("".join(text).split())
            if title:
                self.headings.append((first, len(self.sources) - 1, level, title))
            self._heading = None

    def handle_data(self, data):
        if self._in_title:
            self.title.append(data)
        elif not self._skip:
            self._emit(data, self.getpos()[0])
            if self._heading is not None:
                self._heading[2].append(data)
