"""What a caller may ask of a restore: plain, immutable values passed down the engine's calls.

A leaf module: the CLI, the GUI and the engine's layers all build or read these without
importing anything heavier.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class RestoreOptions:
    """How a chat's or document's cached prefix comes back into the model."""

    level: str = AUTO  # "auto" (the best level per chunk that fits the budget) or a level to force
    budget_ms: float | None = None  # for the whole restore; None: the engine's default budget
    bandwidth_MBps: float | None = None  # declared (and enforced) read bandwidth: a slow link
    no_cache: bool = False  # recompute everything from text: the baseline


@dataclass(frozen=True)
class GenerationOptions:
    """How an answer is generated."""

    max_tokens: int = 512
    temperature: float = 0.0  # 0: greedy, the same answer every time
    seed: int | None = None  # with a temperature above 0: the sampler's seed
