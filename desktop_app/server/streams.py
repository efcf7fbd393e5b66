"""An answer's reports turned into the objects a client's stream carries, whatever its dialect.

OpenAI's text completions stream server-sent events, Ollama's API JSON lines; both carry, in
order, one object per piece of text, then the answer's last object(s), or one error object if
the answer failed once it had begun (a call refused before its first piece raises, for its
route to answer with the error's status: `bridge.opened`). `objects` runs the engine call
(through `bridge`, so a client that leaves stops it within a token) and maps each report with
the dialect's three functions; `ndjson` frames them as Ollama's lines.

It knows neither dialect's shapes nor which engine call it runs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from . import bridge


async def objects(request: Request, stopping: bridge.Stopping,
                  work: Callable[[Callable[[Any], None], Any], Any], *,
                  piece: Callable[[str], dict], done: Callable[[Any], list[dict]],
                  error: Callable[[BaseException], dict]) -> AsyncIterator[dict]:
    """work(emit, cancel)'s emitted text as piece(text) objects, then done(result)'s objects,
    or error(exception)'s; raises what the call raised before its first piece."""
    reports = await bridge.opened(request, stopping, work)

    async def mapped():
        async for kind, item in reports:
            if kind == "event":
                if item:
                    yield piece(item)
            elif kind == "error":
                yield error(item)
            else:
                for obj in done(item):
                    yield obj

    return mapped()


def ndjson(stream: AsyncIterator[dict]) -> StreamingResponse:
    """JSON lines, as Ollama streams its answers."""

    async def lines():
        async for obj in stream:
            yield json.dumps(obj) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
