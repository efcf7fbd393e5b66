"""One validation layer for every value a user supplies: the settings file, environment
variables, command-line options and the local API's requests.

Values are declared once, as pydantic models with their types and ranges (`settings.Settings`,
`options.RestoreOptions`, `options.GenerationOptions`); `parse` checks a mapping against one
and turns any failure into an `InvalidValue` that names the key, what is wrong and the value
given, so every front end reports the same rule in the same words. Front ends only say where
the value came from ("the settings file", "--budget-ms", a request's "max_tokens").

A leaf: it knows no model, store or front end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import pydantic

M = TypeVar("M", bound=pydantic.BaseModel)

# Every model of user values: immutable once built, no unknown keys, no NaN or infinity.
STRICT = pydantic.ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class InvalidValue(ValueError):
    """A user-supplied value of the wrong type or out of range; `key` names it."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.reason = message


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse(model: type[M], data: Mapping[str, Any], *, names: Mapping[str, str] | None = None) -> M:
    """`model` built from `data`, or InvalidValue for the first problem found.

    `names` maps field names to what the user typed (e.g. "budget_ms" -> "--budget-ms").
    """
    try:
        return model.model_validate(dict(data))
    except pydantic.ValidationError as e:
        error = e.errors(include_url=False)[0]
        field = ".".join(str(p) for p in error["loc"]) or model.__name__
        key = (names or {}).get(field, field)
        if error["type"] == "extra_forbidden":
            raise InvalidValue(key, "not a known setting") from None
        message = error["msg"]
        if error["type"] not in ("missing",) and "input" in error:
            message += f" (got {_describe(error['input'])})"
        raise InvalidValue(key, message) from None


def changed(instance: M, **changes: Any) -> M:
    """A copy of `instance` with `changes`, checked like the original was."""
    return parse(type(instance), {**instance.model_dump(), **changes})
