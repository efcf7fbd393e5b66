"""The local API with the official `openai` client and plain HTTP, on the real default model:
answers streamed and not, the prompt cache across requests and across a server restart,
exactness, bad requests, a client leaving mid-stream, two clients at once."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from desktop_app.app import App
from desktop_app.server import Server
from desktop_app.settings import Settings

pytestmark = pytest.mark.model

DOC = ("The ferry to Cape Morrow leaves the harbour at 07:15 and at 16:40 on weekdays. "
       "On Saturdays there is one crossing, at 10:00; on Sundays none. The crossing takes "
       "fifty minutes, and bicycles travel free. ") * 6
SYSTEM = "You answer questions about the ferry timetable below.\n\n" + DOC


class Running:
    """A server on a free port over its own App, in a thread of this process."""

    def __init__(self, data_dir, api_key=None, ollama_port=None, **settings):
        self.app = App(Settings(data_dir=str(data_dir), n_ctx=1024, prompt_cache_min_tokens=64,
                                keep_lossless=True, **settings))
        self.server = Server(self.app, port=0, api_key=api_key, ollama_port=ollama_port)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        assert self.server.started.wait(120)
        self.url = self.server.url
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key or "none",
                                    max_retries=0)

    def stop(self):
        self.server.stop()
        self.thread.join(60)
        self.app.close()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("served")


@pytest.fixture(scope="module")
def served(data_dir):
    running = Running(data_dir)
    yield running
    running.stop()


def ask(client, messages, **extra):
    return client.chat.completions.create(model="default", messages=messages, max_tokens=12,
                                          temperature=0, **extra)


def conversation(question="When does the first ferry leave?"):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def test_models_and_a_plain_answer(served):
    ids = [m.id for m in served.client.models.list().data]
    assert ids == [served.app.model_path.stem, "default"]
    done = ask(served.client, [{"role": "user", "content": "Say hello."}])
    assert done.choices[0].message.content and done.choices[0].finish_reason in ("stop", "length")
    assert done.usage.completion_tokens > 0 and done.usage.prompt_tokens > 5
    assert done.model_extra["kvdesk"]["stored"] is False  # short, nothing cached: not kept


def test_streamed_answer_equals_the_plain_one(served):
    plain = ask(served.client, conversation()).choices[0].message.content
    pieces, final = [], None
    for chunk in ask(served.client, conversation(), stream=True,
                     stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            final = chunk.choices[0].finish_reason or final
        else:
            assert chunk.usage.completion_tokens > 0
    assert "".join(pieces) == plain and final in ("stop", "length")


def test_the_next_turn_restores_the_first_and_a_restart_keeps_it(tmp_path):
    served = Running(tmp_path)
    try:
        first = ask(served.client, conversation("When does the Saturday ferry leave?"))
        assert first.model_extra["kvdesk"]["stored"] is True  # long enough to keep
        turn2 = [*conversation("When does the Saturday ferry leave?"),
                 {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And how long is the crossing?"}]
        second = ask(served.client, turn2)
        assert second.model_extra["kvdesk"]["restored_tokens"] >= first.usage.prompt_tokens - 1
        assert second.usage.prompt_tokens_details.cached_tokens > 0
    finally:
        served.stop()  # a restart: the next server starts with an empty context
    again = Running(tmp_path)
    try:
        third = ask(again.client, turn2)  # (auto: at lossless, the best level stored)
        info = third.model_extra["kvdesk"]
        # The second turn's stored KV (its answer included) covers this prompt: its last
        # chunk is read whole and cut back, so only the prompt's last token is computed.
        # (`lossless` asked computes a prompt's own KV again, as --no-cache does.)
        assert info["restored_tokens"] == third.usage.prompt_tokens - 1
        assert "lossless" in info["chunk_levels"] and info["source"] == "local"
        # The same answer as the second turn's, its KV read back as it was computed.
        assert third.choices[0].message.content == second.choices[0].message.content
    finally:
        again.stop()


def test_kvdesk_ask_uses_the_running_server(served, data_dir, tmp_path):
    doc = tmp_path / "ferry.txt"
    doc.write_text(DOC)

    def kvdesk(*args, rc=0):
        proc = subprocess.run([sys.executable, "-m", "desktop_app", "--data-dir", str(data_dir),
                               "--n-ctx", "1024", *args], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == rc, proc.stderr
        return proc

    # a question the server refuses says why, not that the server answered it
    refused = kvdesk("ask", "999", "When is the Sunday ferry?", rc=1)
    assert "no document 999" in refused.stderr
    assert "answered by the kvdesk server" not in refused.stderr

    attached = kvdesk("attach", str(doc), "--levels", "compact", "--json")
    assert "answered by the kvdesk server" in attached.stderr
    doc_id = json.loads(attached.stdout)[0]["doc_id"]
    asked = kvdesk("ask", str(doc_id), "When is the Sunday ferry?", "--max-tokens", "8",
                   "--json")
    assert "answered by the kvdesk server" in asked.stderr
    result = json.loads(asked.stdout)
    assert result["chunk_levels"] == ["compact"] * len(result["chunk_levels"])
    assert result["recomputed_tokens"] == 0 and result["answer"]
    local = kvdesk("ask", "--chat", str(result["chat_id"]), "And on Saturdays?", "--max-tokens",
                   "4", "--no-server", "--json")
    assert "answered by the kvdesk server" not in local.stderr
    assert [c["chat_id"] for c in served.client.get("/kvdesk/chats", cast_to=object)] \
        == [result["chat_id"]]
    # A reopen with nothing to say needs no body.
    reopened = httpx.post(f"{served.url}/v1/kvdesk/chats/{result['chat_id']}/reopen",
                          trust_env=False, timeout=120)
    assert reopened.status_code == 200 and reopened.json()["tokens"] > 0, reopened.text


def test_bad_requests_get_openai_errors(served):
    url = f"{served.url}/v1/chat/completions"
    cases = [
        (b"{not json", 400, None),
        (json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}), 404,
         "model_not_found"),
        (json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}],
                     "max_tokens": -3}), 400, None),
        (json.dumps({"model": "default", "messages": []}), 400, None),
        (json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}],
                     "tools": [{"type": "function"}]}), 400, None),
        (json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}],
                     "kvdesk": {"documents": [999]}}), 404, "not_found"),
    ]
    # Streamed, a request refused before its answer begins gets the same status, not a 200
    # stream carrying the error (clients trim their history on context_length_exceeded).
    long = [{"role": "user", "content": "ferry " * 3000}]
    for stream_url, extra in (("/v1/chat/completions", {"messages": long}),
                              ("/v1/completions", {"prompt": "ferry " * 3000}),
                              ("/v1/responses", {"input": "ferry " * 3000})):
        cases.append((json.dumps({"model": "default", "stream": True, **extra}), 400,
                      "context_length_exceeded", stream_url))
    cases.append((json.dumps({"model": "default", "stream": True, "messages": conversation(),
                              "kvdesk": {"documents": [999]}}), 404, "not_found"))
    for body, status, code, *where in cases:
        url = f"{served.url}{where[0]}" if where else f"{served.url}/v1/chat/completions"
        r = httpx.post(url, content=body, headers={"content-type": "application/json"},
                       trust_env=False)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert error["message"] and error["type"] and "Traceback" not in r.text
        if code:
            assert error["code"] == code
        if code == "not_found":  # a client can tell which of its fields named nothing
            assert error["param"] == "kvdesk.documents"
    ollama = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120,
                        json={"model": "default", "messages": long, "stream": True})
    assert ollama.status_code == 400 and "context" in ollama.json()["error"]
    huge = "x" * (17 << 20)
    r = httpx.post(url, content=huge, headers={"content-type": "application/json"},
                   trust_env=False)
    assert r.status_code == 413 and "over" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        served.client.chat.completions.create(model="default", max_tokens=-1,
                                              messages=[{"role": "user", "content": "hi"}])


def test_sampling_fields_are_checked_and_a_seed_makes_the_answer_repeatable(served):
    def sampled(**extra):
        return served.client.chat.completions.create(
            model="default", max_tokens=12, messages=conversation(), **extra
        ).choices[0].message.content

    # temperature, top-p, min-p, penalties from kvdesk's defaults (no settings, no model
    # recommendation), seeded: the same answer twice
    assert sampled(seed=5) == sampled(seed=5)
    # top_k reaches the sampler: keeping one token, even OpenAI's wildest temperature (2)
    # answers greedily
    greedy = ask(served.client, conversation()).choices[0].message.content
    assert sampled(temperature=2, extra_body={"top_k": 1}) == greedy
    with pytest.raises(openai.BadRequestError, match="top_p"):
        sampled(top_p=0)
    with pytest.raises(openai.BadRequestError, match="repeat_penalty"):
        sampled(extra_body={"repeat_penalty": -1})


@contextlib.contextmanager
def answer_stops(app):
    """After the block (a client leaving a stream), the first answer the engine gave meanwhile
    was cancelled, within a few tokens."""
    seen = []
    original = app.engine.completions.complete

    def recording(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    app.engine.completions.complete = recording
    try:
        yield
        deadline = time.time() + 30
        while not seen and time.time() < deadline:
            time.sleep(0.05)
        assert seen and seen[0].finish_reason == "cancelled"
        assert seen[0].completion_tokens < 50
    finally:
        app.engine.completions.complete = original


def test_a_client_leaving_mid_stream_stops_the_answer(served):
    with answer_stops(served.app):
        stream = served.client.chat.completions.create(
            model="default", max_tokens=400, temperature=0, stream=True,
            messages=[{"role": "user", "content": "Write a long story about a lighthouse."}])
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()


def test_two_clients_at_once_both_complete(served):
    answers = {}

    def one(name, question):
        answers[name] = ask(served.client, conversation(question)).choices[0].message.content

    threads = [threading.Thread(target=one, args=(n, q)) for n, q in
               (("a", "When is the Sunday ferry?"), ("b", "Do bicycles pay?"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(answers) == {"a", "b"} and all(answers.values())


def test_a_key_is_required_off_loopback_and_checked(tmp_path):
    with pytest.raises(Exception, match="API key"):
        Server(App(Settings(data_dir=str(tmp_path))), host="0.0.0.0")
    running = Running(tmp_path / "keyed", api_key="s3cret")
    try:
        r = httpx.get(f"{running.url}/v1/models", trust_env=False)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert running.client.models.list().data
    finally:
        running.stop()


def test_a_second_server_on_the_data_directory_is_refused_at_once(served, data_dir):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "desktop_app", "--data-dir", str(data_dir),
                           "--n-ctx", "1024", "serve", "--port", "0"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "already serves this data directory" in proc.stderr
    assert "Traceback" not in proc.stderr and "Loading" not in proc.stderr  # (at once)
    # It waited on nothing: not on the background calibration of a server that never started
    # (30 s before).
    assert time.monotonic() - started < 25


def test_kvdesk_ask_stopped_through_the_server_still_gets_its_result(served):
    """Ctrl-C on `kvdesk ask` through a server: the answer so far comes back, kept there and
    marked cancelled, as with --no-server (it used to end in an error, the result lost)."""
    import threading

    from desktop_app.options import GenerationOptions, RestoreOptions
    from desktop_app.server.client import Client

    cancel, seen = threading.Event(), []

    def on_token(text):
        seen.append(text)
        if len(seen) == 3:
            cancel.set()  # what `interruptible` does on Ctrl-C

    res = Client(served.url, None).ask(
        "Write a long story about a lighthouse.", chat_id=None, doc_ids=[],
        restore=RestoreOptions(), generation=GenerationOptions(max_tokens=400, temperature=0),
        on_token=on_token, on_restore=lambda report: None, progress=lambda p: None,
        cancel=cancel)
    assert res.finish_reason == "cancelled" and res.tokens_generated < 50
    assert res.answer.startswith("".join(seen[:3]).strip()[:10])
    (_, answer) = served.app.engine.messages(res.chat_id)
    assert answer.text == res.answer and answer.stats["finish_reason"] == "cancelled"
    stopped = httpx.post(f"{served.url}/v1/kvdesk/ask/stop", json={"stop_id": "0" * 32},
                         trust_env=False, timeout=30)  # nothing in flight by that name
    assert stopped.status_code == 404 and stopped.json()["error"]["param"] == "stop_id"


def test_a_stop_id_names_one_turn_in_flight(served):
    """A second turn under a stop_id in flight is refused (it would take the first one's
    stop); the stop ends the first, whose stream still brings its result."""
    import threading

    name, events = "turn-0123456789", []
    body = {"question": "Write a long story about a lighthouse.", "stream": True,
            "generation": {"max_tokens": 400, "temperature": 0}, "stop_id": name}

    def first():
        with httpx.stream("POST", f"{served.url}/v1/kvdesk/ask", json=body, trust_env=False,
                          timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    events.append(json.loads(line[5:]))

    thread = threading.Thread(target=first)
    thread.start()
    deadline = time.time() + 60
    while sum("token" in e for e in events) < 3 and time.time() < deadline:
        time.sleep(0.05)
    again = httpx.post(f"{served.url}/v1/kvdesk/ask", json={**body, "stream": False},
                       trust_env=False, timeout=60)
    assert again.status_code == 409 and again.json()["error"]["param"] == "stop_id"
    stopped = httpx.post(f"{served.url}/v1/kvdesk/ask/stop", json={"stop_id": name},
                         trust_env=False, timeout=30)
    assert stopped.status_code == 200
    thread.join(60)
    (result,) = [e["result"] for e in events if "result" in e]
    assert result["finish_reason"] == "cancelled"


def test_each_document_is_a_model_answering_from_it(served, tmp_path):
    """For tools that pick a model from the list and cannot send kvdesk's own field (Open
    WebUI, Continue, the `ollama` client): each document is listed as a model."""
    doc = tmp_path / "Ferry guide.txt"
    doc.write_text(DOC + " The Sunday ferry leaves at noon.")  # (not a document attached above)
    doc_id = served.app.engine.attach(doc).doc_id
    name = f"doc-{doc_id}-ferry-guide-txt"
    assert name in [m.id for m in served.client.models.list().data]
    assert served.client.models.retrieve(name).id == name  # (tools check the name first)
    tags = httpx.get(f"{served.url}/api/tags", trust_env=False).json()["models"]
    assert f"{name}:latest" in [m["name"] for m in tags]
    assert len({m["digest"] for m in tags}) == len(tags)  # (clients group models by digest)
    assert served.client.models.retrieve(name.upper()).id == name.upper()
    question = [{"role": "user", "content": "When does the first ferry leave?"}]
    plain = ask(served.client, question)
    read = served.client.chat.completions.create(model=name, messages=question,
                                                 max_tokens=12, temperature=0)
    # The document is read before the question: its tokens are the prompt's.
    assert read.usage.prompt_tokens > plain.usage.prompt_tokens + 30
    assert read.model == name
    ollama = httpx.post(f"{served.url}/api/chat", trust_env=False, timeout=120, json={
        "model": f"doc-{doc_id}:latest", "messages": question, "stream": False,
        "options": {"num_predict": 4, "temperature": 0}}).json()
    assert ollama["prompt_eval_count"] == read.usage.prompt_tokens, ollama  # the same prompt
    with pytest.raises(openai.NotFoundError) as gone:
        served.client.chat.completions.create(model="doc-99999", messages=question,
                                              max_tokens=2)
    assert "no document 99999 is attached" in gone.value.message
    with pytest.raises(openai.NotFoundError):
        served.client.models.retrieve("doc-99999")
    shown = httpx.post(f"{served.url}/api/show", json={"model": "doc-99999"}, trust_env=False)
    assert shown.status_code == 404 and "no document 99999" in shown.json()["error"]
    with pytest.raises(openai.BadRequestError) as legacy:  # (a prompt as it is: no chat)
        served.client.completions.create(model=name, prompt="The ferry", max_tokens=2)
    assert "answers from a document, in a chat" in legacy.value.message
