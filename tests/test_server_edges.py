"""The local API's edges without a model: the API key and CORS together (preflights answered
bare, errors readable by the allowed page), each API's error dialect, routes that included
routers serve, and the new settings' and flags' refusals."""

from __future__ import annotations

import contextlib
import json
import logging
import os

import pytest
from fastapi import APIRouter
from starlette.testclient import TestClient

from desktop_app.app import App
from desktop_app.cli import main
from desktop_app.errors import Cancelled
from desktop_app.server import bridge
from desktop_app.server.api import create_api
from desktop_app.settings import Settings
from store import DiskFullError, NotFoundError

ORIGIN = "http://localhost:3000"
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def client(tmp_path, api_key=None, **settings) -> TestClient:
    app = App(Settings(data_dir=str(tmp_path), **settings))
    return TestClient(create_api(app, api_key=api_key, stopping=bridge.Stopping()),
                      base_url="http://127.0.0.1:8765")


def test_a_page_not_allowed_and_a_host_name_not_this_machines_are_refused(tmp_path):
    c = client(tmp_path, cors_origins=(ORIGIN,))
    # A form's POST from another site (no preflight): refused before anything runs.
    form = c.post("/v1/kvdesk/ask", content=b'{"question": "hi"}',
                  headers={"Origin": "http://evil.example",
                           "content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 403 and "cors_origins" in form.json()["error"]["message"]
    assert c.get("/api/tags", headers={"Origin": "null"}).json() == {"error": (
        "requests from the web page null are not allowed: list it in the setting "
        "cors_origins to let it use kvdesk")}
    assert c.get("/v1/models", headers={"Origin": ORIGIN}).status_code == 200
    # A page that rebound its own name to 127.0.0.1 still sends that name.
    rebound = c.get("/v1/kvdesk/documents", headers={"Host": "attacker.example:8765"})
    assert rebound.status_code == 403 and "API key" in rebound.json()["error"]["message"]
    for host in ("localhost:8765", "127.0.0.1", "[::1]:8765", "::1", "127.0.0.2:1",
                 "LOCALHOST", "0.0.0.0:11434"):
        assert c.get("/v1/models", headers={"Host": host}).status_code == 200, host
    for host in ("127.0.0.1.evil.example", "localhost.evil.example:8765", "evil.example"):
        assert c.get("/v1/models", headers={"Host": host}).status_code == 403, host
    # A page of this server's own origin is taken; it serves no generated page, whose script
    # would come from a CDN (FastAPI's /docs) and so act with the server's own origin.
    for page in ("/docs", "/redoc", "/openapi.json"):
        assert c.get(page).status_code == 404, page
    own = {"Origin": "http://127.0.0.1:8765", "Host": "127.0.0.1:8765"}
    assert c.get("/v1/models", headers=own).status_code == 200
    assert c.get("/v1/models", headers={**own, "Host": "127.0.0.1:9999"}).status_code == 403
    # With a key (a server that may listen on the network) the key decides, not the name.
    keyed = client(tmp_path / "k", api_key="s3cret")
    assert keyed.get("/v1/models", headers={"Host": "box.lan:8765",
                                            "Authorization": "Bearer s3cret"}).status_code == 200


def test_a_keyed_server_answers_an_allowed_pages_preflight_and_lets_it_read_a_401(tmp_path):
    c = client(tmp_path, api_key="s3cret", cors_origins=(ORIGIN,))
    preflight = c.options("/v1/chat/completions", headers=PREFLIGHT)
    assert preflight.status_code == 200  # browsers send preflights without the key
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    refused = c.post("/v1/chat/completions", json={}, headers={"Origin": ORIGIN})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert refused.headers["access-control-allow-origin"] == ORIGIN
    # Under /api/ the same refusal is Ollama's error, which Ollama's clients read.
    ollama = c.get("/api/tags")
    assert ollama.status_code == 401 and "API key" in ollama.json()["error"]


def test_a_keyed_server_leaves_only_its_liveness_checks_open(tmp_path):
    """Ollama has no keys: its plugins' health checks send none, and a 401 there reads as
    "not running". Those checks answer without the key; nothing else does."""
    keyed = client(tmp_path, api_key="s3cret")
    assert keyed.get("/").text == "Ollama is running" and keyed.head("/").status_code == 200
    assert keyed.get("/api/version").json()["version"]
    assert keyed.head("/api/version").status_code == 200
    for method, path in (("GET", "/api/tags"), ("HEAD", "/api/tags"), ("GET", "/api/ps"),
                         ("GET", "/v1/kvdesk/health"), ("GET", "/v1/models"),
                         ("POST", "/"), ("POST", "/api/version"), ("GET", "/api/version/")):
        assert keyed.request(method, path).status_code == 401, (method, path)


def test_any_origin_is_answered_as_any_only_without_a_key(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="desktop_app.server.edges"):
        c = client(tmp_path, cors_origins=("*",))
    # (said as the server starts: it was taken without a word)
    assert any("every web page you open in a browser may use this server" in r.getMessage()
               for r in caplog.records)
    r = c.get("/api/version", headers={"Origin": "http://anything.example"})
    assert r.headers["access-control-allow-origin"] == "*"
    none = client(tmp_path / "none").get("/api/version", headers={"Origin": ORIGIN})
    assert "access-control-allow-origin" not in none.headers  # none listed: no page may


def test_desktop_apps_pages_are_let_in_as_ollama_lets_them_and_patterns_match(tmp_path):
    none = client(tmp_path)
    for app_page in ("app://obsidian.md", "vscode-webview://1f2e3d", "tauri://localhost"):
        r = none.get("/api/tags", headers={"Origin": app_page})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app_page
    assert none.get("/api/tags", headers={"Origin": ORIGIN}).status_code == 403
    assert none.get("/api/tags", headers={"Origin": "https://app.example"}).status_code == 403
    ports = client(tmp_path / "p", api_key="k",
                   cors_origins=("http://localhost:*", "https://*.example.com"))
    for page in ("http://localhost:5173", "http://localhost:3000", "https://ui.example.com",
                 "http://localhost"):  # (a "*" port is any, the scheme's default too)
        preflight = ports.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": page})
        assert preflight.headers["access-control-allow-origin"] == page, page
    for page in ("https://localhost", "http://localhost.evil.example:3000", "https://example.com",
                 "https://a.example.com.evil", "https://evilexample.com"):
        assert ports.get("/api/tags", headers={"Origin": page}).status_code == 403, page
    assert Settings(cors_origins=("HTTP://LocalHost:*", "http://[::1]:80")).cors_origins == (
        "http://localhost:*", "http://[::1]")
    # Never a whole host: that is any page, "*", which an API key refuses.
    for bad in ("http://localhost:70000", "http://a:*/x", "*://a", "https://*", "http://*:80",
                "http://localhost*", "https://*.com", "http://a*.example.com"):
        with pytest.raises(ValueError, match="not an origin"):
            Settings(cors_origins=(bad,))


def test_ollamas_health_check_is_answered(tmp_path):
    c = client(tmp_path)
    r = c.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert c.head("/").status_code == 200


def test_error_dialects_and_a_routers_route(tmp_path):
    c = client(tmp_path)
    router = APIRouter()

    @router.post("/v1/kvdesk/elsewhere")
    async def elsewhere():
        return {}

    @router.post("/v1/kvdesk/stopped")
    async def stopped():
        raise Cancelled("restore cancelled")

    @router.post("/v1/kvdesk/deleted")
    async def deleted():  # a chat deleted while its turn was answered
        raise NotFoundError("no chat 4")

    @router.post("/v1/kvdesk/full")
    async def full():
        raise DiskFullError("the disk holding the data directory D is full")

    c.app.include_router(router)  # a route added later, through a router
    assert c.post("/v1/kvdesk/elsewhere").status_code == 200
    # A request stopped is the server's (503), answered without the error raised again (the
    # test client would raise it here).
    cut = c.post("/v1/kvdesk/stopped")
    assert cut.status_code == 503 and cut.json()["error"]["code"] == "cancelled"
    gone = c.post("/v1/kvdesk/deleted")  # the store's refusals too
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    no_room = c.post("/v1/kvdesk/full")
    assert no_room.status_code == 500 and no_room.json()["error"]["code"] == "storage_unavailable"
    wrong = c.get("/v1/kvdesk/elsewhere").json()["error"]
    assert wrong["code"] == "method_not_allowed" and "takes POST" in wrong["message"]
    # A path under an API's prefix is not sent there again; another is told where they are.
    assert c.get("/api/elsewhere").json() == {
        "error": "GET /api/elsewhere: not served by kvdesk (README's \"Every endpoint\" lists "
                 "the routes it serves)"}
    assert "under /v1" not in c.post("/v1/audio/speech").json()["error"]["message"]
    assert "OpenAI's routes are under /v1, Ollama's under /api" in c.get(
        "/chat/completions").json()["error"]["message"]
    bad = c.post("/api/generate", content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and isinstance(bad.json()["error"], str)
    missing = c.post("/v1/completions", json={"model": "default"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"


def test_the_new_settings_and_flags_are_checked(tmp_path, capsys):
    with pytest.raises(ValueError, match="ollama_port"):
        Settings(ollama_port=70000)
    with pytest.raises(ValueError, match="not an origin"):
        Settings(cors_origins=("localhost:3000",))
    assert Settings(ollama_port=None, cors_origins=("https://a.example:8443",))
    with pytest.raises(SystemExit) as exited:
        main(["--data-dir", str(tmp_path), "serve", "--ollama-port", "70000"])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "--ollama-port" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exited:
        main(["--data-dir", str(tmp_path), "serve", "--port", "70000"])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "Error: --port: " in err and "--server-port" not in err
    with pytest.raises(SystemExit) as exited:
        main(["--data-dir", str(tmp_path), "serve", "--ollama-port", "eleven"])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "neither a port nor none" in err


def test_ollamas_port_can_be_left_unserved_from_the_command_line(tmp_path, monkeypatch):
    """`--ollama-port none` as the setting's null: no second listener (0 is any free port)."""
    import desktop_app.server as server_mod

    made = []

    class Refused(Exception):
        pass

    class FakeServer:
        def __init__(self, app, **kwargs):
            made.append(kwargs)

        def signals_stop(self):
            return contextlib.nullcontext()

        def listen(self):
            raise Refused  # (what was asked is known: nothing is served)

    monkeypatch.setattr(server_mod, "Server", FakeServer)
    for value, port in (("none", None), ("None", None), ("0", 0), ("9999", 9999)):
        with pytest.raises(Refused):
            main(["--data-dir", str(tmp_path), "serve", "--ollama-port", value])
        assert made[-1]["ollama_port"] == port, value
    with pytest.raises(Refused):
        main(["--data-dir", str(tmp_path), "serve"])
    assert made[-1]["ollama_port"] == 11434  # the setting's default


def test_the_served_models_names(tmp_path):
    from desktop_app.server.served import Served

    shipped = Served(App(Settings(data_dir=str(tmp_path))))
    assert shipped.ollama_name == "default:latest"
    assert all(shipped.is_ollama_name(n) for n in ("default", "default:latest",
                                                   f"{shipped.file_id}:latest"))
    assert not shipped.is_ollama_name("llama3.2:3b") and not shipped.is_ollama_name("default:7b")
    folder = tmp_path / "models"
    (folder / "team").mkdir(parents=True)
    path = folder / "team" / "tiny.gguf"
    path.write_bytes(b"GGUF not really")  # listed (as unreadable) by its name all the same
    by_path = Served(App(Settings(data_dir=str(tmp_path), model=str(path),
                                  model_folders=(str(folder),))))
    listed = {m.path: m.name for m in by_path.app.list_models()}
    assert by_path.listed_name == listed[str(path)] == "team/tiny.gguf"
    assert by_path.is_ollama_name(by_path.listed_name)
    # Ollama's name has no ".gguf" in it: a file in the folder itself is called as on the
    # OpenAI routes (it read "tiny.gguf:latest" beside /v1/models' "tiny")
    assert by_path.ollama_name == "team/tiny:latest"
    top = folder / "tiny.gguf"
    top.write_bytes(b"GGUF not really")
    at_top = Served(App(Settings(data_dir=str(tmp_path), model=str(top),
                                 model_folders=(str(folder),))))
    assert at_top.ollama_name == f"{at_top.file_id}:latest" == "tiny:latest"
    assert all(at_top.is_ollama_name(n) for n in ("tiny", "tiny.gguf", "tiny.gguf:latest"))


def test_bad_text_ids_and_paths_are_the_clients_errors_not_the_servers(tmp_path):
    c = client(tmp_path, server_attach_folders=(str(tmp_path),))
    lone = b'{"model": "default", "messages": [{"role": "user", "content": "hi \\ud800 x"}]}'
    for kind in ("application/json", "Application/JSON; charset=utf-8", "text/x+json"):
        r = c.post("/v1/chat/completions", content=lone, headers={"content-type": kind})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content"
        assert "surrogate" in r.json()["error"]["message"]
    # With a key, a client without it is refused before its body is read at all.
    keyed = client(tmp_path / "k", api_key="s3cret")
    assert keyed.post("/v1/chat/completions", content=lone,
                      headers={"content-type": "application/json"}).status_code == 401
    r = c.post("/api/generate", content=b'{"model": "m", "prompt": "\\udc00"}')
    assert r.status_code == 400 and "surrogate" in r.json()["error"]
    # A whole pair (an emoji as json.dumps writes it) is text: the route decides.
    pair = b'{"model": "gpt-9", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    r = c.post("/v1/chat/completions", content=pair,
               headers={"content-type": "application/json"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    huge = 10 ** 30
    for method, url in (("GET", f"/v1/kvdesk/chats/{huge}/messages"),
                        ("DELETE", f"/v1/kvdesk/documents/{huge}"),
                        ("DELETE", f"/v1/kvdesk/chats/{huge}")):
        r = c.request(method, url)
        assert r.status_code == 404 and f"no {url.split('/')[3][:-1]} {huge}" in \
            r.json()["error"]["message"], (url, r.text)
    nul = c.post("/v1/kvdesk/documents", json={"path": str(tmp_path / "a\x00.pdf")})
    assert nul.status_code == 400 and nul.json()["error"]["param"] == "path"
    true = c.post("/v1/chat/completions", json={
        "model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": True})
    assert true.status_code == 400 and true.json()["error"]["param"] == "max_tokens"
    assert "should be a number" in true.json()["error"]["message"]  # not one token
    typed = c.post("/v1/kvdesk/documents", json={"path": 5})
    assert typed.status_code == 400 and typed.json()["error"]["param"] == "path"
    assert "pydantic" not in typed.text and "\n" not in typed.json()["error"]["message"]
    # a question with no text (null content) is refused by name; an assistant's may be null
    null = c.post("/v1/chat/completions", json={
        "model": "default", "messages": [{"role": "user", "content": None}]})
    assert null.status_code == 400 and null.json()["error"]["param"] == "messages.0.content"
    assert null.json()["error"]["message"].endswith("a user message needs its text")


def test_what_clients_send_by_default_is_taken(tmp_path):
    keyed = client(tmp_path, api_key="s3cret")
    for header in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret"):
        assert keyed.get("/v1/models", headers={"Authorization": header}).status_code == 200
    for header in ("Bearer s3cre", "Basic s3cret", "s3cret", ""):
        assert keyed.get("/v1/models", headers={"Authorization": header}).status_code == 401
    c = client(tmp_path / "open")
    # Ollama's name for the model on OpenAI's routes (as Ollama's own /v1 takes it), a
    # tool_choice that asks for no tool, and tools with a choice of none (Continue, LangChain
    # and Open WebUI send their tool list whatever they ask): all refused before, now past
    # those checks (to the next one, n: this client is to load no model).
    tool = [{"type": "function", "function": {"name": "f"}}]
    for extra in ({"model": "default:latest"}, {"model": "default", "tool_choice": "none"},
                  {"model": "default", "tool_choice": "auto"},
                  {"model": "default", "tool_choice": "none", "tools": tool},
                  {"model": "default", "function_call": "none", "functions": [{"name": "f"}]}):
        for route, asked in (("/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hi"}]}),
                             ("/v1/responses", {"input": "hi"})):
            r = c.post(route, json={**extra, **asked, "n": 2})
            assert r.status_code == 400 and r.json()["error"]["param"] == "n", (route, r.text)
    # Tools are checked before any model is needed: a bad one is refused by its field, and
    # a choice asking for a call with none offered by tool_choice.
    for tools, choice, param in (([{"type": "function"}], "auto", "tools.0.function"),
                                 ([{"type": "function", "function": {}}], None,
                                  "tools.0.function.name"),
                                 (tool, {"type": "function", "function": {"name": "g"}},
                                  "tool_choice.function.name"),
                                 (None, "required", "tool_choice")):
        r = c.post("/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": "hi"}],
            "tools": tools, "tool_choice": choice})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (choice, r.text)


def test_a_turn_in_a_chat_cannot_name_documents_too(tmp_path):
    r = client(tmp_path).post("/v1/kvdesk/ask", json={"question": "hi", "chat_id": 1,
                                                      "doc_ids": [2]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "doc_ids"



@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_the_servers_stop_cut_short_says_so_on_kvdesks_own_route(tmp_path, stream):
    """`kvdesk ask` through a server that stops (a restart) while it answers: the answer so
    far comes with its own finish reason, not Ctrl-C's "cancelled", and the stop said."""
    from desktop_app.results import AskResult

    stopping = bridge.Stopping()

    class Stopped:  # the engine's answer, cut where the server's stop found it
        def ask(self, question, *, cancel, **options):
            stopping.stop()
            assert cancel.is_set()
            return AskResult(5, "The Alpha project builds", 0.1, 0.0, 0, [], 0, 4,
                             finish_reason="cancelled")

    app = App(Settings(data_dir=str(tmp_path)))
    app.__dict__["engine"] = Stopped()
    api = TestClient(create_api(app, api_key=None, stopping=stopping),
                     base_url="http://127.0.0.1:8765")
    r = api.post("/v1/kvdesk/ask", json={"question": "Summarize it.", "doc_ids": [1],
                                         "stream": stream})
    assert r.status_code == 200
    got = r.json() if not stream else next(json.loads(line[5:])["result"] for line in
                                           r.text.splitlines() if '"result"' in line)
    assert got["finish_reason"] == "server_stopped" and got["answer"] == "The Alpha project builds"
    assert got["messages"] == ["the answer was cut short: the kvdesk server is stopping (ask "
                               "again once it is back)"]


def test_a_stream_opens_once_its_call_is_past_its_checks():
    import asyncio
    import threading

    class Here:  # a client that stays
        async def is_disconnected(self):
            return False

    go = threading.Event()

    def work(emit, cancel):
        emit(bridge.READY)  # past its checks: the stream opens before the long part
        go.wait(10)
        emit("token")
        raise ValueError("failed later")

    def refused(emit, cancel):
        raise ValueError("no document 9")

    async def run():
        stream = await bridge.opened(Here(), bridge.Stopping(), work)
        go.set()  # (only now: opened did not wait for the first token)
        got = [report async for report in stream]
        with pytest.raises(ValueError, match="no document 9"):
            await bridge.opened(Here(), bridge.Stopping(), refused)
        return got

    got = asyncio.run(run())
    assert got[0] == ("event", "token") and got[1][0] == "error"


def test_a_data_directory_that_cannot_take_the_work_is_the_servers_fault_said_plainly():
    from desktop_app.server.failures import error_of
    from store.errors import DamagedError, ReadOnlyError

    for error in (DamagedError("the store X is damaged (...)"), ReadOnlyError("read-only")):
        status, body = error_of(error)
        assert status == 500 and body["error"]["message"] == str(error)
        assert body["error"]["code"] == "storage_unavailable"


def test_memory_that_ran_out_is_a_503_saying_so_not_an_internal_error(tmp_path, monkeypatch):
    """(A request whose work met a memory limit was "internal error (MemoryError)"; then the
    catch-all's answer, re-raised: a traceback in the log, the connection dropped.)"""
    from desktop_app.engine import Engine

    def short(self):
        raise MemoryError("Unable to allocate 2.5 GiB for an array with shape (4, 4) and "
                          "data type uint8")

    monkeypatch.setattr(Engine, "documents", short)
    got = client(tmp_path).get("/v1/kvdesk/documents")  # (raises what the server re-raised)
    assert got.status_code == 503 and got.json()["error"]["code"] == "out_of_memory"
    assert got.json()["error"]["message"].startswith(
        "not enough memory for this work (2.5 GiB could not be allocated): close other "
        "programs")


def test_an_uploads_own_file_is_kept_only_from_this_machine_and_when_it_holds_its_bytes(
        tmp_path):
    from types import SimpleNamespace

    from desktop_app.server.api import uploaded_from

    file = tmp_path / "notes.md"
    file.write_bytes(b"The gate code is 4417.\n")
    here, away = (SimpleNamespace(client=SimpleNamespace(host=h)) for h in ("::1", "10.0.0.7"))
    data = file.read_bytes()
    assert uploaded_from(here, str(file), data) == str(file)
    assert uploaded_from(away, str(file), data) == ""  # another machine's path means nothing
    assert uploaded_from(here, str(file), data + b"!") == ""  # not the file uploaded
    # ("\ud800": a path no locale encodes, as "山.md" under a Latin-1 server's)
    for claimed in (None, "notes.md", str(tmp_path / "gone.md"), "a\0b", 7, "/n\ud800tes.md"):
        assert uploaded_from(here, claimed, data) == "", claimed
    assert uploaded_from(SimpleNamespace(client=SimpleNamespace(host="testclient")),
                         str(file), data) == ""
    # Never a file that is not a regular one, read forever or never answering.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert uploaded_from(here, str(fifo), b"x") == ""
    assert uploaded_from(here, "/dev/zero", b"") == ""  # (an empty upload has no file)
    assert uploaded_from(here, "/dev/zero", b"x") == ""


def test_an_ask_to_a_server_from_before_stop_id_is_asked_again_without_it():
    """A `kvdesk` upgraded while its server runs: the server refuses the field it does not
    know, and the ask goes on without it (it used to fail until the server restarted)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from desktop_app.options import GenerationOptions, RestoreOptions
    from desktop_app.results import AskResult
    from desktop_app.server.client import Client

    bodies = []

    class OldServer(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            if "stop_id" in body:
                out, status = json.dumps({"error": {
                    "message": "stop_id: Extra inputs are not permitted",
                    "param": "stop_id"}}).encode(), 400
            else:
                result = AskResult(7, "Seven.", 0.1, 0.0, 0, [], 0, 2).as_dict()
                out, status = f"data: {json.dumps({'result': result})}\n\n".encode(), 200
            self.send_response(status)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), OldServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res = Client(f"http://127.0.0.1:{server.server_port}", None).ask(
            "When?", chat_id=7, doc_ids=[], restore=RestoreOptions(),
            generation=GenerationOptions(), on_token=print, on_restore=print, progress=print,
            cancel=threading.Event())
    finally:
        server.shutdown()
    assert res.answer == "Seven." and res.chat_id == 7
    assert ["stop_id" in b for b in bodies] == [True, False]


def test_a_nested_fields_refusal_names_it_within_its_field(tmp_path):
    """`/v1/kvdesk/ask`: a bad or unknown key of `generation` or `restore` is named as the
    request writes it (the model is never loaded: refused first)."""
    c = client(tmp_path)
    for nested, param, words in (
            ({"generation": {"max_tokens": "many"}}, "generation.max_tokens", "integer"),
            ({"generation": {"temprature": 0}}, "generation.temprature", "not a known field"),
            ({"restore": {"level": 7}}, "restore.level", "string")):
        r = c.post("/v1/kvdesk/ask", json={"question": "hi", **nested})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert words in r.json()["error"]["message"], r.text


def test_a_server_starting_holds_its_data_directory_and_its_port(tmp_path):
    """Between its start and its model loaded (no server file yet), a server already holds
    the data directory and the port: a second one is refused at once, not after loading the
    model too, with a traceback from the port it could bind as well."""
    import subprocess
    import sys

    from desktop_app.errors import EngineError
    from desktop_app.server import discovery
    from desktop_app.server.running import bind

    data = tmp_path / "data"
    data.mkdir()
    held = discovery.claim(data)
    assert held is not None and held >= 0 and discovery.claim(data) is None
    proc = subprocess.run([sys.executable, "-m", "desktop_app", "--data-dir", str(data),
                           "serve", "--port", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "a kvdesk server is starting on this data directory" \
        in proc.stderr and "Loading" not in proc.stderr and "Traceback" not in proc.stderr
    os.close(held)
    assert discovery.claim(data) is not None  # (released with its holder)
    first = bind("127.0.0.1", 0)
    try:
        with pytest.raises(EngineError, match="Address already in use"):
            bind("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()


def test_ids_and_numbers_are_taken_as_json_wrote_them_on_every_route(tmp_path):
    """true is no document 1, nor "1" a document or a number, in a list as alone; each is
    refused with its key, the rule and the value given (no model is loaded: refused first)."""
    c = client(tmp_path)
    hi = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
    for route, body, param, given in (
            ("/v1/chat/completions", {**hi, "kvdesk": {"documents": [True]}},
             "kvdesk.documents.0", "should be a number (got true)"),
            ("/v1/chat/completions", {**hi, "kvdesk": {"documents": ["1"]}},
             "kvdesk.documents.0", '(got "1")'),
            ("/v1/chat/completions", {**hi, "max_tokens": "5"}, "max_tokens", '(got "5")'),
            ("/v1/chat/completions", {**hi, "temperature": float("nan")}, "temperature",
             "finite number (got NaN)"),
            ("/v1/kvdesk/ask", {"question": "hi", "doc_ids": [True]}, "doc_ids.0",
             "should be a number (got true)"),
            ("/v1/kvdesk/ask", {"question": "hi", "chat_id": "1"}, "chat_id", '(got "1")'),
            ("/v1/kvdesk/ask", {"question": "hi", "generation": {"max_tokens": "5"}},
             "generation.max_tokens", '(got "5")'),
            ("/v1/kvdesk/ask", {"question": "hi", "restore": {"budget_ms": "5"}},
             "restore.budget_ms", '(got "5")'),
            ("/v1/completions", {"model": "default", "prompt": "hi",
                                 "kvdesk": {"budget_ms": "5"}}, "kvdesk.budget_ms", '(got "5")'),
            ("/v1/embeddings", {"model": "default", "input": "hi", "dimensions": True},
             "dimensions", "should be a number (got true)")):
        r = c.post(route, content=json.dumps(body),  # (NaN as JavaScript writes it)
                   headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (route, r.text)
        assert r.json()["error"]["message"].endswith(given), (route, r.text)
    for body, said in (
            ({"kvdesk": {"documents": [True]}}, "kvdesk.documents.0: should be a number "
                                                "(got true)"),
            ({"options": {"temperature": "0.5"}}, 'options.temperature: should be a number '
                                                  '(got "0.5")')):
        r = c.post("/api/chat", json={**hi, **body})
        assert r.status_code == 400 and r.json() == {"error": said}, r.text


@pytest.mark.parametrize("title, name", [
    ("Müller_Vertrag.txt", "müller-vertrag-txt"),  # (was "m-ller-vertrag-txt")
    ("Договор аренды.txt", "договор-аренды-txt"),  # (was "txt": every such title alike)
    ("契約書.md", "契約書-md"),
    ("हिंदी नोट्स.txt", "हिंदी-नोट्स-txt"),  # (a vowel sign is its letter's, not a break)
    ("  Ferry guide (2024) .pdf", "ferry-guide-2024-pdf"),
])
def test_a_documents_model_name_keeps_its_titles_letters_in_any_script(title, name):
    from desktop_app.server import served

    assert served._slug(title) == name
    for asked in (f"doc-3-{name}", f"doc-3-{name}:latest", f"DOC-3-{name.upper()}"):
        assert served._DOCUMENT_MODEL.fullmatch(asked)[1] == "3"  # (the name picks it)


def test_a_blank_or_spaced_key_is_refused_and_a_short_one_on_the_network_is_said(caplog):
    """(`--api-key ' '` was taken, and no client could ever match it; a one-character key on
    0.0.0.0 was taken without a word.)"""
    from desktop_app.errors import EngineError
    from desktop_app.server.running import check_bind

    for key in (" ", " s3cret", "s3cret\t"):
        with pytest.raises(EngineError, match="blank or begins or ends with a space"):
            check_bind("127.0.0.1", key)
    with caplog.at_level(logging.WARNING, logger="kvdesk.server"):
        check_bind("0.0.0.0", "a")
        check_bind("127.0.0.1", "a")  # (only this machine: no one to guess it)
        check_bind("0.0.0.0", "k" * 22)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("the API key has only 1 character(s): on "
                                                 "0.0.0.0")
