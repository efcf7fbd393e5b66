"""OpenAI's Responses API, its text subset: what `client.responses.create` sends for a
conversation without tools.

    POST   /v1/responses          `input` (a string, or message items of text parts),
                                  `instructions`, `previous_response_id`, sampling, kvdesk's
                                  own `kvdesk` field (documents to answer from, how to
                                  restore: as on chat completions); streamed as the Responses
                                  API streams (typed events) or not
    GET    /v1/responses/{id}     a stored response
    DELETE /v1/responses/{id}     forget it

A response continues the conversation `previous_response_id` names: the server keeps each
stored response's conversation (its input items and answer; not its instructions, which, as
OpenAI's, apply to one response only) in the data directory, so a conversation continues after
a restart too, and through the same persistent prompt cache as chat completions: its stored KV
comes back, only the new input is computed. The documents a response was answered from
are kept with it: a response continuing it reads them again unless its own `kvdesk` field
names others (`"documents": []`: none). `store: false` keeps nothing. The newest `KEEP`
responses are kept. `text.format` holds the answer to JSON or a JSON schema, as
`response_format` does on chat completions. Tools are refused by name, saying they are
answered on chat completions and Ollama's /api/chat (but with tool_choice "none": unused, as
on chat completions), and so are reasoning, images and files.

Routes only translate, as in `api`: the engine does the work.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import pydantic
from fastapi import FastAPI, Request

from ..app import App
from ..errors import ContextFullError, MissingError
from ..options import GenerationOptions
from ..results import Completion
from ..validation import InvalidValue, parse
from . import bridge, streams
from . import schemas as s
from .api import _stream
from .failures import ApiError, cut_body, error_of, finished, refuse_cut
from .served import Served

KEEP = 2000  # stored responses; the oldest beyond are forgotten
_ID = "resp_"


class Item(pydantic.BaseModel):
    """A message item of `input` (other item types are refused by name)."""

    model_config = pydantic.ConfigDict(extra="ignore")
    type: str = "message"
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: str | list[s.Part] | None = None

    def message(self, where: str) -> dict:
        if self.type != "message" or self.role is None:
            raise InvalidValue(where, f"{self.type!r} items are not supported: kvdesk answers "
                                      "text messages only")
        parts = self.content if isinstance(self.content, list) else []
        text = [p.model_copy(update={"type": "text"}) if p.type in ("input_text", "output_text")
                else p for p in parts]  # the Responses API's names for text parts
        msg = s.Message(role=self.role, content=text if isinstance(self.content, list)
                        else self.content)
        msg.check_parts(where)
        return msg.flat()


class ResponsesRequest(s.Sampled):
    input: str | list[Item]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    store: bool = True
    text: dict | None = None
    reasoning: dict | None = None

    def conversation(self) -> list[dict]:
        self.check_supported()
        if self.reasoning and any(v for v in self.reasoning.values()):
            raise InvalidValue("reasoning", "kvdesk's models do not reason; leave it out")
        if isinstance(self.input, str):
            if not self.input.strip():  # (as an empty prompt is refused on /v1/completions)
                raise InvalidValue("input", "it is empty")
            return [{"role": "user", "content": self.input}]
        return [item.message(f"input.{i}") for i, item in enumerate(self.input)]

    def generation(self) -> GenerationOptions:
        given = {name: getattr(self, name) for name in GenerationOptions.model_fields}
        return parse(GenerationOptions, {**given, "max_tokens": self.max_output_tokens},
                     names={"max_tokens": "max_output_tokens"})

    def text_format(self) -> dict:
        """`text.format` as given ({"type": "text"} when none), echoed in the response."""
        fmt = (self.text or {}).get("format")
        if fmt is not None and not isinstance(fmt, dict):
            raise InvalidValue("text.format", "an object with its type (text, json_object or "
                               "json_schema)")
        return fmt or {"type": "text"}


class Kept:
    """Stored responses and their conversations: one JSON file each, written whole."""

    def __init__(self, data_dir: Path):
        self.folder = data_dir / "responses"

    def path(self, rid: str) -> Path:
        if not rid.startswith(_ID) or not rid[len(_ID):].isalnum():
            raise MissingError(f"no stored response {rid!r}")
        return self.folder / f"{rid}.json"

    def load(self, rid: str) -> dict:
        try:
            return json.loads(self.path(rid).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise MissingError(f"no stored response {rid!r} (responses are kept when asked "
                               f"with store: true, the newest {KEEP:,})") from None

    def save(self, response: dict, conversation: list[dict], documents: list[int]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(response["id"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"response": response, "conversation": conversation,
                                   "documents": documents}))
        os.replace(tmp, path)
        kept = sorted(self.folder.glob(f"{_ID}*.json"), key=lambda p: p.stat().st_mtime)
        for old in kept[:-KEEP]:
            old.unlink(missing_ok=True)

    def delete(self, rid: str) -> None:
        self.load(rid)  # a clear 404 for one never kept
        self.path(rid).unlink(missing_ok=True)


def install(api: FastAPI, app: App, stopping: bridge.Stopping) -> None:
    served, kept = Served(app), Kept(app.data_dir)

    @api.post("/v1/responses")
    async def create(body: ResponsesRequest, request: Request):
        if not served.picks(body.model, ollama=False):
            raise ApiError(404, served.refusal(body.model, ollama=False),
                           code="model_not_found", param="model")
        previous = kept.load(body.previous_response_id) if body.previous_response_id else {}
        conversation = [*previous.get("conversation", []), *body.conversation()]
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        messages = [*system, *conversation]
        options = body.kvdesk.engine_options(body.generation(), body.stops(), s.answer_format(
            body.text_format(), "text.format", nested=False))
        if "documents" not in body.kvdesk.model_fields_set:  # those it continues from
            options["documents"] = previous.get("documents", [])
        options = served.answering(body.model, options)
        rid, mid = f"{_ID}{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        created = int(time.time())

        def response(done: Completion | None) -> dict:
            return shape(body, rid, mid, created, done)

        def finish(done: Completion) -> dict:
            answered = response(done)
            if body.store:  # (an input ending with the assistant's words: the answer goes on)
                given = conversation[-1:] if conversation[-1:] and \
                    conversation[-1]["role"] == "assistant" else []
                said = "".join(m["content"] for m in given) + done.text
                kept.save(answered, [*conversation[:len(conversation) - len(given)],
                                     {"role": "assistant", "content": said}],
                          list(options["documents"]))
            return answered

        if not body.stream:
            try:
                done = await bridge.call(request, stopping, lambda cancel: app.engine.complete(
                    messages, cancel=cancel, **options))
            except (ContextFullError, InvalidValue) as e:
                raise _in_input(e) from None
            refuse_cut(done)  # (the server stopping cut it short: an error, never stored)
            return finish(done)
        at = {"item_id": mid, "output_index": 0}
        part = {"type": "output_text", "text": "", "annotations": []}
        opening = [("response.created", {"response": response(None)}),
                   ("response.output_item.added", {"output_index": 0, "item": item(mid, None)}),
                   ("response.content_part.added", {**at, "content_index": 0, "part": part})]

        def closing(done: Completion) -> list[dict]:
            if not finished(done):  # cut short by the server stopping: never a whole answer
                return [{**cut_body()["error"], "type": "error"}]
            answered = finish(done)
            text = {**part, "text": done.text}
            return [{"type": "response.output_text.done", **at, "content_index": 0,
                     "text": done.text, "logprobs": []},
                    {"type": "response.content_part.done", **at, "content_index": 0,
                     "part": text},
                    {"type": "response.output_item.done", "output_index": 0,
                     "item": answered["output"][0]},
                    {"type": f"response.{answered['status']}", "response": answered}]

        try:
            objects = await streams.objects(
                request, stopping, lambda emit, cancel: app.engine.complete(
                    messages, cancel=cancel, on_token=emit,
                    on_start=lambda: emit(bridge.READY), **options),
                piece=lambda text: {"type": "response.output_text.delta", **at,
                                    "content_index": 0, "delta": text, "logprobs": []},
                done=closing,
                error=lambda e: {**error_of(_in_input(e))[1]["error"], "type": "error"})
        except (ContextFullError, InvalidValue) as e:  # refused before it began: the status
            raise _in_input(e) from None

        async def events():
            n = 0
            for kind, obj in opening:
                yield _event({"type": kind, **obj}, n)
                n += 1
            async for obj in objects:
                yield _event(obj, n)
                n += 1

        return _stream(events())

    @api.get("/v1/responses/{rid}")
    async def retrieve(rid: str):
        return kept.load(rid)["response"]

    @api.delete("/v1/responses/{rid}")
    async def delete(rid: str):
        kept.delete(rid)
        return {"id": rid, "object": "response.deleted", "deleted": True}


def _in_input(e: BaseException) -> BaseException:
    """What chat names `messages` (a prompt too long for the context, a conversation with
    no question) is this API's `input`."""
    if isinstance(e, ContextFullError):
        return ContextFullError(str(e), "input")
    if isinstance(e, InvalidValue) and e.key == "messages":
        return InvalidValue("input", e.reason)
    return e


def item(mid: str, done: Completion | None) -> dict:
    """The answer's message item: incomplete, as its response is, when cut at its limit."""
    return {"type": "message", "id": mid, "role": "assistant",
            "status": "in_progress" if done is None else "incomplete"
            if done.finish_reason == "length" else "completed",
            "content": [] if done is None else [{"type": "output_text", "text": done.text,
                                                 "annotations": []}]}


def shape(body: ResponsesRequest, rid: str, mid: str, created: int,
          done: Completion | None) -> dict[str, Any]:
    """The response object: in progress (None), or answered."""
    cut = done is not None and done.finish_reason == "length"
    out = {"id": rid, "object": "response", "created_at": created, "model": body.model,
           "status": "in_progress" if done is None else "incomplete" if cut else "completed",
           "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
           "error": None, "instructions": body.instructions,
           "previous_response_id": body.previous_response_id,
           "max_output_tokens": body.max_output_tokens, "temperature": body.temperature,
           "top_p": body.top_p, "store": body.store, "parallel_tool_calls": False,
           "tool_choice": "none", "tools": [], "text": {"format": body.text_format()},
           "truncation": "disabled", "metadata": {},
           "output": [] if done is None else [item(mid, done)], "usage": None}
    if done is not None:
        out["usage"] = {"input_tokens": done.prompt_tokens,
                        "input_tokens_details": {"cached_tokens": done.cached_tokens},
                        "output_tokens": done.completion_tokens,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": done.prompt_tokens + done.completion_tokens}
        out["kvdesk"] = s.restore_info(s.noted(done, body.declined_tools()))
    return out


def _event(obj: dict, n: int) -> dict:
    return {"event": obj["type"], "data": json.dumps({**obj, "sequence_number": n})}
