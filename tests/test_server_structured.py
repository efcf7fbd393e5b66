"""Structured output on the local API, on the real default model: OpenAI's `response_format`
(JSON mode, a JSON schema) and the Responses API's `text.format` with the official `openai`
client, Ollama's `format` ("json", a schema) with the `ollama` client; the answer held to
llama.cpp's grammar parses, and a schema's required keys, enum and patterns hold (a `"` a
pattern allows written `\\"`); a schema that cannot be a grammar refused by its field; an
answer cut at its limit said by "length"; the prompt cache working as without a format."""

from __future__ import annotations

import json
import re

import httpx
import ollama
import openai
import pytest

from desktop_app.model import answerformat, llamacalls
from desktop_app.options import GenerationOptions
from desktop_app.validation import InvalidValue
from tests.test_server import SYSTEM, Running

pytestmark = pytest.mark.model

CITY = {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40},
                       "size": {"type": "string", "enum": ["small", "medium", "large"]},
                       "capital": {"type": "boolean"}},
        "required": ["city", "size", "capital"]}
ASK = [{"role": "user", "content": "Describe Paris in JSON: its name, its size and whether it "
                                   "is a capital."}]
# (SmolLM2 135M, asked for any object about a city, writes numbers of "1111..." forever)
JSON_ASK = [{"role": "user", "content": 'Answer in JSON with the key "answer": what is the '
                                        "capital of France?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = Running(tmp_path_factory.mktemp("structured"), ollama_port=0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(served):
    return ollama.Client(host=served.server.ollama_url)


def ask(served, messages=ASK, max_tokens=96, **extra):
    return served.client.chat.completions.create(model="default", messages=messages,
                                                 max_tokens=max_tokens, temperature=0, **extra)


def a_city(text: str) -> dict:
    """The answer as JSON, checked by hand against CITY: every required key, the enum's
    value, the types."""
    value = json.loads(text)
    assert isinstance(value, dict) and set(CITY["required"]) <= set(value), text
    assert isinstance(value["city"], str) and isinstance(value["capital"], bool), text
    assert value["size"] in CITY["properties"]["size"]["enum"], text
    return value


def test_json_mode_answers_a_json_object_streamed_and_not(served):
    done = ask(served, JSON_ASK, response_format={"type": "json_object"})
    (choice,) = done.choices
    assert choice.finish_reason == "stop", choice
    assert isinstance(json.loads(choice.message.content), dict)
    pieces = [c.choices[0].delta.content or "" for c in ask(
        served, JSON_ASK, response_format={"type": "json_object"}, stream=True) if c.choices]
    assert "".join(pieces) == choice.message.content


def test_a_json_schema_holds_its_required_keys_and_enum(served):
    done = ask(served, response_format={"type": "json_schema", "json_schema": {
        "name": "city", "schema": CITY, "strict": True}})
    assert done.choices[0].finish_reason == "stop"
    a_city(done.choices[0].message.content)


def test_the_responses_api_takes_its_text_format(served):
    fmt = {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}
    done = served.client.responses.create(model="default", input=ASK[0]["content"],
                                          max_output_tokens=96, temperature=0,
                                          text={"format": fmt})
    assert done.status == "completed"
    a_city(done.output_text)
    assert done.text.format.type == "json_schema"  # (echoed as asked)


def test_ollamas_format_json_and_a_schema(client):
    chat = client.chat(model="default", messages=JSON_ASK, format="json",
                       options={"num_predict": 96, "temperature": 0})
    assert chat.done_reason == "stop" and isinstance(json.loads(chat.message.content), dict)
    generated = client.generate(model="default", prompt=ASK[0]["content"], format=CITY,
                                options={"num_predict": 96, "temperature": 0})
    assert generated.done_reason == "stop"
    a_city(generated.response)


def test_an_answer_cut_at_its_limit_says_length(served, client):
    """The JSON is then incomplete (README): the finish says so, as OpenAI's does."""
    done = ask(served, response_format={"type": "json_object"}, max_tokens=4)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 4
    cut = client.chat(model="default", messages=ASK, format=CITY,
                      options={"num_predict": 4, "temperature": 0})
    assert cut.done_reason == "length"


def test_a_schema_that_cannot_be_a_grammar_is_refused_by_its_field(served, client):
    unknown = {"type": "nosuch"}
    cases = [({"type": "json_schema", "json_schema": {"name": "x", "schema": unknown}},
              "response_format.json_schema.schema", "Unrecognized schema"),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
              "response_format.json_schema.schema", "a JSON schema is an object"),
             ({"type": "json_schema"}, "response_format.json_schema", "its schema"),
             ({"type": "xml"}, "response_format.type", "json_schema")]
    for fmt, param, words in cases:
        with pytest.raises(openai.BadRequestError, match=words) as e:
            ask(served, response_format=fmt)
        assert e.value.body["param"] == param
    with pytest.raises(openai.BadRequestError, match="Unrecognized schema") as e:
        served.client.responses.create(model="default", input="x", text={"format": {
            "type": "json_schema", "name": "x", "schema": unknown}})
    assert e.value.body["param"] == "text.format.schema"
    for fmt, words in ((unknown, "Unrecognized schema"),
                       ({"type": "string", "pattern": "a+"}, "Pattern must start with")):
        with pytest.raises(ollama.ResponseError, match=f"format: .*{words}") as e:
            client.chat(model="default", messages=ASK, format=fmt)
        assert e.value.status_code == 400
    # (a format the client itself would not send)
    r = httpx.post(f"{served.server.ollama_url}/api/generate", trust_env=False,
                   json={"model": "default", "prompt": "x", "format": "xml"})
    assert r.status_code == 400 and '"json" or a JSON schema' in r.json()["error"], r.text


def test_a_format_is_refused_for_a_prefill(served):
    """The grammar holds a whole answer: after the assistant's own words it would begin
    again."""
    with pytest.raises(openai.BadRequestError, match="assistant's own words") as e:
        ask(served, [*ASK, {"role": "assistant", "content": '{"city": '}],
            response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format"


def test_the_prompt_cache_works_as_without_a_format(served):
    """The grammar does not change the prompt: a conversation held to a schema is stored,
    and its next turn comes back from the store, only the new message computed."""
    first = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": "Describe the first ferry of a weekday."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "ferry", "schema": {
        "type": "object", "properties": {"time": {"type": "string", "maxLength": 8}},
        "required": ["time"]}}}
    done = ask(served, first, response_format=fmt)
    assert done.choices[0].finish_reason == "stop"
    assert done.model_extra["kvdesk"]["stored"] is True
    then = [*first, {"role": "assistant", "content": done.choices[0].message.content},
            {"role": "user", "content": "And on Saturdays?"}]
    again = ask(served, then, response_format=fmt)
    assert again.usage.prompt_tokens_details.cached_tokens >= done.usage.prompt_tokens
    assert set(json.loads(again.choices[0].message.content)) == {"time"}


def test_a_grammar_llama_cpp_cannot_parse_is_refused_not_crashed(served):
    rt = served.app.engine.runtime
    vocab = rt.llm._model.vocab
    assert llamacalls.grammar_parses(vocab, answerformat.json_object("f").grammar)
    assert not llamacalls.grammar_parses(vocab, "root ::= (")
    with pytest.raises(ValueError, match="could not parse"):
        llamacalls.chain(GenerationOptions(temperature=0), rt.llm, rt.n_ctx, "root ::= (")


def test_json_objects_grammar_is_an_object_with_bounded_whitespace():
    grammar = answerformat.json_object("format").grammar
    assert grammar.lstrip().startswith("root   ::= object")
    assert 'ws ::= | " " | "\\n" [ \\t]{0,20}' in grammar
    with pytest.raises(InvalidValue, match="nested too deeply|cannot be turned"):
        nested: dict = {}
        for _ in range(2000):
            nested = {"type": "array", "items": nested}
        answerformat.json_schema(nested, "format")


def held_tokens(rt, prompt, grammar, options, *, drawn_first):
    rt.reset()
    rt.prefill(prompt)
    sampler = llamacalls.chain(options, rt.llm, rt.n_ctx, grammar, drawn_first=drawn_first)
    out = []
    try:
        for _ in range(48):
            token = sampler.sample(rt.llm._ctx, -1)
            if rt.is_end_of_generation(token):
                break
            out.append(token)
            rt.prefill([token])
    finally:
        sampler.close()
    return out


@pytest.mark.parametrize("penalty", [None, 1.3])
def test_the_drawn_token_checked_first_gives_the_grammar_firsts_tokens(runtime, penalty):
    """`Held` (the drawn token checked alone, the grammar run over every token only when it
    refuses it) answers as the grammar first in the chain does, at temperature 0, penalties
    or not: the argmax of the allowed tokens is the plain one wherever that is allowed."""
    options = GenerationOptions(temperature=0, repeat_penalty=penalty, repeat_last_n=64)
    for asked, grammar in ((JSON_ASK, answerformat.json_object("f").grammar),
                           (ASK, answerformat.json_schema(CITY, "f").grammar)):
        prompt = runtime.tokenize(runtime.render_chat(asked, add_generation_prompt=True),
                                  add_bos=runtime.adds_bos)
        held = held_tokens(runtime, prompt, grammar, options, drawn_first=True)
        assert held == held_tokens(runtime, prompt, grammar, options, drawn_first=False)
        if penalty is None:  # (whole within 48 tokens; a penalty of 1.3 writes on)
            assert json.loads(runtime.detokenize(held))


def test_a_schemas_strings_hold_no_raw_control_character(runtime):
    """(The converter's string let a raw line break in: 2 of 8 answers at `stop` were no JSON
    a client's parser takes.) After `{"name": "x` a schema's grammar, and a tool's arguments',
    refuse a raw line break and take `\\n` written as JSON writes it."""
    import ctypes

    import llama_cpp

    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    vocab = runtime.llm._model.vocab
    newline, = runtime.tokenize("\n")
    escaped = runtime.tokenize("\\n")[0]
    for gbnf in (answerformat.json_schema(schema, "f").grammar,
                 answerformat.schema_rules([("args", schema, "f")]) + "\nroot ::= args\n"):
        stage = llamacalls.grammar_stage(vocab, gbnf)
        try:
            for token in runtime.tokenize('{"name": "x'):
                llama_cpp.llama_sampler_accept(stage, token)
            data = (llama_cpp.llama_token_data * 2)(
                llama_cpp.llama_token_data(newline, 0.0, 0.0),
                llama_cpp.llama_token_data(escaped, 0.0, 0.0))
            arr = llama_cpp.llama_token_data_array(data, 2, -1, False)
            llama_cpp.llama_sampler_apply(stage, ctypes.byref(arr))
            assert data[0].logit == float("-inf") and data[1].logit == 0.0, gbnf
        finally:
            llama_cpp.llama_sampler_free(stage)


def takes(rt, gbnf: str, tokens: list[int]) -> bool:
    """Whether the grammar takes `tokens`, each checked alone before it is accepted (as
    `llamacalls.Held` checks a drawn token)."""
    import ctypes

    import llama_cpp

    stage = llamacalls.grammar_stage(rt.llm._model.vocab, gbnf)
    assert stage is not None, gbnf
    try:
        for token in tokens:
            data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0., 0.))
            arr = llama_cpp.llama_token_data_array(data, 1, -1, False)
            llama_cpp.llama_sampler_apply(stage, ctypes.byref(arr))
            if data[0].logit != 0.0:
                return False
            llama_cpp.llama_sampler_accept(stage, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(stage)


def a_pattern(pattern: str) -> str:
    """The grammar of an object whose one string, "n", is held to `pattern`."""
    return answerformat.json_schema({"type": "object", "properties": {"n": {
        "type": "string", "pattern": pattern}}, "required": ["n"]}, "f").grammar


def whole(rt, value_text: str) -> list[int]:
    """The tokens of the object whose "n" is the JSON string `value_text`, then its end."""
    return [*rt.tokenize('{"n": "' + value_text + '"}'), rt.llm.token_eos()]


@pytest.mark.parametrize("pattern", ["^x.*$", "^[^@]+$"])
def test_a_patterns_dot_and_negated_class_are_a_json_strings_characters(runtime, pattern):
    """(The converter's `.` took any character but a line break, and a negated class any
    character it does not name: a raw tab, and a raw `"` ending the string before the
    pattern's end, each an answer no client's parser takes.) After `{"n": "x`: a raw tab
    refused, `\\t` taken; after a raw `"` (the string's end) no more of it."""
    gbnf = a_pattern(pattern)
    before = runtime.tokenize('{"n": "x')
    tab, = runtime.tokenize("\t")
    escaped = runtime.tokenize("\\t")[0]
    letter = runtime.tokenize("y")[0]
    assert not takes(runtime, gbnf, [*before, tab])
    assert takes(runtime, gbnf, [*before, escaped])
    assert takes(runtime, gbnf, [*before, letter])
    assert not takes(runtime, gbnf, [*runtime.tokenize('{"n": "x"'), letter])


@pytest.mark.parametrize("pattern, escaped, raw", [
    ('^[a-z"]+$', 'a\\"b', 'a"b'),
    ('^[A-Za-z ,."]+$', 'Hello, \\"world\\".', 'Hello, "world".'),
    ("^[\\x00-\\x7F]+$", 'a\\"b\\tc\\\\d\\u0001~', "a\tb"),
    ("^[a-z\\t]+$", "a\\tb", "a\tb"),
    ('^(yes|no|"maybe")$', '\\"maybe\\"', '"maybe"'),
    ("^a\\\\b$", "a\\\\b", "a\\b"),
])
def test_a_patterns_characters_that_json_escapes_are_written_escaped(runtime, pattern, escaped,
                                                                      raw):
    """(review 72's M1: a positive class or a literal that names `"`, `\\` or a control
    character let it into the JSON string raw: a `"` ended the string early, and the answer
    went on past it, no JSON.) Each is taken in the form json.dumps writes, and only in it:
    the string `escaped` (JSON text; the value it stands for matches the pattern) whole, the
    same value written `raw` not."""
    assert re.fullmatch(pattern, json.loads(f'"{escaped}"'))
    gbnf = a_pattern(pattern)
    assert takes(runtime, gbnf, whole(runtime, escaped))
    assert not takes(runtime, gbnf, whole(runtime, raw))


@pytest.mark.parametrize("pattern, value", [
    ("^v\\d+\\.\\d+$", "v1.25"), ("^[\\w.-]+@[\\w-]+\\.[a-z]{2,}$", "jo.e@ex-ample.org"),
    ("^x\\s+\\/\\S$", "x \t\n/\""), ("^(\\x41|b)+\\u00e9$", "Abb\u00e9"),
    ("^[^@]+@[^@\\s]+$", 'He said "hi"\n\\o/\u0001 \U0001F600@x.org'),
    ("^a\\sb\\Sc$", "a\u00a0b\u00e9c"),  # (\s: every white space, as ECMA-262's)
])
def test_a_patterns_escapes_are_the_characters_they_stand_for(runtime, pattern, value):
    """(The converter copied `\\.`, `\\d`, `\\w`, `\\s` into the grammar as written, which
    llama.cpp cannot parse: the request was refused.) Each is a class of what it stands for,
    those JSON escapes (`\\s`'s tab and line break, `\\S`'s `"`) written escaped."""
    assert re.fullmatch(pattern, value)
    assert takes(runtime, a_pattern(pattern),
                 whole(runtime, json.dumps(value, ensure_ascii=False)[1:-1]))


def test_an_answer_held_to_a_pattern_that_names_a_quote_is_json(served):
    """(review 72's M1, a real answer: `[A-Za-z ,."]` let a raw `"` end the string, and the
    model wrote on past it: `{ "text": "Hello, world.", "fieldCode...`, no JSON.)"""
    pattern = '^[A-Za-z ,."]+$'
    fmt = {"type": "json_schema", "json_schema": {"name": "q", "schema": {
        "type": "object", "properties": {"text": {"type": "string", "pattern": pattern}},
        "required": ["text"]}}}
    asked = [{"role": "user", "content": 'Reply with JSON: a short sentence in which someone '
                                         'says "hello" (with quotation marks), in a field '
                                         "called text."}]
    for seed in range(4):  # (seed 2 wrote the answer above, without the fix)
        done = served.client.chat.completions.create(
            model="default", messages=asked, max_tokens=96, temperature=0.9, seed=seed,
            response_format=fmt)
        (choice,) = done.choices
        assert choice.finish_reason == "stop", choice
        assert re.fullmatch(pattern, json.loads(choice.message.content)["text"]), choice


@pytest.mark.parametrize("pattern", ["^[]a]+$", "^[^]]+$", "^a}$", "^a]$"])
def test_a_pattern_with_a_bracket_that_closes_nothing_is_refused_not_looped_on(pattern):
    """(llama-cpp-python's converter looped for good on a stray `]` or `}`: a server's every
    route, /health too, waited behind the request.)"""
    schema = {"type": "object", "properties": {"n": {"type": "string", "pattern": pattern}}}
    with pytest.raises(InvalidValue, match="closes nothing"):
        answerformat.json_schema(schema, "response_format")
    with pytest.raises(InvalidValue, match="closes nothing"):
        answerformat.schema_rules([("args", schema, "tools.0")])
    escaped = {"type": "object", "properties": {"n": {"type": "string", "pattern": "^\\]x\\}$"}}}
    assert answerformat.json_schema(escaped, "f")  # (the characters themselves: taken)


@pytest.mark.parametrize("pattern, said", [
    *[(p, "repeats nothing") for p in ("^*$", "^+a$", "^{2}$", "^a|*b$", "^(*a)$")],
    *[(p, "is not supported") for p in ("^\\b\\w+\\b$", "^\\p{L}+$", "^(a)\\1$")]])
def test_a_pattern_that_repeats_nothing_or_has_no_grammar_is_refused_naming_it(pattern, said):
    """(The converter failed on a quantifier with nothing before it with an IndexError: a 500
    "internal error"; a word boundary gave llama.cpp's "could not parse the grammar made of
    it", naming nothing; review 73.)"""
    with pytest.raises(InvalidValue, match=said):
        answerformat.json_schema({"type": "string", "pattern": pattern}, "response_format")
    for fine in ("^a*$", "^x{2}$", "^(a|b)?$", "^a??$"):
        assert answerformat.json_schema({"type": "string", "pattern": fine}, "f")
