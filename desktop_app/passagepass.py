"""The background passage pass as its front ends see it: `PassagePass`, and the words for it
that the window and `kvdesk serve` share.

The pass (`desktop_app.chat.passagefill`) gives every passage of a long document its KV in a
long-running kvdesk; `EngineAPI.passage_pass` hands its state here, read from what the pass
keeps in memory (never from the store). The estimate of the time left is the pass's own
measured rate, never a constant. A leaf like `results`: it imports nothing of the engine and
must never do work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .results import Record

LOGGER = "kvdesk.passages"  # the pass's log, which `kvdesk serve` prints from info on

# The rate is said once this many passages have been computed in this run: the first waits
# for the model context to load, which would make the estimate hours too long.
MEASURED_AFTER = 3


@dataclass(frozen=True)
class PassagePass(Record):
    """What the pass is doing: the document it works (`doc_id` None: none), how far it is,
    its measured rate, and whether the user paused it."""

    doc_id: int | None = None
    title: str = ""
    done: int = 0  # the document's passages with their KV
    total: int = 0  # its passages
    per_minute: float | None = None  # the rate measured in this run (None: not yet)
    queued: int = 0  # documents waiting after this one
    paused: bool = False  # by the user, until Resume or the next start
    notes: dict[int, str] = field(default_factory=dict)  # doc id: why its pass stopped short

    @property
    def left_s(self) -> float | None:
        """Seconds until this document's passages all have their KV, at the measured rate."""
        return None if not self.per_minute else 60 * (self.total - self.done) / self.per_minute

    def line(self) -> str:
        """E.g. "manbook.txt 89 of 4,003 (about 2 h left; 2 more documents after it)"."""
        what = [f"about {duration(self.left_s)} left" if self.left_s is not None else
                "measuring its speed"] if not self.paused else []
        what += [f"{self.queued} more document{'s' * (self.queued != 1)} after it"
                 ] if self.queued else []
        return (f"{self.title} {self.done:,} of {self.total:,}"
                + (f" ({'; '.join(what)})" if what else ""))


def duration(seconds: float) -> str:
    """A time left as people say it: "40 s", "12 min", "2 h", "1 h 20 min"."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h" if hours >= 10 or minutes < 5 else f"{hours} h {minutes} min"
