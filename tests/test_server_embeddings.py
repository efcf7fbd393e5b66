"""`/v1/embeddings` with the official `openai` client and plain HTTP: OpenAI's shapes, the
same vectors as `Engine.embed`, and OpenAI's errors for what it cannot do; and a document
longer than the context attached through the API, said at once as it is from the CLI."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
from test_server import Running

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = Running(tmp_path_factory.mktemp("embeddings"))
    yield running
    running.stop()


def test_the_official_client_gets_the_engines_vectors(served):
    name = served.app.engine.embedder.name
    texts = ["The ferry leaves at 07:15.", "Bicycles travel free on the crossing."]
    # The client asks for base64 by default and decodes it itself.
    got = served.client.embeddings.create(model="default", input=texts)
    assert got.model == name and [d.index for d in got.data] == [0, 1]
    vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
    assert np.allclose(vectors, served.app.engine.embed(texts), atol=1e-6)
    assert got.usage.prompt_tokens == got.usage.total_tokens > 8
    floats = served.client.embeddings.create(model=name, input=texts[0],
                                             encoding_format="float")
    assert np.allclose(floats.data[0].embedding, vectors[0], atol=1e-6)
    short = served.client.embeddings.create(model=name, input=texts[0], dimensions=64)
    assert len(short.data[0].embedding) == 64
    assert abs(np.linalg.norm(short.data[0].embedding) - 1) < 1e-5


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"model": "gpt-4", "input": "x"}, 404, "does not make embeddings"),
    ({"model": "default", "input": [1, 2, 3]}, 400, "check_embedding_ctx_length=False"),
    ({"model": "default", "input": []}, 400, "1 to 2048"),
    ({"model": "default", "input": ["ok", "  "]}, 400, "empty text"),
    ({"model": "default", "input": "x", "dimensions": 4096}, 400, "at most 256"),
    ({"model": "default", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"input": "x"}, 400, "model"),
    # What is accepted, not the token forms the type holds only to refuse them with why.
    ({"model": "default", "input": 5}, 400,
     "input: should be a string or an array of strings (got 5)"),
    ({"model": "default", "input": [["a"]]}, 400,
     'input: should be a string or an array of strings (got [["a"]])'),
    ({"model": "default", "input": ["a", 2]}, 400, "input: should be a string or an array"),
])
def test_bad_requests_get_openai_errors(served, body, status, says):
    response = httpx.post(f"{served.url}/v1/embeddings", json=body, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert says in error["message"] and "integer" not in error["message"]
    assert error["param"] is None or "[" not in error["param"]  # no union member's name
    with pytest.raises(openai.APIStatusError):
        if status == 404:
            served.client.embeddings.create(model="gpt-4", input="x")
        else:
            served.client.embeddings.create(model="default", input=[[1, 2]])


def test_a_long_upload_is_said_at_once_and_kept_as_passages(served):
    text = "\n\n".join(f"## Part {i}\n\nThe quarry at Helmsby shipped {i * 13} tonnes of "
                         f"slate in week {i}, by barge and by rail." for i in range(120))
    events = []
    with httpx.stream("POST", f"{served.url}/v1/kvdesk/documents?stream=true", timeout=300,
                      files={"file": ("quarry.md", text.encode(), "text/markdown")}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:]))
    notes = [e["progress"]["note"] for e in events if e.get("progress", {}).get("note")]
    assert len(notes) == 1 and "a context of 1,024 holds" in notes[0]
    first_note = next(i for i, e in enumerate(events) if e.get("progress", {}).get("note"))
    assert not any(e.get("progress", {}).get("phase") == "prefill" for e in events)
    (result,) = [e["result"] for e in events if "result" in e]
    assert events.index({"result": result}) > first_note
    assert result["passages"] > 3 and result["kept_tokens"] == 0
    listed = httpx.get(f"{served.url}/v1/kvdesk/documents", timeout=30).json()
    assert [d["passages"] for d in listed if d["doc_id"] == result["doc_id"]] == \
        [result["passages"]]


def test_a_text_over_the_embedders_limit_is_refused_by_openais_route_cut_by_ollamas(served):
    """8,192 of the embedder's tokens a text, as OpenAI's models read; megabytes are refused
    by their length, in a moment, not tokenized for minutes."""
    embedder = served.app.engine.embedder
    long = "ferry " * 9000  # (over 8,192 tokens, under the bound on characters)
    assert len(embedder.tokens([long])[0]) > 8192
    huge = "x" * (4 << 20)
    for text, size in ((long, "tokens"), (huge, "4,194,304 characters")):
        r = httpx.post(f"{served.url}/v1/embeddings", timeout=30, trust_env=False,
                       json={"model": "default", "input": ["short", text]})
        assert r.status_code == 400, r.text[:300]
        error = r.json()["error"]
        assert error["param"] == "input.1" and "8,192 tokens" in error["message"], error
        assert error["message"].startswith("input.1: ") and size in error["message"], error
    one = httpx.post(f"{served.url}/v1/embeddings", timeout=30, trust_env=False,
                     json={"model": "default", "input": huge})
    assert one.status_code == 400 and one.json()["error"]["param"] == "input", one.text[:300]
    # Ollama's /api/embed reads such a text to the limit (its default: truncate), or refuses
    # it when asked not to; the older route cuts it too.
    cut = embedder.embed_tokens([embedder.tokens([long])[0][:8192]])[0]
    for text in (long, huge):
        r = httpx.post(f"{served.url}/api/embed", timeout=30, trust_env=False,
                       json={"model": "default", "input": ["short", text]})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["prompt_eval_count"] == 8192 + embedder.count_tokens(["short"])
        if text is long:
            assert np.allclose(r.json()["embeddings"][1], cut, atol=1e-6)
        refused = httpx.post(f"{served.url}/api/embed", timeout=30, trust_env=False,
                             json={"model": "default", "input": ["short", text],
                                   "truncate": False})
        assert refused.status_code == 400 and refused.json()["error"].startswith(
            "input.1: "), refused.text
    legacy = httpx.post(f"{served.url}/api/embeddings", timeout=30, trust_env=False,
                        json={"model": "default", "prompt": long})
    assert legacy.status_code == 200 and np.allclose(legacy.json()["embedding"], cut, atol=1e-6)


def test_each_text_is_tokenized_once_for_its_vector_and_its_count(served, monkeypatch):
    embedder = served.app.engine.embedder
    texts = ["The ferry leaves at 07:15.", "Bicycles travel free on the crossing."]
    want, count = embedder.embed(texts), embedder.count_tokens(texts)
    calls = []
    tokens = embedder.tokens
    monkeypatch.setattr(embedder, "tokens", lambda t: calls.append(t) or tokens(t))
    for name in ("embed", "count_tokens"):
        monkeypatch.setattr(embedder, name, lambda *_: pytest.fail("tokenized again"))
    got = served.client.embeddings.create(model="default", input=texts)
    assert np.allclose([d.embedding for d in got.data], want, atol=1e-6)
    assert got.usage.prompt_tokens == count and calls == [texts]
