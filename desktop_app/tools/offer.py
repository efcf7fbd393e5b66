"""The tools a request offers and how it asks them to be used: checked (`offer_of`), told to
the model (`Offer.section`), and the grammar its answer is held to (`Offer.answer_format`).

A call is written as one line, `<tool_call>{"name": "NAME", "arguments": {...}}</tool_call>`,
the envelope fixed by the grammar (one line: a base model's answer ends at a line break), so
that the same call written back into a later request's history (`turns.written`) is the same
text, and the prompt cache reuses it. The arguments are held to the tool's `parameters`
schema through llama.cpp's schema converter (`answerformat.schema_rules`).

- "required", or one tool named: the answer is one call (several, one a line, with
  `parallel`: at most MAX_CALLS, the same call twice read as one) of those tools, nothing
  else.
- "auto": the model chooses with its first visible characters. An answer that begins with the
  marker is held to the calls; any other answer is free text that cannot begin with it. One
  pass, no second request. llama.cpp's server instead holds the answer lazily, from wherever
  a trigger appears (a call after a sentence of text), its grammar then taking the text from
  the trigger on in one piece, unchecked; here every token is checked by the grammar before
  it is taken (`llamacalls.Held`), from the first, and a text answer runs at the plain speed
  (its tokens pass the grammar's check alone). The cost: an answer in text cannot begin with
  `<tool_call>` (nor, after spaces, with it), and a call never follows text.
- "none": no tools (the server's routes leave them unshown).

A conversation ending with the assistant's own words is continued as text (`Offer.held`), the
tools still told: a call cannot continue words.

The section describing the tools depends on the tools alone, never on the choice or on
`parallel`: a client asking "auto" then "required" with the same tools shares the prefix.
It never evaluates anything, and never runs a tool.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..model import answerformat
from ..model.answerformat import AnswerFormat
from ..validation import InvalidValue

MARKER, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS = 8  # a parallel answer's most calls: a small model may otherwise call for ever
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
NO_ARGUMENTS = {"type": "object", "properties": {}}
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Tool:
    """A function the client can run: its name, what it does, its arguments' JSON schema."""

    name: str
    description: str
    parameters: dict

    def described(self) -> str:
        """One line of the section: the tool as JSON."""
        return json.dumps({"name": self.name, "description": self.description,
                           "parameters": self.parameters}, ensure_ascii=False)


@dataclass(frozen=True)
class Offer:
    """Tools offered, and the choice: "auto", "required", or a tool's name (`named`)."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    named: str | None = None
    # Several calls in one answer only where the client says so (`parallel_tool_calls: true`):
    # OpenAI's default allows them but never needs them, and the shipped models, allowed,
    # write the same call again until their limit (measured: SmolLM2 at temperature 0).
    parallel: bool = False
    field: str = "tools"

    def section(self) -> str:
        """What the system prompt says of the tools (the same for the same tools)."""
        return ("You can call tools: functions that the user's application runs for you. To "
                f'call one, answer with only {MARKER}{{"name": "<the tool\'s name>", '
                '"arguments": {<its arguments, as JSON>}}' f"{CLOSE}; its result comes back "
                "in the next message. When no tool is needed, answer in plain text.\n"
                "Tools:\n" + "\n".join(t.described() for t in self.tools))

    def messages(self, messages: list[dict]) -> list[dict]:
        """`messages` (plain role and content ones: `turns.written`) with the section in
        their system prompt: after the client's own first system message, else first."""
        if messages and messages[0]["role"] == "system":
            first = messages[0]
            return [{**first, "content": f"{first['content']}\n\n{self.section()}"},
                    *messages[1:]]
        return [{"role": "system", "content": self.section()}, *messages]

    def held(self, messages: Sequence[dict]) -> Offer | None:
        """The offer an answer to `messages` (as `turns.written` writes them) is held to:
        none where they end with the assistant's own words, which the answer continues, as
        text (a call is a whole answer: "auto" lets the model go on in words); a call asked
        for cannot continue them (400, by `tool_choice`)."""
        if not messages or messages[-1]["role"] != "assistant" or \
                not messages[-1]["content"].strip():
            return self
        if self.choice != "auto":
            raise InvalidValue("tool_choice", "a call cannot continue the assistant's words "
                               "the conversation ends with: leave out its last message, or "
                               'ask "auto"')
        return None

    def answer_format(self) -> AnswerFormat:
        """The grammar: a call (or several) of the tools chosen, or for "auto", a call or
        text that does not begin with one (the module's docstring)."""
        chosen = [(i, t) for i, t in enumerate(self.tools)
                  if self.named is None or t.name == self.named]
        rules = answerformat.schema_rules([
            (f"tool-{i}-args", t.parameters, f"{self.field}.{i}.function.parameters")
            for i, t in chosen])
        calls = [f"call-{i} ::= {_literal(lead(t.name))} tool-{i}-args {_literal('}')}"
                 for i, t in chosen]
        block = f"block ::= {_literal(MARKER)} ({' | '.join(f'call-{i}' for i, _ in chosen)})" \
                f" {_literal(CLOSE)}"
        more = f' ("\\n" block){{0,{MAX_CALLS - 1}}}' if self.parallel else ""
        head = [block, f"calls ::= block{more}"]
        if self.choice == "auto":
            head += ['root ::= [ \\t\\n]* (calls | text)?', f"text ::= {_not_starting(MARKER)}"]
        else:
            head.append("root ::= calls")
        grammar = "\n".join([*head, *calls, rules])
        return AnswerFormat(grammar, self.field)


def lead(name: str) -> str:
    """A call's text before its arguments (a name is letters, digits, _ and -)."""
    return f'{{"name": "{name}", "arguments": '


def _literal(text: str) -> str:
    """A GBNF string literal (its escapes are JSON's for the characters a name may hold)."""
    return json.dumps(text)


def _not_starting(marker: str) -> str:
    """GBNF for any text that does not begin with `marker`, nor with a space or line break
    (those are the root's, before the choice): for each start of the marker, that start then
    a character the marker does not have there, then anything; or a start of it alone."""
    def char_not(c: str) -> str:
        return f"[^\\x{ord(c):02x}]"
    first = f"[^\\x{ord(marker[0]):02x} \\t\\n\\r]"
    alternatives = [f"{first} .*"]
    for i in range(1, len(marker)):
        alternatives.append(f"{_literal(marker[:i])} ({char_not(marker[i])} .*)?")
    return " | ".join(f"({a})" for a in alternatives)


def offer_of(tools: Any, choice: Any = None, parallel: bool | None = None, *,
             field: str = "tools", choice_field: str = "tool_choice") -> Offer | None:
    """The offer a request makes (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`;
    Ollama's `tools` alone, "auto"), checked: a bad tool is refused (400) by the field that
    is wrong (`tools.0.function.name`...), a schema the converter cannot take by its
    `parameters`. None where no tool may be called: no tools, or the choice "none"."""
    if choice is not None and not isinstance(choice, dict) and choice not in CHOICES:
        raise InvalidValue(choice_field, f'"none", "auto", "required" or {{"type": '
                           f'"function", "function": {{"name": ...}}}} (got {choice!r})')
    if not tools:
        if choice not in (None, "none", "auto"):
            raise InvalidValue(choice_field, "it asks for a tool call, but no tools are "
                               f"offered ({field})")
        return None
    if not isinstance(tools, list):
        raise InvalidValue(field, "a list of tools")
    offered = tuple(_tool(t, f"{field}.{i}") for i, t in enumerate(tools))
    names = [t.name for t in offered]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise InvalidValue(field, f"two tools are named {twice!r}: each name once")
    if choice == "none":
        return None
    named = None
    if isinstance(choice, dict):
        function = choice.get("function")
        named = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(named, str):
            raise InvalidValue(choice_field, '{"type": "function", "function": {"name": ...}} '
                               "names the tool to call")
        if named not in names:
            raise InvalidValue(f"{choice_field}.function.name", f"no tool named {named!r} is "
                               f"offered ({', '.join(names)})")
    offer = Offer(offered, "named" if named else choice or "auto", named, bool(parallel), field)
    offer.answer_format()  # (a schema the converter cannot take: refused here, by its field)
    return offer


def _tool(given: Any, where: str) -> Tool:
    if not isinstance(given, dict):
        raise InvalidValue(where, "a tool is an object: {\"type\": \"function\", "
                           "\"function\": {\"name\", \"description\", \"parameters\"}}")
    if given.get("type", "function") != "function":
        raise InvalidValue(f"{where}.type", f'only "function" tools can be called (got '
                           f"{given.get('type')!r})")
    function = given.get("function")
    if not isinstance(function, dict):
        raise InvalidValue(f"{where}.function", "the function's name, description and "
                           "parameters are needed")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidValue(f"{where}.function.name", "a name of 1 to 64 letters, digits, _ "
                           f"or - is needed (got {name!r})")
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise InvalidValue(f"{where}.function.description", "a text")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = NO_ARGUMENTS
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise InvalidValue(f"{where}.function.parameters", "a JSON schema of an object (the "
                           'arguments): {"type": "object", "properties": {...}}')
    return Tool(name, description, parameters)
