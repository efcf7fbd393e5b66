"""Blocking engine calls driven from the server's event loop.

Every engine call blocks (the model, the codec and the store work inside it), so it runs on a
worker thread with a `threading.Event` as its cancel. `call` waits for it while watching the
client: a client that goes away, or a server shutting down, sets the cancel, which the engine
polls between tokens and chunks. `events` runs a call that reports as it goes (restore, tokens,
progress) and yields each report to an async generator: the server-sent events of a streamed
response, cancelled the same way when the client disconnects mid-stream. `opened` starts such
a stream and waits for its first report (or `READY`, which a call emits once it is past its
checks, so that the client is not kept waiting through a long restore), so that a call refused
before then (an unknown document, a prompt over the context) raises, and the route answers
with the error's status instead of a stream that opened with 200 and carries the error.

It knows nothing of OpenAI's shapes or of which engine method is called.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from starlette.requests import Request

from ..errors import Cancelled
from .failures import STOPPING

T = TypeVar("T")
POLL_S = 0.1
DONE, FAILED = object(), object()
READY = object()  # emitted by a call once it is past its checks: `opened` returns on it


class Stopping:
    """The server's shutdown, and the cancels of the calls in flight (set all at once)."""

    def __init__(self):
        self.event = threading.Event()
        self._cancels: set[threading.Event] = set()
        # re-entrant: a signal's handler calls stop() on the main thread, maybe inside stop()
        self._lock = threading.RLock()

    def register(self, cancel: threading.Event) -> None:
        with self._lock:
            self._cancels.add(cancel)
            if self.event.is_set():
                cancel.set()

    def unregister(self, cancel: threading.Event) -> None:
        with self._lock:
            self._cancels.discard(cancel)

    def stop(self) -> None:
        with self._lock:
            self.event.set()
            for cancel in self._cancels:
                cancel.set()


async def call(request: Request, stopping: Stopping,
               work: Callable[[threading.Event], T]) -> T:
    """work(cancel) on a worker thread; cancel set if the client leaves or the server stops."""
    cancel = threading.Event()
    stopping.register(cancel)
    task = asyncio.ensure_future(asyncio.to_thread(work, cancel))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return _stopping_said(task, stopping)
            if not cancel.is_set() and await request.is_disconnected():
                cancel.set()
    finally:
        cancel.set()
        stopping.unregister(cancel)


def _said(e: BaseException, stopping: Stopping) -> BaseException:
    """`e`, or, for a call the server's stop cancelled, the stop said (`failures.STOPPING`)
    instead of how far the work got ("stopped after 0 of 9 tokens" read as the answer's)."""
    return Cancelled(STOPPING) if isinstance(e, Cancelled) and stopping.event.is_set() else e


def _stopping_said(task: asyncio.Future, stopping: Stopping):
    try:
        return task.result()
    except Cancelled as e:
        raise _said(e, stopping) from None


async def events(stopping: Stopping,
                 work: Callable[[Callable[[Any], None], threading.Event], T]
                 ) -> AsyncIterator[tuple[str, Any]]:
    """Run work(emit, cancel) on a thread; yield ("event", x) for each emit(x), then
    ("done", result) or ("error", exception). Closing the generator (the client left)
    cancels the work."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancel = threading.Event()
    stopping.register(cancel)

    def emit(item: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ("event", item))

    def run() -> None:
        try:
            result = work(emit, cancel)
        except BaseException as e:  # handed to the event loop, which answers with it
            loop.call_soon_threadsafe(queue.put_nowait, ("error", _said(e, stopping)))
        else:
            loop.call_soon_threadsafe(queue.put_nowait, ("done", result))

    thread = threading.Thread(target=run, name="kvdesk-api-call", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = await queue.get()
            yield kind, item
            if kind != "event":
                return
    finally:
        cancel.set()  # a client gone mid-stream: the engine stops within a token
        stopping.unregister(cancel)


async def opened(request: Request, stopping: Stopping,
                 work: Callable[[Callable[[Any], None], threading.Event], T]
                 ) -> AsyncIterator[tuple[str, Any]]:
    """`events(stopping, work)` once it has its first report (`READY` is not passed on); the
    exception of a call that failed before reporting anything is raised here. A client gone
    while it waits gets an empty stream (the call is cancelled)."""
    stream = events(stopping, work)
    first = asyncio.ensure_future(anext(stream))
    while not (await asyncio.wait({first}, timeout=POLL_S))[0]:
        if await request.is_disconnected():
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await stream.aclose()  # (its cleanup cancels the call, had `first` just finished)
            return _chained(None, stream)
    kind, item = first.result()
    if kind == "error":
        await stream.aclose()
        raise item
    return _chained(None if kind == "event" and item is READY else (kind, item), stream)


async def _chained(first, stream):
    try:
        if first is not None:
            yield first
        async for report in stream:
            if not (report[0] == "event" and report[1] is READY):
                yield report
    finally:
        await stream.aclose()
