"""A source shown in its document: the passages around it, it highlighted and scrolled to.

Presentation only: the passages come from the engine (`EngineAPI.passages_around`), on a
worker thread, before this dialog is made.
"""

from __future__ import annotations

import html

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QTextBrowser, QVBoxLayout

from desktop_app.results import Source

from ..text.markdown import Colors


class DocumentView(QDialog):
    def __init__(self, title: str, total: int, passages: list[Source], shown: Source,
                 colors: Colors, parent=None):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.resize(760, 620)
        first, last = passages[0].index + 1, passages[-1].index + 1
        self.span = QLabel(f"{title}: passages {first:,}-{last:,} of {total:,}, around "
                           f"{shown.location}")
        self.text = QTextBrowser(openLinks=False)
        blocks = []
        for p in passages:
            where = html.escape(" › ".join([*p.heading, p.location]))
            it = p.index == shown.index
            style = f"background:{colors.user_bg};" if it else ""
            label = (f'<b style="color:{colors.link}">{where} — the source</b>' if it else where)
            blocks.append(f'<a name="p{p.index}"></a><p style="color:{colors.muted};'
                          f'font-size:small">{label}</p><div style="white-space:pre-wrap;'
                          f'{style}">{html.escape(p.text)}</div>')
        self.text.setHtml("".join(blocks))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.span)
        layout.addWidget(self.text, 1)
        layout.addWidget(buttons)
        self.text.scrollToAnchor(f"p{shown.index}")
