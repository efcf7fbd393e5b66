"""The command line's side of a running server: ask, reopen and attach through it.

A one-shot `kvdesk ask` in a fresh process would load the model, numba's kernels and the
codec's tables before its first token; a server running on the same data directory has them
loaded and the chat possibly already in its context. `Client` sends the command there and
hands back the same records the engine returns (AskResult, RestoreReport, AttachResult),
calling the same callbacks as the stream arrives, so the CLI prints exactly what it prints
in-process. Stopping (Ctrl-C) an ask asks the server to stop it (`stop_id`) and reads its
result, the answer so far (kept there); other calls close the connection, and the server
stops their work within a token.

It never imports the engine, the model runtime or the codec.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from ..errors import Cancelled, ChatFullError, DocumentError, EngineError, MissingError
from ..options import GenerationOptions, RestoreOptions
from ..results import AskResult, AttachResult, Progress, RestoreReport
from ..validation import InvalidValue

# Generous: a long restore or prefill is streamed, but a first attach can take minutes.
TIMEOUT = httpx.Timeout(connect=2.0, read=600.0, write=600.0, pool=2.0)


class ServerError(EngineError):
    """The server refused the request; its message says why."""


class Client:
    def __init__(self, url: str, api_key: str | None):
        self.url = url
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def ask(self, question: str, *, chat_id: int | None, doc_ids: list[int],
            restore: RestoreOptions, generation: GenerationOptions,
            on_token: Callable[[str], None], on_restore: Callable[[RestoreReport], None],
            progress: Callable[[Progress], None], cancel: threading.Event) -> AskResult:
        stop_id = secrets.token_hex(16)
        body = {"question": question, "chat_id": chat_id, "doc_ids": doc_ids,
                "restore": _given(restore), "generation": _given(generation), "stream": True,
                "stop_id": stop_id}

        def stop() -> bool:
            # Ctrl-C: the server stops the answer and still sends the result (the answer so
            # far, kept there), as an ask in this process gives it; a turn that has just
            # ended sends it anyway.
            try:
                r = httpx.post(self.url + "/v1/kvdesk/ask/stop", json={"stop_id": stop_id},
                               headers=self.headers, timeout=TIMEOUT, trust_env=False)
            except httpx.HTTPError:
                return False
            return r.status_code == 200 or _error(r.text).get("param") == "stop_id"

        try:
            events = iter(self._stream("POST", "/v1/kvdesk/ask", cancel, stop, json=body))
            first = [next(events, None)]
        except InvalidValue as e:
            if e.key != "stop_id":
                raise
            # A server from before stop_id (upgraded while it ran): asked without it, and
            # Ctrl-C leaves its stream (the answer so far is kept there, not sent).
            del body["stop_id"]
            events = iter(self._stream("POST", "/v1/kvdesk/ask", cancel, None, json=body))
            first = []
        for event in itertools.chain(first, events):
            if event is None:
                break
            if "token" in event:
                on_token(event["token"])
            elif "restore" in event:
                on_restore(RestoreReport.from_dict(event["restore"]))
            elif "progress" in event:
                progress(Progress.from_dict(event["progress"]))
            elif "result" in event:
                return AskResult.from_dict(event["result"])
        raise Cancelled("the server's answer ended early")

    def reopen(self, chat_id: int, *, restore: RestoreOptions,
               progress: Callable[[Progress], None], cancel: threading.Event) -> RestoreReport:
        body = {"restore": _given(restore), "stream": True}
        return RestoreReport.from_dict(self._result(f"/v1/kvdesk/chats/{chat_id}/reopen",
                                                    progress, cancel, json=body))

    def attach(self, path: str | Path, *, levels: list[str] | None,
               progress: Callable[[Progress], None], cancel: threading.Event) -> AttachResult:
        path = Path(path)
        try:
            f = path.open("rb")
        except OSError as e:
            raise DocumentError(f"{path}: {e.strerror}") from None
        with f:
            files = {"file": (path.name, f, "application/octet-stream")}
            # (where the file lives, so that the server watches it for changes as an attach
            # in this process would: kept by a server on this machine only)
            data = {"source_path": str(path.resolve()),
                    **({"levels": ",".join(levels)} if levels else {})}
            return AttachResult.from_dict(self._result(
                "/v1/kvdesk/documents?stream=true", progress, cancel, files=files, data=data))

    def _result(self, route: str, progress, cancel, **request) -> dict:
        for event in self._stream("POST", route, cancel, None, **request):
            if "progress" in event:
                progress(Progress.from_dict(event["progress"]))
            elif "result" in event:
                return event["result"]
        raise Cancelled("the server's answer ended early")

    def _stream(self, method: str, route: str, cancel: threading.Event,
                stop: Callable[[], bool] | None, **request: Any) -> Iterator[dict]:
        """The route's events; once `cancel` is set, `stop()` asks the server to end them
        (False, or none: the stream is left, Cancelled raised)."""
        stopped = False
        try:
            with httpx.stream(method, self.url + route, headers=self.headers, timeout=TIMEOUT,
                              trust_env=False, **request) as response:
                if response.status_code != 200:
                    response.read()
                    _raise(response.status_code, _error(response.text))
                for line in response.iter_lines():  # the server pings every second
                    if cancel.is_set() and not stopped:
                        stopped = stop is not None and stop()
                        if not stopped:
                            raise Cancelled("stopped")
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:
                        _raise(400, event["error"])
                    yield event
        except httpx.TransportError as e:  # killed, or gone with its machine: said, no traceback
            raise ServerError(f"the kvdesk server at {self.url} stopped before it answered in "
                              f"full ({e}); ask again (--no-server works in this process)"
                              ) from None


def _given(options) -> dict:
    """The values set on an options record (the server applies its own defaults for the rest)."""
    return options.model_dump(exclude_defaults=True)


def _error(text: str) -> dict:
    try:
        return json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return {"message": text.strip() or "no message"}


def _raise(status: int, error: dict) -> None:
    message = error.get("message", "")
    if error.get("code") == "cancelled":  # stopped before it answered (Ctrl-C, a shutdown)
        raise Cancelled(message or "stopped")
    if error.get("code") == "chat_full":  # (said as in this process: what to do is the CLI's)
        raise ChatFullError(message, tuple(error.get("documents") or ()))
    if status == 404:
        raise MissingError(message)
    if error.get("param"):
        raise InvalidValue(error["param"], message.split(": ", 1)[-1])
    raise ServerError(f"the kvdesk server refused: {message}")
