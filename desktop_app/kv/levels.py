"""The codec levels as the app offers them: which are stored, in what order of quality.

Every named level a document is stored at lets the streaming restore choose per chunk;
CacheGen's published bins (cachegen-1..3) exist for comparisons (`attach --levels`, `eval`).

It never encodes or decodes: the codec does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import codec

from ..errors import EngineError

# What a document is stored at unless asked otherwise: 30-60 % of the raw fp16 KV together.
# `lossless` (~14 bits per element: 85-90 % of raw on its own) is opt-in (the keep_lossless
# setting, `attach --levels`): recomputing from text is the exact fallback without it.
DEFAULT_LEVELS = ("high", "balanced", "compact")
EXACT = "lossless"
QUALITY_ORDER = ("lossless", "high", "cachegen-3", "balanced", "cachegen-2", "compact",
                 "cachegen-1")


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



_NOTE = re.compile(r"(\d+) of (\d+) chunks? (?:is |are )?(not stored|failed) (?:its |their )?"
                   r"(?:check )?at '([^']+)': read at (.+) instead")


def _note(kind: str, k: int, n: int, asked: str, read: Sequence[str]) -> str:
    chunks = f"{k} of {n} chunk" + ("" if n == 1 else "s")
    at = f"{asked!r}: read at {', '.join(sorted(set(read)))} instead"
    if kind == "not stored":
        return f"{chunks} {'is' if k == 1 else 'are'} not stored at {at}"
    return f"{chunks} failed {'its' if k == 1 else 'their'} check at {at}"


def level_notes(asked: str, read: Sequence[str], not_stored: int) -> list[str]:
    """What a restore at the level `asked` says of the chunks it read at another (the levels
    it read, `read`): `not_stored` of them because none is stored at it, the rest after the
    one stored failed its check."""
    others = [lvl for lvl in read if lvl != asked]
    missing = min(len(others), not_stored)
    return [_note(kind, k, len(read), asked, others)
            for kind, k in (("not stored", missing), ("failed", len(others) - missing)) if k]


def merged_level_notes(messages: Sequence[str], chunks: int) -> list[str]:
    """`messages` with the level notes of several reads (a blend's parts, `chunks` chunks in
    all) summed into one per kind and level, where the first of them was."""
    out: list = []
    totals: dict[tuple[str, str], list] = {}
    for message in messages:
        found = _NOTE.fullmatch(message)
        if found is None:
            out.append(message)
            continue
        k, _, kind, asked, read = found.groups()
        if (kind, asked) not in totals:
            out.append(totals.setdefault((kind, asked), [kind, 0, 0, asked, []]))
        total = totals[(kind, asked)]
        total[1], total[2] = total[1] + int(k), chunks
        total[4] += read.split(", ")
    return [x if isinstance(x, str) else _note(*x) for x in out]
