"""The codec levels as the app offers them: which are stored, in what order of quality.

Every named level a document is stored at lets the streaming restore choose per chunk;
CacheGen's published bins (cachegen-1..3) exist for comparisons (`attach --levels`, `eval`).

It never encodes or decodes: the codec does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import codec

from ..errors import EngineError

# What a document is stored at unless asked otherwise: 30-60 % of the raw fp16 KV together.
# `lossless` (~14 bits per element: 85-90 % of raw on its own) is opt-in (the keep_lossless
# setting, `attach --levels`): recomputing from text is the exact fallback without it.
DEFAULT_LEVELS = ("high", "balanced", "compact")
EXACT = "lossless"
QUALITY_ORDER = ("lossless", "high", "cachegen-3", "balanced", "cachegen-2", "compact",
                 "cachegen-1")


def stored_by_default(levels: Sequence[str], rt, calibrations) -> tuple[str, ...]:
    """What a cache of `rt`'s model is stored at unless asked otherwise: the app's `levels`,
    or `lossless` alone for a sliding-window model whose codec is not calibrated yet. The
    model-independent levels were tuned on a full-attention model and lose answers on such a
    one (Gemma 3 270M: its passages lost 18 of 21 answers, and a document's cache read at
    `high` answered a port number wrongly that lossless answered right), so until its
    calibration its caches are exact: larger, never wrong (the passages, which would fill
    gigabytes so, are read as text: `PassageKV.kept`)."""
    if rt.layout.swa_layers and calibrations.current(rt.fingerprint) is None:
        return (EXACT,)
    return tuple(levels)


def cache_levels(entry, sliding_window: bool) -> str:
    """Which levels a cache (a store entry) is at, as `kvdesk docs` says: "calibrated" (its
    model's calibrated levels), "model-independent" (stored before the model was calibrated:
    the calibration moves a document's to its levels), "lossless-until-calibrated" (a
    sliding-window model's, until its calibration encodes it at its levels) or "lossless"
    (exact only, as asked for)."""
    if set(entry.levels) == {EXACT}:
        return "lossless-until-calibrated" if sliding_window and entry.calibration is None \
            else "lossless"
    return "model-independent" if entry.calibration is None else "calibrated"


def quality_order(levels: Sequence[str]) -> list[str]:
    """The distinct `levels`, best quality first (unknown names last, by name)."""
    rank = {name: i for i, name in enumerate(QUALITY_ORDER)}
    return sorted(dict.fromkeys(levels), key=lambda lvl: (rank.get(lvl, len(rank)), lvl))


def check_levels(levels: Sequence[str], *, restoring: bool = False) -> None:
    """Refuse names that are no codec level, saying which are (`auto` too, for a restore)."""
    unknown = set(levels) - set(codec.levels())
    if unknown:
        auto = "auto (the best level per chunk that fits the time budget), " if restoring else ""
        raise EngineError(f"unknown level(s) {', '.join(sorted(unknown))}; known: {auto}"
                          f"{', '.join(quality_order(codec.levels()))}")


@dataclass(frozen=True)
class LevelNote:
    """Chunks a restore at the level `asked` read at other levels instead: `count` of the
    `chunks` it read, because none is stored at it (`kind` "not stored"), the one stored
    failed its check on this read ("failed"), or its entry is stored at it but this chunk
    cannot be read there, set aside after an earlier failed check or missing ("damaged");
    `read`, the levels they were read at, by name; `shared`, read from the shared cache (the
    S3 tier), whose copies this machine's `verify --repair` does not mend.

    Kept as data until it is shown (`str`: the sentence the user reads), so that the notes
    of several reads (a blend's parts) add up into one (`+`)."""

    kind: str
    count: int
    chunks: int
    asked: str
    read: tuple[str, ...]
    shared: bool = False

    def __add__(self, other: LevelNote) -> LevelNote:
        if other.key != self.key:
            raise ValueError(f"a note on {other.kind!r} at {other.asked!r} does not add to "
                             f"one on {self.kind!r} at {self.asked!r}, or not from one cache")
        return LevelNote(self.kind, self.count + other.count, self.chunks + other.chunks,
                         self.asked, tuple(sorted({*self.read, *other.read})), self.shared)

    @property
    def key(self) -> tuple[str, str, bool]:
        """What notes that add up share: the kind, the level asked, the cache read."""
        return self.kind, self.asked, self.shared

    def __str__(self) -> str:
        k = self.count
        chunks = f"{k} of {self.chunks} chunk" + ("" if self.chunks == 1 else "s")
        at = f"{self.asked!r}: read at {', '.join(self.read)} instead"
        if self.kind == "not stored":
            return f"{chunks} {'is' if k == 1 else 'are'} not stored at {at}"
        # Stored but unreadable: what `kvdesk docs` counts as damaged, and repair recomputes;
        # a shared copy is put back by a machine that holds the entry.
        repair = (f"; `kvdesk verify --repair` computes {'it' if k == 1 else 'them'} again"
                  if not self.shared else "; the shared cache's copy is damaged: `kvdesk "
                  "remote verify --repair` puts it back from a machine that holds the entry")
        if self.kind == "damaged":
            return (f"{chunks} {'is' if k == 1 else 'are'} damaged at {self.asked!r} (set "
                    f"aside after a failed check, or missing): read at {', '.join(self.read)} "
                    f"instead{repair}")
        return f"{chunks} failed {'its' if k == 1 else 'their'} check at {at}{repair}"


# What a restore says: a sentence, or a level note not yet made one.
Message = str | LevelNote


def level_notes(asked: str, read: Sequence[str], not_stored: int, kept: int = 0,
                damaged: int = 0, shared: bool = False,
                chunks: int | None = None) -> list[LevelNote]:
    """What a restore at the level `asked` says of the chunks it read at another (the levels
    it read, `read`): `not_stored` of them because none is stored at it, `kept` because
    their entry is kept at one level by design (a passage's: nothing to say), `damaged`
    because the one stored was set aside before (or is missing), the rest after the one
    stored failed its check on this read (`shared`: all read from the shared cache).
    `chunks`: how many the restore asked for, where it read fewer (the rest recomputed)."""
    others = [lvl for lvl in read if lvl != asked]
    left = len(others) - kept
    missing = min(left, not_stored)
    set_aside = min(left - missing, damaged)
    total = max(len(read), chunks or 0)
    return [LevelNote(kind, k, total, asked, tuple(sorted(set(others))), shared)
            for kind, k in (("not stored", missing), ("damaged", set_aside),
                            ("failed", left - missing - set_aside))
            if k > 0]


def merged_level_notes(messages: Sequence[Message], chunks: int) -> list[Message]:
    """`messages` with the level notes of several reads (a blend's parts, `chunks` chunks in
    all) summed into one per kind and level, where the first of them was."""
    out: list[Message | tuple[str, str, bool]] = []
    totals: dict[tuple[str, str, bool], LevelNote] = {}
    for message in messages:
        if isinstance(message, str):
            out.append(message)
            continue
        key = message.key
        if key not in totals:
            out.append(key)
        totals[key] = totals[key] + message if key in totals else message
    return [replace(totals[x], chunks=chunks) if isinstance(x, tuple) else x for x in out]


def said(messages: Sequence[Message]) -> list[str]:
    """`messages` as the user reads them: each level note made its sentence."""
    return [str(m) for m in messages]
