"""OpenAI's older surface that local tools still call: one model's object, and the text
completions editors use for completion and fill-in-the-middle.

    GET  /v1/models/{id}        the served model (`client.models.retrieve`)
    POST /v1/completions        a prompt continued as it is (no chat template); with `suffix`,
                                filled in between where the model has fill-in-the-middle
                                tokens; streamed or not, through the persistent prompt cache

A text completion goes through the same prompt cache as a chat completion: the longest stored
prefix of its tokens comes back, only the rest is computed, and prompt and answer are kept as
an entry (from `prompt_cache_min_tokens` on, or when it extends a stored one), so an editor's
next completion in the same file starts from the cached file.

Routes only translate, as in `api`: the engine does the work.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from fastapi import FastAPI, Request

from ..app import App
from ..chat.completions import RawPrompt
from ..results import Completion
from ..validation import InvalidValue
from . import bridge, streams
from . import schemas as s
from .api import _data, _stream
from .failures import ApiError, cut_body, error_of, finished, refuse_cut
from .served import Served


class TextRequest(s.Sampled):
    """OpenAI's text completion request (its legacy `completions` endpoint)."""

    prompt: str | list[str | int]
    suffix: str | None = None
    echo: bool = False
    best_of: int | None = None  # (`kvdesk`: how to restore; documents belong in a chat)

    def text(self) -> RawPrompt:
        self.check_supported()
        if self.echo:
            raise InvalidValue("echo", "not supported; the answer is the completion only")
        if self.best_of not in (None, 1):
            raise InvalidValue("best_of", "kvdesk answers with one completion")
        if self.kvdesk.documents:
            raise InvalidValue("kvdesk.documents", "a prompt given as it is has no chat to put "
                               "them in; use chat completions for them")
        prompt = self.prompt
        if isinstance(prompt, list):
            if prompt and not all(isinstance(p, str) for p in prompt):
                raise InvalidValue("prompt", "token ids are not supported; send the text")
            if len(prompt) != 1:
                raise InvalidValue("prompt", f"one prompt per request (got {len(prompt)})")
            prompt = prompt[0]
        return RawPrompt(prompt, self.suffix or None)


def install(api: FastAPI, app: App, stopping: bridge.Stopping) -> None:
    served = Served(app)

    def model_object(name: str) -> dict:
        created = int(Path(app.model_path).stat().st_mtime)
        return {"id": name, "object": "model", "created": created, "owned_by": "kvdesk"}

    def check_model(name: str) -> None:
        if served.document_of(name) is not None:
            raise ApiError(400, f"model {name!r} answers from a document, in a chat: "
                           "/v1/chat/completions or /v1/responses (a prompt given as it is "
                           "has none)", code="model_not_supported", param="model")
        if not served.is_openai_name(name):
            raise ApiError(404, served.refusal(name, ollama=False), code="model_not_found",
                           param="model")

    @api.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        doc = served.document_of(model_id)  # (a document's model: while it is attached)
        if doc is None:
            check_model(model_id)
        elif not await asyncio.to_thread(served.picks, model_id, ollama=False):
            raise ApiError(404, served.refusal(model_id, ollama=False), code="model_not_found",
                           param="model")
        return model_object(model_id)

    @api.post("/v1/completions")
    async def completions(body: TextRequest, request: Request):
        check_model(body.model)
        prompt = body.text()
        options = body.kvdesk.engine_options(body.generation(), body.stops())
        cid = f"cmpl-{uuid.uuid4().hex[:24]}"

        def shaped(text: str, finish: str | None) -> dict:
            return {"id": cid, "object": "text_completion", "created": int(time.time()),
                    "model": body.model, "choices": [{"text": text, "index": 0,
                                                      "logprobs": None,
                                                      "finish_reason": finish}]}

        if not body.stream:
            done: Completion = await bridge.call(request, stopping, lambda cancel: app.engine
                                                 .complete(prompt, cancel=cancel, **options))
            refuse_cut(done)
            return {**shaped(done.text, done.finish_reason), "usage": s.usage(done),
                    "kvdesk": s.restore_info(done)}
        include_usage = body.stream_options is not None and body.stream_options.include_usage

        def last(done: Completion) -> list[dict]:
            if not finished(done):
                return [cut_body()]
            final = [{**shaped("", done.finish_reason), "kvdesk": s.restore_info(done)}]
            if include_usage:
                final.append({**shaped("", None), "choices": [], "usage": s.usage(done)})
            return final

        objects = await streams.objects(
            request, stopping, lambda emit, cancel: app.engine.complete(
                prompt, cancel=cancel, on_token=emit, on_start=lambda: emit(bridge.READY),
                **options),
            piece=lambda text: shaped(text, None), done=last, error=lambda e: error_of(e)[1])

        async def events():
            async for obj in objects:
                yield _data(obj)
            yield {"data": "[DONE]"}

        return _stream(events())

