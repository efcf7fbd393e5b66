"""A conversation's tool calls and tool results as the model reads them, and an answer read
back into calls.

`written`: a client's history (OpenAI's and Ollama's: an assistant message with `tool_calls`,
a `tool` message with the result) as plain messages the chat template renders: the
assistant's calls as the text the model writes for them (`offer`'s one-line envelope, so that
an answer stored in the prompt cache is found again when the client sends it back), a tool's
result as a user turn saying which call it answers (no shipped model has a tool role: Gemma's
template would render one as the model's own turn).

`read`: an answer that begins with the marker is its calls (held to the grammar: each parses,
its arguments as the schema says), the arguments kept as the text the model wrote; any other
is text. `Watch`: the same decision on a streamed answer, its text passed on as soon as it
cannot be the start of a call.

It never evaluates anything, and never runs a tool.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..validation import InvalidValue
from .offer import CLOSE, MARKER, NAME, Offer, lead

RESULT = "tool_result"  # the key marking a tool's result among `written`'s user messages


@dataclass(frozen=True)
class Call:
    """A tool call: its id, the function's name and its arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def parsed(self) -> Any:
        return json.loads(self.arguments)


@dataclass(frozen=True)
class Answer:
    """An answer read: its text (None when it is calls alone) and its calls; `whole`: cut at
    its limit where nothing of its calls was lost (in a call that, so far, is one of them
    written again, or in a call's closing marks, after its arguments)."""

    content: str | None
    calls: tuple[Call, ...] = ()
    whole: bool = False


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def block(name: str, arguments: str) -> str:
    """A call as the model writes it (`offer`'s grammar)."""
    return f"{MARKER}{lead(name)}{arguments}}}{CLOSE}"


def written(messages: Sequence[dict]) -> list[dict]:
    """`messages` with their tool calls and tool results as plain text messages ({"role",
    "content"}). An assistant message's `tool_calls` are [{"id", "function": {"name",
    "arguments"}}], the arguments JSON text (OpenAI) or a value (Ollama); a tool message
    names its call by `tool_call_id` (OpenAI) or the tool by `tool_name` (Ollama); either is
    said where known. A result's message is marked `RESULT`: a user message, but not what the
    user asks (a long document's passages are retrieved for the question before it). Bad
    calls are refused (400) by their field, `messages.3.tool_calls.0`."""
    out, names = [], {}
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") or []
        if m["role"] == "tool":
            call_id = m.get("tool_call_id")
            name = m.get("tool_name") or m.get("name") or names.get(call_id)
            said = " ".join(filter(None, [f"of {name}" if name else "",
                                          f"(call {call_id})" if call_id else ""]))
            out.append({"role": "user", RESULT: True,
                        "content": f"Tool result{' ' + said if said else ''}:\n"
                                   f"{m.get('content') or ''}"})
            continue
        if not calls:
            out.append({"role": m["role"], "content": m.get("content") or ""})
            continue
        if m["role"] != "assistant":
            raise InvalidValue(f"messages.{i}.tool_calls", "only an assistant message calls "
                               "tools")
        if i == len(messages) - 1:
            raise InvalidValue(f"messages.{i}.tool_calls", "the conversation ends with tool "
                               "calls whose results are missing: send each call's result "
                               "after it, as a tool message")
        blocks = []
        for j, call in enumerate(calls):
            name, arguments, call_id = _call(call, f"messages.{i}.tool_calls.{j}")
            names[call_id] = name
            blocks.append(block(name, arguments))
        text = (m.get("content") or "").strip()
        out.append({"role": "assistant",
                    "content": "\n".join([*([text] if text else []), *blocks])})
    return out


def _call(call: Any, where: str) -> tuple[str, str, str | None]:
    """(name, arguments as JSON text, id) of a call in a client's history."""
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidValue(f"{where}.function.name", "a tool call names its function")
    # (written into the prompt as the model writes a call: one line, a tool's name)
    if not NAME.fullmatch(name):
        raise InvalidValue(f"{where}.function.name", "a name of 1 to 64 letters, digits, _ "
                           f"or - (got {name!r})")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments or "{}", parse_constant=_not_json)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise InvalidValue(f"{where}.function.arguments", "the arguments are JSON text "
                               "of an object") from None
        text = arguments.strip() or "{}"
    elif arguments is None or isinstance(arguments, dict):
        # (Ollama's: the value itself; written as json.dumps writes it)
        text = json.dumps(arguments or {}, ensure_ascii=False)
    else:
        raise InvalidValue(f"{where}.function.arguments", "the arguments are an object")
    call_id = call.get("id")
    return name, text, call_id if isinstance(call_id, str) else None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")  # (Python's json reads NaN and Infinity)


def read(offer: Offer, text: str) -> Answer:
    """The answer `text` as calls, where it begins with the marker (each block whole: one cut
    at the answer's limit is left out), else as text. Calls come only of an answer the
    grammar held: they parse, name an offered tool, and (where the converter held them)
    match its schema."""
    rest = text.lstrip()
    if not rest.startswith(MARKER):
        return Answer(text)
    calls, blocks, seen, decoder = [], [], set(), json.JSONDecoder()
    while rest.startswith(MARKER):
        tool = next((t for t in offer.tools if rest.startswith(MARKER + lead(t.name))), None)
        if tool is None:
            break
        at = len(MARKER + lead(tool.name))
        try:
            value, end = decoder.raw_decode(rest, at)
        except ValueError:
            break  # (cut at the answer's limit)
        tail = rest[end:].lstrip(" ")
        closed = tail.startswith("}" + CLOSE)
        if not closed and not ("}" + CLOSE).startswith(tail):
            break  # (the closing marks cut at the answer's limit: the call itself is whole)
        if (tool.name, _canonical(value)) not in seen:  # (once: the same call, however spaced)
            seen.add((tool.name, _canonical(value)))
            calls.append(Call(new_call_id(), tool.name, rest[at:end]))
        after = tail[len("}" + CLOSE):] if closed else ""
        blocks.append(rest[:len(rest) - len(after)])
        rest = after.lstrip()
        if not closed:
            return Answer(None, tuple(calls), True)
    whole = bool(rest) and any(b.startswith(rest) for b in blocks)
    return Answer(None, tuple(calls), whole) if calls else Answer(text)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _same_as(block: str) -> str:
    """A whole call's text (between the markers: itself a JSON object), spaced as any other
    writing of the same call."""
    try:
        return _canonical(json.loads(block))
    except ValueError:
        return block


class Repeats:
    """Whether an answer of several calls (`parallel`) has written one of them again, whole:
    where the answer should end. Free to call again, the shipped models write the same call
    until their limit (measured: SmolLM2 at its default temperature)."""

    def __init__(self, offer: Offer | None):
        self.watching = offer is not None and offer.parallel
        self.seen = False
        self._text = ""

    def feed(self, piece: str) -> bool:
        """Take the answer's next piece; whether a call has now been written twice."""
        if self.watching and not self.seen:
            self._text += piece
            if CLOSE in self._text[-len(piece) - len(CLOSE):]:
                whole = [_same_as(b.strip().removeprefix(MARKER))
                         for b in self._text.split(CLOSE)[:-1]]
                self.seen = len(set(whole)) < len(whole)
        return self.seen

    def stopping(self, cancel: Any, then: Callable[[str], None] | None = None
                 ) -> Callable[[str], None] | None:
        """`then` (an answer's token callback), also setting `cancel` (the answer's, which
        ends it within a token) once a call is written again."""
        if not self.watching:
            return then

        def fed(piece: str) -> None:
            if then is not None:
                then(piece)
            if self.feed(piece):
                cancel.set()
        return fed


class Watch:
    """A streamed answer's text passed on (`emit`) once it cannot be the start of a call;
    a call's text kept back, for `read` at the end (`finish`)."""

    def __init__(self, offer: Offer | None, emit: Callable[[str], None]):
        self.emit = emit
        # (a call is all the answer may be: nothing to pass on)
        self.state = "text" if offer is None else "calls" if offer.choice != "auto" else None
        self._held = ""

    def feed(self, piece: str) -> None:
        if self.state == "text":
            self.emit(piece)
            return
        if self.state == "calls":
            return
        self._held += piece
        start = self._held.lstrip()
        if start.startswith(MARKER):
            self.state = "calls"
        elif not MARKER.startswith(start):
            self.state = "text"
            self.emit(self._held)

    def finish(self, whole: str, answer: Answer | None) -> str:
        """The end of the answer (`whole`, read as `answer`): the text not passed on yet,
        unless it was calls (an answer that began as a call but was cut: all of it, as
        text), for the caller to send."""
        state, self.state = self.state, "text"
        if answer is not None and answer.calls:
            return ""
        return whole if state == "calls" else self._held if state is None else ""
