"""The quality-vs-speed slider: from the fastest load (the most compressed cache level) to the
best quality (the least compressed), and its tooltip with the expected load time and size.

It only maps a position to one of the engine's level names and formats an estimate it is
given; it never calls the engine.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSlider, QWidget

from desktop_app.results import RestoreEstimate, size_text

# (README, "For the same answer every time": a lossy level's greedy answer parts from a
# re-read's somewhere, often within its first sentence on a small model)
_FIDELITY = ("Only lossless answers exactly as reading the text again would; the other levels "
             "answer from a close copy of the cache, and may word an answer otherwise.")


class QualitySlider(QWidget):
    changed = Signal(str)  # the level now selected

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        # (a screen reader reads its value as a bare position: the level's name, with what it
        # costs, is its description)
        self.slider = QSlider(Qt.Orientation.Horizontal, minimumWidth=120, pageStep=1,
                              accessibleName="Quality vs. load time")
        self.slider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.name = QLabel()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("fastest load", buddy=self.slider))  # (its labels, to a reader)
        layout.addWidget(self.slider)
        layout.addWidget(QLabel("best quality", buddy=self.slider))
        layout.addWidget(self.name)
        self._levels: tuple[str, ...] = ()  # fastest first, as the slider reads left to right
        self._estimate: RestoreEstimate | None = None
        self.slider.valueChanged.connect(self._moved)
        self.set_levels(())

    def set_levels(self, levels_best_first: tuple[str, ...]) -> None:
        """The engine's levels, best first; the slider starts at the best lossy one, since
        lossless caches are several times larger for a difference rarely seen in answers."""
        self._levels = tuple(reversed(levels_best_first))
        start = len(self._levels) - 1 - (levels_best_first[:1] == ("lossless",))
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(0, len(self._levels) - 1))
        self.slider.setValue(max(0, start))
        self.slider.blockSignals(False)
        self.setEnabled(bool(self._levels))
        self._fit_name()
        self._moved()

    def _fit_name(self) -> None:
        """The level's label as wide as the longest level's name in its font: never cut."""
        metrics = self.name.fontMetrics()
        self.name.setMinimumWidth(max((metrics.horizontalAdvance(level) for level in
                                       self._levels), default=0) + metrics.averageCharWidth())

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._fit_name()

    def level(self) -> str:
        """The selected level, or "auto" before the engine said which levels it has."""
        return self._levels[self.slider.value()] if self._levels else "auto"

    def set_level(self, level: str) -> None:
        self.slider.setValue(self._levels.index(level))

    def set_estimate(self, estimate: RestoreEstimate | None) -> None:
        self._estimate = estimate
        self._update_tooltip()

    def _moved(self) -> None:
        self.name.setText(self.level() if self._levels else "")
        self._update_tooltip()
        if self._levels:
            self.changed.emit(self.level())

    def _update_tooltip(self) -> None:
        est = self._estimate
        if est is None or not est.tokens:
            tip = said = "How chats are loaded: the most compressed cache loads fastest."
        else:
            rows, costs = [], []
            for level in reversed(self._levels):
                if level not in est.bytes:
                    continue
                size, ms = size_text(est.bytes[level]), est.seconds.get(level, 0) * 1000
                cells = (f"<td>{level}</td><td align=right>{size}</td>"
                         f"<td align=right>~{ms:,.0f} ms</td>")
                rows.append(f"<tr><td>{'▶' if level == self.level() else ''}</td>{cells}</tr>")
                costs.append(f"{level}, {size}, about {ms:,.0f} ms")
            tip = (f"<p>Loading this chat's {est.tokens:,} cached tokens:</p>"
                   f"<table cellspacing=4>{''.join(rows)}</table>")
            said = f"Loading this chat's {est.tokens:,} cached tokens: {'; '.join(costs)}."
        tip, said = f"{tip}<p>{_FIDELITY}</p>", f"{said} {_FIDELITY}"
        self.setToolTip(tip)
        self.slider.setToolTip(tip)
        # (the level first: what a screen reader says as the slider moves)
        self.slider.setAccessibleDescription(
            f"{self.level()}. {said}" if self._levels else said)
