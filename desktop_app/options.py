"""What a caller may ask of a restore and of an answer: immutable values with their ranges.

Declared once (pydantic, through `validation`), so the CLI's options, the settings file, the
local API's request fields and the engine's keyword arguments obey the same rules: a negative
budget or token count is refused with the same message wherever it comes from. A leaf: every
front end and every layer of the engine imports these without importing anything heavier.
"""

from __future__ import annotations

import pydantic
from pydantic import Field

from .validation import UserValues, conflict_error

AUTO = "auto"


class RestoreOptions(UserValues):
    """How a chat's or document's cached prefix comes back into the model."""

    # "auto" (the best level per chunk that fits the budget) or a codec level to force
    level: str = Field(AUTO, min_length=1, max_length=64)
    # for the whole restore; None: the engine's default budget
    budget_ms: float | None = Field(None, gt=0, le=3_600_000)
    # declared (and enforced) read bandwidth, in MB/s: a slow link
    bandwidth_MBps: float | None = Field(None, gt=0, le=1e6)
    no_cache: bool = False  # recompute everything from text: the baseline

    @pydantic.field_validator("no_cache")
    @classmethod
    def _no_level(cls, value: bool, info: pydantic.ValidationInfo) -> bool:
        if value and info.data.get("level", AUTO) != AUTO:  # (checked before it: declared first)
            raise conflict_error(f"recomputes everything from text: the level "
                                 f"{info.data['level']!r} given with it would not apply")
        return value


class GenerationOptions(UserValues):
    """How an answer is generated: llama.cpp's sampler chain (penalties, top-k, top-p, min-p,
    temperature) and the answer's length. Named as the OpenAI API and llama.cpp's server
    name them, so a request maps onto these fields one to one.

    A field left None is not set here: it comes from the next layer down, in the order
    `sampling.resolve` applies (a request or flag, then the settings file, then the model
    file's recommendation, then kvdesk's measured defaults). `description` is the help text
    every front end shows.
    """

    max_tokens: int | None = Field(None, ge=1, le=1 << 20,
                                   description="Longest answer, in tokens.")
    temperature: float | None = Field(None, ge=0, le=10, description=(
        "Sampling temperature; 0: greedy, the most likely token every time."))
    top_k: int | None = Field(None, ge=0, le=1 << 20, description=(
        "Sample among the k most likely tokens; 0: off."))
    top_p: float | None = Field(None, gt=0, le=1, description=(
        "Sample among the most likely tokens whose probabilities add up to p; 1: off."))
    min_p: float | None = Field(None, ge=0, le=1, description=(
        "Drop tokens less likely than min_p times the most likely one; 0: off."))
    repeat_penalty: float | None = Field(None, gt=0, le=10, description=(
        "Make tokens seen in the last repeat_last_n tokens this much less likely; 1: off."))
    repeat_last_n: int | None = Field(None, ge=-1, le=1 << 20, description=(
        "How many of the last tokens the penalties look at; 0: off, -1: the whole context."))
    presence_penalty: float | None = Field(None, ge=-2, le=2, description=(
        "Subtracted from the logit of every token seen in that window; 0: off."))
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description=(
        "Subtracted once per occurrence of a token in that window; 0: off."))
    seed: int | None = Field(None, ge=0, lt=1 << 32, description=(
        "Seed of the sampler: the same answer every time (default: a new one each time)."))


class GcOptions(UserValues):
    """An explicit eviction (`kvdesk gc`)."""

    budget_gb: float | None = Field(None, ge=0, le=1e6)  # 0: evict every cache; None: the setting
