"""The errors a user can act on, gathered so the CLI and the GUI report them the same way.

Everything listed here is shown to the user as one clear message; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

from codec import CodecError
from store import StoreError

from .documents import DocumentError
from .engine import EngineError
from .kvstate import KVStateError
from .models import ModelNotFoundError
from .runtime import Cancelled, RuntimeStateError
from .settings import SettingsError

USER_ERRORS: tuple[type[BaseException], ...] = (
    ModelNotFoundError,
    SettingsError,
    KVStateError,
    RuntimeStateError,
    Cancelled,
    DocumentError,
    EngineError,
    CodecError,
    StoreError,
)
