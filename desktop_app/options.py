"""What a caller may ask of a restore and of an answer: immutable values with their ranges.

Declared once (pydantic, through `validation`), so the CLI's options, the local API's request
fields and the engine's keyword arguments obey the same rules: a negative budget or token
count is refused with the same message wherever it comes from. A leaf: every front end and
every layer of the engine imports these without importing anything heavier.
"""

from __future__ import annotations

import pydantic
from pydantic import Field

from .validation import STRICT

AUTO = "auto"


class RestoreOptions(pydantic.BaseModel):
    """How a chat's or document's cached prefix comes back into the model."""

    model_config = STRICT

    # "auto" (the best level per chunk that fits the budget) or a codec level to force
    level: str = Field(AUTO, min_length=1, max_length=64)
    # for the whole restore; None: the engine's default budget
    budget_ms: float | None = Field(None, gt=0, le=3_600_000)
    # declared (and enforced) read bandwidth, in MB/s: a slow link
    bandwidth_MBps: float | None = Field(None, gt=0, le=1e6)
    no_cache: bool = False  # recompute everything from text: the baseline



class GenerationOptions(pydantic.BaseModel):
    """How an answer is generated."""

    model_config = STRICT

    max_tokens: int = Field(512, ge=1, le=1 << 20)
    temperature: float = Field(0.0, ge=0, le=10)  # 0: greedy, the same answer every time
    seed: int | None = Field(None, ge=0, lt=1 << 32)  # with a temperature above 0



class GcOptions(pydantic.BaseModel):
    """An explicit eviction (`kvdesk gc`)."""

    model_config = STRICT

    budget_gb: float | None = Field(None, ge=0, le=1e6)  # 0: evict every cache; None: the setting
