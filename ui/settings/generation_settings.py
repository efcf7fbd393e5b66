"""The settings dialog's "Answers" group: how answers are generated (temperature, top-k,
top-p, min-p, repetition penalty and its window, longest answer).

Each value is a spin box whose lowest position reads "default": the value is then not set,
and comes from the model file's recommendation or kvdesk's defaults (`sampling.resolve`), so
saving the dialog never pins today's defaults. Ranges and help texts come from
`options.GenerationOptions`, the one declaration every front end checks against; values this
group does not show (the presence and frequency penalties, a seed) are kept as they were.
"""

from __future__ import annotations

from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from desktop_app.model.sampling import DEFAULTS
from desktop_app.options import GenerationOptions
from desktop_app.validation import parse

from .. import theme

DEFAULT_TEXT = "default"
# field -> (label, the spin box position that reads "default", maximum, step, decimals);
# the default position sits just below the field's range (or on a value it refuses).
FIELDS = {
    "temperature": ("Temperature", -0.05, 10.0, 0.05, 2),
    "top_k": ("Top-k", -1, 1000, 1, 0),
    "top_p": ("Top-p", 0.0, 1.0, 0.05, 2),
    "min_p": ("Min-p", -0.01, 1.0, 0.01, 2),
    "repeat_penalty": ("Repetition penalty", 0.0, 10.0, 0.05, 2),
    "repeat_last_n": ("Penalty window (tokens)", -2, 1 << 20, 16, 0),
    "max_tokens": ("Longest answer (tokens)", 0, 1 << 20, 64, 0),
}


class GenerationBox(QGroupBox):
    def __init__(self, values: GenerationOptions, parent: QWidget | None = None):
        super().__init__("Answers", parent)
        self._values = values
        self.spins: dict[str, QSpinBox | QDoubleSpinBox] = {}
        outer = QVBoxLayout(self)
        form = QFormLayout()
        outer.addLayout(form)
        for name, (label, unset, maximum, step, decimals) in FIELDS.items():
            spin = QDoubleSpinBox(decimals=decimals) if decimals else QSpinBox()
            spin.setRange(unset, maximum)
            spin.setSingleStep(step)
            spin.setSpecialValueText(DEFAULT_TEXT)
            spin.setToolTip(GenerationOptions.model_fields[name].description)
            value = getattr(values, name)
            spin.setValue(unset if value is None else value)
            self.spins[name] = spin
            form.addRow(label, spin)
        shown = ", ".join(f"{FIELDS[n][0].split(' (')[0].lower()} {getattr(DEFAULTS, n)}"
                          for n in FIELDS)
        note = QLabel(f"“{DEFAULT_TEXT}”: the model file's recommendation if it has one, else "
                      f"kvdesk's ({shown}).", wordWrap=True)
        theme.muted(note)
        outer.addWidget(note)

    def values(self) -> GenerationOptions:
        """The values as edited, None where "default"; InvalidValue names one out of range."""
        edited = {name: None if spin.value() == spin.minimum() else spin.value()
                  for name, spin in self.spins.items()}
        return parse(GenerationOptions, {**self._values.model_dump(), **edited})
