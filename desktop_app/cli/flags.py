"""The flags several commands share (`ask`, `reopen`), each set passed on as one record:
--level, --budget-ms... as a `restore`, --temperature, --max-tokens... as a `generation`.

Parsing only: it never loads a model or opens a store (a level name is checked against the
codec's list, imported only where levels are named).
"""

from __future__ import annotations

import functools

import click

from ..errors import EngineError
from ..options import AUTO, GenerationOptions, RestoreOptions
from ..validation import InvalidValue
from .base import option_name, values


def known_levels(option: str, names: list[str], restoring: bool = False) -> None:
    """Refuse level names that are no codec level, naming the option as typed, before any
    work (the codec is imported for it: only where levels are named)."""
    from ..kv.levels import check_levels

    try:
        check_levels(names, restoring=restoring)
    except EngineError as e:
        raise InvalidValue(option, str(e)) from None


def restore_options(f):
    """--level, --budget-ms, --bandwidth-MBps and --no-cache, passed on as one `restore`."""
    for opt in reversed([
        click.option("--level", default="auto", show_default=True,
                     callback=lambda ctx, param, value: value.lower(),  # (names: lower case)
                     help="auto (adaptive per chunk) or a codec level to force."),
        click.option("--budget-ms", type=float, help="Time budget for the restore."),
        click.option("--bandwidth-MBps", "bandwidth_MBps", type=float,
                     help="Read bandwidth to plan for and throttle to (a slow link)."),
        click.option("--no-cache", is_flag=True, help="Recompute from text (the baseline)."),
    ]):
        f = opt(f)

    @functools.wraps(f)
    def wrapper(*args, level, budget_ms, bandwidth_MBps, no_cache, **kwargs):
        restore = values(RestoreOptions, level=level, budget_ms=budget_ms,
                         bandwidth_MBps=bandwidth_MBps, no_cache=no_cache)
        if restore.level != AUTO:  # named as typed, as the API names kvdesk.level
            known_levels("--level", [restore.level], restoring=True)
        return f(*args, restore=restore, **kwargs)

    return wrapper


def generation_options(f):
    """A flag for every field of GenerationOptions (--temperature, --top-k, --max-tokens...),
    passed on as one `generation` holding only the flags given: the rest come from the
    settings file, the model file or kvdesk's defaults (`kvdesk info` shows which)."""
    fields = GenerationOptions.model_fields
    for name, spec in reversed(fields.items()):
        kind = int if spec.annotation == int | None else float
        f = click.option(option_name(name), name, type=kind, help=spec.description)(f)

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        given = {name: kwargs.pop(name) for name in fields}
        return f(*args, generation=values(GenerationOptions, **given), **kwargs)

    return wrapper
