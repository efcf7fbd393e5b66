"""The errors a user can act on, and cancellation: a leaf module every layer may import.

`is_user_error(e)` says whether an exception is shown to the user as one clear message (a
missing model, a bad setting, an unreadable document, a corrupt cache...); anything else is a
bug and keeps its traceback. The CLI and the GUI both decide with it, so they agree.

It imports no model runtime and no codec: the GUI imports it, and must not load llama.cpp or
numba by doing so.
"""

from __future__ import annotations

import sys

from store.errors import StoreError

from .documents import DocumentError
from .kvstate import KVStateError
from .models import ModelNotFoundError
from .settings import SettingsError
from .validation import InvalidValue


class Cancelled(Exception):
    """The caller asked to stop; whatever was under way kept only what was complete."""


class EngineError(ValueError):
    """A request the engine cannot serve: an unknown document or chat, a bad level..."""


class RuntimeStateError(RuntimeError):
    """llama.cpp refused a state, or the context cannot hold the request."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    ModelNotFoundError,
    SettingsError,
    InvalidValue,
    KVStateError,
    RuntimeStateError,
    Cancelled,
    DocumentError,
    EngineError,
    StoreError,
)


def user_errors() -> tuple[type[BaseException], ...]:
    """USER_ERRORS, with the codec's CodecError once the codec is loaded.

    An exception of that class cannot exist before its module is imported, and importing it
    here would load numba into every process that only wants to report errors.
    """
    codec_errors = sys.modules.get("codec.errors")
    return USER_ERRORS if codec_errors is None else (*USER_ERRORS, codec_errors.CodecError)


def is_user_error(error: BaseException) -> bool:
    return isinstance(error, user_errors())
