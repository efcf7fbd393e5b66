"""The local API as an ASGI application (FastAPI): OpenAI's chat routes, and kvdesk's own
(`legacy`, `responses`, `ollama` and `edges` add the rest: text completions, the Responses
API, Ollama's API, CORS, body limits and the API key).

    GET  /v1/models                           the loaded model (and "default"), and each
                                              document as a model answering from it
    POST /v1/embeddings                       OpenAI embeddings, from retrieval's model
                                              (`embeddings`)
    POST /v1/chat/completions                 OpenAI chat completions, streamed or not, with a
                                              persistent prompt cache and a `kvdesk` field;
                                              tool calls (`desktop_app.tools`)
    GET  /v1/kvdesk/health                    liveness, for `kvdesk ask` to find the server;
                                              not "ok" once nothing more can be stored
    GET  /v1/kvdesk/documents                 attached documents (POST: attach one; DELETE)
    GET  /v1/kvdesk/chats                     chats (GET .../messages, POST .../reopen, DELETE)
    POST /v1/kvdesk/ask                       a turn in a stored chat, as `kvdesk ask` asks it
    POST /v1/kvdesk/ask/stop                  stop a turn by its `stop_id`, its result still
                                              sent (what `kvdesk ask` does on Ctrl-C)

Errors are OpenAI's JSON (`{"error": {"message", "type", "code", "param"}}`) with the right
status, never a traceback. A client may attach a file by path only inside the folders the
settings allow (else it uploads it).

Routes only translate: the engine does the work, on worker threads (`bridge`).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from store import ReadOnlyError, StoreError

from .. import __version__
from ..app import App
from ..errors import Cancelled
from ..options import GenerationOptions, RestoreOptions
from ..results import Progress
from ..tools import Repeats, Watch, read, written
from ..validation import first_problem, parse, problem
from . import bridge, edges, embeddings, failures
from . import schemas as s
from .failures import ApiError, cut_body, error_of, finished, json_response, refuse_cut
from .served import Served

PING_S = 1.0  # streamed responses stay alive, and a client's stop is noticed within this
# A stream cut by the server's shutdown: the time its answer has to stop (within a token) and
# send its last event, within uvicorn's graceful shutdown (10 s).
SHUTDOWN_GRACE_S = 5.0


def create_api(app: App, *, api_key: str | None, stopping: bridge.Stopping,
               origins: Sequence[str] | None = None) -> FastAPI:
    """The local API over `app`'s engine; `origins`: the web pages allowed (None: the
    settings')."""
    # No generated pages (/docs, /redoc, /openapi.json): /docs loads its script from a CDN,
    # and a page of the server's own origin may use every route (README documents the API).
    api = FastAPI(title="kvdesk", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None)
    model_id = Path(app.model_path).stem
    served = Served(app)

    def engine():
        return app.engine

    asks: dict[str, threading.Event] = {}  # turns in flight by their client's stop_id
    asks_lock = threading.Lock()

    api.add_middleware(edges.TextCheck)  # (added first: innermost, past the key and the limit)
    api.add_middleware(edges.KeyGuard, api_key=api_key)
    api.add_middleware(edges.BodyLimit)
    api.add_middleware(edges.JsonBody)

    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0]
        if first["type"] == "json_invalid":  # its loc ends with a character offset, no field
            why = first.get("ctx", {}).get("error", first["msg"])
            return json_response(400, s.error(f"the body is not valid JSON: {why} (at character "
                                      f"{first['loc'][-1]})"))
        error = first_problem([{**x, "loc": [p for p in x["loc"] if p != "body"]}
                               for x in e.errors()])
        where = ".".join(str(p) for p in error["loc"]) or "body"
        return json_response(400, s.error(f"{where}: {problem(error)}", param=where))

    @api.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        message = ("the body is not valid JSON in UTF-8"
                   if e.detail == "There was an error parsing the body" else str(e.detail))
        code = "request_too_large" if e.status_code == 413 else None
        return json_response(e.status_code, s.error(message, code=code))

    @api.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return json_response(e.status, e.body)

    @api.exception_handler(ValueError)
    @api.exception_handler(Cancelled)
    @api.exception_handler(StoreError)
    @api.exception_handler(MemoryError)
    async def refused(request: Request, e: Exception):
        # Bad values, the engine's refusals (InvalidValue...), the store's (a chat deleted as it
        # was answered, a full disk), a request stopped and memory run out get a handler of
        # their own: the catch-all below answers too, but Starlette then re-raises (a traceback
        # in the log), and the client's kept-alive connection is dropped under its next one.
        return json_response(*error_of(e))

    @api.exception_handler(Exception)
    async def failure(request: Request, e: Exception):
        status, body = error_of(e)
        return json_response(status, body)

    # -- OpenAI --------------------------------------------------------------------------------

    def refuse(status: int, message: str, code: str | None, param: str | None):
        raise ApiError(status, message, code=code, param=param)

    api.include_router(embeddings.router(engine, stopping, refuse))

    @api.get("/v1/models")
    async def models():
        created = int(Path(app.model_path).stat().st_mtime)
        documents = await asyncio.to_thread(served.document_models)
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "kvdesk"}
            for name in (model_id, "default", *(name for name, _ in documents))]}

    @api.post("/v1/chat/completions")
    async def chat_completions(body: s.ChatRequest, request: Request):
        if not served.picks(body.model, ollama=False):
            raise ApiError(404, served.refusal(body.model, ollama=False),
                           code="model_not_found", param="model")
        body.check_supported()
        declined, offered = body.declined_tools(), body.offer()
        messages = written([m.flat() for m in body.messages])  # (tool calls and results)
        offer = None  # (the tools a call is held to: none for words to continue, as text)
        if offered is not None:
            messages = offered.messages(messages)
            offer = offered.held(messages)
        options = served.answering(body.model, body.kvdesk.engine_options(
            body.generation(), body.stops(), body.answer_format(offered, offer)))
        cid, repeats = s.completion_id(), Repeats(offer)  # (parallel calls: ends at a repeat)
        if not body.stream:
            done = s.ended(await bridge.call(request, stopping, lambda cancel: engine().complete(
                messages, cancel=cancel, on_token=repeats.stopping(cancel), **options)), repeats)
            refuse_cut(done)
            return s.completion(s.noted(done, declined), cid=cid, model=body.model,
                                answer=read(offer, done.text) if offer else None)
        include_usage = body.stream_options is not None and body.stream_options.include_usage

        def work(emit, cancel):
            return engine().complete(messages, cancel=cancel,
                                     on_token=repeats.stopping(cancel, emit),
                                     on_start=lambda: emit(bridge.READY), **options)

        reports = await bridge.opened(request, stopping, work)

        async def chunks():
            yield _data(s.chunk(cid=cid, model=body.model,
                                delta={"role": "assistant", "content": ""}))
            texts: list[str] = []  # what may be sent as text (a call's text is kept back)
            watch = Watch(offer, texts.append)
            async for kind, item in reports:
                item = s.ended(item, repeats) if kind == "done" else item
                if kind == "event":
                    watch.feed(item)
                elif kind == "error":
                    yield _data(error_of(item)[1])
                elif not finished(item):
                    yield _data(cut_body())
                else:
                    answer = read(offer, item.text) if offer else None
                    if rest := watch.finish(item.text, answer):
                        texts.append(rest)
                    deltas = s.call_deltas(answer) if answer else []
                for text in texts:
                    yield _data(s.chunk(cid=cid, model=body.model, delta={"content": text}))
                texts.clear()
                if kind == "done" and finished(item):
                    for delta in deltas:
                        yield _data(s.chunk(cid=cid, model=body.model, delta=delta))
                    yield _data(s.chunk(cid=cid, model=body.model, delta={},
                                        finish_reason=s.finish(item, answer),
                                        kvdesk=s.restore_info(s.noted(item, declined))))
                    if include_usage:
                        yield _data({**s.chunk(cid=cid, model=body.model, delta={}),
                                     "choices": [], "usage": s.usage(item)})
            yield {"data": "[DONE]"}

        return _stream(chunks())

    # -- kvdesk's own --------------------------------------------------------------------------

    @api.get("/v1/kvdesk/health")
    async def health():
        try:  # a data directory removed, a disk filled or a file found damaged since the start
            app.store.check_writable()
            problem = {"status": "ok"}
        except ReadOnlyError as e:
            problem = {"status": "storage_unavailable", "problem": str(e)}
        return {**problem, "version": __version__, "pid": os.getpid(),
                "data_dir": str(app.data_dir.resolve()), "model": str(app.model_path),
                # the context size served, and whether it was chosen for the model (not set)
                "n_ctx": app.context.n_ctx, "n_ctx_auto": app.settings.n_ctx is None}

    @api.get("/v1/kvdesk/documents")
    async def documents(request: Request):
        return [d.as_dict() for d in await bridge.call(request, stopping,
                                                       lambda _: engine().documents())]

    @api.delete("/v1/kvdesk/documents/{doc_id}")
    async def delete_document(doc_id: int, request: Request):
        chats = await bridge.call(request, stopping, lambda _: engine().delete_document(doc_id))
        return {"deleted": "document", "id": doc_id, "chats_kept": chats}

    @api.post("/v1/kvdesk/documents")
    async def attach(request: Request, stream: bool = False):
        path, levels, cleanup, source = await _attachment(request,
                                                          app.settings.server_attach_folders)

        def work(emit, cancel):
            try:
                return engine().attach(path, levels=levels, progress=emit, cancel=cancel,
                                       source=source)
            finally:
                cleanup()

        return await _respond(request, stopping, work, stream)

    @api.get("/v1/kvdesk/chats")
    async def chats(request: Request):
        return [c.as_dict() for c in await bridge.call(request, stopping,
                                                       lambda _: engine().chats())]

    @api.get("/v1/kvdesk/chats/{chat_id}/messages")
    async def messages(chat_id: int, request: Request):
        return [m.as_dict() for m in await bridge.call(
            request, stopping, lambda _: engine().messages(chat_id))]

    @api.delete("/v1/kvdesk/chats/{chat_id}")
    async def delete_chat(chat_id: int, request: Request):
        await bridge.call(request, stopping, lambda _: engine().delete_chat(chat_id))
        return {"deleted": "chat", "id": chat_id}

    @api.post("/v1/kvdesk/chats/{chat_id}/reopen")
    async def reopen(chat_id: int, request: Request, body: s.ReopenRequest | None = None):
        body = body or s.ReopenRequest()  # (nothing to say: restore as the settings say)
        restore = parse(RestoreOptions, body.restore, within="restore", strict=True)
        return await _respond(request, stopping, lambda emit, cancel: engine().reopen(
            chat_id, restore=restore, progress=emit, cancel=cancel), body.stream)

    @api.post("/v1/kvdesk/ask")
    async def ask(body: s.AskRequest, request: Request):
        if body.chat_id is not None and body.doc_ids:
            raise ApiError(400, "doc_ids: a chat keeps the documents it began with; give "
                           "chat_id (a turn in it) or doc_ids (a new chat), not both",
                           param="doc_ids")
        restore = parse(RestoreOptions, body.restore, within="restore", strict=True)
        generation = parse(GenerationOptions, body.generation, within="generation",
                           strict=True)

        with asks_lock:
            if body.stop_id in asks:
                raise ApiError(409, "a turn with that stop_id is in flight: name each turn "
                               "anew", code="conflict", param="stop_id")

        def work(emit, cancel):
            if body.stop_id is not None:
                with asks_lock:  # (one taken meanwhile stays its first turn's)
                    asks.setdefault(body.stop_id, cancel)
            try:
                return failures.said_cut(engine().ask(
                    body.question, chat_id=body.chat_id, doc_ids=body.doc_ids, restore=restore,
                    generation=generation, progress=emit, on_restore=emit, cancel=cancel,
                    on_token=lambda text: emit({"token": text})), stopping.event)
            finally:
                with asks_lock:
                    if asks.get(body.stop_id) is cancel:
                        del asks[body.stop_id]

        return await _respond(request, stopping, work, body.stream)

    @api.post("/v1/kvdesk/ask/stop")
    async def stop_ask(body: s.StopRequest):
        """Stop a turn in flight, as its client leaving would, but answering it: its stream
        ends with its result, the answer so far kept (`finish_reason` "cancelled")."""
        with asks_lock:
            cancel = asks.get(body.stop_id)
        if cancel is None:
            raise ApiError(404, "no turn in flight by that stop_id (it may have ended)",
                           code="not_found", param="stop_id")
        cancel.set()
        return {"stopped": body.stop_id}

    # The rest of OpenAI's surface, Ollama's API, and the edges (CORS, unknown routes, Ollama's
    # error JSON); imported here, as the first three use this module's streaming framing.
    from . import legacy, ollama, responses

    legacy.install(api, app, stopping)
    responses.install(api, app, stopping)
    ollama.install(api, app, stopping)
    edges.install(api, origins=app.settings.cors_origins if origins is None else origins,
                  api_key=api_key)
    return api


async def _respond(request: Request, stopping: bridge.Stopping,
                   work: Callable[[Callable[[Any], None], Any], Any], stream: bool):
    """A kvdesk call's result as JSON, or streamed as events: progress, restore, token, then
    result (or error)."""
    if not stream:
        return (await bridge.call(request, stopping, lambda cancel: work(
            lambda _: None, cancel))).as_dict()

    reports = await bridge.opened(request, stopping, work)

    async def events():
        async for kind, item in reports:
            if kind == "error":
                yield _data(error_of(item)[1])
            elif kind == "done":
                yield _data({"result": item.as_dict()})
            elif isinstance(item, Progress):
                yield _data({"progress": item.as_dict()})
            elif isinstance(item, dict):
                yield _data(item)
            else:  # the restore's report
                yield _data({"restore": item.as_dict()})
        yield {"data": "[DONE]"}

    return _stream(events())


def _stream(events) -> EventSourceResponse:
    """Server-sent events; at the server's shutdown the work in flight is stopped (`bridge`),
    and the stream ends with its last event (a finish_reason or an error), not cut."""
    return EventSourceResponse(events, ping=PING_S, shutdown_grace_period=SHUTDOWN_GRACE_S)


async def _attachment(request: Request, allowed: tuple[str, ...]):
    """(file to attach, levels, cleanup, the user's file it copies) from an upload, or from
    a path inside an allowed folder (None: that path is the user's file)."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form(max_part_size=edges.MAX_UPLOAD)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "file: a document to attach is needed", param="file")
        levels = _levels(form.get("levels"))
        folder = Path(tempfile.mkdtemp(prefix="kvdesk-upload-"))

        def cleanup() -> None:
            shutil.rmtree(folder, ignore_errors=True)

        path = folder / upload_name(upload.filename)
        try:
            data = await upload.read()
            path.write_bytes(data)
            # (off the event loop: it reads a file the size of the upload)
            source = await run_in_threadpool(uploaded_from, request, form.get("source_path"),
                                             data)
        except BaseException:
            cleanup()
            raise
        return path, levels, cleanup, source
    try:
        data = json.loads(await request.body())
    except ValueError as e:
        raise ApiError(400, f"a JSON body {{\"path\", \"levels\"}} or a file upload is "
                       f"needed (the body is not JSON: {e})") from None
    if not isinstance(data, dict):
        raise ApiError(400, "a JSON object {\"path\", \"levels\"} or a file upload is needed")
    body = parse(s.AttachByPath, data)
    if "\0" in body.path:
        raise ApiError(400, "path: a file name holds no NUL character", param="path")
    try:
        path = Path(body.path).expanduser().resolve()
    except (OSError, RuntimeError) as e:  # a name too long, a link loop
        raise ApiError(400, f"path: cannot be resolved ({e})", param="path") from None
    if not any(path.is_relative_to(Path(f).expanduser().resolve()) for f in allowed):
        # Never the resolved path: a link's target is not the client's to learn.
        raise ApiError(403, "this path is outside the allowed folders: upload the file, or "
                       "add its folder to server_attach_folders in the settings",
                       "permission_error", "path_not_allowed", "path")
    return path, body.levels, lambda: None, None


def uploaded_from(request: Request, claimed, data: bytes) -> str:
    """The file an upload copies, watched for changes as an attached file is (`kvdesk attach`
    through a server sends its path): kept only from a client on this machine, and only
    when that is a regular file holding the bytes uploaded; else "" (none known). Never said
    either way. (A client on this machine, any local user's among them, learns nothing it
    could not: that a file it names holds bytes it already has.)"""
    try:
        here = ipaddress.ip_address(request.client.host).is_loopback
    except (AttributeError, ValueError):  # no client, or a test client's name
        here = False
    if not here or not data or not isinstance(claimed, str) or "\0" in claimed or \
            not os.path.isabs(claimed):
        return ""
    try:  # (non-blocking, and a regular file only: never a FIFO or a device read forever)
        fd = os.open(claimed, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):  # (ValueError: a path the server's locale cannot encode)
        return ""
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return ""
        digest = hashlib.sha256()
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return claimed if digest.digest() == hashlib.sha256(data).digest() else ""


def upload_name(filename: str | None) -> str:
    """The file name an upload is kept under while it is attached (the document's title; its
    suffix tells the kind): the client's name without any folder or unprintable character,
    short enough for any file system; "document.txt" when nothing of it is left (`..`)."""
    name = "".join(c for c in Path(filename or "").name if c.isprintable())
    if not name.strip(". "):
        return "document.txt"
    suffix = Path(name).suffix[:16]
    stem = name[:len(name) - len(suffix)] if suffix else name
    while len((stem + suffix).encode()) > 200:
        stem = stem[:-1]
    return stem + suffix


def _levels(value) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) and \
        value.strip() else None


def _data(obj: dict) -> dict:
    return {"data": json.dumps(obj)}
