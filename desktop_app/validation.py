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

import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import pydantic
import pydantic_core

M = TypeVar("M", bound=pydantic.BaseModel)
JSON = "json"  # validation's context key: the values are a JSON document's (`parse`'s from_json)

# Every model of user values: immutable once built, no unknown keys, no NaN or infinity.
STRICT = pydantic.ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Exact(pydantic.BaseModel):
    """Values taken as the user wrote them, where true or false is not a number nor a number
    or a word true or false: pydantic would read `"temperature": true` as 1.0 and `"yes"` as
    true, and a value the user did not mean would be used without a word."""

    @pydantic.field_validator("*", mode="before")
    @classmethod
    def _true_is_no_number(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        types = {a for a in getattr(annotation, "__args__", (annotation,)) if a is not None
                 and a is not type(None)}
        if types == {bool} and value is not None and not isinstance(value, bool):
            raise ValueError("should be true or false")
        if isinstance(value, bool) and bool not in types:
            raise ValueError("should be a number" if types & {int, float} else
                             "should not be true or false")
        # a JSON document's number is written as one: "5" is a string (the environment's
        # values and the command line's are strings by nature, and are read as numbers)
        if isinstance(value, str) and types & {int, float} and (info.context or {}).get(JSON):
            raise ValueError(f"should be {'a number' if float in types else 'an integer'}, "
                             "not a string")
        return value


def null_is_default(*fields: str):
    """A model's validator giving `fields` their defaults when a client sends them as null,
    as some write every field they leave out (`_nulls = null_is_default("stream")`)."""
    def default(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        field = cls.model_fields[info.field_name]
        return field.get_default(call_default_factory=True) if value is None else value
    return pydantic.field_validator(*fields, mode="before")(classmethod(default))


class RequestValues(Exact):
    """A request to the local API: `Exact`, and strict all the way down, as JSON wrote its
    values: a number is not read from a string ("1"), nor a whole number from 1.0, nor
    true taken for 1 in a list (`"documents": [true]`), where pydantic would read each. (The
    environment's values stay lax: a variable's value is a string; a settings file's numbers
    are JSON numbers, `parse`'s from_json.)"""

    model_config = pydantic.ConfigDict(strict=True)


class UserValues(Exact):
    """A model of user values: STRICT, and `Exact`."""

    model_config = STRICT


class InvalidValue(ValueError):
    """A user-supplied value of the wrong type or out of range; `key` names it."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.reason = message


def _describe(value: Any) -> str:
    """A value as the user wrote it: in JSON's words where it is JSON (true, null, "text")."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# pydantic names each member of a union in an error's location ("input", "list[str]", 0); the
# user wrote no such key, so members are spoken of as the JSON types they stand for.
_JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
               "dict": "object", "list": "array", "none": "null"}


def _is_member(part: Any) -> bool:
    """A union member's tag in an error's location: a type ('str', 'list[int]', 'Part'), not
    a key (kvdesk's models name theirs in lower case) nor a list's index."""
    return (isinstance(part, str) and re.fullmatch(r"[A-Za-z_]\w*(\[.*\])?", part) is not None
            and ("[" in part or part in _JSON_TYPES or part[:1].isupper()))


def _json_type(member: str) -> str:
    """'list[list[int]]' -> 'array of arrays of integers'; a model's name -> 'object'."""
    outer, _, inner = member.partition("[")
    if outer == "list" and inner:
        of = _json_type(inner[:-1])
        return "array of " + (of.replace("array", "arrays", 1) if of.startswith("array")
                              else of + "s")
    return _JSON_TYPES.get(outer, "object" if outer[:1].isupper() else outer)


def first_problem(errors: list[dict]) -> dict:
    """The error to tell the user of pydantic's `errors`, its `loc` free of union members'
    tags: the first error; or, when its value matched no member of a union, the error of the
    one member it came closest to, else one saying which types the key takes."""
    loc = tuple(errors[0]["loc"])
    at = next((i for i, p in enumerate(loc) if _is_member(p)), None)
    if at is None:
        return errors[0]
    tried = [e for e in errors if tuple(e["loc"][:at]) == loc[:at] and len(e["loc"]) > at
             and _is_member(e["loc"][at])]
    depth = {e["loc"][at]: len(e["loc"]) for e in tried}
    deepest = max(depth.values())
    if deepest > at + 2 and list(depth.values()).count(deepest) == 1:  # past the member's shape
        e = next(e for e in tried if len(e["loc"]) == deepest)
        return {**e, "loc": tuple(p for p in e["loc"] if not _is_member(p))}
    kinds = ", ".join(dict.fromkeys(_json_type(m) for m in depth))
    return {**errors[0], "loc": loc[:at], "type": "union", "msg": f"should be one of: {kinds}"}


SECRET = "secret_value"
CONFLICT = "conflict"


def secret_error(message: str) -> pydantic_core.PydanticCustomError:
    """A validator's refusal of a value that may hold a secret: never echoed back."""
    return pydantic_core.PydanticCustomError(SECRET, message)


def conflict_error(message: str) -> pydantic_core.PydanticCustomError:
    """A validator's refusal of a value that another one rules out: the message names both,
    and the value itself (a flag's `true`) would say nothing more."""
    return pydantic_core.PydanticCustomError(CONFLICT, message)


def parse(model: type[M], data: Mapping[str, Any], *, names: Mapping[str, str] | None = None,
          within: str | None = None, strict: bool = False, from_json: bool = False) -> M:
    """`model` built from `data`, or InvalidValue for the first problem found.

    `names` maps field names to what the user typed (e.g. "budget_ms" -> "--budget-ms");
    `within`: the request field `data` is (e.g. "generation": "generation.max_tokens");
    `strict`: `data` is a request's, read as `RequestValues` are;
    `from_json`: `data` is a JSON document's (the settings file): a number given as a string
    ("5") is refused, nested models' too, as true is (a list still makes a tuple).
    """
    try:
        return model.model_validate(dict(data), strict=strict or None,
                                    context={JSON: True} if from_json else None)
    except pydantic.ValidationError as e:
        error = first_problem(e.errors(include_url=False))
        field = ".".join(str(p) for p in error["loc"]) or model.__name__
        key = (names or {}).get(field, field)
        key = f"{within}.{key}" if within else key
        if error["type"] == "extra_forbidden":
            raise InvalidValue(key, f"not a known {'field' if within else 'setting'}") from None
        raise InvalidValue(key, problem(error)) from None


# pydantic's words for the common types ("Input should be a valid integer, unable to parse
# string as an integer") in kvdesk's own, `Exact`'s: one voice, whichever check refused a value.
_WORDS = {"int_parsing": "should be an integer", "int_type": "should be an integer",
          "int_from_float": "should be a whole number", "float_parsing": "should be a number",
          "float_type": "should be a number", "finite_number": "should be a finite number",
          "bool_parsing": "should be true or false", "bool_type": "should be true or false",
          "string_type": "should be a string",
          # a nested model's own name (GenerationOptions) means nothing to the user
          "model_type": "should be a JSON object of its keys",
          "tuple_type": "should be a JSON list"}


def problem(error: dict) -> str:
    """What the user is told of one of pydantic's errors (`first_problem`'s): what the value
    should be, and the value given (never a secret's)."""
    kind = error["type"]
    if kind in ("int_type", "float_type") and isinstance(error.get("input"), bool):
        message = "should be a number"  # (true in a list of numbers, as `Exact` says it alone)
    elif kind == "literal_error":  # ("'system', 'light' or 'dark'": the words, unquoted)
        message = "should be " + re.sub(r"'([^']*)'", r"\1", error["ctx"]["expected"])
    else:  # a range's words are pydantic's own ("greater than 0"), said as the others are
        message = _WORDS.get(kind) or re.sub(
            r"^Input should", "should", error["msg"].removeprefix("Value error, "))
    if kind not in ("missing", SECRET, CONFLICT) and "input" in error:
        message += f" (got {_describe(error['input'])})"
    return message


def changed(instance: M, **changes: Any) -> M:
    """A copy of `instance` with `changes`, checked like the original was; what was left
    at its default stays unset (a settings file saved keeps only what was set)."""
    return parse(type(instance), {**instance.model_dump(exclude_unset=True), **changes})
