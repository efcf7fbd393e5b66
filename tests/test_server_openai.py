"""The rest of OpenAI's surface, with the official `openai` client and plain HTTP on the real
default model: `models.retrieve`, text completions streamed and not through the persistent
prompt cache, fill-in-the-middle refused where the model cannot, the Responses API's 501,
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
             ({"prompt": "x", "logprobs": 2}, "logprobs"), ({"prompt": ""}, "empty")]
    for fields, words in cases:
        r = httpx.post(f"{served.url}/v1/completions", json={"model": "default", **fields},
                       trust_env=False)
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


def test_unknown_routes_and_the_responses_api_get_openais_error_json(served):
    for method, path, status, words in (
            ("POST", "/v1/audio/speech", 404, "POST /v1/audio/speech: not served"),
            ("GET", "/v1/chat/completions", 405, "takes POST"),
            ("DELETE", "/v1/models/default", 405, "takes GET"),
            ("GET", "/nothing", 404, "GET /nothing: not served")):
        r = httpx.request(method, f"{served.url}{path}", trust_env=False)
        error = r.json()["error"]
        assert r.status_code == status and words in error["message"], r.text
        assert error["type"] and error["code"]
    with pytest.raises(openai.APIStatusError) as e:
        served.client.responses.create(model="default", input="Hello")
    assert e.value.status_code == 501 and e.value.body["code"] == "not_implemented"
    assert "/v1/chat/completions" in e.value.message
