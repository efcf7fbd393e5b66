"""`/v1/embeddings` with the official `openai` client and plain HTTP: OpenAI's shapes, the
same vectors as `Engine.embed`, and OpenAI's errors for what it cannot do."""

from __future__ import annotations

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
    ({"model": "default", "input": [1, 2, 3]}, 400, "token arrays"),
    ({"model": "default", "input": []}, 400, "1 to 2048"),
    ({"model": "default", "input": ["ok", "  "]}, 400, "empty text"),
    ({"model": "default", "input": "x", "dimensions": 4096}, 400, "at most 256"),
    ({"model": "default", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"input": "x"}, 400, "model"),
])
def test_bad_requests_get_openai_errors(served, body, status, says):
    response = httpx.post(f"{served.url}/v1/embeddings", json=body, timeout=30)
    assert response.status_code == status
    assert says in response.json()["error"]["message"]
    with pytest.raises(openai.APIStatusError):
        if status == 404:
            served.client.embeddings.create(model="gpt-4", input="x")
        else:
            served.client.embeddings.create(model="default", input=[[1, 2]])
