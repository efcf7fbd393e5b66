"""The settings dialog's context size box: "Automatic" (the model's own context, as memory
allows) or a size the settings accept, within the bounds the settings model declares.

A widget only: it never reads or saves the settings file (the dialog does).
"""

from __future__ import annotations

from PySide6.QtWidgets import QSpinBox

from desktop_app.settings import Settings


def field_bounds(name: str) -> tuple[int, int]:
    """A numeric setting's own (ge, le), as the settings model checks them."""
    meta = Settings.model_fields[name].metadata
    return (next(m.ge for m in meta if hasattr(m, "ge")),
            next(m.le for m in meta if hasattr(m, "le")))


class ContextSizeBox(QSpinBox):
    """The context size: "Automatic", or a size the settings accept. Automatic is the value
    just under the smallest size, so no value in between can be entered or stepped to."""

    def __init__(self, n_ctx: int | None):
        smallest, largest = field_bounds("n_ctx")
        super().__init__(minimum=smallest - 1, maximum=largest, singleStep=1024,
                         suffix=" tokens", groupSeparatorShown=True)
        # Automatic: the model's trained context capped by the memory it needs.
        self.setSpecialValueText("Automatic (the model's own, as memory allows)")
        self.setValue(n_ctx or self.minimum())

    def context_size(self) -> int | None:
        return None if self.value() == self.minimum() else self.value()

    def stepBy(self, steps: int) -> None:
        if self.value() == self.minimum() and steps > 0:  # whole steps, not 255 + 1024
            self.setValue(max(self.minimum() + 1, steps * self.singleStep()))
        else:
            super().stepBy(steps)
