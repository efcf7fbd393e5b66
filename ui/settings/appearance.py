"""The settings dialog's appearance fields: the theme, and the text size as a percentage of
the platform's font (what the window's View ▸ Larger text / Smaller text steps through).

Each holds one setting's value and gives it back; they never apply it (the main window paints,
`ui.theme`) nor save it.
"""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QSpinBox

from desktop_app.settings import TEXT_SCALES

from ..theme import TEXT_STEP

THEMES = {"system": "Follow the system", "light": "Light", "dark": "Dark",
          "high-contrast": "High contrast"}


class ThemeBox(QComboBox):
    def __init__(self, theme: str):
        super().__init__()
        for key, label in THEMES.items():
            self.addItem(label, key)
        self.setCurrentIndex(list(THEMES).index(theme))


class TextSizeBox(QSpinBox):
    """The text size in whole percents, in the window's steps (typed, any percent between)."""

    def __init__(self, scale: float):
        super().__init__(minimum=round(TEXT_SCALES[0] * 100), maximum=round(TEXT_SCALES[1] * 100),
                         singleStep=round(TEXT_STEP * 100), suffix=" %")
        self.setAccessibleName("Text size")
        self.setToolTip("The window's text, from the system's font size (100 %). The View menu "
                        "changes it too: Ctrl++ larger, Ctrl+- smaller, Ctrl+0 actual size.")
        self._scale = scale
        self.setValue(round(scale * 100))

    def scale(self) -> float:
        """The size chosen, as the setting holds it (one set to, say, 1.234 in the settings
        file, shown as 123 %, stays 1.234 unless changed)."""
        return self._scale if self.value() == round(self._scale * 100) else self.value() / 100
