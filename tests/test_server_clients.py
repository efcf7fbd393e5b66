"""What real clients send and expect of the local API, without a model: fields sent as null,
HEAD health checks, Ollama's model management, its durations and digests, CORS's default
port, and a busy port said before the model loads."""

from __future__ import annotations

import json
import os

import pytest
from starlette.testclient import TestClient

from desktop_app.app import App
from desktop_app.results import Completion, RestoreReport
from desktop_app.server import bridge
from desktop_app.server.api import create_api
from desktop_app.settings import Settings

USER = [{"role": "user", "content": "hi"}]


def client(tmp_path, api_key=None, **settings) -> TestClient:
    app = App(Settings(data_dir=str(tmp_path), **settings))
    return TestClient(create_api(app, api_key=api_key, stopping=bridge.Stopping()),
                      base_url="http://127.0.0.1:8765")


def test_a_null_kvdesk_field_is_one_left_out(tmp_path):
    """As every other optional field: taken (a model not served is the first refusal)."""
    c = client(tmp_path)
    for url, body in (("/v1/chat/completions", {"messages": USER}),
                      ("/v1/completions", {"prompt": "hi"}),
                      ("/v1/responses", {"input": "hi"}),
                      ("/api/chat", {"messages": USER}), ("/api/generate", {"prompt": "hi"})):
        r = c.post(url, json={"model": "gpt-9", "kvdesk": None, **body})
        assert r.status_code == 404 and "gpt-9" in r.text, (url, r.text)


def test_health_checks_by_head_are_answered_as_ollama_answers_them(tmp_path):
    c = client(tmp_path)
    for path in ("/", "/api/version", "/api/tags"):  # (/api/ps's, with the model: loaded)
        r = c.head(path)
        assert r.status_code == 200 and not r.content, path
    assert c.head("/api/chat").status_code == 405


def test_keep_alive_must_be_a_duration_as_ollama_reads_one(tmp_path):
    c = client(tmp_path)
    for url, body in (("/api/chat", {"messages": USER}), ("/api/generate", {"prompt": "hi"}),
                      ("/api/embed", {"input": "hi"})):
        bad = c.post(url, json={"model": "gpt-9", "keep_alive": "forever", **body})
        assert bad.status_code == 400 and bad.json()["error"].startswith(
            "keep_alive: not a duration"), (url, bad.text)
        for fine in ("5m", "1h30m", "-1m", "0", "-1", 300, -1, 2.5, None):
            r = c.post(url, json={"model": "gpt-9", "keep_alive": fine, **body})
            assert r.status_code == 404, (url, fine, r.text)  # (past its checks)


def test_the_models_digest_is_64_hex_digits_as_ollamas(tmp_path):
    import re

    (listed,) = client(tmp_path).get("/api/tags").json()["models"]
    assert re.fullmatch(r"[0-9a-f]{64}", listed["digest"]), listed["digest"]
    # the same file, the same digest (hashed again here: another data directory)
    (again,) = client(tmp_path / "again").get("/api/tags").json()["models"]
    assert again["digest"] == listed["digest"]


def test_a_pull_of_the_model_served_succeeds_and_managing_models_is_refused_saying_why(
        tmp_path):
    c = client(tmp_path)
    for name in ("default", "default:latest"):
        assert c.post("/api/pull", json={"model": name, "stream": False}).json() == {
            "status": "success"}
        streamed = c.post("/api/pull", json={"model": name})  # (streamed, Ollama's default)
        assert streamed.status_code == 200 and streamed.headers["content-type"].startswith(
            "application/x-ndjson")
        assert [json.loads(line) for line in streamed.text.splitlines()][-1] == {
            "status": "success"}
    assert c.post("/api/pull", json={"name": "default", "stream": None}).status_code == 200
    other = c.post("/api/pull", json={"model": "llama3.2"})
    assert other.status_code == 404
    for method, path, body in (("DELETE", "/api/delete", {"model": "default"}),
                               ("POST", "/api/copy", {"source": "default", "destination": "x"}),
                               ("POST", "/api/create", {"model": "x", "from": "default"}),
                               ("POST", "/api/push", {"model": "default"})):
        r = c.request(method, path, json=body)
        assert r.status_code == 400, (path, r.text)
        for said in (r, other):
            error = said.json()["error"]  # (Ollama's error shape)
            assert "kvdesk does not download or manage models" in error, error
            assert "'default:latest'" in error and "`kvdesk models`" in error
            assert "under /api" not in error


def test_a_busy_port_is_said_before_the_model_loads(tmp_path, capsys):
    """The port is bound (and that socket served) before the model loads: a busy one is said
    at once, and the data directory is let go."""
    from desktop_app.cli import main
    from desktop_app.server import discovery
    from desktop_app.server.running import bind

    busy = bind("127.0.0.1", 0)
    try:
        with pytest.raises(SystemExit) as exited:
            main(["--data-dir", str(tmp_path), "serve", "--port",
                  str(busy.getsockname()[1]), "--ollama-port", "none"])
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "Address already in use" in err, err
    assert "Loading" not in err and "Traceback" not in err
    held = discovery.claim(tmp_path)
    assert held is not None  # (let go)
    os.close(held)


class CutShort:
    """An engine whose answer the server's stopping cuts after its first words."""

    def complete(self, prompt, *, cancel=None, on_token=None, on_start=None, **options):
        if on_start:
            on_start()
        if on_token:
            on_token("The keeper")
        return Completion("The keeper", "cancelled", 5, 2, 0.1,
                          RestoreReport(4, 0.0, 0, [], 4), 0, False)


@pytest.mark.parametrize("url, body", [("/v1/chat/completions", {"messages": USER}),
                                       ("/v1/completions", {"prompt": "hi"})])
def test_an_answer_cut_short_is_an_error_not_a_finish_reason_clients_do_not_know(
        tmp_path, url, body):
    """OpenAI's finish reasons have none for an answer stopped after it began (the server
    stopping): whole or streamed, it ends in an error, as Ollama's routes end it."""
    app = App(Settings(data_dir=str(tmp_path)))
    app.__dict__["engine"] = CutShort()
    c = TestClient(create_api(app, api_key=None, stopping=bridge.Stopping()),
                   base_url="http://127.0.0.1:8765")
    whole = c.post(url, json={"model": "default", **body})
    assert whole.status_code == 503 and "cut short" in whole.json()["error"]["message"]
    streamed = c.post(url, json={"model": "default", "stream": True, **body})
    events = [line.removeprefix("data:").strip() for line in streamed.text.splitlines()
              if line.startswith("data:")]
    assert events[-1] == "[DONE]" and "cut short" in json.loads(events[-2])["error"]["message"]
    assert not any('"finish_reason": "cancelled"' in e for e in events)


def test_records_read_from_a_newer_server_leave_out_what_they_do_not_know():
    """(A server upgraded while it ran, then the install rolled back: the CLI asking through it
    failed on the record's new key, `AskResult(**result)`, after the answer streamed.) The
    client builds every record it reads with `from_dict`."""
    import inspect

    from desktop_app.server import client
    assert "(**" not in inspect.getsource(client)
    from desktop_app.results import AskResult

    sent = AskResult(chat_id=3, answer="Seven.", ttft_s=0.1, restore_s=0.05, bytes_read=10,
                     chunk_levels=["high"], recomputed_tokens=0, tokens_generated=2)
    assert AskResult.from_dict({**sent.as_dict(), "a_newer_field": [1]}) == sent
    report = RestoreReport.from_dict({"new": 1, **RestoreReport(
        tokens=5, restore_s=0.1, bytes_read=3, chunk_levels=["high"],
        recomputed_tokens=0).as_dict()})
    assert report.tokens == 5
