"""What Ollama's API requests may carry, how their `options` map onto kvdesk's, and the
objects Ollama answers with.

Ollama's `options` go through kvdesk's one validation layer (`options.GenerationOptions`), each
named as the client sent it: `options.num_predict: Input should be greater than or equal to 1`.
Sampling options map onto kvdesk's by name (`num_predict` is the longest answer); options that
tell Ollama's runner how to use the hardware (`num_gpu`, `num_thread`, `use_mmap`...) are
accepted and have nothing to do here; `num_ctx` is accepted, the server's context size holding
(`kvdesk --n-ctx N serve`); a sampler kvdesk does not have (`mirostat`, `typical_p`, `tfs_z`) is
accepted only at the value that turns it off, and any other option is refused by name, as are
images and thinking. `format` ("json", or a JSON schema) holds the answer to a grammar
(`answerformat.AnswerFormat`), a schema that cannot be one refused by name. `tools` are offered
as on OpenAI's chat completions (`desktop_app.tools`, the choice "auto": Ollama has no other),
a history's tool calls and `tool` messages written into the model's turns, and an answer's
calls given as Ollama gives them (`tool_calls`, the arguments an object). kvdesk's own `kvdesk`
field (documents to answer from, the restore level and budget) is read as on OpenAI's
routes. Answers are Ollama's objects: a streamed answer is JSON lines, each piece `"done":
false`, the last `"done": true` with `done_reason`, the durations in nanoseconds and the token
counts, plus kvdesk's field saying how the prompt came back (`restored_tokens`...). It
answers nothing itself: `ollama` routes the requests.
"""

from __future__ import annotations

import hashlib
import re
import time
from datetime import UTC, datetime
from typing import Any, Literal

import pydantic

from ..model import answerformat
from ..model.answerformat import AnswerFormat
from ..options import GenerationOptions
from ..results import Completion
from ..tools import Answer, Offer, offer_of, written
from ..validation import InvalidValue, RequestValues, null_is_default, parse
from . import schemas as s

# Ollama's names of kvdesk's generation options.
SAMPLING = {"num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k",
            "top_p": "top_p", "min_p": "min_p", "repeat_penalty": "repeat_penalty",
            "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty", "seed": "seed"}
# How Ollama's runner loads the model and uses the hardware: nothing to do with the answer.
RUNNER = {"num_ctx", "num_keep", "num_batch", "num_gpu", "main_gpu", "use_mmap", "use_mlock",
          "num_thread", "numa", "low_vram", "vocab_only", "f16_kv", "logits_all",
          "penalize_newline", "mirostat_tau", "mirostat_eta"}
# Samplers kvdesk does not have, at the value that turns each off.
OFF = {"mirostat": 0, "typical_p": 1, "tfs_z": 1}
NO_IMAGES = "images are not supported by this model"
# keep_alive as Ollama reads it: Go's durations ("5m", "1h30m", "-1m"; "0"), or seconds (a
# number, which clients also send as a string: "-1").
DURATION = re.compile(r"[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+"
                      r"|[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def keep_alive_checked():
    """A model's validator refusing a `keep_alive` that is not a duration, as Ollama does (400),
    though kvdesk keeps the model while it serves whatever it says."""
    def checked(cls, value: Any) -> Any:
        if isinstance(value, str) and not DURATION.fullmatch(value):
            raise ValueError('not a duration: seconds (a number), or a duration such as "5m" '
                             'or "1h30m" (negative: for ever)')
        return value
    return pydantic.field_validator("keep_alive")(classmethod(checked))


class Message(RequestValues):
    model_config = pydantic.ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[str] | None = None
    tool_calls: list[Any] | None = None
    tool_name: str | None = None  # the tool a `tool` message's result is of

    def checked(self, where: str) -> dict:
        """The message for `tools.written`."""
        if self.images:
            raise InvalidValue(f"{where}.images", NO_IMAGES)
        return {"role": self.role, "content": self.content or "",
                **({"tool_calls": self.tool_calls} if self.tool_calls else {}),
                **({"tool_name": self.tool_name} if self.tool_name else {})}


class _Request(RequestValues):
    model_config = pydantic.ConfigDict(extra="ignore")
    model: str = pydantic.Field(min_length=1)
    options: dict[str, Any] = pydantic.Field(default_factory=dict)
    stream: bool = True  # Ollama's default
    format: str | dict | None = None
    keep_alive: str | float | None = None  # accepted: kvdesk keeps the model while serving
    think: bool | str | None = None
    _nulls = null_is_default("stream", "options", "kvdesk")
    _durations = keep_alive_checked()
    # kvdesk's own field, as on OpenAI's routes: documents to answer from, how to restore.
    kvdesk: s.KvdeskOptions = pydantic.Field(default_factory=s.KvdeskOptions)

    def engine_options(self, offer: Offer | None = None, held: Offer | None = None) -> dict:
        """What the engine's `complete` takes besides the prompt (`KvdeskOptions`), held to
        the tool calls' grammar where tools are offered (`offer`) and a call may be made
        (`held`: `Offer.held`)."""
        given = self.answer_format()
        if offer is not None and given is not None:
            raise InvalidValue("format", "a format and tools cannot hold one answer together: "
                               "leave out one or the other")
        if offer is not None:
            given = held.answer_format() if held is not None else None
        return self.kvdesk.engine_options(*self.generation(), given)

    def answer_format(self) -> AnswerFormat | None:
        """`format`'s grammar: "json" any JSON object (as Ollama's), else what the schema
        describes; none for an empty one."""
        if not self.format:
            return None
        if self.format == "json":
            return answerformat.json_object("format")
        if isinstance(self.format, str):
            raise InvalidValue("format", f'"json" or a JSON schema (got {self.format!r})')
        return answerformat.json_schema(self.format, "format")

    def check_supported(self) -> None:
        if self.think:
            raise InvalidValue("think", f"{self.model!r} does not support thinking")

    def unloading(self) -> bool:
        """keep_alive 0 asks Ollama to unload the model; kvdesk keeps it while serving."""
        return self.keep_alive in (0, "0", "0s", "0m")

    def generation(self) -> tuple[GenerationOptions, list[str]]:
        """The options as kvdesk's generation options (checked), and the stop strings."""
        given, names = {}, {}
        for key, value in self.options.items():
            if key == "num_predict" and isinstance(value, int) and not isinstance(value, bool) \
                    and value < 1 and value not in (-1, -2):
                raise InvalidValue("options.num_predict", "-1 (no limit), -2 (until the "
                                   f"context is full) or at least 1 (got {value})")
            if key in SAMPLING:
                if value is not None and not (key == "seed" and value == -1) and not (
                        key == "num_predict" and value in (-1, -2)):  # -1, -2: no limit
                    given[SAMPLING[key]] = value
                names[SAMPLING[key]] = f"options.{key}"
            elif key in OFF:
                if value not in (None, OFF[key]):
                    raise InvalidValue(f"options.{key}", f"kvdesk has no {key} sampler; "
                                       f"leave it out, or {OFF[key]} (off)")
            elif key == "num_ctx":
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                          or value < 1):
                    raise InvalidValue("options.num_ctx", f"a positive whole number (got "
                                       f"{value!r})")
            elif key not in RUNNER and key != "stop":
                raise InvalidValue(f"options.{key}", "not an option kvdesk knows")
        stop = self.options.get("stop") or []
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
            raise InvalidValue("options.stop", "a list of strings")
        return parse(GenerationOptions, given, names=names, strict=True), [x for x in stops if x]


class ChatRequest(_Request):
    messages: list[Message] = pydantic.Field(default_factory=list)
    tools: list[Any] | None = None

    def offer(self) -> Offer | None:
        """The tools offered, checked (`tools.offer_of`), or None."""
        return offer_of(self.tools)

    def conversation(self, offer: Offer | None) -> list[dict]:
        """The messages as the model reads them: tool calls and results written as text,
        the tools told in the system prompt."""
        self.check_supported()
        messages = written([m.checked(f"messages.{i}") for i, m in enumerate(self.messages)])
        return offer.messages(messages) if offer is not None and messages else messages


class GenerateRequest(_Request):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None
    tools: Any = None  # (not Ollama's here: refused by name, as text completions refuse them)

    def check_supported(self) -> None:
        super().check_supported()
        if self.tools:
            raise InvalidValue("tools", s.TOOLS_HERE)
        if self.images:
            raise InvalidValue("images", NO_IMAGES)
        if self.template:
            raise InvalidValue("template", "kvdesk renders prompts with the model's own chat "
                               "template; leave it out, or send raw prompts (raw: true)")
        if self.context:
            raise InvalidValue("context", "not supported; send the conversation to /api/chat, "
                               "whose prompt cache keeps it across requests and restarts")


class ShowRequest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")
    model: str | None = None
    name: str | None = None  # older clients' name for it

    @property
    def asked(self) -> str:
        if not (self.model or self.name):
            raise InvalidValue("model", "the model's name is needed")
        return self.model or self.name


class PullRequest(ShowRequest):
    """A pull: the model (`insecure` has nothing to do here: nothing is downloaded)."""

    stream: bool = True  # Ollama's default
    _nulls = null_is_default("stream")


class EmbedRequest(RequestValues):
    """/api/embed's `input` (one text or several), or the older /api/embeddings' `prompt`;
    `truncate` (Ollama's default: true) reads a text to the embedder's limit, false refuses a
    longer one (`embeddings.MAX_INPUT_TOKENS`). `options` and `keep_alive` are accepted."""

    model_config = pydantic.ConfigDict(extra="ignore")
    model: str
    input: s.EmbeddingInput = pydantic.Field(default_factory=list)
    prompt: str | None = None
    dimensions: int | None = pydantic.Field(default=None, ge=1)
    truncate: bool = True
    options: dict[str, Any] | None = None
    keep_alive: str | int | float | None = None
    _nulls = null_is_default("input")
    _durations = keep_alive_checked()


# -- answers ------------------------------------------------------------------------------------


def timestamp(seconds: float | None = None) -> str:
    """RFC 3339, as Ollama writes its times."""
    return datetime.fromtimestamp(time.time() if seconds is None else seconds, UTC) \
        .isoformat().replace("+00:00", "Z")


def stamped(model: str, **fields) -> dict:
    return {"model": model, "created_at": timestamp(), **fields}


def chat_piece(model: str, text: str, *, done: bool = False) -> dict:
    return stamped(model, message={"role": "assistant", "content": text}, done=done)


def calls_piece(model: str, answer: Answer, *, done: bool = False) -> dict:
    """An answer's tool calls as Ollama gives them: each function's name and its arguments
    as an object (`content` empty)."""
    piece = chat_piece(model, "", done=done)
    piece["message"]["tool_calls"] = [
        {"function": {"index": i, "name": call.name, "arguments": call.parsed()}}
        for i, call in enumerate(answer.calls)]
    return piece


def generate_piece(model: str, text: str, *, done: bool = False) -> dict:
    return stamped(model, response=text, done=done)


def loaded(model: str, chat: bool, unloading: bool) -> dict:
    """The answer to an empty request: clients send one to load (or unload) the model."""
    piece = chat_piece if chat else generate_piece
    return {**piece(model, "", done=True), "done_reason": "unload" if unloading else "load"}


def final(c: Completion, started: float, taken: float) -> dict:
    """The last object's counts and durations (ns), and how the prompt came back. The time
    the request waited for those before it (`taken` - `started`) counts in the total only, as
    Ollama's does: a client reckoning tokens a second from the others gets this machine's."""
    total = time.perf_counter() - started
    waited = max(0.0, taken - started)
    return {"done_reason": "length" if c.finish_reason == "length" else "stop",
            "total_duration": nanoseconds(total), "load_duration": 0,
            "prompt_eval_count": c.prompt_tokens,
            "prompt_eval_duration": nanoseconds(max(0.0, c.ttft_s - waited)),
            "eval_count": c.completion_tokens,
            "eval_duration": nanoseconds(max(0.0, total - c.ttft_s)),
            "kvdesk": s.restore_info(c)}


def digest(model_hash: str) -> str:
    """The model's digest as Ollama shows one, 64 hex digits (a sha256's), from kvdesk's hash
    of the file's bytes: the same file, the same digest, wherever it is shown."""
    return hashlib.sha256(model_hash.encode()).hexdigest()


def error(message: str) -> dict:
    return {"error": message}


def nanoseconds(seconds: float) -> int:
    return int(seconds * 1e9)
