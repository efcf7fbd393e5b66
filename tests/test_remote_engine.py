"""The shared cache end to end on the real default model: two data directories playing two
machines on one bucket of a real S3 server, the adaptive stream from it, its faults, the CLI."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from benchmarks.s3_server import S3Server
from desktop_app.engine import Engine
from desktop_app.kv.levels import DEFAULT_LEVELS, EXACT
from desktop_app.kv.sharing import Sharing
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from store import NotFoundError, RemoteConfig, RemoteTier, SharedObjectError, Store
from store.shared import sync
from store.shared.manifest import Manifest

EVERY_LEVEL = (*DEFAULT_LEVELS, EXACT)

pytestmark = pytest.mark.model

DOC = """The Halden ferry crosses the fjord six times a day, the first crossing at 06:40 and
the last at 21:10. The crossing takes 25 minutes. The ferry, the Solveig, was built in 1987
in Bergen and carries 40 cars and 290 passengers. In winter the 13:00 crossing is cancelled
when ice covers the inner harbour. Tickets are sold on board; bicycles travel free. The
ferry's bell came from the older boat it replaced, the Marta, which sank at her moorings
in the storm of 1986 and was raised the following summer."""
def ask(eng: Engine, question: str, *, doc: int, tokens: int, **restore):
    return eng.ask(question, doc_ids=[doc], restore=RestoreOptions(**restore),
                   generation=GenerationOptions(max_tokens=tokens, temperature=0))


QUESTION = "How long does the crossing take?"


def tier_on(server: S3Server, bucket: str, **config) -> RemoteTier:
    return RemoteTier(RemoteConfig(bucket=bucket, prefix=f"e2e/{uuid.uuid4().hex[:12]}",
                                   endpoint_url=server.endpoint_url, connect_timeout_s=1,
                                   read_timeout_s=5, max_attempts=2, **config))


def engine_on(data_dir, model_path, model_hash, tier, **kwargs) -> Engine:
    def factory():
        return Runtime(model_path, model_hash=model_hash, n_ctx=1024, flash_attn=True)

    return Engine(Store(data_dir), factory, chunk_tokens=32, remote=tier, levels=EVERY_LEVEL,
                  **kwargs)


@pytest.fixture(scope="module")
def machine_a(s3_server, s3_bucket, tmp_path_factory, model_path, model_hash):
    """Machine A attached the document with automatic pushing on."""
    folder = tmp_path_factory.mktemp("machine-a")
    with pytest.MonkeyPatch.context() as mp:
        s3_server.use_credentials(mp, folder)
        engine = engine_on(folder / "data", model_path, model_hash,
                           tier_on(s3_server, s3_bucket), auto_push=True)
        path = folder / "ferry.txt"
        path.write_text(DOC)
        engine.attached = engine.attach(path)
        engine.document = path
        yield engine
        engine.close()
        engine.store.close()


@pytest.fixture
def open_engines():
    engines: list[Engine] = []
    yield engines
    for engine in engines:
        engine.close()
        engine.store.close()


@pytest.fixture
def machine(tmp_path, model_path, model_hash, aws_env, open_engines):
    """Another machine: a fresh data directory on the tier given (machine A's by default)."""
    def make(tier, name="b", **kwargs) -> Engine:
        engine = engine_on(tmp_path / name, model_path, model_hash, tier, **kwargs)
        open_engines.append(engine)
        return engine

    return make


def lazily_pulled(engine: Engine) -> int:
    """The documents added from the tier, their caches left there: the one document's id."""
    report = engine.sharing.pull(engine.fingerprint, lazy=True)
    assert len(report["pulled"]) == 1 and engine.store.entries() == []
    (doc,) = engine.store.documents()
    return doc.id


def test_a_document_attached_on_one_machine_is_asked_about_on_another(machine_a, machine):
    assert machine_a.attached.pushed and not machine_a.attached.pulled
    b = machine(machine_a.sharing.tier)
    doc_id = lazily_pulled(b)
    res = ask(b, QUESTION, doc=doc_id, tokens=16, level="lossless")
    assert res.source == "remote" and res.recomputed_tokens == 0 and res.bytes_read > 0
    assert set(res.chunk_levels) == {"lossless"}
    assert any("kept the shared cache's" in m for m in res.messages)
    # Lossless is exact: the same answer as on the machine that prefilled it.
    machine_a.runtime.reset()
    assert res.answer == ask(machine_a, QUESTION, doc=machine_a.attached.doc_id, tokens=16,
                             level="lossless").answer
    entry = b.store.document_entry(doc_id, b.fingerprint)
    assert set(entry.levels) == set(b.levels) and b.store.verify()["corrupt"] == []
    # The chat's own entry extends the kept copy, and the next restore is local.
    assert [e.parent_id for e in b.store.entries() if e.chat_id == res.chat_id] == [entry.id]
    b.runtime.reset()
    again = ask(b, "Which ship did it replace?", doc=doc_id, tokens=8)
    assert again.source == "local" and again.recomputed_tokens == 0 and again.bytes_read > 0


def test_a_streamed_cache_larger_than_the_budget_is_not_fetched_nor_said_kept(
        machine_a, machine, monkeypatch):
    b = machine(machine_a.sharing.tier)
    doc_id = lazily_pulled(b)
    b.store.budget_bytes = 10_000  # far below the document's cache
    completed = []
    monkeypatch.setattr(sync, "complete", lambda *a, **k: completed.append(a) or 1 / 0)
    res = ask(b, QUESTION, doc=doc_id, tokens=4)
    assert res.source == "remote" and res.tokens_generated > 0
    assert not any("kept the shared cache's" in m for m in res.messages)
    assert any("were not kept here" in m and "larger than the whole storage budget" in m
               for m in res.messages), res.messages
    assert completed == [] and b.store.entries() == []


HARBOUR = """The inner harbour at Halden has berths for sixty boats and a fuel pier that opens
at 07:00. The harbour master, Ingrid Dahl, keeps the key to the winter shed. A crane on the
north quay lifts boats of up to twelve tonnes out of the water each October; the slipway on
the south side was rebuilt in 2009 after a lorry broke through its old planks."""


def two_documents_shared(s3_server, s3_bucket, machine, tmp_path) -> tuple[Engine, int, int]:
    """Machine A attached and pushed two documents; machine B pulled them lazily: (B, the
    ferry's id, the harbour's id there)."""
    tier = tier_on(s3_server, s3_bucket)
    a = machine(tier, "a", auto_push=True)
    for name, text in (("ferry.txt", DOC), ("harbour.txt", HARBOUR)):
        (tmp_path / name).write_text(text)
        assert a.attach(tmp_path / name).pushed
    b = machine(tier)
    assert len(b.sharing.pull(b.fingerprint, lazy=True)["pulled"]) == 2
    ids = {d.title: d.id for d in b.store.documents()}
    return b, ids["ferry.txt"], ids["harbour.txt"]


def ask_both(b: Engine, ferry: int, harbour: int):
    return b.ask("Who keeps the key to the winter shed?", doc_ids=[ferry, harbour],
                 generation=GenerationOptions(max_tokens=4, temperature=0))


def test_a_chat_over_two_documents_takes_the_later_one_from_the_shared_cache(
        s3_server, s3_bucket, machine, tmp_path):
    b, ferry, harbour = two_documents_shared(s3_server, s3_bucket, machine, tmp_path)
    res = ask_both(b, ferry, harbour)
    # The first document streams; the later one is pulled before the blend and said, not
    # computed again from its text.
    assert any(m.startswith(f"document {harbour} (harbour.txt) taken from the shared cache")
               for m in res.messages), res.messages
    assert res.blended["mode"] == "blended" and res.blended["reused_tokens"] > 0
    assert b.store.document_entry(harbour, b.fingerprint) is not None


def test_an_answer_that_read_a_later_document_from_the_shared_cache_says_remote(
        s3_server, s3_bucket, machine, tmp_path):
    b, ferry, harbour = two_documents_shared(s3_server, s3_bucket, machine, tmp_path)
    assert b.prefill(ferry).pulled  # the first document is here; the second only there
    res = ask_both(b, ferry, harbour)
    assert res.blended["mode"] == "blended" and res.blended["reused_tokens"] > 0
    assert res.source == "remote"  # (it said "local": the first part was read here)


def test_a_later_document_taken_from_the_shared_cache_never_evicts_the_first(
        s3_server, s3_bucket, machine, tmp_path):
    """At a budget holding the first document's cache, the later one's copy evicted it
    before the blend read it (streamed again from the bucket), and the note said "kept
    here" of the copy."""
    b, ferry, harbour = two_documents_shared(s3_server, s3_bucket, machine, tmp_path)
    assert b.prefill(ferry).pulled
    head = b.store.document_entry(ferry, b.fingerprint)
    b.store.budget_bytes = head.nbytes + head.nbytes // 4  # no room for the harbour's
    res = ask_both(b, ferry, harbour)
    assert res.tokens_generated > 0
    assert b.store.document_entry(ferry, b.fingerprint).id == head.id  # kept
    assert b.store.document_entry(harbour, b.fingerprint) is None
    assert any(m.startswith(f"document {harbour} (harbour.txt): its shared cache") and
               "beside the caches this answer reads" in m for m in res.messages), res.messages
    assert not any("kept here" in m for m in res.messages), res.messages


def test_attach_takes_the_shared_cache_instead_of_prefilling(machine_a, machine):
    c = machine(machine_a.sharing.tier, "c")
    res = c.attach(machine_a.document)
    assert res.pulled and res.prefill_s == 0 and res.kept_tokens == machine_a.attached.kept_tokens
    assert res.stored_bytes == machine_a.attached.stored_bytes
    c.runtime.reset()
    assert ask(c, QUESTION, doc=res.doc_id, tokens=8).recomputed_tokens == 0


def test_attach_taken_from_the_shared_cache_names_what_storing_it_evicted(machine_a,
                                                                         machine):
    """The pull stored the copy under the budget without saying what it pushed out."""
    c = machine(machine_a.sharing.tier, "c")
    c.store.register_model("other", "/models/other.gguf", {"n_layer": 2})
    with c.store.write_entry("other", range(300), levels=["raw"]) as writer:
        for span in writer.spans:
            writer.put_chunk(span.chunk_index, "raw", bytes(50_000))
    c.store.budget_bytes = sum(machine_a.attached.stored_bytes.values()) + 50_000
    res = c.attach(machine_a.document)
    assert res.pulled and writer.entry.id not in [e.id for e in c.store.entries()]
    assert any(m.startswith("storing this evicted") and "model other.gguf's (not the one "
               "loaded): 1 shared prompt cache(s)" in m for m in res.warnings), res.warnings


def test_without_automatic_pull_the_tier_is_not_read(machine_a, machine):
    b = machine(machine_a.sharing.tier, auto_pull=False)
    res = ask(b, QUESTION, doc=lazily_pulled(b), tokens=4)
    assert res.source == "local" and set(res.chunk_levels) == {"text"}


def fault_tier(machine_a, server, bucket) -> tuple[RemoteTier, Manifest]:
    """A prefix of its own holding machine A's document entry, to damage at will."""
    tier = tier_on(server, bucket, parallel=2)
    sync.push_all(machine_a.store, tier, machine_a.fingerprint)
    return tier, sync.find(tier, machine_a.fingerprint, machine_a.store.tokens(
        machine_a.store.document_entry(machine_a.attached.doc_id, machine_a.fingerprint).id))


def chunk_key(tier, manifest, chunk, level) -> str:
    return tier.chunk_key(manifest.fingerprint, manifest.prefix_hash, level, chunk,
                          manifest.chunks[level][chunk].sha256)


def test_a_deleted_object_is_read_at_another_level(machine_a, machine, s3_server, s3_bucket):
    tier, manifest = fault_tier(machine_a, s3_server, s3_bucket)
    s3_server.client().delete_object(Bucket=s3_bucket, Key=chunk_key(tier, manifest, 1,
                                                                        "lossless"))
    b = machine(tier)
    res = ask(b, QUESTION, doc=lazily_pulled(b), tokens=8)  # no budget: lossless
    assert res.recomputed_tokens == 0 and res.tokens_generated > 0
    assert res.chunk_levels[1] == "high" and set(res.chunk_levels) == {"lossless", "high"}
    assert any("does not exist: read at 'high' instead" in m for m in res.messages)
    # Its lossless level is gone: the copy cannot be completed, so nothing of it is kept.
    assert any("could not be kept" in m for m in res.messages) and b.store.entries() == []


def test_a_corrupt_object_falls_back_to_recomputing(machine_a, machine, s3_server, s3_bucket):
    tier, manifest = fault_tier(machine_a, s3_server, s3_bucket)
    for level in manifest.levels:
        s3_server.client().put_object(Bucket=s3_bucket, Key=chunk_key(tier, manifest, 2, level),
                                      Body=b"\0" * manifest.chunks[level][2].nbytes)
    b = machine(tier)
    res = ask(b, QUESTION, doc=lazily_pulled(b), tokens=8)
    assert res.tokens_generated > 0 and res.chunk_levels[:2] == ["lossless"] * 2
    assert res.chunk_levels[2:] == ["text"] * (len(res.chunk_levels) - 2)
    assert any(m.startswith("recomputing from token 64:") and "SHA-256 mismatch" in m
               for m in res.messages)


def first_chunk_damaged(machine_a, machine, server, bucket) -> tuple[Engine, int]:
    """Another machine on a tier whose entry of machine A's document has its first chunk
    damaged at every level: (its engine, the document's id there)."""
    tier, manifest = fault_tier(machine_a, server, bucket)
    for level in manifest.levels:
        server.client().put_object(Bucket=bucket, Key=chunk_key(tier, manifest, 0, level),
                                   Body=b"\0" * manifest.chunks[level][0].nbytes)
    b = machine(tier)
    return b, lazily_pulled(b)


def test_a_context_recomputed_for_a_damaged_shared_entry_is_kept_here(
        machine_a, machine, s3_server, s3_bucket):
    b, doc_id = first_chunk_damaged(machine_a, machine, s3_server, s3_bucket)
    res = ask(b, QUESTION, doc=doc_id, tokens=8)
    assert set(res.chunk_levels) == {"text"}
    note = next(m for m in res.messages if "could not be kept here" in m)
    assert "stored here instead" in note and "kvdesk remote verify --repair" in note
    assert not any("is not stored" in m for m in res.messages)
    # Computed exactly here: the document's cache and the chat's are kept, the next is local.
    assert b.store.document_entry(doc_id, b.fingerprint) is not None
    b.runtime.reset()
    again = ask(b, "Which ship did it replace?", doc=doc_id, tokens=8)
    assert again.source == "local" and again.recomputed_tokens == 0


def test_attach_takes_the_levels_intact_when_one_level_is_damaged_there(
        machine_a, machine, s3_server, s3_bucket):
    tier, manifest = fault_tier(machine_a, s3_server, s3_bucket)
    damaged = chunk_key(tier, manifest, 1, "high")
    s3_server.client().put_object(Bucket=s3_bucket, Key=damaged,
                                  Body=b"\0" * manifest.chunks["high"][1].nbytes)
    c = machine(tier, "c")
    res = c.attach(machine_a.document)
    assert res.pulled and res.prefill_s == 0  # not computed again for one damaged object
    note = next(w for w in res.warnings if "'high' level" in w or "high level" in w)
    assert damaged in note and "kvdesk remote verify --repair" in note
    entry = c.store.document_entry(res.doc_id, c.fingerprint)
    assert set(entry.levels) == set(manifest.levels) - {"high"}
    c.runtime.reset()
    answer = ask(c, QUESTION, doc=res.doc_id, tokens=4, level="high")
    assert answer.recomputed_tokens == 0 and "high" not in answer.chunk_levels


def test_a_shared_copy_that_fails_its_check_is_not_sent_to_local_repair(
        machine_a, machine, s3_server, s3_bucket):
    tier, manifest = fault_tier(machine_a, s3_server, s3_bucket)
    s3_server.client().put_object(Bucket=s3_bucket, Key=chunk_key(tier, manifest, 1, "high"),
                                  Body=b"\0" * manifest.chunks["high"][1].nbytes)
    b = machine(tier)
    res = ask(b, QUESTION, doc=lazily_pulled(b), tokens=4, level="high")
    assert res.chunk_levels[1] != "high" and res.recomputed_tokens == 0
    note = next(m for m in res.messages if "failed its check at 'high'" in m)
    assert "kvdesk remote verify --repair" in note and "`kvdesk verify --repair`" not in note


def test_the_server_stopped_mid_stream(machine_a, machine, tmp_path, model_path, model_hash):
    server = S3Server(tmp_path / "s3").start()
    try:
        bucket = server.make_bucket("kvdesk-stopped")
        tier, _ = fault_tier(machine_a, server, bucket)
        b = machine(tier)
        doc_id = lazily_pulled(b)
        get = tier.get

        first_read = threading.Event()

        def stops_after_the_first_chunk(key, **kwargs):
            # Reads run in parallel: the others wait for chunk 0's, which stops the server.
            if "/kv/" not in key:
                return get(key, **kwargs)
            if not key.rsplit("/", 1)[1].startswith("00000-"):
                first_read.wait(60)
                return get(key, **kwargs)
            try:
                return get(key, **kwargs)
            finally:
                server.stop()
                first_read.set()

        tier.get = stops_after_the_first_chunk
        res = ask(b, QUESTION, doc=doc_id, tokens=8)
    finally:
        server.stop()
    assert res.tokens_generated > 0 and res.source == "remote"
    assert res.chunk_levels[0] == "lossless" and res.chunk_levels[-1] == "text"
    assert 0 < res.recomputed_tokens < b.runtime.n_tokens
    assert any("did not answer" in m for m in res.messages)
    assert b.store.entries() == []  # neither the partial copy nor a re-encoding of it


def kvdesk(*args, env):
    proc = subprocess.run([sys.executable, "-m", "desktop_app", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})
    return proc.returncode, proc.stdout, proc.stderr


def test_cli_remote_status_push_pull(machine_a, aws_env, tmp_path, s3_server):
    tier = machine_a.sharing.tier
    shared = {"KVDESK_REMOTE_BUCKET": tier.config.bucket,
              "KVDESK_REMOTE_ENDPOINT_URL": s3_server.endpoint_url,
              "KVDESK_REMOTE_PREFIX": tier.prefix, "KVDESK_DATA_DIR": str(tmp_path / "cli")}
    rc, out, err = kvdesk("remote", "pull", "--json", env=shared)
    assert rc == 0, err
    assert [t["title"] for t in json.loads(out)["pulled"]] == [machine_a.attached.title]
    rc, out, err = kvdesk("remote", "status", "--json", env=shared)
    status = json.loads(out)
    assert rc == 0 and status["reachable"] and status["bucket"] == tier.config.bucket
    assert status["local_entries"] >= 1 and status["only_local"] == 0
    assert s3_server.secret_key not in out + err
    lazy = {**shared, "KVDESK_DATA_DIR": str(tmp_path / "lazy")}
    rc, out, err = kvdesk("remote", "pull", "--lazy", env=lazy)
    assert rc == 0 and "its cache streams when first used" in out, err
    rc, out, err = kvdesk("docs", env=lazy)
    assert rc == 0 and "not cached here (a question streams the shared cache's)\n" in out, err
    tiny = {**shared, "KVDESK_DATA_DIR": str(tmp_path / "tiny"),
            "KVDESK_CONFIG_DIR": str(tmp_path / "tiny-config")}
    (tmp_path / "tiny-config").mkdir()
    (tmp_path / "tiny-config" / "settings.json").write_text('{"storage_budget_gb": 1e-5}')
    rc, out, err = kvdesk("remote", "pull", env=tiny)
    assert rc == 0 and f"not kept {machine_a.attached.title}: its cache (" in out, out + err
    assert "larger than the whole storage budget of 10.0 KB" in out
    rc, out, err = kvdesk("remote", "verify", "--json", env=shared)
    checked = json.loads(out)
    assert rc == 0 and checked["checked"] >= 1 and checked["objects"] and not checked["damaged"]

    rc, out, err = kvdesk("remote", "push", "--json",
                          env={"KVDESK_DATA_DIR": str(tmp_path / "none")})
    assert rc == 1 and "Traceback" not in err
    assert json.loads(out)["kind"] == "RemoteError" and len(out.strip().splitlines()) == 1
    # A mistyped data directory is read as empty, said, and not made a new store.
    typo = {**shared, "KVDESK_DATA_DIR": str(tmp_path / "typo")}
    for command in ("status", "verify", "push"):
        rc, out, err = kvdesk("remote", command, env=typo)
        assert rc == 0 and f"no data directory at {tmp_path / 'typo'}" in err, (command, err)
        assert not (tmp_path / "typo").exists()
    down = {**shared, "KVDESK_REMOTE_ENDPOINT_URL": "http://127.0.0.1:9"}
    rc, out, err = kvdesk("remote", "status", "--json", env=down)
    assert rc == 1 and json.loads(out)["reachable"] is False


class SlowProxy(BaseHTTPRequestHandler):
    """The S3 server behind a slow link: each chunk object takes half a second to come."""

    target: tuple[str, int]

    def forward(self):  # (the Host header goes along: the request's signature names it)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "/kv/" in self.path:
            time.sleep(0.5)
        upstream = http.client.HTTPConnection(*self.target, timeout=30)
        upstream.request(self.command, self.path, body, dict(self.headers))
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", answer.getheader("Content-Length") or str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_POST = forward

    def log_message(self, *args):
        pass


def test_ctrl_c_stops_a_pull_which_a_pull_again_completes(machine_a, aws_env, tmp_path,
                                                            s3_server):
    """It ran to the end and exited 0 where the Ctrl-C came at the wrong moment."""
    tier = machine_a.sharing.tier
    SlowProxy.target = urlsplit(s3_server.endpoint_url).hostname, \
        urlsplit(s3_server.endpoint_url).port
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), SlowProxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    env = {**os.environ, "KVDESK_REMOTE_BUCKET": tier.config.bucket,
           "KVDESK_REMOTE_ENDPOINT_URL": f"http://127.0.0.1:{proxy.server_port}",
           "KVDESK_REMOTE_PREFIX": tier.prefix, "KVDESK_DATA_DIR": str(tmp_path / "d")}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "desktop_app", "remote", "pull",
                                 "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
        for line in proc.stderr:  # the first objects in
            if line.startswith("pull"):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proxy.shutdown()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "Stopping..." in err and "stopped: 1 shared cache(s) not pulled" in err
    assert json.loads(out)["not_done"] == 1 and json.loads(out)["pulled"] == []
    local = {**env, "KVDESK_REMOTE_ENDPOINT_URL": s3_server.endpoint_url}
    rc, out, err = kvdesk("docs", "--json", env=local)
    assert rc == 0 and json.loads(out) == []  # the copy under way dropped whole
    rc, out, err = kvdesk("remote", "pull", env=local)
    assert rc == 0 and f"pulled {machine_a.attached.title}" in out, err


def test_boto3_loads_only_when_the_tier_is_used():
    code = ("import sys; from desktop_app.app import App; from desktop_app.settings import "
            "Settings; from store import RemoteConfig, RemoteTier; "
            "App(Settings()).remote; RemoteTier(RemoteConfig(bucket='abc')).chunk_key("
            "'fp', bytes(16), 'high', 0, 'a' * 64); print('boto3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("error, damaged", [
    (SharedObjectError("remote object kv/x/0: SHA-256 mismatch"), True),
    (NotFoundError("KV entry 5 was removed while being written"), False),
    (NotFoundError("document 3 is deleted"), False)])
def test_only_a_bucket_objects_damage_sends_the_user_to_repair_the_bucket(
        tmp_path, monkeypatch, error, damaged):
    """A copy that fails here (its pending entry removed, a document deleted) is no damage of
    the shared entry: the bucket is not blamed, and the context is not said stored instead."""
    store = Store(tmp_path / "data")
    sharing = Sharing(store, None)
    copy = SimpleNamespace(manifest=SimpleNamespace(token_end=300), nbytes=1000,
                           abort=lambda: None, evicted=[])
    sharing._streamed = [SimpleNamespace(copy=copy, tier=None)]

    def fails(tier, copy):
        raise error
    monkeypatch.setattr(sync, "complete", fails)
    ok, (note,) = sharing.keep(exact=True)
    assert ok is damaged
    assert ("stored here instead" in note) is damaged
    assert ("kvdesk remote verify --repair" in note) is damaged
    store.close()



def test_a_request_whose_context_is_not_stored_never_says_it_is_stored_instead(
        machine_a, machine, s3_server, s3_bucket):
    """Over the local API, a damaged shared entry's note says the context computed here is
    stored instead only where it is: not for a prompt too short to be kept on its own (under
    `min_cache_tokens`, nothing of it stored here), nor a blended or a full disk's."""
    b, doc_id = first_chunk_damaged(machine_a, machine, s3_server, s3_bucket)
    done = b.complete([{"role": "user", "content": QUESTION}], documents=[doc_id],
                      restore=RestoreOptions(level=EXACT),
                      generation=GenerationOptions(max_tokens=8, temperature=0))
    note = next(m for m in done.messages if "could not be kept here" in m)
    assert "stored here instead" not in note and "kvdesk remote verify --repair" in note
    assert not done.stored
