"""Chat templates: how a model's turns are rendered into the text it was tuned on.

A GGUF's own template (`tokenizer.chat_template`) when it has one. A model file without one
whose name says it was tuned to chat (instruct, it, chat) gets its family's: Gemma's turns for
Gemma, ChatML for the rest (what most small instruct models were tuned on). One that says no
such thing is a base model (Gemma 3 270M as packaged): it continues text, and in chat turns
it echoes the question, so it is asked in plain text ("Question: ... / Answer:"), which it
continues with the answer, ended with its line (`ChatTemplate.ends_answer`: past it, such a
model makes up the next question) or where it begins that question on the same line
(`ChatTemplate.answer_stops`).

A Gemma template, the model's own or not, is rendered as llama.cpp's own chat formatting
renders it (`llama_chat_apply_template` recognizes it by its `<start_of_turn>` and applies
its built-in format): Gemma has no system role, so the system prompt opens the first user
turn. The model's own Jinja template would drop a system prompt with no user turn after it,
the one message a document's prefix is, and refuses two system messages in a row.

kvdesk needs templates that only ever append (a chat's next turn extends the tokens of the
last one), so a conversation that ends with system messages renders up to where the next
user turn's text begins: under Gemma that is an open user turn, the question completes it.
The beginning-of-sequence token is the tokenizer's to add where the model's vocabulary asks
for it, as llama.cpp's chat formatting leaves it out: a template that writes it is rendered
without it, so that no prompt starts with two.

This module only renders text: it never tokenizes or evaluates.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import jinja2
import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from ..errors import EngineError

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# llama.cpp's Gemma format (llm_chat_apply_template, LLM_CHAT_TEMPLATE_GEMMA): a system
# message opens the next user turn and is followed by a blank line; "assistant" is "model".
# Unlike llama.cpp it does not trim contents (an answer's closing must follow its very text),
# and several system messages are kept apart by a blank line each, not run together.
GEMMA_TEMPLATE = (
    "{%- set ns = namespace(open=false) -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}"
    "{{ '' if ns.open else '<start_of_turn>user\\n' }}{{ m['content'] + '\\n\\n' }}"
    "{%- set ns.open = true -%}"
    "{%- elif m['role'] == 'user' -%}"
    "{{ '' if ns.open else '<start_of_turn>user\\n' }}{{ m['content'] + '<end_of_turn>\\n' }}"
    "{%- set ns.open = false -%}"
    "{%- else -%}"
    "{{ '<end_of_turn>\\n' if ns.open else '' }}"
    "{{ '<start_of_turn>model\\n' + m['content'] + '<end_of_turn>\\n' }}"
    "{%- set ns.open = false -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<end_of_turn>\\n' if ns.open else '' }}{{ '<start_of_turn>model\\n' }}"
    "{%- endif -%}")
GEMMA_MARK = "<start_of_turn>"  # how llama.cpp recognizes a Gemma template
# A base model's conversation as plain text, each turn closed by a blank line; an answer
# follows "Answer:" after a space (the model writes it; a stored answer is stripped).
PLAIN_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}{{ 'Question: ' + m['content'] + '\\nAnswer:' }}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{{ ('' if m['content'][:1] == ' ' else ' ') + m['content'] + '\\n\\n' }}"
    "{%- else -%}{{ m['content'] + '\\n\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}")
CHAT_TUNED = re.compile(r"(?<![a-z])(it|instruct|chat)(?![a-z])", re.IGNORECASE)


def template_of(metadata: dict) -> str:
    """The Jinja template kvdesk renders a model's chats with (from its GGUF metadata)."""
    own = metadata.get("tokenizer.chat_template") or ""
    gemma = metadata.get("general.architecture", "").startswith("gemma")
    if GEMMA_MARK in own:
        return GEMMA_TEMPLATE
    if own:
        return own
    names = " ".join(str(metadata.get(k, "")) for k in
                     ("general.name", "general.finetune", "general.basename"))
    if not CHAT_TUNED.search(names):
        return PLAIN_TEMPLATE
    return GEMMA_TEMPLATE if gemma else CHATML_TEMPLATE


class ChatTemplate:
    """One model's template, rendered with its own BOS and EOS pieces."""

    def __init__(self, template: str, *, bos: str, eos: str, adds_bos: bool):
        self.template = template
        self._formatter = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)
        # The tokenizer adds BOS: a template's own copy would be a second one.
        self._strip = bos if adds_bos and bos else ""
        self.plain = template == PLAIN_TEMPLATE  # a base model's text, not chat turns
        # what ends a chat answer where the text holds it (the answer cut before it)
        self.answer_stops: tuple[str, ...] = ("Question:",) if self.plain else ()
        self._lock = threading.Lock()  # the formatter holds the flag: one rendering at a time

    @classmethod
    def of(cls, llm: llama_cpp.Llama, *, adds_bos: bool) -> ChatTemplate:
        """The loaded model's template."""
        def piece(tok: int) -> str:
            return llm._model.token_get_text(tok) if tok >= 0 else ""

        return cls(template_of(llm.metadata), bos=piece(llm.token_bos()),
                   eos=piece(llm.token_eos()), adds_bos=adds_bos)

    def ends_answer(self, piece: str) -> bool:
        """Whether a token's text ends the answer, besides the model's end-of-generation
        tokens: in plain text, a line break."""
        return self.plain and "\n" in piece and not piece.strip()

    def render(self, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
        msgs = list(messages)
        if not add_generation_prompt and msgs and msgs[-1]["role"] == "system":
            return self._open(msgs)
        return self._render(msgs, add_generation_prompt)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        with self._lock:
            self._formatter.add_generation_prompt = add_generation_prompt
            try:
                text = self._formatter(messages=messages).prompt
            except (jinja2.TemplateError, ValueError) as e:  # (its raise_exception's, a field)
                raise EngineError(f"this model's chat template refuses the conversation: "
                                  f"{e}") from None
        return text[len(self._strip):] if self._strip and text.startswith(self._strip) \
            else text

    def _open(self, messages: list[dict]) -> str:
        """Messages ending with system ones, up to where a user turn after them would begin
        its text: their own rendering where it holds them and a user turn appends to it
        (ChatML), else the start of that turn (a template with no system role)."""
        alone = self._render(messages, False)
        marker = "\x00kvdesk-next-turn\x00"
        after = self._render([*messages, {"role": "user", "content": marker}], False)
        if after.startswith(alone) and messages[-1]["content"].strip() in alone:
            return alone
        return after[:after.index(marker)]
