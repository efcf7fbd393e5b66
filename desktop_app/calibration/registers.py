"""Further calibration registers: built-in texts of another kind, on which every level must
hold too.

The level search places each level on the built-in prose text (calibrate.TEXT_NAME). Top-1 at
a given scale varies from text to text (RESULTS, "The second stage's cost": SmolLM2's
`compact` held at top-1 0.926 on the prose text and gave 0.867-0.875 on held-out pydoc and
code at the same scale), so a level can also be required to hold on other registers,
measured rather than assumed: a `Register` is one such text (written for kvdesk and shipped
in desktop_app/data, never an evaluation text), with its own exact run, q8_0 and fp16-ulp
rows and therefore its own contract targets and its own top-1 noise. The search measures a
scale's level configs (fixed by the prose text, as the product stores them) on each.

This module only measures: it must never touch the store or choose a level itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..model import kvstate
from . import quality


def text(name: str) -> str:
    """A built-in calibration text of desktop_app/data, by file name."""
    path = resources.files("desktop_app").joinpath("data", name)
    if not path.is_file():
        raise ValueError(f"no built-in calibration text {name!r}")
    return path.read_text("utf-8")


@dataclass
class Register:
    name: str
    ev: quality.Evaluator
    sections: list  # the exact KV of each cache section, in position order
    targets: dict  # {level: its contract's target on this text}


def open_all(stack: ExitStack, model_path: str | Path, names, prefix_tokens: int,
             cont_tokens: int, *, cancel: threading.Event | None = None,
             pause: Callable[[], None] | None = None) -> list[Register]:
    """Each named register's reference runs (closed with `stack`), each run stopped by
    `cancel` and waiting at `pause` between its slices (quality.Evaluator's)."""
    out = []
    for name in names:
        ev = stack.enter_context(quality.Evaluator(
            model_path, text(name), prefix_tokens=prefix_tokens, cont_tokens=cont_tokens,
            greedy_tokens=0, fit=True, cancel=cancel, pause=pause))
        q8, floor = ev.row("q8_0"), ev.row(quality.FLOOR)
        out.append(Register(name, ev, [kvstate.in_position_order(kv)
                                       for kv in ev.seq_state.sections],
                            quality.targets(q8, floor)))
    return out
