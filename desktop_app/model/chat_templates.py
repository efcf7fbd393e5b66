"""Chat templates: how a model's turns are rendered into the text it was tuned on.

A GGUF's own template (`tokenizer.chat_template`) when it has one; else its family's: Gemma's
turns for Gemma, ChatML for the rest (what most small instruct models were tuned on). kvdesk
needs templates that only ever append (a chat's next turn extends the tokens of the last one).
This module only renders text: it never tokenizes or evaluates.
"""

from __future__ import annotations

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Gemma's turns (it has no system role: a system message is a turn of the user's).
GEMMA_TEMPLATE = (
    "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}"
    "\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def formatter(llm: llama_cpp.Llama) -> Jinja2ChatFormatter:
    """The loaded model's template, with its own BOS and EOS pieces."""
    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        arch = llm.metadata.get("general.architecture", "")
        template = GEMMA_TEMPLATE if arch.startswith("gemma") else CHATML_TEMPLATE

    def piece(tok: int) -> str:
        return llm._model.token_get_text(tok) if tok >= 0 else ""

    return Jinja2ChatFormatter(template, eos_token=piece(llm.token_eos()),
                               bos_token=piece(llm.token_bos()))
