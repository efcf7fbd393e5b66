"""The errors a user can act on, and cancellation: a leaf module every layer may import.

`is_user_error(e)` says whether an exception is shown to the user as one clear message (a
missing model, a bad setting, an unreadable document, a corrupt cache...); anything else is a
bug and keeps its traceback. The CLI, the GUI and the local API all decide with it, so they
agree.

The app's own errors are defined here, and their modules raise them from here (but for
`models`, which must load on its own). It imports no
model runtime, codec or store: the GUI imports it and must not load llama.cpp or numba by
doing so, and a command that hands its work to a running server loads only what it needs.
The store's and the codec's errors are recognized once those packages are loaded (an
exception of their classes cannot exist before).
"""

from __future__ import annotations

import re
import sys

from .validation import InvalidValue


class Cancelled(Exception):
    """The caller asked to stop; whatever was under way kept only what was complete."""


class EngineError(ValueError):
    """A request the engine cannot serve: an unknown document or chat, a bad level..."""


class MissingError(EngineError):
    """The document or chat asked for does not exist (or no longer); `field` is the request's
    field that named it, when a request did (an API's "kvdesk.documents")."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class ContextFullError(EngineError):
    """A prompt longer than the model's context, leaving no room to answer; `field` is the
    request's field that holds it (an API's "messages" or "prompt"). For a conversation
    measured, `over` is how many tokens too many it has and `sizes` each message's share of
    its tokens, in the request's order: what a caller leaving out old messages needs to leave
    out enough at once (`server.ollama.fitted`), not one at a time. `own` is each message's
    text's tokens alone (no share of the template's, which shifts as messages come), and
    `space` the tokens the context holds beside the request's documents: what that caller
    cuts by, at the same messages however many come after them."""

    def __init__(self, message: str, field: str = "messages", *, over: int = 0,
                 sizes: tuple[float, ...] = (), own: tuple[int, ...] = (), space: int = 0):
        super().__init__(message)
        self.field = field
        self.over = over
        self.sizes = sizes
        self.own = own
        self.space = space


class ChatFullError(EngineError):
    """A chat's next question refused: the chat fills its context, leaving no room for the
    question and an answer. `doc_ids` are the chat's documents, which a new chat can take on
    (its turns it cannot): what a front end offers to go on with; none where they take most
    of the context themselves (a new chat over them would be as full at once)."""

    def __init__(self, message: str, doc_ids: tuple[int, ...] = ()):
        super().__init__(message)
        self.doc_ids = tuple(doc_ids)


class UnsupportedModelError(EngineError):
    """A model whose cache kvdesk cannot keep: the message says what was found and what works."""


class RuntimeStateError(RuntimeError):
    """llama.cpp refused a state, or the context cannot hold the request."""


class KVStateError(ValueError):
    """The bytes are not a sequence state this bridge can represent exactly."""


class DocumentError(ValueError):
    """This file cannot be attached; the message says why, for the user."""


class NotTextError(DocumentError):
    """The file's bytes are not text in any encoding (an image, an archive, a database): a
    folder leaves such a file out as binary."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    InvalidValue,  # SettingsError among them
    KVStateError,
    RuntimeStateError,
    Cancelled,
    DocumentError,
    EngineError,
)
# Recognized once loaded: (module, class). `models` loads on its own (the bundle finds the
# default model with the standard library only), so its error is defined there.
_ELSEWHERE = (("store.errors", "StoreError"), ("codec.errors", "CodecError"),
              ("desktop_app.model.models", "ModelNotFoundError"),
              ("desktop_app.calibration.quality", "EvalError"))


def user_errors() -> tuple[type[BaseException], ...]:
    """USER_ERRORS, with the store's, the codec's, `models`' and `eval`'s errors once loaded."""
    loaded = [getattr(sys.modules[m], name) for m, name in _ELSEWHERE if m in sys.modules]
    return (*USER_ERRORS, *loaded)


def is_user_error(error: BaseException) -> bool:
    return isinstance(error, user_errors())


def is_storage_fault(error: BaseException) -> bool:
    """Whether the data directory cannot take the work (read-only, or its database damaged):
    the user's to act on, never a request's fault."""
    errors = sys.modules.get("store.errors")
    return errors is not None and isinstance(error, errors.ReadOnlyError)


def data_folder_fault(error: BaseException | None) -> str | None:
    """Why the data directory's store could not be opened at all, when `error` says so:
    "version" (written by a newer kvdesk, or not a kvdesk store), "unusable" (not a database,
    damaged past reading, no permission, a file in its place...); None for anything else."""
    errors = sys.modules.get("store.errors")
    if errors is None or error is None:
        return None
    if isinstance(error, errors.SchemaVersionError):
        return "version"
    return "unusable" if isinstance(error, errors.DataDirError | errors.DamagedError) else None


def out_of_memory(e: MemoryError, smaller: str = "--n-ctx, below what `kvdesk info` shows") -> str:
    """What to say of memory that ran out mid-work (a memory limit, `ulimit -v`, a full
    machine): what could not be allocated, where it says (numpy's "Unable to allocate 133.
    MiB for an array..."), and what to do (`smaller`: how a smaller context is set where it
    is said)."""
    size = re.match(r"Unable to allocate ([\d.]+)\.? ?([KMGT]i?B)", str(e))
    return ("not enough memory for this work" + (
        f" ({size[1].rstrip('.')} {size[2]} could not be allocated)" if size else "")
        + f": close other programs, or give kvdesk a smaller context ({smaller}); what was "
        "stored before it is kept")
