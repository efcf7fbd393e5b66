"""Ollama's API on the local server, with the official `ollama` client and plain HTTP, on the
real default model: list, show, ps, chat streamed and not, generate; the stream line by line;
one prompt cache with OpenAI's chat completions, across a restart; Ollama's errors; the second
listener; CORS for an allowed and a refused origin."""

from __future__ import annotations

import json
import socket

import httpx
import ollama
import pytest

from desktop_app.app import App
from desktop_app.errors import EngineError
from desktop_app.server import Server, running
from desktop_app.settings import Settings
from tests.test_server import SYSTEM, Running, answer_stops

pytestmark = pytest.mark.model

ORIGIN = "http://localhost:5173"
QUIET = {"num_predict": 8, "temperature": 0}
FINAL_KEYS = {"done_reason", "total_duration", "load_duration", "prompt_eval_count",
              "prompt_eval_duration", "eval_count", "eval_duration"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # Ollama's second port: any free one here (11434 may be a real Ollama's on this machine).
    running = Running(tmp_path_factory.mktemp("ollama"), ollama_port=0, cors_origins=(ORIGIN,))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(served):
    return ollama.Client(host=served.server.ollama_url)


def test_the_second_listener_serves_the_same_api(served):
    assert served.server.ollama_url and served.server.ollama_url != served.url
    for base in (served.url, served.server.ollama_url):
        r = httpx.get(f"{base}/api/version", trust_env=False)
        assert r.status_code == 200 and r.json()["version"]
    head = httpx.head(f"{served.url}/api/ps", trust_env=False)  # (a health check's)
    assert head.status_code == 200 and not head.content


def test_list_show_and_ps_with_the_ollama_client(client, served):
    (model,) = client.list().models
    assert model.model == "default:latest" and model.size > 1_000_000
    assert model.details.format == "gguf" and model.details.family == "llama"
    assert model.details.parameter_size == "135M" and model.details.quantization_level
    shown = client.show("default")
    # (SmolLM2 has no fill-in-the-middle tokens; tools: test_server_tools)
    assert shown.capabilities == ["completion", "tools"]
    assert shown.modelinfo["llama.context_length"] == 8192
    assert "temperature" in shown.parameters and "FROM " in shown.modelfile
    assert "<|im_start|>" in shown.template  # the file's own (ChatML)
    (running,) = client.ps().models
    assert running.context_length == 1024 and running.name == "default:latest"
    assert running.digest == model.digest and len(model.digest) == 64  # (a sha256's, as Ollama's)


def test_chat_streamed_and_not_with_the_ollama_client(client):
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "When is the Saturday crossing?"}]
    whole = client.chat(model="default", messages=messages, options=QUIET)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.eval_count > 0 and whole.prompt_eval_count > 100
    assert whole.total_duration >= whole.prompt_eval_duration > 0
    parts = list(client.chat(model="default", messages=messages, options=QUIET, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count


def test_a_queued_requests_prompt_eval_duration_leaves_out_its_wait(client, served):
    """Ollama counts the time a request waits for those before it in its total only: a
    client reckoning prompt tokens a second from prompt_eval_duration gets the machine's."""
    import threading
    import time

    for stream in (False, True):
        got = []

        def ask(stream=stream, got=got):
            answer = client.chat(model="default", options={"num_predict": 2, "temperature": 0},
                                 messages=[{"role": "user", "content": "Hello?"}],
                                 stream=stream)
            got.append(list(answer)[-1] if stream else answer)

        with served.app.engine.session.lock:  # a turn in progress: the request queues
            asking = threading.Thread(target=ask)
            asking.start()
            time.sleep(3)
        asking.join(60)
        (last,) = got
        assert last.done and last.total_duration > 3e9, stream
        assert last.prompt_eval_duration < 2.5e9, stream


def test_a_conversation_longer_than_the_context_loses_its_oldest_messages(client, served):
    """As Ollama answers it (tools send long histories whole): the oldest turns left out,
    the system message and the last question kept, and said; OpenAI's route refuses it."""
    history = [{"role": "system", "content": SYSTEM}]
    for i in range(12):
        history += [{"role": "user", "content": f"Tell me about ferry number {i}. " * 8},
                    {"role": "assistant", "content": f"Ferry {i} sails at noon. " * 8}]
    history.append({"role": "user", "content": "When is the Saturday crossing?"})
    whole = client.chat(model="default", messages=history, options=QUIET)
    assert whole.done and whole.message.content and whole.prompt_eval_count < 1024
    said = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120, json={
        "model": "default", "messages": history, "options": QUIET, "stream": False}).json()
    assert left_out(said) % 2 == 0 and 0 < left_out(said) < 24  # whole turns; the question kept
    refused = httpx.post(f"{served.url}/v1/chat/completions", trust_env=False, timeout=120,
                         json={"model": "default", "messages": history, "max_tokens": 1})
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    with pytest.raises(ollama.ResponseError):  # nothing but the question is too long
        client.chat(model="default", options=QUIET,
                    messages=[{"role": "user", "content": "Ferry " * 3000}])


def left_out(said: dict) -> int:
    """How many oldest messages an answer says were left out."""
    notes = [m for m in said["kvdesk"]["messages"] if "oldest" in m]
    return int(notes[0].split(" oldest ")[0].rsplit(" ", 1)[1]) if notes else 0


@pytest.mark.parametrize("turns", [14, 700])
def test_the_next_turn_past_the_context_finds_the_window_left_in_the_cache(served, turns):
    """Left out just enough, each turn's window started a message later (each question here
    is longer than an old turn): nothing held past the system prompt, the whole context
    computed and stored again each turn. Left out a block at a time, at the same message
    the next turn cuts at too, the turn after a cut holds all but its new messages: when
    the conversation grows past the context (14 turns: ~850 tokens), and when it comes with
    more text than the context could hold tokens of (700: ~100 KB, refused by its bytes
    alone before; a conversation landing within a block may need a second cut soon after)."""
    history = [{"role": "system", "content": "You answer questions about the ferries."}]
    for i in range(turns):
        history += [{"role": "user", "content": f"Tell me about ferry {i}. " * 3},
                    {"role": "assistant", "content": f"Ferry {i} sails at noon. " * 3}]
    said = []
    while len(said) < 6 and (len(said) < 2 or not left_out(said[-2]) or
                             left_out(said[-2]) != left_out(said[-1])):
        history.append({"role": "user", "content": "Which ferries sail at noon, and from "
                        f"which pier does ferry {len(said)} leave? " * 3})
        said.append(httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120, json={
            "model": "default", "messages": history, "options": QUIET,
            "stream": False}).json())
        history.append({"role": "assistant", "content": said[-1]["message"]["content"]})
    first, second = said[-2:]
    assert left_out(first) == left_out(second) > 0, said
    assert second["kvdesk"]["restored_tokens"] > 0.8 * second["prompt_eval_count"], second


def test_a_history_left_shorter_leaves_room_for_the_answer(served):
    """kvdesk's context does not shift as Ollama's does: a trimmed history filling it left
    the answer ~100 tokens, cut ("length"). With no num_predict the room is kvdesk's default
    answer length (512), at most a quarter of the context (1,024 here)."""
    history = [{"role": "system", "content": SYSTEM}]
    for i in range(14):
        history += [{"role": "user", "content": f"Tell me about ferry number {i}. " * 8},
                    {"role": "assistant", "content": f"Ferry {i} sails at noon. " * 8}]
    history.append({"role": "user", "content": "Write a long story about the ferries."})
    said = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120, json={
        "model": "default", "messages": history, "stream": False,
        "options": {"temperature": 0, "stop": ["\n"]}}).json()  # (short: its first line)
    n_ctx = served.app.context.n_ctx
    assert said["prompt_eval_count"] + 1 + n_ctx // 4 < n_ctx, said
    assert any("with room for the answer" in m for m in said["kvdesk"]["messages"])


def test_generate_through_the_template_and_raw(client):
    templated = client.generate(model="default:latest", prompt="Say hello.", options=QUIET)
    assert templated.done and templated.response
    assert templated.context is None  # none to send back: each prompt stands alone (README)
    raw = client.generate(model="default", prompt="The capital of France is", raw=True,
                          options=QUIET)
    assert raw.response and raw.prompt_eval_count < 10  # no chat template around it
    loaded = client.generate(model="default", prompt="")
    assert loaded.done and loaded.done_reason == "load"


def test_the_stream_line_by_line(served):
    body = {"model": "default", "messages": [{"role": "user", "content": "Say hi."}],
            "options": QUIET}
    with httpx.stream("POST", f"{served.url}/api/chat", json=body, trust_env=False) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    *pieces, last = lines
    assert pieces and all(p["done"] is False and p["message"]["role"] == "assistant"
                          and p["message"]["content"] and p["model"] == "default"
                          and p["created_at"].endswith("Z") for p in pieces)
    assert last["done"] is True and last["message"]["content"] == ""
    assert FINAL_KEYS <= set(last) and last["eval_count"] >= len(pieces)
    assert all(isinstance(last[k], int) for k in FINAL_KEYS - {"done_reason"})
    assert last["kvdesk"]["restored_tokens"] + last["kvdesk"]["recomputed_tokens"] \
        == last["prompt_eval_count"]


def test_a_message_without_content_is_an_empty_one(served):
    r = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120, json={
        "model": "default", "stream": False, "options": QUIET,
        "messages": [{"role": "system", "content": None}, {"role": "user", "content": "Hi."}]})
    assert r.status_code == 200 and r.json()["message"]["content"], r.text


def test_a_conversation_ending_with_the_assistant_is_continued(served):
    """A prefill, as Ollama and llama.cpp's server take it: the answer goes on from the
    assistant's words, as the same answer went on from them when asked without them."""
    asked = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": "When is the Saturday crossing?"}]

    def chat(messages, n) -> str:  # exact: the same tokens computed the same way each time
        r = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120, json={
            "model": "default", "messages": messages, "stream": False,
            "options": {"num_predict": n, "temperature": 0}, "kvdesk": {"level": "lossless"}})
        assert r.status_code == 200, r.text
        return r.json()["message"]["content"]

    whole = chat(asked, 12)
    assert " " in whole.strip(), whole
    start = whole[:whole.index(" ", 1)]  # its first word: a token boundary
    rest = chat([*asked, {"role": "assistant", "content": start}], 12)
    assert rest and whole.startswith(start) and (start + rest).startswith(whole[:24]), (
        whole, start, rest)


@pytest.mark.parametrize("kind", [None, "application/x-www-form-urlencoded",
                                  "text/plain;charset=UTF-8"])
def test_a_body_sent_as_ollamas_curl_examples_send_it_is_read_as_json(served, kind):
    # `curl URL -d '{...}'`, as Ollama's documentation has it: form-encoded, or no type at
    # all; or as text (a browser's fetch of a string, scripts), which Ollama reads as JSON too
    body = json.dumps({"model": "default", "stream": False, "options": QUIET,
                       "messages": [{"role": "user", "content": "Hi."}]})
    headers = {"content-type": kind} if kind else {}
    r = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120, content=body,
                   headers=headers)
    assert r.status_code == 200 and r.json()["message"]["content"], r.text
    r = httpx.post(f"{served.url}/api/embed", trust_env=False, timeout=120, headers=headers,
                   content=json.dumps({"model": "default", "input": "a ferry"}))
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 1, r.text


def test_options_go_through_kvdesks_validation(client):
    seeded = {"num_predict": 10, "seed": 7, "temperature": 0.9}
    asked = [{"role": "user", "content": "Name a colour."}]
    first = client.chat(model="default", messages=asked, options=seeded)
    assert first.message.content == client.chat(model="default", messages=asked,
                                                options=seeded).message.content
    assert first.eval_count <= 10
    # accepted: the runner's options, samplers at their "off" value, keep_alive, num_ctx
    client.chat(model="default", messages=asked, keep_alive="5m",
                options={**QUIET, "num_thread": 2, "num_gpu": 0, "mirostat": 0, "num_ctx": 4096})
    refused = [({"num_predict": 0}, r"options.num_predict: -1 \(no limit\), -2 .* \(got 0\)"),
               ({"num_predict": -3}, r"options.num_predict: .*at least 1 \(got -3\)"),
               ({"top_p": 3}, "options.top_p"),
               ({"mirostat": 2}, "options.mirostat"), ({"wild": 1}, "options.wild"),
               ({"stop": [1]}, "options.stop")]
    for options, named in refused:
        with pytest.raises(ollama.ResponseError, match=named) as e:
            client.chat(model="default", messages=asked, options=options)
        assert e.value.status_code == 400


def test_ollamas_errors(client, served):
    cases = [(lambda: client.chat(model="llama3:8b", messages=[{"role": "user", "content": "x"}]),
              404, "not served here"),
             (lambda: client.chat(model="default", messages=[
                 {"role": "user", "content": "what is this?", "images": ["aGVsbG8="]}]),
              400, "images are not supported by this model"),
             (lambda: client.generate(model="default", prompt="x", images=["aGVsbG8="]),
              400, "images are not supported by this model"),
             (lambda: client.chat(model="default", messages=[{"role": "user", "content": "x"}],
                                  format={"type": "nosuch"}), 400, "format: .*Unrecognized"),
             (lambda: client.chat(model="default", messages=[{"role": "user", "content": "x"}],
                                  tools=[{"type": "function", "function": {"name": "a b"}}]),
              400, "tools.0.function.name"),
             (lambda: client.generate(model="default", prompt="x", context=[1, 2]),
              400, "send the conversation to /api/chat"),
             (lambda: client.generate(model="default", prompt="def f(", suffix="  return 1"),
              400, "fill-in-the-middle"),
             (lambda: client.embed(model="llama3:8b", input="x"), 404, "embeddings"),
             (lambda: client.embed(model="default", input=[""]), 400, "empty text")]
    for call, status, words in cases:
        with pytest.raises(ollama.ResponseError, match=words) as e:
            call()
        assert e.value.status_code == status
    for method, path, status in (("POST", "/api/blobs/sha256-0", 404), ("GET", "/api/chat", 405),
                                 ("POST", "/api/chat", 400), ("POST", "/api/pull", 400)):
        r = httpx.request(method, f"{served.url}{path}", content=b"{oops",
                          headers={"content-type": "application/json"}, trust_env=False)
        assert r.status_code == status and isinstance(r.json()["error"], str), r.text
        assert "Traceback" not in r.text
    # A union's members are the JSON types the field takes, not pydantic's names for them.
    r = httpx.post(f"{served.url}/api/embed", json={"model": "default", "input": 5},
                   trust_env=False)
    assert r.status_code == 400 and r.json()["error"] == (  # (token arrays are refused)
        "input: should be a string or an array of strings (got 5)"), r.text  # (as everywhere)
    r = httpx.post(f"{served.url}/v1/chat/completions", trust_env=False, json={
        "model": "default", "max_tokens": "ten", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["message"].endswith('(got "ten")'), r.text
    assert "POST /api/blobs/sha256-0: not served" in httpx.post(
        f"{served.url}/api/blobs/sha256-0", trust_env=False).text
    # Generate has no tools (Ollama's neither): refused by name, as text completions refuse them.
    r = httpx.post(f"{served.url}/api/generate", trust_env=False, json={
        "model": "default", "prompt": "x", "stream": False, "tools": [
            {"type": "function", "function": {"name": "f"}}]})
    assert r.status_code == 400 and r.json()["error"] == ("tools: tool calls are answered on "
                                                          "/v1/chat/completions and Ollama's "
                                                          "/api/chat, not on this route"), r.text
    # A word is not true or false (pydantic would read "yes" as true), as on OpenAI's routes.
    r = httpx.post(f"{served.url}/api/chat", trust_env=False, json={
        "model": "default", "stream": "yes", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"] == (
        'stream: should be true or false (got "yes")')


def test_kvdesks_own_field_names_the_documents_as_on_openais_routes(served):
    text = "The ferry to Kelmar leaves at 6:40 from pier 3. Tickets cost 12 crowns."
    r = httpx.post(f"{served.url}/v1/kvdesk/documents", timeout=300, trust_env=False,
                   files={"file": ("ferry.txt", text.encode(), "text/plain")})
    assert r.status_code == 200, r.text
    doc = r.json()["doc_id"]
    asked = [{"role": "user", "content": "When does the ferry leave?"}]
    for route, body in (("/api/chat", {"messages": asked}),
                        ("/api/generate", {"prompt": "When does the ferry leave?"})):
        r = httpx.post(f"{served.url}{route}", trust_env=False, timeout=120, json={
            "model": "default", "stream": False, "options": QUIET, **body,
            "kvdesk": {"documents": [doc], "level": "high"}})
        assert r.status_code == 200, r.text
        # The document's cache came back: more of the prompt restored than the turn alone.
        assert r.json()["kvdesk"]["restored_tokens"] > 20, r.text
    for kvdesk, status, words in (({"documents": [999]}, 404, "999"),
                                  ({"level": "finest"}, 400, "kvdesk.level: unknown level"),
                                  ({"docs": [doc]}, 400, "kvdesk.docs")):
        r = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120, json={
            "model": "default", "stream": False, "messages": asked, "kvdesk": kvdesk})
        assert r.status_code == status and words in r.json()["error"], r.text


def test_ollamas_embeddings_are_the_vectors_retrieval_uses(client, served):
    """/api/embed (several texts) and the older /api/embeddings (one), through the official
    client: the engine's own embedder, unit length, the same vector on both routes."""
    import numpy as np

    texts = ["The warranty covers two years.", "Bananas are yellow."]
    out = client.embed(model="default", input=texts)
    got = np.asarray(out.embeddings, dtype=np.float32)
    want = served.app.engine.embed(texts)
    assert got.shape == want.shape and np.allclose(got, want, atol=1e-6)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert out.prompt_eval_count > 0 and out.total_duration > 0
    one = client.embeddings(model="default", prompt=texts[0])
    assert np.allclose(one.embedding, got[0], atol=1e-6)
    cut = client.embed(model="default", input=texts[0], dimensions=64)
    assert len(cut.embeddings[0]) == 64
    # No input: Ollama's request to load the model, answered with no vectors.
    for body in ({"model": "default"}, {"model": "default", "input": ""},
                 {"model": "default", "input": None}):
        r = httpx.post(f"{served.url}/api/embed", json=body, trust_env=False, timeout=60)
        assert r.status_code == 200 and r.json()["embeddings"] == [], r.text


def test_the_older_embeddings_route_takes_no_prompt_as_ollama_does(client, served):
    """No prompt, or "": Ollama's request to load the model, answered 200 with no vector."""
    assert client.embeddings(model="default", prompt="").embedding == []
    assert client.embeddings(model="default").embedding == []
    r = httpx.post(f"{served.url}/api/embeddings", trust_env=False, timeout=60,
                   json={"model": "gpt-4", "prompt": ""})
    assert r.status_code == 404 and "does not make embeddings" in r.json()["error"], r.text


def test_a_null_is_a_field_left_out(served):
    r = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120, json={
        "model": "default", "options": None, "stream": None,
        "messages": [{"role": "user", "content": "Hi."}]})
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert r.status_code == 200 and len(lines) > 1 and lines[-1]["done"] is True, r.text
    r = httpx.post(f"{served.url}/v1/chat/completions", trust_env=False, timeout=120, json={
        "model": "default", "n": None, "stream": None, "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi."}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text


def test_one_prompt_cache_with_openais_chat_completions_across_a_restart(tmp_path):
    asked = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": "How long is the crossing?"}]
    def chat(running, messages) -> dict:  # plain HTTP: the client drops kvdesk's field
        r = httpx.post(f"{running.url}/api/chat", trust_env=False, timeout=120, json={
            "model": "default", "messages": messages, "options": QUIET, "stream": False})
        assert r.status_code == 200, r.text
        return r.json()

    first = Running(tmp_path)
    try:
        answer = chat(first, asked)
        assert answer["kvdesk"]["stored"] is True
    finally:
        first.stop()
    again = Running(tmp_path)  # a restart: the next server starts with an empty context
    try:
        turn2 = [*asked, {"role": "assistant", "content": answer["message"]["content"]},
                 {"role": "user", "content": "Do bicycles pay?"}]
        via_openai = again.client.chat.completions.create(
            model="default", messages=turn2, max_tokens=8, temperature=0)
        # The Ollama turn's stored KV, its answer included, came back for OpenAI's request.
        assert via_openai.model_extra["kvdesk"]["restored_tokens"] \
            > answer["prompt_eval_count"]
        turn3 = [*turn2, {"role": "assistant", "content": via_openai.choices[0].message.content},
                 {"role": "user", "content": "Thanks."}]
        assert chat(again, turn3)["kvdesk"]["restored_tokens"] > via_openai.usage.prompt_tokens
    finally:
        again.stop()


def test_cors_preflight_for_an_allowed_and_a_refused_origin(served):
    url = f"{served.url}/v1/chat/completions"
    ask = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    allowed = httpx.options(url, headers={"Origin": ORIGIN, **ask}, trust_env=False)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    refused = httpx.options(url, headers={"Origin": "http://evil.example", **ask},
                            trust_env=False)
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    assert "cors_origins" in refused.json()["error"]["message"]  # (a /v1 route: OpenAI's)
    simple = httpx.get(f"{served.url}/api/tags", headers={"Origin": ORIGIN}, trust_env=False)
    assert simple.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.get(f"{served.url}/api/tags", headers={"Origin": "http://evil.example"},
                      trust_env=False)
    assert "access-control-allow-origin" not in other.headers


def test_cors_never_any_origin_with_an_api_key(tmp_path):
    settings = Settings(data_dir=str(tmp_path), cors_origins=("*",))
    with pytest.raises(EngineError, match="every web page"):
        Server(App(settings), api_key="s3cret")
    Server(App(settings))  # without a key, the user may open it to every page
    with pytest.raises(ValueError, match="not an origin"):
        Settings(cors_origins=("http://localhost:3000/app",))
    # Kept as browsers send them (so that they match), an extension's scheme included.
    assert Settings(cors_origins=("HTTP://LocalHost:80", "https://ui.example:443",
                                  "chrome-extension://abcdef")).cors_origins == (
        "http://localhost", "https://ui.example", "chrome-extension://abcdef")


def test_a_taken_ollama_port_is_left_alone(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert running.spare("127.0.0.1", taken.getsockname()[1]) is None
    assert "not free" in caplog.text
    free = running.spare("127.0.0.1", 0)
    assert free is not None
    free.close()


def test_a_client_leaving_ollamas_stream_stops_the_answer(served):
    body = {"model": "default", "options": {"num_predict": 400, "temperature": 0},
            "messages": [{"role": "user", "content": "Write a long story about a ship."}]}
    with answer_stops(served.app), httpx.stream("POST", f"{served.url}/api/chat", json=body,
                                                trust_env=False) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 3:
                break
