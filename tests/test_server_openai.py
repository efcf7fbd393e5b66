"""The rest of OpenAI's surface, with the official `openai` client and plain HTTP on the real
default model: `models.retrieve`, text completions streamed and not through the persistent
prompt cache, fill-in-the-middle refused where the model cannot, the Responses API's text
subset (a conversation continued by id, after a restart too, streamed as its typed events),
error JSON naming unknown routes and unsupported fields, images refused in words."""

from __future__ import annotations

import httpx
import openai
import pytest

from desktop_app.model.prompts import raw_prompt
from tests.test_server import DOC, Running

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = Running(tmp_path_factory.mktemp("openai"))
    yield running
    running.stop()


def complete(client, prompt, **extra):
    return client.completions.create(model="default", prompt=prompt, max_tokens=8,
                                     temperature=0, **extra)


def test_models_retrieve(served):
    for name in (served.app.model_path.stem, "default"):
        model = served.client.models.retrieve(name)
        assert model.id == name and model.object == "model" and model.owned_by == "kvdesk"
    with pytest.raises(openai.NotFoundError) as e:
        served.client.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found" and "not served here" in e.value.message


def test_text_completion_streamed_and_not(served):
    whole = complete(served.client, "The capital of France is")
    (choice,) = whole.choices
    assert whole.object == "text_completion" and choice.text
    assert choice.finish_reason in ("stop", "length") and whole.usage.completion_tokens > 0
    assert whole.usage.prompt_tokens < 10  # as it is: no chat template around it
    pieces, final, usage = [], None, None
    for chunk in complete(served.client, "The capital of France is", stream=True,
                          stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            final = chunk.choices[0].finish_reason or final
        else:
            usage = chunk.usage
    assert "".join(pieces) == choice.text and final == choice.finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_a_text_completion_goes_through_the_prompt_cache(served):
    prompt = "Timetable notes.\n" + DOC + "\nThe first ferry on weekdays leaves at"
    first = complete(served.client, prompt)
    info = first.model_extra["kvdesk"]
    assert info["stored"] is True and first.usage.prompt_tokens > 64
    longer = prompt + first.choices[0].text + "\nThe Saturday crossing is at"
    second = complete(served.client, longer)
    # the first prompt and its answer came back from the store; only the new line computed
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert second.model_extra["kvdesk"]["recomputed_tokens"] < 16


def test_fill_in_the_middle_needs_the_models_tokens(served):
    with pytest.raises(openai.BadRequestError, match="fill-in-the-middle"):
        complete(served.client, "def add(a, b):\n", suffix="\n    return c\n")


class FimTemplate:
    """A tokenizer with fill-in-the-middle tokens: one token per character, specials 900+."""

    adds_bos, fim_tokens = True, (901, 902, 903)

    def tokenize(self, text, *, add_bos=False, special=True):
        return [900] * add_bos + [ord(c) for c in text]


def test_a_fill_in_the_middle_prompt_is_prefix_suffix_middle():
    tokens = raw_prompt(FimTemplate(), "ab", "cd")
    assert tokens == [900, 901, ord("a"), ord("b"), 902, ord("c"), ord("d"), 903]
    assert raw_prompt(FimTemplate(), "ab") == [900, ord("a"), ord("b")]


def test_unsupported_fields_are_refused_by_name(served):
    cases = [({"prompt": ["one", "two"]}, "one prompt per request"),
             ({"prompt": [1, 2, 3]}, "token ids"), ({"prompt": "x", "echo": True}, "echo"),
             ({"prompt": "x", "best_of": 3}, "best_of"), ({"prompt": "x", "n": 2}, "n:"),
             ({"prompt": "x", "logprobs": 2}, "logprobs"), ({"prompt": ""}, "empty"),
             ({"prompt": "x", "kvdesk": {"documents": [1]}}, "use chat completions"),
             ({"prompt": "x", "kvdesk": {"level": "sharp"}}, "sharp")]
    for fields, words in cases:
        r = httpx.post(f"{served.url}/v1/completions", json={"model": "default", **fields},
                       trust_env=False)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        if words not in ("empty",):  # refused by name: `param` names the field (README)
            named = [k for k in fields if k != "prompt" or len(fields) == 1][-1]
            if named == "kvdesk":
                named += "." + next(iter(fields["kvdesk"]))
            assert r.json()["error"]["param"] == named, r.text
    hi = [{"role": "user", "content": "hi"}]
    for fields, words in (({"logit_bias": {"42": -100}}, "logit_bias"),
                          ({"modalities": ["text", "audio"]}, "modalities"),
                          ({"web_search_options": {}}, None), ({"modalities": ["text"]}, None)):
        r = httpx.post(f"{served.url}/v1/chat/completions", trust_env=False, json={
            "model": "default", "messages": hi, "max_tokens": 1, **fields})
        if words is None:  # empty or text-only: nothing that changes the answer
            assert r.status_code == 200, r.text
        else:
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    parts = [({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
              "images are not supported by this model"),
             ({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}},
              "audio is not supported by this model")]
    for part, words in parts:
        with pytest.raises(openai.BadRequestError, match=words) as e:
            served.client.chat.completions.create(model="default", messages=[
                {"role": "user", "content": [{"type": "text", "text": "What is it?"}, part]}])
        assert e.value.body["param"] == "messages.0.content.1"


def test_unknown_routes_get_openais_error_json(served):
    for method, path, status, words in (
            ("POST", "/v1/audio/speech", 404, "POST /v1/audio/speech: not served"),
            ("GET", "/v1/chat/completions", 405, "takes POST"),
            ("DELETE", "/v1/models/default", 405, "takes GET"),
            ("GET", "/nothing", 404, "GET /nothing: not served")):
        r = httpx.request(method, f"{served.url}{path}", trust_env=False)
        error = r.json()["error"]
        assert r.status_code == status and words in error["message"], r.text
        assert error["type"] and error["code"]


INSTRUCTIONS = "You answer about the ferry timetable below.\n\n" + DOC


def test_responses_continue_a_conversation_through_the_prompt_cache_across_a_restart(tmp_path):
    first = Running(tmp_path)
    try:
        one = first.client.responses.create(model="default", instructions=INSTRUCTIONS,
                                            input="When is the Sunday ferry?",
                                            max_output_tokens=8, temperature=0)
        assert one.output_text and one.status in ("completed", "incomplete")
        assert one.output[0].status == one.status  # a message cut at its limit: incomplete
        assert one.model_extra["kvdesk"]["stored"] is True
    finally:
        first.stop()
    again = Running(tmp_path)  # the conversation is kept by id, its KV by the store
    try:
        two = again.client.responses.create(model="default", instructions=INSTRUCTIONS,
                                            input=[{"role": "user", "content": [
                                                {"type": "input_text",
                                                 "text": "And on Saturdays?"}]}],
                                            previous_response_id=one.id,
                                            max_output_tokens=8, temperature=0)
        assert two.previous_response_id == one.id and two.output_text
        assert two.usage.input_tokens_details.cached_tokens > one.usage.input_tokens
        assert again.client.responses.retrieve(one.id).output_text == one.output_text
        again.client.responses.delete(one.id)
        with pytest.raises(openai.NotFoundError, match="no stored response"):
            again.client.responses.retrieve(one.id)
    finally:
        again.stop()


def test_the_assistants_own_words_are_continued_and_kept_as_one_message(served):
    """A prefill on both routes; a stored response keeps the words and their continuation as
    the one message they are, so the next turn finds the stored KV to its end."""
    asked = [{"role": "system", "content": INSTRUCTIONS},
             {"role": "user", "content": "When is the Sunday ferry?"}]
    chat = served.client.chat.completions.create(
        model="default", messages=[*asked, {"role": "assistant", "content": "The Sunday"}],
        max_tokens=8, temperature=0)
    assert chat.choices[0].message.content.strip()
    one = served.client.responses.create(
        model="default", instructions=INSTRUCTIONS, max_output_tokens=8, temperature=0,
        input=[{"role": "user", "content": "When is the Sunday ferry?"},
               {"role": "assistant", "content": "The Sunday"}])
    assert one.output_text.strip()
    two = served.client.responses.create(
        model="default", instructions=INSTRUCTIONS, input="And on Saturdays?",
        previous_response_id=one.id, max_output_tokens=8, temperature=0)
    assert two.usage.input_tokens_details.cached_tokens > one.usage.input_tokens
    with pytest.raises(openai.BadRequestError, match="needs a user") as e:
        served.client.chat.completions.create(
            model="default", messages=[{"role": "assistant", "content": "Hello"}])
    assert e.value.body["param"] == "messages"


def test_a_streamed_response_is_the_responses_apis_events(served):
    events = list(served.client.responses.create(model="default", input="Say hi.",
                                                 max_output_tokens=8, temperature=0,
                                                 stream=True, store=False))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == events[-1].response.output_text == events[-4].text
    with pytest.raises(openai.NotFoundError):  # store: false keeps nothing
        served.client.responses.retrieve(events[-1].response.id)


def test_tools_with_a_choice_of_none_are_answered_in_text_without_them(served):
    """Continue, LangChain and Open WebUI send their tool list with every request; with
    tool_choice "none" OpenAI answers in text, and so does kvdesk, the tools unused, said."""
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    asked = {"model": "default", "messages": [{"role": "user", "content": "Say hi."}],
             "max_tokens": 4, "temperature": 0, "tools": tools, "tool_choice": "none"}
    whole = served.client.chat.completions.create(**asked)
    bare = served.client.chat.completions.create(**{**asked, "tools": None,
                                                    "tool_choice": None})
    assert whole.choices[0].message.content == bare.choices[0].message.content  # not shown
    assert whole.usage.prompt_tokens == bare.usage.prompt_tokens
    (note,) = [m for m in whole.model_extra["kvdesk"]["messages"] if "tools" in m]
    assert note.startswith('tools: not shown to the model, as tool_choice "none" asks')
    last = list(served.client.chat.completions.create(**asked, stream=True))[-1]
    assert note in last.model_extra["kvdesk"]["messages"]
    response = served.client.responses.create(
        model="default", input="Say hi.", max_output_tokens=4, tool_choice="none",
        tools=[{"type": "function", "name": "weather", "parameters": {}}])
    assert response.output_text and note in response.model_extra["kvdesk"]["messages"]
    with pytest.raises(openai.BadRequestError, match="answered on /v1/chat/completions"):
        served.client.responses.create(  # (chat completions answer them: test_server_tools)
            model="default", input="Say hi.", max_output_tokens=4, tool_choice="auto",
            tools=[{"type": "function", "name": "weather", "parameters": {}}])


def test_what_responses_refuse(served):
    cases = [({"input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]},
              400, "images are not supported by this model"),
             ({"input": "x", "previous_response_id": "resp_gone"}, 404, "no stored response"),
             ({"input": "x", "tools": [{"type": "function", "name": "f"}]}, 400, "tools"),
             ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
              400, "'function_call_output' items are not supported"),
             ({"input": "x", "reasoning": {"effort": "high"}}, 400, "reasoning"),
             ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens")]
    for fields, status, words in cases:
        with pytest.raises(openai.APIStatusError, match=words) as e:
            served.client.responses.create(model="default", **fields)
        assert e.value.status_code == status
    # a refusal of one field names it (`param`), in this API's words
    for fields, param in (({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
                          ({"input": []}, "input"), ({"input": " "}, "input")):
        with pytest.raises(openai.BadRequestError) as e:
            served.client.responses.create(model="default", **fields)
        assert e.value.body["param"] == param
    for fields, param in (({"prompt": ""}, "prompt"), ({"prompt": "x", "suffix": "y"}, "suffix")):
        with pytest.raises(openai.BadRequestError) as e:
            served.client.completions.create(model="default", max_tokens=4, **fields)
        assert e.value.body["param"] == param


def test_a_prompt_no_context_could_hold_is_refused_before_its_turn(served):
    """Megabytes of text take many seconds to tokenize: while another request's turn runs,
    such a request is refused at once instead of waiting for its turn to find out."""
    huge = "ferry timetable " * 120_000  # 1.9 MB
    lock = served.app.engine.session.lock
    with lock:  # another turn holds the context
        with pytest.raises(openai.BadRequestError) as e:
            served.client.with_options(timeout=30, max_retries=0).chat.completions.create(
                model="default", max_tokens=1, messages=[{"role": "user", "content": huge}])
        assert e.value.body["code"] == "context_length_exceeded"
        assert "at least" in e.value.message and "1,920,000 bytes" in e.value.message
        with pytest.raises(openai.BadRequestError) as e:
            served.client.with_options(timeout=30, max_retries=0).completions.create(
                model="default", prompt=huge, max_tokens=1)
        assert e.value.body["param"] == "prompt"


def test_a_prompt_too_long_for_the_context_says_so_in_openais_code(served):
    # Clients trim their history on `context_length_exceeded`; the field is the prompt's own.
    long = "ferry " * 1200  # (the served context: 1,024 tokens)
    with pytest.raises(openai.BadRequestError) as e:
        served.client.chat.completions.create(model="default", max_tokens=1,
                                              messages=[{"role": "user", "content": long}])
    assert e.value.body["code"] == "context_length_exceeded"
    assert e.value.body["param"] == "messages" and "with room to answer" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        complete(served.client, long)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        served.client.responses.create(model="default", input=long, max_output_tokens=16)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "input"
    # Streamed: refused before the stream opens, with the same status and code.
    with pytest.raises(openai.BadRequestError) as e:
        with served.client.responses.stream(model="default", input=long) as events:
            list(events)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "input"
