"""Tool calling on the local API, on the real default model (SmolLM2 135M, whose template has
no tool syntax): with the official `openai` client, a call asked for ("required", or a tool
named) parses and matches its tool's schema, streamed in OpenAI's delta shape too; "auto"
answers a question that needs no tool in text; a tool's result sent back answers from the
prompt cache, the call's turn reused; the `ollama` client gets Ollama's shapes; bad tools are
400s naming the field. (The grammar itself, token by token: tests/test_tools.py.)"""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest

from desktop_app.results import Completion, RestoreReport
from desktop_app.server import ollama_shapes as sh
from desktop_app.tools import MARKER, Answer, Call, offer_of
from tests.test_server import Running
from tests.test_tools import TOOLS, WEATHER

pytestmark = pytest.mark.model

PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = Running(tmp_path_factory.mktemp("tools"), ollama_port=0)
    yield running
    running.stop()


def ask(served, messages=PARIS, max_tokens=64, **extra):
    return served.client.chat.completions.create(
        model="default", messages=messages, tools=TOOLS, temperature=0, max_tokens=max_tokens,
        **extra)


def a_weather_call(name: str, arguments: dict) -> None:
    """Checked by hand against WEATHER's schema."""
    assert name == "get_weather"
    assert set(arguments) == {"city", "unit"} and isinstance(arguments["city"], str)
    assert len(arguments["city"]) <= 40 and arguments["unit"] in ("celsius", "fahrenheit")


def test_a_call_asked_for_parses_and_matches_its_schema(served):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        done = ask(served, tool_choice=choice)
        (choice_,) = done.choices
        assert choice_.finish_reason == "tool_calls" and choice_.message.content is None
        (call,) = choice_.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        a_weather_call(call.function.name, json.loads(call.function.arguments))
    # Another tool named: its own schema, whatever the question.
    done = ask(served, tool_choice={"type": "function", "function": {"name": "add"}})
    (call,) = done.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "add" and set(arguments) == {"a", "b"}
    assert all(isinstance(v, int) for v in arguments.values())


def test_parallel_calls_are_each_whole_and_distinct(served):
    done = ask(served, tool_choice="required", parallel_tool_calls=True)
    calls = done.choices[0].message.tool_calls
    assert 1 <= len(calls) <= 8 and len({c.id for c in calls}) == len(calls)
    assert len({(c.function.name, c.function.arguments) for c in calls}) == len(calls)
    for call in calls:
        if call.function.name == "get_weather":
            a_weather_call(call.function.name, json.loads(call.function.arguments))


def test_a_call_cut_at_its_limit_comes_back_as_text_saying_length(served):
    done = ask(served, tool_choice="required", max_tokens=8)
    (choice,) = done.choices
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content.startswith(MARKER)
    chunks = list(ask(served, tool_choice="required", max_tokens=8, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_auto_answers_a_question_needing_no_tool_in_text(served):
    done = ask(served, [{"role": "user", "content": "What is 2+2?"}], tool_choice="auto")
    (choice,) = done.choices
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert "4" in choice.message.content and MARKER not in choice.message.content
    streamed = list(ask(served, [{"role": "user", "content": "What is 2+2?"}], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        choice.message.content
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_a_streamed_call_comes_in_openais_delta_shape(served):
    chunks = list(ask(served, tool_choice="required", stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    assert not "".join(d.content or "" for d in deltas)  # the call's text is never content
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == "" and all(c.index == 0 for c in calls)
    a_weather_call("get_weather", json.loads("".join(c.function.arguments for c in calls)))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    whole = ask(served, tool_choice="required").choices[0].message.tool_calls[0]
    assert whole.function.arguments == "".join(c.function.arguments for c in calls)


def test_a_tools_result_goes_back_through_the_prompt_cache(served):
    first = ask(served, tool_choice="required")
    message = first.choices[0].message
    result = {"role": "tool", "tool_call_id": message.tool_calls[0].id,
              "content": json.dumps({"temperature": 18, "sky": "cloudy"})}
    second = ask(served, [*PARIS, message.model_dump(exclude_none=True), result])
    (choice,) = second.choices
    assert choice.message.content or choice.message.tool_calls  # (the model chooses)
    # The call's turn is written back as the model wrote it: the whole first request comes
    # back from the store, and the call's tokens up to where the model, held to the grammar,
    # split its text otherwise than the tokenizer does.
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens


def test_the_same_tools_again_reuse_their_prefix(served):
    ask(served, [{"role": "user", "content": "Hello there."}], max_tokens=4)
    again = ask(served, [{"role": "user", "content": "Is it cold in Oslo?"}], max_tokens=4)
    section = len(offer_of(TOOLS).section()) // 6  # (a token is about 4 characters of JSON)
    assert again.usage.prompt_tokens_details.cached_tokens > section


def test_the_ollama_client_gets_ollamas_shapes(served):
    client = ollama.Client(host=served.server.ollama_url)
    assert client.show("default").capabilities == ["completion", "tools"]
    history = [*PARIS, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris",
                                                            "unit": "celsius"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "18 C, cloudy"}]
    for stream in (False, True):
        parts = client.chat(model="default", messages=history, tools=TOOLS, stream=stream,
                            options={"temperature": 0, "num_predict": 48})
        parts = list(parts) if stream else [parts]
        assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
        text = "".join(p.message.content or "" for p in parts)
        calls = [c for p in parts for c in p.message.tool_calls or []]
        assert MARKER not in text and (text or calls)
        for call in calls:  # (the model chooses; a call is held to the schema)
            assert isinstance(call.function.arguments, dict)
            if call.function.name == "get_weather":
                a_weather_call(call.function.name, dict(call.function.arguments))
    # An answer of calls, as the client's own model of Ollama's reply reads it.
    said = Answer(None, (Call("call_1", "add", '{"a": 1, "b": 2}'),))
    reply = ollama.ChatResponse.model_validate(sh.calls_piece("default", said, done=True))
    assert reply.message.content == "" and reply.message.tool_calls[0].function.name == "add"
    assert reply.message.tool_calls[0].function.arguments == {"a": 1, "b": 2}


def test_bad_tools_are_400s_naming_the_field(served):
    user = [{"role": "user", "content": "hi"}]
    cases = [({"tools": [{"type": "function", "function": {"description": "x"}}]},
              "tools.0.function.name"),
             ({"tools": [{"type": "function", "function": {"name": "a b"}}]},
              "tools.0.function.name"),
             ({"tools": [{"type": "function"}]}, "tools.0.function"),
             ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
             ({"tools": [WEATHER, WEATHER]}, "tools"),
             ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                 "type": "array"}}}]}, "tools.0.function.parameters"),
             ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                 "type": "object", "properties": {"a": {"$ref": "https://x.org/s"}}}}}]},
              "tools.0.function.parameters"),
             ({"tools": TOOLS, "tool_choice": {"type": "function",
                                               "function": {"name": "nope"}}},
              "tool_choice.function.name"),
             ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
             ({"tool_choice": "required"}, "tool_choice"),
             ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
             ({"messages": [*user, {"role": "assistant", "tool_calls": [
                 {"id": "c", "function": {"arguments": "{}"}}]}, *user]},
              "messages.1.tool_calls.0.function.name"),
             ({"messages": [*user, {"role": "assistant", "tool_calls": [
                 {"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}, *user]},
              "messages.1.tool_calls.0.function.arguments"),
             ({"messages": [*user, {"role": "tool", "tool_call_id": "c"}]},
              "messages.1.content")]
    for fields, param in cases:
        r = httpx.post(f"{served.url}/v1/chat/completions", trust_env=False, timeout=60,
                       json={"model": "default", "messages": user, **fields})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (fields, r.text)
        assert r.json()["error"]["message"].startswith(param) and "Traceback" not in r.text
    for fields, words in (({"tools": [{"function": {"name": "f", "parameters": []}}]},
                           "tools.0.function.parameters"),
                          ({"tools": TOOLS, "format": "json"}, "format")):
        r = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=60,
                       json={"model": "default", "messages": user, **fields})
        assert r.status_code == 400 and r.json()["error"].startswith(words), r.text
    # The Responses API has no tools yet, and says where they are.
    with pytest.raises(openai.BadRequestError, match="/v1/chat/completions"):
        served.client.responses.create(model="default", input="hi", tools=[
            {"type": "function", "name": "f", "parameters": {"type": "object"}}])


def test_a_bound_the_grammar_cannot_hold_is_a_400_and_the_server_stays_up(served):
    """(5,000: more than kvdesk's grammar holds, and refused by llama.cpp's own parser too,
    rather than 20,000, which overflowed its stack and took the server's process with it:
    tests/test_tools.py tries that one, refused before anything parses it.)"""
    long = {"type": "object", "properties": {"x": {"type": "string", "maxLength": 5000}}}
    user = [{"role": "user", "content": "hi"}]
    for route, fields, param in (
            ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
                "name": "f", "parameters": long}}], "tool_choice": "required"},
             "tools.0.function.parameters.properties.x"),
            ("/v1/chat/completions", {"response_format": {"type": "json_schema",
                                                          "json_schema": {"schema": long}}},
             "response_format.json_schema.schema.properties.x"),
            ("/api/chat", {"format": long}, "format.properties.x")):
        r = httpx.post(f"{served.url}{route}", trust_env=False, timeout=60,
                       json={"model": "default", "messages": user, "stream": False, **fields})
        error = r.json()["error"]
        message = error if isinstance(error, str) else error["message"]
        assert r.status_code == 400 and message == f"{param}: maxLength 5000 is more than " \
            "kvdesk's grammar can hold (at most 1000)", r.text
    assert ask(served, max_tokens=4).choices[0].finish_reason


def test_the_assistants_own_words_are_continued_with_tools_offered(served):
    """Clients send their tools on every request ("auto"): a conversation ending with the
    assistant's words is continued as text, as without them; a call asked for cannot continue
    them, and calls whose results are missing are said to be."""
    words = [*PARIS, {"role": "assistant", "content": "The weather in Paris is"}]
    done = ask(served, words, max_tokens=8)
    assert done.choices[0].message.content and not done.choices[0].message.tool_calls
    assert MARKER not in done.choices[0].message.content
    r = httpx.post(f"{served.server.ollama_url}/api/chat", trust_env=False, timeout=60, json={
        "model": "default", "messages": words, "tools": TOOLS, "stream": False,
        "options": {"temperature": 0, "num_predict": 8}})
    assert r.status_code == 200 and r.json()["message"]["content"] == \
        done.choices[0].message.content, r.text
    called = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]}
    for messages, choice, param in ((words, "required", "tool_choice"),
                                    ([*PARIS, called], "auto", "messages.1.tool_calls")):
        with pytest.raises(openai.BadRequestError) as e:
            ask(served, messages, tool_choice=choice)
        assert e.value.body["param"] == param, e.value.body


def test_parallel_calls_end_at_the_first_call_written_again(served):
    """Free to call again, the model writes the same call again (at the default temperature;
    here a tool with no arguments, so any second call is the first again): the answer ends
    there, one call, "tool_calls", so that the `openai` client's `.parse()` takes it."""
    now = [{"type": "function", "function": {"name": "now", "description": "The time now"}}]
    for seed, stream in ((0, False), (1, False), (2, False), (0, True)):
        done = served.client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "What time is it?"}],
            tools=now, tool_choice="required", parallel_tool_calls=True, seed=seed,
            max_tokens=200, stream=stream, stream_options={"include_usage": True} if stream
            else None)
        if stream:
            chunks = list(done)
            assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [d.tool_calls[0] for c in chunks if c.choices
                     for d in [c.choices[0].delta] if d.tool_calls and d.tool_calls[0].id]
            reason, usage = chunks[-2].choices[0].finish_reason, chunks[-1].usage
        else:
            calls, reason = done.choices[0].message.tool_calls, done.choices[0].finish_reason
            usage = done.usage
        assert reason == "tool_calls" and len(calls) == 1, (seed, calls)
        assert usage.completion_tokens < 60  # (two calls at most: ~23 tokens each)


def test_ollamas_answer_of_a_call_streamed_and_not(served, monkeypatch):
    """The model's call as Ollama's client reads it, whatever the model would choose (the
    shipped ones never call in "auto"): a stand-in for the engine writes one through its
    tokens. No line's content carries the call's text; one line has it as `tool_calls`, its
    arguments an object; then the last line, done."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", ' \
           '"unit": "celsius"}}</tool_call>'

    def written(messages, *, on_token=None, on_start=None, **_):
        if on_start:
            on_start()
        for i in range(0, len(text), 5):  # (pieces that split the marker too)
            if on_token:
                on_token(text[i:i + 5])
        return Completion(text, "stop", 40, 20, 0.1, RestoreReport(40, 0, 0, [], 0), 0, False,
                          [])

    monkeypatch.setattr(served.app.engine, "complete", written)
    for stream in (False, True):
        r = httpx.post(f"{served.server.ollama_url}/api/chat", trust_env=False, timeout=60,
                       json={"model": "default", "messages": PARIS, "tools": TOOLS,
                             "stream": stream})
        lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
        assert r.status_code == 200 and lines[-1]["done"], r.text
        assert not "".join(x["message"]["content"] or "" for x in lines)  # (none of it)
        calls = [c for x in lines for c in x["message"].get("tool_calls") or []]
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
            ("get_weather", {"city": "Paris", "unit": "celsius"})], lines
        assert all(not x["done"] for x in lines[:-1]) and lines[-1]["done_reason"] == "stop"
        assert not stream or len(lines) == 2 and not lines[-1]["message"]["content"]
