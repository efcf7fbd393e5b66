"""What the local API's routes take of a request's values, without a model: a value out of
the range OpenAI documents is refused before anything runs, naming the field, the rule and the
value given; a document named twice reaches the engine once."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from desktop_app.app import App
from desktop_app.errors import MissingError
from desktop_app.server import bridge
from desktop_app.server.api import create_api
from desktop_app.settings import Settings

HI = [{"role": "user", "content": "hi"}]
OPENAI = (("/v1/chat/completions", {"messages": HI}), ("/v1/completions", {"prompt": "hi"}),
          ("/v1/responses", {"input": "hi"}))


@pytest.fixture
def client(tmp_path) -> TestClient:
    app = App(Settings(data_dir=str(tmp_path)))
    return TestClient(create_api(app, api_key=None, stopping=bridge.Stopping()),
                      base_url="http://127.0.0.1:8765")


@pytest.mark.parametrize(("route", "body"), OPENAI)
def test_a_temperature_over_openais_2_is_refused_on_openais_routes(client, route, body):
    for value in (5, 2.5):
        r = client.post(route, json={"model": "default", "temperature": value, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {"message": "temperature: should be less than or "
                                                f"equal to 2 (got {value})", "param":
                                     "temperature", "type": "invalid_request_error",
                                     "code": None}


class Recording:
    """An engine that records the documents each call names, and answers none."""

    def __init__(self):
        self.named: list[list[int]] = []

    def complete(self, messages, *, documents=(), **_):
        return self._named(documents)

    def ask(self, question, *, doc_ids=(), **_):
        return self._named(doc_ids)

    def _named(self, ids):
        self.named.append(list(ids))
        raise MissingError("recorded")


def test_a_document_named_twice_is_read_once_on_every_route(tmp_path):
    app = App(Settings(data_dir=str(tmp_path)))
    app.engine = engine = Recording()
    c = TestClient(create_api(app, api_key=None, stopping=bridge.Stopping()),
                   base_url="http://127.0.0.1:8765")
    twice = {"documents": [2, 1, 2, 1]}
    for route, body in (*OPENAI[::2], ("/api/chat", {"messages": HI, "stream": False}),
                        ("/api/generate", {"prompt": "hi", "stream": False})):
        for stream in (False, True):
            r = c.post(route, json={"model": "default", "kvdesk": twice, **body,
                                    "stream": stream})
            assert r.status_code == 404, (route, r.text)
    assert c.post("/v1/kvdesk/ask", json={"question": "hi", "doc_ids": [2, 1, 2]}
                  ).status_code == 404
    assert engine.named == [[2, 1]] * 9
