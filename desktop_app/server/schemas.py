"""What the local API's requests may carry, and the OpenAI shapes it answers with.

Requests are pydantic models; the values they pass on to the engine are built through the one
validation layer (`options`, `validation`), so a negative `max_tokens` is refused here with
the same rule as `kvdesk ask --max-tokens -3`. Fields of OpenAI's API that kvdesk does not
implement and that would change the answer's meaning (several choices, log probabilities;
tools on the routes other than chat completions) are refused by name; others (user,
metadata...) are ignored, as OpenAI-compatible servers do. A response format (JSON, or a JSON
schema) holds the answer to a grammar (`answer_format`: `answerformat.AnswerFormat`), a schema
that cannot be one refused by its field. Chat completions' tools are checked and told to the
model by `desktop_app.tools` (`ChatRequest.offer`), its calls answered in OpenAI's shapes
(`tool_calls`, `call_deltas`). Responses follow OpenAI's chat completion objects, with a
`kvdesk` field saying how the prompt came back into the model.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Annotated, Any, Literal

import pydantic
import pydantic_core
from pydantic import Field

from ..errors import EngineError
from ..kv.levels import check_levels
from ..model import answerformat
from ..model.answerformat import AnswerFormat
from ..options import AUTO, GenerationOptions, RestoreOptions
from ..results import Completion
from ..tools import Answer, Offer, Repeats, offer_of
from ..validation import InvalidValue, RequestValues, null_is_default, parse

MAX_STOP = 4  # as OpenAI


def _text_or_tokens(value: Any, handler: pydantic.ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except pydantic.ValidationError:
        raise pydantic_core.PydanticCustomError(
            "embedding_input", "should be a string or an array of strings") from None


# An embeddings route's `input` (OpenAI's and Ollama's). Token arrays are in the type only to
# be refused with the reason (`embeddings.embedded`: the embedder reads text): a value of no
# shape is told what is accepted, not the token forms pydantic would list among them.
EmbeddingInput = Annotated[str | list[str] | list[int] | list[list[int]],
                           pydantic.WrapValidator(_text_or_tokens)]


# Content parts kvdesk's models cannot read, each refused in words the user can act on.
UNREADABLE_PARTS = {"image_url": "images are not supported by this model",
                    "input_image": "images are not supported by this model",
                    "input_audio": "audio is not supported by this model",
                    "file": "files in messages are not supported: attach documents through "
                            "/v1/kvdesk/documents and name them in the kvdesk field"}


class Part(pydantic.BaseModel):
    """One part of a message's content; only text is read (`Message.check_parts`)."""

    model_config = pydantic.ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class Message(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    # an assistant's calls, and the call a tool's result answers (`tools.written`)
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None

    def check_parts(self, where: str) -> None:
        # (an assistant's may be null, as after a tool call; a question or instruction never)
        if self.content is None and self.role != "assistant":
            raise InvalidValue(f"{where}.content", f"a {self.role} message needs its text")
        for i, part in enumerate(self.content if isinstance(self.content, list) else []):
            if part.type != "text":
                raise InvalidValue(f"{where}.content.{i}", UNREADABLE_PARTS.get(
                    part.type, f"a {part.type!r} part is not supported: text only"))
            if part.text is None:
                raise InvalidValue(f"{where}.content.{i}.text", "a text part needs its text")

    def flat(self) -> dict:
        """{"role", "content"} as the chat template takes it (a developer message is a
        system message; text parts joined)."""
        text = self.content if isinstance(self.content, str) else \
            "".join(p.text or "" for p in self.content or [])
        flat = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.tool_calls:
            flat["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            flat["tool_call_id"] = self.tool_call_id
        return flat


def each_once(*fields: str):
    """A model's validator keeping each id of `fields` once, in the order first given: a
    document named twice is read once (`"documents": [1, 1]`), on every route."""
    def once(cls, ids: list[int]) -> list[int]:
        return list(dict.fromkeys(ids))
    return pydantic.field_validator(*fields)(classmethod(once))


class KvdeskOptions(RequestValues):
    """kvdesk's own request field: documents to answer from, and how to restore."""

    model_config = pydantic.ConfigDict(extra="forbid")
    documents: list[int] = Field(default_factory=list, max_length=64)
    level: str = AUTO
    budget_ms: float | None = None
    bandwidth_MBps: float | None = None
    _once = each_once("documents")

    def engine_options(self, generation: GenerationOptions, stop: list[str],
                       answer_format: AnswerFormat | None = None) -> dict:
        """What the engine's `complete` takes besides the prompt: these documents and how to
        restore (checked), with the request's generation options, stop strings and the
        format its answer is held to (`answer_format`)."""
        return {"documents": self.documents, "restore": self.restore(),
                "generation": generation, "stop": stop, "answer_format": answer_format}

    def restore(self) -> RestoreOptions:
        if self.level != AUTO:
            try:
                check_levels([self.level], restoring=True)
            except EngineError as e:
                raise InvalidValue("kvdesk.level", str(e)) from None
        return parse(RestoreOptions, {"level": self.level, "budget_ms": self.budget_ms,
                                      "bandwidth_MBps": self.bandwidth_MBps},
                     names={"level": "kvdesk.level", "budget_ms": "kvdesk.budget_ms",
                            "bandwidth_MBps": "kvdesk.bandwidth_MBps"})


class StreamOptions(RequestValues):
    model_config = pydantic.ConfigDict(extra="ignore")
    include_usage: bool = False


TOOLS_HERE = ("tool calls are answered on /v1/chat/completions and Ollama's /api/chat, not on "
              "this route")
FUNCTIONS = "the older functions are not taken: send them as tools, on /v1/chat/completions"
UNSUPPORTED = {"tools": TOOLS_HERE, "functions": FUNCTIONS, "tool_choice": TOOLS_HERE,
               "function_call": FUNCTIONS, "audio": "kvdesk answers text only; audio is not "
               "supported", "prediction": "predicted outputs are not supported",
               "logit_bias": "logit biases are not supported",
               "web_search_options": "web searches are not supported"}
# Each way of offering tools, with the field that chooses among them.
CHOICE = {"tools": "tool_choice", "functions": "function_call"}


class Sampled(RequestValues):
    """What OpenAI's chat and text completions and the Responses API share: the model,
    streaming, how the answer is sampled and where it stops, and kvdesk's own field (the
    documents to answer from, how to restore: `KvdeskOptions`, checked alike on each)."""

    model_config = pydantic.ConfigDict(extra="allow", allow_inf_nan=False)  # (NaN: "finite")
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # GenerationOptions' fields by their names (OpenAI's, and llama.cpp server's for top_k,
    # min_p, repeat_penalty and repeat_last_n); one not given comes from the settings file,
    # the model file or kvdesk's defaults, as for `kvdesk ask`.
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = Field(None, le=2)  # (OpenAI's range: 0 to 2)
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    logprobs: bool | int | None = None
    kvdesk: KvdeskOptions = Field(default_factory=KvdeskOptions)
    _nulls = null_is_default("stream", "n", "kvdesk")

    def declined_tools(self) -> list[str]:
        """The tool fields given with a choice of none ("none"): clients (Continue, LangChain,
        Open WebUI) send their tool list whatever they ask, and OpenAI then answers in text.
        They go unused (never shown to the model), said in the answer's notes (`noted`)."""
        extra = self.model_extra or {}
        return [name for name, choice in CHOICE.items()
                if extra.get(name) and extra.get(choice) == "none"]

    def check_supported(self) -> None:
        extra = self.model_extra or {}
        declined = self.declined_tools()
        for name, what in UNSUPPORTED.items():
            value = extra.get(name)
            offered = next((t for t, c in CHOICE.items() if c == name), None)
            # A choice that asks for no tool call is taken: "none" always, "auto" with no
            # tools offered (clients send both as defaults); a tool call asked for never is.
            if not value or name in declined or offered and (
                    value == "none" or value == "auto" and not extra.get(offered)):
                continue
            raise InvalidValue(name, what)
        if self.n != 1:
            raise InvalidValue("n", "kvdesk answers with one choice")
        if self.logprobs:
            raise InvalidValue("logprobs", "not supported")
        if any(m != "text" for m in extra.get("modalities") or []):
            raise InvalidValue("modalities", "kvdesk answers text only")

    def generation(self) -> GenerationOptions:
        given = {name: getattr(self, name) for name in GenerationOptions.model_fields}
        newer = self.max_completion_tokens is not None  # OpenAI's newer name wins
        given["max_tokens"] = self.max_completion_tokens if newer else self.max_tokens
        return parse(GenerationOptions, given,
                     names={"max_tokens": "max_completion_tokens" if newer else "max_tokens"})

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise InvalidValue("stop", f"at most {MAX_STOP} sequences")
        return [s for s in stops if s]


class ChatRequest(Sampled):
    messages: list[Message] = Field(min_length=1)
    response_format: dict | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None

    def check_supported(self) -> None:
        super().check_supported()
        for i, message in enumerate(self.messages):
            message.check_parts(f"messages.{i}")

    def declined_tools(self) -> list[str]:
        return [*(["tools"] if self.tools and self.tool_choice == "none" else []),
                *super().declined_tools()]

    def offer(self) -> Offer | None:
        """The tools the model may call, checked (`tools.offer_of`); None for none."""
        return offer_of(self.tools, self.tool_choice, self.parallel_tool_calls)

    def answer_format(self, offer: Offer | None = None, held: Offer | None = None
                      ) -> AnswerFormat | None:
        """The grammar the answer is held to: with tools offered (`offer`), the tool calls'
        where a call may be made (`held`: `Offer.held`), else none."""
        given = answer_format(self.response_format, "response_format", nested=True)
        if offer is not None and given is not None:
            raise InvalidValue("response_format", "a format and tools cannot hold one answer "
                               "together: leave out one or the other")
        if offer is not None:
            return held.answer_format() if held is not None else None
        return given


def answer_format(given: dict | None, field: str, *, nested: bool) -> AnswerFormat | None:
    """The grammar an OpenAI response format holds the answer to: none for text; any JSON
    object for `json_object`; for `json_schema`, what its `schema` describes (none given: any
    object), under `json_schema` in chat completions (`nested`), beside `type` in the
    Responses API's `text.format`. Its `strict` changes nothing: a grammar is always strict."""
    kind = (given or {}).get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return answerformat.json_object(field)
    if kind != "json_schema":
        raise InvalidValue(f"{field}.type", "text, json_object or json_schema (got "
                           f"{_describe(kind)})")
    where, spec = (f"{field}.json_schema", given.get("json_schema")) if nested else (field, given)
    if not isinstance(spec, dict):
        raise InvalidValue(where, "an object with the schema's name and its schema")
    if spec.get("schema") is None:
        return answerformat.json_object(field)
    return answerformat.json_schema(spec["schema"], f"{where}.schema")


def _describe(value: Any) -> str:
    return repr(value) if isinstance(value, str) else type(value).__name__


class AskRequest(RequestValues):
    """kvdesk's own turn in a stored chat (what `kvdesk ask` sends to a running server)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    question: str
    chat_id: int | None = None
    doc_ids: list[int] = Field(default_factory=list)
    _once = each_once("doc_ids")
    restore: dict[str, Any] = Field(default_factory=dict)
    generation: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    # A name the client gives the turn, to stop it later (`StopRequest`) and still be sent its
    # result, the answer so far kept, as `kvdesk ask` does on Ctrl-C.
    stop_id: str | None = Field(None, min_length=8, max_length=64)


class StopRequest(RequestValues):
    """Stop the turn a client named in its `AskRequest.stop_id`."""

    model_config = pydantic.ConfigDict(extra="forbid")
    stop_id: str = Field(min_length=8, max_length=64)


class ReopenRequest(RequestValues):
    model_config = pydantic.ConfigDict(extra="forbid")
    restore: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False


class AttachByPath(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    path: str
    levels: list[str] | None = None


# -- answers ------------------------------------------------------------------------------------


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def restore_info(c: Completion) -> dict:
    """How the prompt came back into the model: kvdesk's field on a completion."""
    r = c.report
    return {"restored_tokens": c.cached_tokens,
            "recomputed_tokens": c.prompt_tokens - c.cached_tokens,
            "chunk_levels": r.chunk_levels,
            "restore_s": round(r.restore_s, 4), "source": r.source, "stored": c.stored,
            "ttft_s": c.ttft_s, "messages": c.messages, "sources": c.sources,
            "evidence": c.evidence, "read_whole": c.read_whole}


def noted(c: Completion, declined: list[str]) -> Completion:
    """The completion with a note first for each tool field that went unused
    (`Sampled.declined_tools`)."""
    said = [f'{name}: not shown to the model, as {CHOICE[name]} "none" asks; the answer is '
            "text" for name in declined]
    return replace(c, messages=[*said, *c.messages]) if said else c


def usage(c: Completion) -> dict:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens}}


def completion(c: Completion, *, cid: str, model: str, answer: Answer | None = None) -> dict:
    """A chat completion; with `answer` (the text read for tool calls), its calls."""
    message = {"role": "assistant", "content": c.text}
    if answer is not None and answer.calls:
        message = {**message, "content": answer.content, "tool_calls": tool_calls(answer)}
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish(c, answer)}],
            "usage": usage(c), "kvdesk": restore_info(c)}


def finish(c: Completion, answer: Answer | None) -> str:
    """OpenAI's finish_reason: "tool_calls" for an answer of calls ended by the model, or cut
    at its limit where its calls are whole (`Answer.whole`: writing one of them again, or a
    call's closing marks)."""
    calls = answer is not None and answer.calls and (
        c.finish_reason == "stop" or c.finish_reason == "length" and answer.whole)
    return "tool_calls" if calls else c.finish_reason


def ended(c: Completion, repeats: Repeats) -> Completion:
    """An answer of calls stopped once one was written again (`tools.Repeats`) as one the
    model ended: "cancelled" there was kvdesk's own stop, not the client's."""
    return replace(c, finish_reason="stop") if repeats.seen and \
        c.finish_reason == "cancelled" else c


def tool_calls(answer: Answer) -> list[dict]:
    return [{"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in answer.calls]


def call_deltas(answer: Answer) -> list[dict]:
    """A streamed answer's calls as OpenAI streams them: each call's id and name first (its
    arguments empty), then its arguments."""
    return [delta for i, call in enumerate(answer.calls) for delta in (
        {"tool_calls": [{"index": i, "id": call.id, "type": "function",
                         "function": {"name": call.name, "arguments": ""}}]},
        {"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]})]


def chunk(*, cid: str, model: str, delta: dict, finish_reason: str | None = None,
          **extra) -> dict:
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish_reason}], **extra}


def error(message: str, kind: str = "invalid_request_error", code: str | None = None,
          param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}
