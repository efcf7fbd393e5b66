"""The codec levels as the app offers them: which are stored, in what order of quality.

Every named level a document is stored at lets the streaming restore choose per chunk;
CacheGen's published bins (cachegen-1..3) exist for comparisons (`attach --levels`, `eval`).

It never encodes or decodes: the codec does.
"""

from __future__ import annotations

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
