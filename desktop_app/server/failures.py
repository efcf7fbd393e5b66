"""What a failed request answers: the API's error, and the status and body an exception
becomes (OpenAI's error JSON; `edges` reshapes it for Ollama's routes).

A user's mistake (a bad field, a missing document, a full context) is a 4xx naming it; a
request stopped before its answer (the server stopping, the client gone) is a 503 that says
so; anything else is a bug: a 500 whose traceback goes to the server's log, never to the
client. It never decides what is refused: the routes and the engine do.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from fastapi.responses import JSONResponse

from store import NotFoundError

from ..errors import (
    Cancelled,
    ChatFullError,
    ContextFullError,
    MissingError,
    is_storage_fault,
    is_user_error,
    out_of_memory,
)
from ..results import SERVER_STOPPED, AskResult
from ..validation import InvalidValue
from . import schemas as s

log = logging.getLogger("kvdesk.server")


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.body = status, s.error(message, kind, code, param)


# Said of any request the server's stop ends: a client (or its user) can tell it from its own
# mistake, and ask again once the server is back.
STOPPING = "the kvdesk server is stopping (ask again once it is back)"
CUT_SHORT = f"the answer was cut short: {STOPPING}"


def cut_short() -> str:
    """What an answer stopped after it began says, where the API has no field for it."""
    return error_of(Cancelled(CUT_SHORT))[1]["error"]["message"]


def finished(done) -> bool:
    """Whether a completion ended as OpenAI's and Ollama's answers can (their finish reasons
    have none for an answer stopped after it began, by the server stopping): one that did not
    is an error (`refuse_cut`, `cut_body`), so that no client keeps it as a whole answer."""
    return done.finish_reason != "cancelled"


def said_cut(done: AskResult, stopping: threading.Event) -> AskResult:
    """A kvdesk answer (`/v1/kvdesk/ask`, which has a field for it) as the server's stop
    left it: one that stop cut short is said so, its finish reason `SERVER_STOPPED` and
    `CUT_SHORT` in its messages (its turn stays stored as the engine stopped it); any other
    as it is. A client's own stop (`ask/stop`) at the same moment also reads as the server's:
    `kvdesk ask` knows its own Ctrl-C."""
    if done.finish_reason != "cancelled" or not stopping.is_set():
        return done
    return replace(done, finish_reason=SERVER_STOPPED, messages=[*done.messages, CUT_SHORT])


def refuse_cut(done) -> None:
    """A whole (not streamed) answer stopped after it began: the request's error."""
    if not finished(done):
        raise Cancelled(CUT_SHORT)


def cut_body() -> dict:
    """A streamed answer stopped after it began: its last event, in OpenAI's error shape."""
    return error_of(Cancelled(CUT_SHORT))[1]


def json_response(status: int, body: dict) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def error_of(e: BaseException) -> tuple[int, dict]:
    """(status, OpenAI error body) of an exception; a bug's traceback goes to the log only."""
    if isinstance(e, ApiError):
        return e.status, e.body
    if isinstance(e, MissingError):
        return 404, s.error(str(e), code="not_found", param=e.field)
    if isinstance(e, NotFoundError):  # deleted while the request ran
        return 404, s.error(str(e), code="not_found")
    if isinstance(e, ChatFullError):  # (its documents: what a new chat to go on would take)
        body = s.error(str(e), code="chat_full")
        return 400, {"error": {**body["error"], "documents": list(e.doc_ids)}}
    if isinstance(e, ContextFullError):  # OpenAI's code: clients trim their history on it
        return 400, s.error(str(e), code="context_length_exceeded", param=e.field)
    if isinstance(e, InvalidValue):
        return 400, s.error(str(e), param=e.key)
    if isinstance(e, Cancelled):  # not the client's mistake: asking again may answer
        return 503, s.error(f"{e}: the request was stopped before its answer was complete",
                            "server_error", code="cancelled")
    if isinstance(e, UnicodeEncodeError):  # (a body TextCheck could not read as JSON text)
        return 400, s.error("the request's text holds half of a UTF-16 surrogate pair, "
                            "which is not Unicode")
    if isinstance(e, MemoryError):  # (the machine's state, not the request: asking later may)
        return 503, s.error(out_of_memory(e), "server_error", code="out_of_memory")
    if is_storage_fault(e):  # (the server's data directory, not the request)
        return 500, s.error(str(e), "server_error", code="storage_unavailable")
    if is_user_error(e):
        return 400, s.error(str(e))
    log.error("request failed", exc_info=e)
    return 500, s.error(f"internal error ({type(e).__name__}); the server's log has the details",
                        "server_error")
