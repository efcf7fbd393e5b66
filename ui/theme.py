"""Light and dark appearance: the Qt palette, and the colours of rendered messages to match;
and the text's size, the platform's font scaled (`scale_text`, View ▸ Larger text).

"system" follows the platform's colour scheme and its contrast preference (Qt's style hints:
a platform set to high contrast gets "high-contrast", white and yellow on black, every text
at 7:1 or more); "light", "dark" and "high-contrast" force one.
Every theme uses the Fusion style with our own palette, since Fusion honours a custom palette
on every platform and the rendered messages must match the widgets around them.

This module only paints: it never reads or writes settings.
"""

from __future__ import annotations

import math

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QLabel, QProxyStyle, QStyle, QStyleFactory

from desktop_app.settings import TEXT_SCALES

from .text.markdown import DARK, HIGH_CONTRAST, LIGHT, Colors

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
_HIGH_CONTRAST_ROLES = {
    QPalette.ColorRole.Window: "#000000",
    QPalette.ColorRole.WindowText: "#ffffff",
    QPalette.ColorRole.Base: "#000000",
    QPalette.ColorRole.AlternateBase: "#1a1a1a",
    QPalette.ColorRole.ToolTipBase: "#000000",
    QPalette.ColorRole.ToolTipText: "#ffffff",
    QPalette.ColorRole.PlaceholderText: "#d0d0d0",
    QPalette.ColorRole.Text: "#ffffff",
    QPalette.ColorRole.Button: "#000000",
    QPalette.ColorRole.ButtonText: "#ffffff",
    QPalette.ColorRole.BrightText: "#ff8080",
    QPalette.ColorRole.Link: "#ffff00",
    QPalette.ColorRole.Highlight: "#ffff00",
    QPalette.ColorRole.HighlightedText: "#000000",
}
# Fusion draws fields' and buttons' frames in the window colour darkened: on black, none.
_HIGH_CONTRAST_FRAMES = ("QLineEdit, QPlainTextEdit, QTextEdit, QTextBrowser, QComboBox, "
                         "QSpinBox, QDoubleSpinBox, QPushButton, QToolButton "
                         "{ border: 1px solid #ffffff; } QPushButton { padding: 3px 10px; }")
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
        if self.mode != "light" and element in _INDICATORS:
            option = type(option)(option)
            palette = QPalette(option.palette)
            palette.setColor(QPalette.ColorRole.Window, QColor(_DARK_INDICATOR_WINDOW))
            option.palette = palette
        super().drawPrimitive(element, option, painter, widget)


def muted_label() -> QLabel:
    """A note, hidden until it has something to say (`muted`)."""
    return muted(QLabel(wordWrap=True, visible=False))


def muted(label: QLabel) -> QLabel:
    """`label` as a note: muted, yet enabled (a screen reader calls a disabled label
    unavailable), in the palette's colour for it (4.5:1 on the window)."""
    label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
    return label


def resolve(theme: str) -> str:
    """"light", "dark" or "high-contrast": what `theme` means here and now."""
    if theme != "system":
        return theme
    hints = QGuiApplication.styleHints()
    # (Qt 6.10 on: an older Qt, which the gui extra allows, says nothing of contrast)
    accessibility = getattr(hints, "accessibility", None)
    if accessibility is not None and (accessibility().contrastPreference()
                                      == Qt.ContrastPreference.HighContrast):
        return "high-contrast"
    return "dark" if hints.colorScheme() == Qt.ColorScheme.Dark else "light"


def apply(app: QApplication, theme: str) -> Colors:
    """Paint the whole application in `theme`; returns the matching message colours."""
    mode = resolve(theme)
    app.setStyle(_Style(mode))
    palette = QPalette()
    roles = {"dark": _DARK_ROLES, "high-contrast": _HIGH_CONTRAST_ROLES}.get(mode, _LIGHT_ROLES)
    for role, color in roles.items():
        palette.setColor(role, QColor(color))
    disabled = "#a0a0a0" if mode == "high-contrast" else "#8d96a0"
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText,
                 QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(disabled))
    app.setPalette(palette)
    app.setStyleSheet(_HIGH_CONTRAST_FRAMES if mode == "high-contrast" else "")
    return {"dark": DARK, "high-contrast": HIGH_CONTRAST}.get(mode, LIGHT)


TEXT_STEP = 0.1  # each Larger text / Smaller text: 10 % of the platform's font
_UNSCALED, _SCALED = "kvdesk_unscaled_font", "kvdesk_scaled_font"  # (the app's properties)


def text_step(scale: float, steps: int) -> float:
    """`scale` moved `steps` 10 % steps (from off the steps' grid, 1.15, to the next step up or
    down, 1.2 or 1.1), within the settings' bounds."""
    # (a hair's tolerance: 1.1 / 0.1 is 11.000000000000002, already on the grid)
    tenths = scale / TEXT_STEP
    start = math.floor(tenths + 1e-6) if steps > 0 else math.ceil(tenths - 1e-6)
    return min(max(round((start + steps) * TEXT_STEP, 2), TEXT_SCALES[0]), TEXT_SCALES[1])


def scaled(font: QFont, factor: float) -> QFont:
    """`font` `factor` times as large, in points or, where the platform gave it so, pixels."""
    font = QFont(font)
    if font.pointSizeF() > 0:
        font.setPointSizeF(font.pointSizeF() * factor)
    else:
        font.setPixelSize(max(1, round(font.pixelSize() * factor)))
    return font


def scale_text(app: QApplication, scale: float) -> None:
    """The application's font (every widget, dialog and menu sized by the platform's font) at
    `scale` times the platform's. At 1 with nothing scaled yet the font is left alone: Qt stops
    following the platform's font changes once a font is set. One set since by other code (a
    test) is taken as the new unscaled font."""
    unscaled, last = app.property(_UNSCALED), app.property(_SCALED)
    if unscaled is None or app.font() != last:
        if scale == 1:
            return
        unscaled = app.font()
        app.setProperty(_UNSCALED, unscaled)
    app.setFont(scaled(unscaled, scale))
    app.setProperty(_SCALED, app.font())
    if sheet := app.styleSheet():  # (high contrast's frames: under a style sheet the widgets
        app.setStyleSheet(sheet)  # take a new application font only when it is set again)
