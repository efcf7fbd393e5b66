"""`kvdesk serve`: a local OpenAI-compatible API whose prompt cache survives restarts.

    api         the ASGI application (FastAPI): OpenAI's routes, and kvdesk's own
    schemas     what requests may carry and the OpenAI shapes answered
    bridge      blocking engine calls driven from the event loop, cancelled when a client leaves
    legacy      OpenAI's text completions (with fill-in-the-middle), one model's object
    responses   OpenAI's Responses API, its text subset, conversations kept by id
    ollama      Ollama's API (`ollama_shapes`: its requests, options and answers)
    edges       CORS for the origins allowed, unknown routes, Ollama's error JSON
    failures    what a failed request answers: the API's errors, an exception's status
    streams     an answer's reports as a stream's objects; served: the model's names
    discovery   the server file by which `kvdesk ask` finds a server on its data directory
    client      the command line's side of a running server
    running     `Server` and `LocalAPI` themselves (uvicorn over the api), and the sockets:
                the server's port, and Ollama's 11434 when free

`Server` runs uvicorn over one `App` (the same engine a window may be using): requests are
answered on worker threads; turns in the chat context run one at a time, first come first
served, while documents attach in their own context meanwhile. Loopback only unless an API key
is given. Ctrl-C or SIGTERM stops it: answers in flight are stopped within a token, nothing is
half-written (entries become visible only once complete), the server file is removed.

Importing the package imports none of them: `kvdesk ask` looks for a running server through
`discovery` before anything else, and must not pay for FastAPI and uvicorn (a quarter of a
second) to find none. `Server`, `LocalAPI` and `check_bind` are found here on first use.

It stands on `app` and what lies below; it never imports the CLI, the launcher or Qt, and it
holds no chat or cache logic: requests are translated into the engine's calls and back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .running import LOOPBACK, LocalAPI, Server, check_bind

__all__ = ["LOOPBACK", "LocalAPI", "Server", "check_bind"]


def __getattr__(name: str):
    if name in __all__:
        from . import running

        return getattr(running, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
