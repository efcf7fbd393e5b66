"""What the local API's routes take of the values OpenAI documents a range for, without a
model: refused before anything runs, naming the field, the rule and the value given."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from desktop_app.app import App
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
        assert r.json()["error"] == {"message": "temperature: Input should be less than or "
                                                f"equal to 2 (got {value})", "param":
                                     "temperature", "type": "invalid_request_error",
                                     "code": None}
