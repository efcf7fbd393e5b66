"""Chat templates rendered as llama.cpp's own chat formatting renders them (its built-in
formats through `llama_chat_apply_template`, a GGUF's Jinja template through
llama-cpp-python's `Jinja2ChatFormatter`), append-only, with one BOS; and the installed
models asked a plain question answer it instead of echoing their prompt."""

from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path

import llama_cpp
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from desktop_app.errors import EngineError
from desktop_app.model import chat_templates as ct
from desktop_app.model.prompts import (
    Prompter,
    Turn,
    answer_text,
    closing,
    document_prefix,
    question_turn,
)

CONVERSATION = [
    {"role": "system", "content": "You answer questions about the timetable."},
    {"role": "user", "content": "When does the ferry leave?"},
    {"role": "assistant", "content": "At 07:15."},
    {"role": "user", "content": "And on Sundays?"},
]

# The template Google ships with Gemma 3's instruction-tuned models (tokenizer_config.json).
GEMMA3_OWN = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/"
    "assistant/...\") }}\n    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n")


def llama_cpp_renders(template: str, messages: list[dict], add_generation_prompt: bool) -> str:
    """llama.cpp's own chat formatting (`llama_chat_apply_template`): a built-in format's
    name, or a template it recognizes as one."""
    array = (llama_cpp.llama_chat_message * len(messages))(*[
        llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode())
        for m in messages])
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(template.encode(), array, len(messages),
                                            add_generation_prompt, buf, len(buf))
    assert 0 < n < len(buf), f"llama.cpp does not know the template ({n})"
    return buf.raw[:n].decode()


def jinja_renders(template: str, messages: list[dict], add_generation_prompt: bool,
                  bos: str = "") -> str:
    return Jinja2ChatFormatter(template, eos_token="", bos_token=bos, add_generation_prompt=(
        add_generation_prompt))(messages=messages).prompt


def kvdesk(template: str, bos: str = "<bos>", adds_bos: bool = True) -> ct.ChatTemplate:
    return ct.ChatTemplate(template, bos=bos, eos="", adds_bos=adds_bos)


@pytest.mark.parametrize("n", [2, 4])
def test_gemma_turns_are_llama_cpps_and_the_templates_google_ships(n):
    msgs = CONVERSATION[:n]
    ours = kvdesk(ct.GEMMA_TEMPLATE).render(msgs, add_generation_prompt=True)
    assert ours == llama_cpp_renders("gemma", msgs, True)
    assert "<bos>" + ours == jinja_renders(GEMMA3_OWN, msgs, True, bos="<bos>")
    # the system prompt opens the first user turn: there is no system role
    assert ours.startswith("<start_of_turn>user\nYou answer questions about the timetable."
                           "\n\nWhen does the ferry leave?<end_of_turn>\n")


def test_a_gguf_with_gemmas_own_template_is_rendered_as_llama_cpp_does():
    assert ct.template_of({"tokenizer.chat_template": GEMMA3_OWN}) == ct.GEMMA_TEMPLATE
    tpl = kvdesk(ct.template_of({"tokenizer.chat_template": GEMMA3_OWN}))
    # a document's prefix (system messages alone, several of them too) is not dropped, and
    # the question's turn appends to it
    for system in (CONVERSATION[:1], [*CONVERSATION[:1], {"role": "system",
                                                           "content": "Document: B"}]):
        prefix = tpl.render(system, add_generation_prompt=False)
        full = tpl.render([*system, CONVERSATION[1]], add_generation_prompt=True)
        assert system[-1]["content"] in prefix and full.startswith(prefix)


def test_chatml_is_llama_cpps():
    ours = kvdesk(ct.CHATML_TEMPLATE).render(CONVERSATION, add_generation_prompt=True)
    assert ours == llama_cpp_renders("chatml", CONVERSATION, True)


def test_llama3s_own_template_is_llama_cpps_without_the_bos_the_tokenizer_adds():
    from llama_cpp.llama_chat_format import LLAMA3_INSTRUCT_CHAT_TEMPLATE

    ours = kvdesk(LLAMA3_INSTRUCT_CHAT_TEMPLATE, bos="<|begin_of_text|>").render(
        CONVERSATION, add_generation_prompt=True)
    assert ours == llama_cpp_renders("llama3", CONVERSATION, True)


def test_a_template_that_writes_bos_is_rendered_without_it_when_the_tokenizer_adds_it():
    template = "{{ bos_token }}" + ct.CHATML_TEMPLATE
    assert not kvdesk(template, bos="<s>").render(CONVERSATION[:2], add_generation_prompt=True
                                                  ).startswith("<s>")
    assert kvdesk(template, bos="<s>", adds_bos=False).render(
        CONVERSATION[:2], add_generation_prompt=True).startswith("<s>")


def test_a_template_with_no_system_role_opens_the_user_turn_for_a_prefix():
    """Llama 2's template puts the system prompt inside the first [INST]: rendered alone, it
    would give no text at all."""
    llama2 = ("{% if messages[0]['role'] == 'system' %}{% set sys = '<<SYS>>\\n' + "
              "messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% set msgs = messages[1:] %}"
              "{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
              "{% for m in msgs %}{% if m['role'] == 'user' %}{{ '[INST] ' + "
              "(sys if loop.first else '') + m['content'] + ' [/INST]' }}{% else %}"
              "{{ ' ' + m['content'] + ' ' }}{% endif %}{% endfor %}")
    tpl = kvdesk(llama2)
    prefix = tpl.render(CONVERSATION[:1], add_generation_prompt=False)
    assert prefix == "[INST] <<SYS>>\nYou answer questions about the timetable.\n<</SYS>>\n\n"
    assert tpl.render(CONVERSATION[:2], add_generation_prompt=True).startswith(prefix)


def test_a_model_file_without_a_template_is_asked_as_its_tuning_says():
    assert ct.template_of({"general.name": "Gemma 3 270m", "general.architecture": "gemma3"}) \
        == ct.PLAIN_TEMPLATE
    assert ct.template_of({"general.name": "gemma-3-270m-it", "general.architecture":
                           "gemma3"}) == ct.GEMMA_TEMPLATE
    assert ct.template_of({"general.name": "Qwen2.5 0.5B Instruct"}) == ct.CHATML_TEMPLATE
    assert ct.template_of({"general.name": "Titan"}) == ct.PLAIN_TEMPLATE
    plain = kvdesk(ct.PLAIN_TEMPLATE)
    text = plain.render(CONVERSATION, add_generation_prompt=True)
    assert text == ("You answer questions about the timetable.\n\nQuestion: When does the "
                    "ferry leave?\nAnswer: At 07:15.\n\nQuestion: And on Sundays?\nAnswer:")
    assert plain.ends_answer("\n") and not plain.ends_answer("Sunday\n")
    assert not kvdesk(ct.CHATML_TEMPLATE).ends_answer("\n")


def test_smollm2_is_rendered_and_tokenized_as_llama_cpp_does(runtime):
    own = runtime.llm.metadata["tokenizer.chat_template"]
    assert runtime.chat_template.template == own
    ours = runtime.render_chat(CONVERSATION, add_generation_prompt=True)
    assert ours == jinja_renders(own, CONVERSATION, True) \
        == llama_cpp_renders(own, CONVERSATION, True)
    prefix = Prompter().prefix(runtime, None)
    turn = question_turn(runtime, prefix.messages, "Hello?")
    tokens = [*prefix.tokens, *turn.tokens]
    bos = runtime.llm.token_bos()  # SmolLM2's is <|im_start|>: every turn starts with it
    assert tokens[:2] != [bos, bos]
    assert tokens == runtime.tokenize(runtime.render_chat(
        turn.messages, add_generation_prompt=True), add_bos=runtime.adds_bos)


def test_a_document_cut_to_fit_is_the_start_of_its_text_as_written(runtime):
    """Spaces too (detokenizing its first tokens tidies an indented line into one space):
    the model reads the document as written, and a later document's cut part is the start
    of its own cached KV, which a blend reuses."""
    indent = " " * 33
    code = "".join(f"pattern_{i} = (r'[a-z]'   # a letter\n{indent}r'[.!?]')\n"
                   for i in range(200))
    prefix = document_prefix(runtime, ("code.py", code), 600)
    assert 0 < prefix.kept_tokens < prefix.doc_tokens and len(prefix.tokens) <= 600
    body = prefix.messages[0]["content"].split("Document: code.py\n\n", 1)[1]
    assert code.startswith(body) and len(body) > len(code) // 10


@pytest.fixture(scope="module")
def gemma_engine(gemma_path):
    from desktop_app.engine import Engine
    from desktop_app.model.runtime import Runtime
    from store import Store

    def factory():
        return Runtime(gemma_path, model_hash="gemma3-270m", n_ctx=1024, flash_attn=False)

    eng = Engine(Store(Path(tempfile.mkdtemp(prefix="kvdesk-gemma-"))), factory,
                 chunk_tokens=128)
    yield eng
    eng.close()


def test_gemma_answers_a_plain_question_instead_of_echoing_its_prompt(gemma_engine,
                                                                      tmp_path):
    from desktop_app.options import GenerationOptions, RestoreOptions

    greedy = GenerationOptions(max_tokens=32, temperature=0)
    first = gemma_engine.ask("What is the capital of France?", chat_id=None, doc_ids=[],
                             restore=RestoreOptions(no_cache=True), generation=greedy)
    assert "Paris" in first.answer
    doc = tmp_path / "kettle.txt"
    doc.write_text("The Aurora kettle holds 1.7 litres and boils in three minutes. It comes "
                   "with a two-year warranty that does not cover limescale damage.")
    doc_id = gemma_engine.attach(str(doc)).doc_id
    answer = gemma_engine.ask("How much water does the kettle hold?", chat_id=None,
                              doc_ids=[doc_id], restore=RestoreOptions(), generation=greedy)
    again = gemma_engine.ask("And how long does it take to boil?", chat_id=answer.chat_id,
                             doc_ids=[], restore=RestoreOptions(), generation=greedy)
    for a in (first, answer, again):
        assert a.answer and "Question" not in a.answer and "kvdesk" not in a.answer, a.answer
    assert "1.7" in answer.answer


def test_a_prompt_continued_as_it_is_is_not_cut_at_a_line_by_a_base_models_chat_format(
        gemma_engine):
    """Only chat answers end with their line: a legacy completion (or Ollama's raw generate)
    of a base model writes on past it."""
    from desktop_app.chat.completions import RawPrompt
    from desktop_app.options import GenerationOptions

    done = gemma_engine.complete(RawPrompt("Shopping list:\n- apples\n- pears\n-"),
                                 generation=GenerationOptions(max_tokens=24, temperature=0))
    assert "\n" in done.text.strip() and done.completion_tokens > 6, done


def test_a_base_models_chat_answer_reaches_a_client_without_the_space_before_it(gemma_engine):
    """The plain format's "Answer:" makes a base model write a space first: a chat client gets
    the answer from its first visible character, streamed as whole; a prompt continued as it
    is keeps it (the words follow the prompt's)."""
    from desktop_app.chat.completions import RawPrompt
    from desktop_app.options import GenerationOptions, RestoreOptions

    greedy = GenerationOptions(max_tokens=8, temperature=0)
    streamed = []
    done = gemma_engine.complete([{"role": "user", "content": "What is the capital of France?"}],
                                 restore=RestoreOptions(no_cache=True), generation=greedy,
                                 on_token=streamed.append)
    assert done.text and done.text == done.text.lstrip() == "".join(streamed), done.text
    raw = gemma_engine.complete(RawPrompt("Question: What is the capital of France?\nAnswer:"),
                                generation=greedy)
    assert raw.text.startswith(" ") and raw.text.lstrip().startswith(done.text), raw.text
    asked = []  # kvdesk's own chats (the window, `ask`, /v1/kvdesk/ask) alike
    res = gemma_engine.ask("What is the capital of France?", generation=greedy,
                           restore=RestoreOptions(no_cache=True), on_token=asked.append)
    assert res.answer and "".join(asked) == res.answer and asked[0] == asked[0].lstrip()


def test_a_plain_answer_is_ended_by_a_line_break_only_after_its_text(runtime, monkeypatch):
    # A base model often opens its answer with a line break; ending there answered nothing.
    from desktop_app.model import llamacalls

    newline, word, other = (runtime.tokenize(t)[-1] for t in ("\n", " Sunday", " noon"))
    script = iter([newline, word, other, newline, word])

    class Scripted:
        def sample(self, ctx, idx):
            return next(script)

        def close(self):
            pass

    monkeypatch.setattr(llamacalls, "chain", lambda *a, **k: Scripted())
    monkeypatch.setattr(runtime, "chat_template", kvdesk(ct.PLAIN_TEMPLATE))
    runtime.reset()
    runtime.prefill(runtime.tokenize("Question: When?\nAnswer:"))
    assert [t.text for t in runtime.generate(8)] == ["\n", " Sunday", " noon"]
    runtime.reset()


class _Rendering:
    """A `Template` as far as rendering goes."""

    def __init__(self, tpl: ct.ChatTemplate):
        self.render_chat = tpl.render


@pytest.mark.parametrize("template", [ct.CHATML_TEMPLATE, ct.GEMMA_TEMPLATE, GEMMA3_OWN])
def test_a_conversation_ending_with_the_assistant_is_answered_by_continuing_it(template):
    """A prefill, as llama.cpp's server and Ollama take it: the answer continues the
    assistant's words (which Gemma's template trims), and closes as the template closes
    the whole message."""
    tpl = _Rendering(kvdesk(template, bos=""))
    asked = CONVERSATION[:2]
    text, words = answer_text(tpl, [*asked, {"role": "assistant", "content": " At 07"}])
    assert words == ("At 07" if template == GEMMA3_OWN else " At 07")
    assert text == tpl.render_chat(asked, add_generation_prompt=True) + words
    closed = tpl.render_chat([*asked, {"role": "assistant", "content": " At 07:15."}],
                             add_generation_prompt=False)
    turn = Turn((*asked, {"role": "assistant", "content": " At 07"}), text, [], words)
    assert text + ":15." + closing(tpl, turn, ":15.") == closed
    # Empty words are the generation prompt, as if the message were not there.
    assert answer_text(tpl, [*asked, {"role": "assistant", "content": " "}]) == (
        tpl.render_chat(asked, add_generation_prompt=True), "")


def test_an_assistant_message_the_template_rewrites_cannot_be_continued():
    shouting = ct.CHATML_TEMPLATE.replace("m['content']", "m['content'] | upper")
    tpl = _Rendering(kvdesk(shouting))
    assert "At 07" not in tpl.render_chat([{"role": "assistant", "content": "At 07"}],
                                          add_generation_prompt=False)
    with pytest.raises(EngineError, match="rewrites the assistant's last message"):
        answer_text(tpl, [*CONVERSATION[:2], {"role": "assistant", "content": "At 07"}])


def test_the_answers_start_is_found_where_the_template_writes_it_not_in_its_own_markup():
    # (Qwen3-style: an empty reasoning block before each of the assistant's messages)
    thinking = ct.CHATML_TEMPLATE.replace(
        "\n{{ m['content'] }}", "\n{% if m['role'] == 'assistant' %}<think>\n\n</think>\n\n"
        "{% endif %}{{ m['content'] }}")
    assert thinking != ct.CHATML_TEMPLATE
    tpl = _Rendering(kvdesk(thinking, bos=""))
    asked = CONVERSATION[:2]
    text, words = answer_text(tpl, [*asked, {"role": "assistant", "content": "think"}])
    assert words == "think" and text.endswith("<think>\n\n</think>\n\nthink")


def test_a_conversation_the_template_refuses_is_a_clear_error():
    strict = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(EngineError, match="refuses the conversation: Conversation roles"):
        kvdesk(strict).render(CONVERSATION[:2], add_generation_prompt=True)
