"""Light and dark appearance: the Qt palette, and the colours of rendered messages to match.

"system" follows the platform's colour scheme (Qt's style hints); "light" and "dark" force one.
Every theme uses the Fusion style with our own palette, since Fusion honours a custom palette
on every platform and the rendered messages must match the widgets around them.

This module only paints: it never reads or writes settings.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QLabel, QProxyStyle, QStyle, QStyleFactory

from .text.markdown import DARK, LIGHT, Colors

_DARK_ROLES = {
    QPalette.ColorRole.Window: "#202124",
    QPalette.ColorRole.WindowText: "#e6edf3",
    QPalette.ColorRole.Base: "#17181a",
    QPalette.ColorRole.AlternateBase: "#26282b",
    QPalette.ColorRole.ToolTipBase: "#2d2f33",
    QPalette.ColorRole.ToolTipText: "#e6edf3",
    QPalette.ColorRole.PlaceholderText: "#8d96a0",
    QPalette.ColorRole.Text: "#e6edf3",
    QPalette.ColorRole.Button: "#2b2d31",
    QPalette.ColorRole.ButtonText: "#e6edf3",
    QPalette.ColorRole.BrightText: "#ff7b72",
    QPalette.ColorRole.Link: "#4493f8",
    QPalette.ColorRole.Highlight: "#2f6feb",
    QPalette.ColorRole.HighlightedText: "#ffffff",
}
_LIGHT_ROLES = {
    QPalette.ColorRole.Window: "#f6f7f9",
    QPalette.ColorRole.WindowText: "#1f2328",
    QPalette.ColorRole.Base: "#ffffff",
    QPalette.ColorRole.AlternateBase: "#f0f2f5",
    QPalette.ColorRole.ToolTipBase: "#ffffff",
    QPalette.ColorRole.ToolTipText: "#1f2328",
    QPalette.ColorRole.PlaceholderText: "#656d76",  # (also notes' text: 4.5:1 on Window)
    QPalette.ColorRole.Text: "#1f2328",
    QPalette.ColorRole.Button: "#eceef1",
    QPalette.ColorRole.ButtonText: "#1f2328",
    QPalette.ColorRole.BrightText: "#cf222e",
    QPalette.ColorRole.Link: "#0969da",
    QPalette.ColorRole.Highlight: "#0969da",
    QPalette.ColorRole.HighlightedText: "#ffffff",
}


# Fusion outlines a check box or radio button in the window colour darkened, which on the dark
# base is the base itself: an unticked box vanished. Indicators are outlined from this instead.
_DARK_INDICATOR_WINDOW = "#a4acb5"
_INDICATORS = (QStyle.PrimitiveElement.PE_IndicatorCheckBox,
               QStyle.PrimitiveElement.PE_IndicatorRadioButton)


class _Style(QProxyStyle):
    """Fusion, with indicators whose outline shows on the dark palette too."""

    def __init__(self, mode: str):
        super().__init__(QStyleFactory.create("Fusion"))
        self.mode = mode

    def drawPrimitive(self, element, option, painter, widget=None):  # noqa: N802 (Qt's name)
        if self.mode == "dark" and element in _INDICATORS:
            option = type(option)(option)
            palette = QPalette(option.palette)
            palette.setColor(QPalette.ColorRole.Window, QColor(_DARK_INDICATOR_WINDOW))
            option.palette = palette
        super().drawPrimitive(element, option, painter, widget)


def muted_label() -> QLabel:
    """A note, hidden until it has something to say: muted, yet enabled (a screen reader calls
    a disabled label unavailable), in the palette's colour for it (4.5:1 on the window)."""
    label = QLabel(wordWrap=True, visible=False)
    label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
    return label


def resolve(theme: str) -> str:
    """"light" or "dark": what `theme` ("system", "light" or "dark") means here and now."""
    if theme != "system":
        return theme
    scheme = QGuiApplication.styleHints().colorScheme()
    return "dark" if scheme == Qt.ColorScheme.Dark else "light"


def apply(app: QApplication, theme: str) -> Colors:
    """Paint the whole application in `theme`; returns the matching message colours."""
    mode = resolve(theme)
    app.setStyle(_Style(mode))
    palette = QPalette()
    for role, color in (_DARK_ROLES if mode == "dark" else _LIGHT_ROLES).items():
        palette.setColor(role, QColor(color))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText,
                 QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#8d96a0"))
    app.setPalette(palette)
    return DARK if mode == "dark" else LIGHT
