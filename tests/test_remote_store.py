"""The remote tier against a real S3 server (SeaweedFS on loopback): layout, push and pull,
manifests written last, idempotence, isolation, faults and credentials. No model."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from test_store_helpers import FP, LEVELS, count, dead_pid, open_store, payload, put_entry

from store import (
    CorruptObjectError,
    NotFoundError,
    RemoteConfig,
    RemoteError,
    RemoteTier,
    text_hash,
)
from store.shared import checking, sync
from store.shared.manifest import ChunkObject, Manifest, RemoteDocument

TOKENS = list(range(600))  # three chunks of 256


def attached(store, tokens=TOKENS, *, title="notes.md", fingerprint=FP, salt=b"",
             window_start=None):
    """A document with its root entry, as attach leaves it; `salt` varies the chunk bytes."""
    doc = store.add_document(f"hash-of-{title}", title, f"the text of {title}", type="markdown",
                             n_tokens=len(tokens))
    with store.write_entry(fingerprint, tokens, levels=LEVELS, document_id=doc.id,
                           window_start=window_start) as writer:
        for span in writer.spans + writer.windows:
            for level in LEVELS:
                writer.put_chunk(span.chunk_index, level,
                                 salt + payload(span.token_start, span.token_end, level))
    return writer.entry


def recorded_puts(monkeypatch, tier: RemoteTier) -> list[str]:
    keys: list[str] = []
    put = tier.put

    def recording(key, data):
        keys.append(key)
        put(key, data)

    monkeypatch.setattr(tier, "put", recording)
    return keys


def bucket_keys(s3_server, tier: RemoteTier) -> set[str]:
    pages = s3_server.client().get_paginator("list_objects_v2").paginate(
        Bucket=tier.config.bucket, Prefix=tier.prefix + "/")
    return {o["Key"] for page in pages for o in page.get("Contents", ())}


def test_layout_is_content_addressed_under_prefix_and_fingerprint():
    tier = RemoteTier(RemoteConfig(bucket="team-bucket", prefix="/team-a/"))
    digest = "ab" * 32
    assert tier.chunk_key("fp1", bytes(range(16)), "high", 3, digest) == \
        f"team-a/kv/fp1/{bytes(range(16)).hex()}/high/00003-{digest}"
    key = tier.manifest_key("fp1", 4096, bytes(range(16)))
    assert key == f"team-a/manifests/fp1/00004096-{bytes(range(16)).hex()}.json"
    assert key.startswith(tier.manifest_folder("fp1"))
    assert tier.parse_manifest_key(key) == (4096, bytes(range(16)))
    assert tier.parse_manifest_key("team-a/manifests/fp1/notes.txt") is None
    with pytest.raises(ValueError, match="outside"):
        tier.get("team-b/kv/fp1/x")
    for bad in ("../x", "a/b", ""):
        with pytest.raises(ValueError):
            tier.chunk_key("fp1", bytes(16), bad, 0, digest)
        with pytest.raises(ValueError):
            tier.manifest_folder(bad)


def test_manifest_round_trip_and_every_check():
    manifest = Manifest(
        fingerprint=FP, tokens=tuple(range(300)), chunk_size=256, levels=("high",),
        chunks={"high": (ChunkObject(10, "a" * 64), ChunkObject(5, "b" * 64))},
        document=RemoteDocument("h", "T", "text", 300, "text"), created=1.0)
    data = manifest.to_json()
    key = "p/manifests/x.json"
    assert Manifest.from_json(data, key=key, fingerprint=FP,
                              prefix_hash=manifest.prefix_hash) == manifest
    with pytest.raises(CorruptObjectError, match="made under model"):
        Manifest.from_json(data, key=key, fingerprint="another-model")
    with pytest.raises(CorruptObjectError, match="do not hash to its key"):
        Manifest.from_json(data, key=key, fingerprint=FP, prefix_hash=bytes(16))
    with pytest.raises(CorruptObjectError, match="checksum"):
        Manifest.from_json(data.replace(b'"T"', b'"U"'), key=key, fingerprint=FP)
    with pytest.raises(CorruptObjectError, match="malformed"):
        Manifest.from_json(data[:-10], key=key, fingerprint=FP)
    with pytest.raises(CorruptObjectError, match="newer"):
        Manifest.from_json(data.replace(b'"version": 7', b'"version": 99'), key=key,
                           fingerprint=FP)
    short = replace(manifest, chunks={"high": (ChunkObject(10, "a" * 64),)})
    with pytest.raises(CorruptObjectError, match="2 chunks"):
        Manifest.from_json(short.to_json(), key=key, fingerprint=FP)
    # A window's parts are objects after the chunks: a manifest must name them all.
    windowed = replace(manifest, window_start=44)
    with pytest.raises(CorruptObjectError, match="3 chunks"):
        Manifest.from_json(windowed.to_json(), key=key, fingerprint=FP)
    objects = (*manifest.chunks["high"], ChunkObject(7, "c" * 64))
    windowed = replace(windowed, chunks={"high": objects})
    assert Manifest.from_json(windowed.to_json(), key=key, fingerprint=FP) == windowed
    with pytest.raises(CorruptObjectError, match="window from token 300"):
        Manifest.from_json(replace(windowed, window_start=300).to_json(), key=key,
                           fingerprint=FP)


def test_push_then_pull_on_another_machine(a, b, remote_tier, s3_server):
    entry = attached(a)
    report = sync.push_all(a, remote_tier, FP)
    assert [(t["tokens"], t["objects"]) for t in report["pushed"]] == [(600, 6)]
    keys = bucket_keys(s3_server, remote_tier)
    assert len([k for k in keys if "/kv/model-a/" in k]) == 6
    assert len([k for k in keys if "/manifests/model-a/" in k]) == 1
    assert checking.status(b, remote_tier, FP) == {
        "reachable": True, "local_entries": 0, "remote_entries": 1, "only_local": 0,
        "only_remote": 1, "damaged": []}

    pulled = sync.pull_all(b, remote_tier, FP)
    assert [t["tokens"] for t in pulled["pulled"]] == [600] and pulled["failed"] == []
    (doc,) = b.documents()
    assert (doc.title, doc.text, doc.source_path) == ("notes.md", "the text of notes.md", None)
    match = b.longest_prefix(FP, [*TOKENS, 7, 8])
    assert match.n_tokens == 600 and match.entries[0].document_id == doc.id
    for span in match.spans:
        for level in LEVELS:
            assert b.read_chunk(span.entry_id, span.chunk_index, level) == \
                a.read_chunk(entry.id, span.chunk_index, level)
    assert sync.pull_all(b, remote_tier, FP) == {"pulled": [], "already_local": 1,
                                                 "passages_left": 0, "not_kept": [],
                                                 "evicted": [], "levels_left_out": [],
                                                 "failed": [], "not_done": 0}


def test_a_pull_on_a_small_budget_names_what_it_did_not_keep_and_what_it_evicted(
        a, b, remote_tier, monkeypatch):
    small = attached(a, list(range(1000, 1300)), title="one.md")
    attached(a, list(range(2000, 2300)), title="two.md")
    big = attached(a, list(range(5000, 6200)), title="big.md")
    sync.push_all(a, remote_tier, FP)
    b.budget_bytes = small.nbytes * 3 // 2  # one small cache at a time; the big one never
    assert big.nbytes > b.budget_bytes
    fetched = []
    read_chunk = sync.read_chunk
    monkeypatch.setattr(sync, "read_chunk", lambda t, m, *a: fetched.append(m.token_end) or
                        read_chunk(t, m, *a))
    report = sync.pull_all(b, remote_tier, FP)
    assert [(t["title"], t["bytes"]) for t in report["not_kept"]] == [("big.md", big.nbytes)]
    assert 1200 not in fetched  # not fetched to be dropped at once
    first, second = [t["title"] for t in report["pulled"]]  # (in the tier's order)
    assert [(c["title"], c["document_id"] is not None) for c in report["evicted"]] == [
        (first, True)]
    assert sorted(d.title for d in b.documents()) == ["big.md", "one.md", "two.md"]
    assert [b.document(e.document_id).title for e in b.entries()] == [second]


def test_a_manifest_a_newer_kvdesk_wrote_is_never_written_over(a, remote_tier, s3_server):
    """A push read it as corrupt and wrote its own in its place."""
    entry = attached(a)
    sync.push_all(a, remote_tier, FP)
    (key,) = [k for k in bucket_keys(s3_server, remote_tier) if "/manifests/" in k]
    newer = remote_tier.get(key).replace(b'"version": 7', b'"version": 8')
    remote_tier.put(key, newer)
    with pytest.raises(CorruptObjectError, match="version 8 is newer"):
        sync.read_manifest(remote_tier, FP, entry.token_end, entry.prefix_hash)
    assert sync.push(a, remote_tier, entry).skipped
    assert remote_tier.get(key) == newer


def test_status_names_a_damaged_manifest_only_there_instead_of_counting_it_shared(
        a, b, remote_tier, s3_server):
    """A truncated manifest was counted "shared there, 1 only there", which a pull refused."""
    attached(a)
    attached(a, list(range(1000, 1600)), title="other.md")
    sync.push_all(a, remote_tier, FP)
    key = sorted(k for k in bucket_keys(s3_server, remote_tier) if "/manifests/" in k)[0]
    remote_tier.put(key, remote_tier.get(key)[:100])
    report = checking.status(b, remote_tier, FP)
    assert report["remote_entries"] == report["only_remote"] == 2
    assert [d["key"] for d in report["damaged"]] == [key]
    assert "malformed manifest" in report["damaged"][0]["error"]
    assert checking.status(a, remote_tier, FP)["damaged"] == []  # (held here: verify reads it)


def test_an_entry_travels_with_its_window(a, b, remote_tier, s3_server):
    entry = attached(a, window_start=88)
    report = sync.push_all(a, remote_tier, FP)
    assert [(t["tokens"], t["objects"]) for t in report["pushed"]] == [(600, 10)]
    (key,) = [k for k in bucket_keys(s3_server, remote_tier) if "/manifests/" in k]
    manifest = sync.read_manifest(remote_tier, FP, 600, entry.prefix_hash)
    assert manifest.window_start == 88 and manifest.window_spans == [(88, 344), (344, 600)]
    assert b'"version": 7' in remote_tier.get(key)
    pulled = sync.pull_all(b, remote_tier, FP)
    (copy,) = b.entries()
    assert pulled["pulled"][0]["objects"] == 10
    window = b.windows([copy.id])[copy.id]
    assert [(s.chunk_index, s.token_start, s.token_end) for s in window] == [
        (3, 88, 344), (4, 344, 600)]
    for part in window:
        for level in LEVELS:
            assert b.read_chunk(copy.id, part.chunk_index, level) == \
                a.read_chunk(entry.id, part.chunk_index, level)


def test_a_pushed_passage_is_named_as_an_answer_cites_it(a, remote_tier):
    doc = a.add_document("h" * 64, "book.txt", "one\n\ntwo\nthree", type="text")
    a.add_passages(doc.id, [
        SimpleNamespace(index=i, text=t, start=0, end=len(t), page=None, lines=lines,
                        heading=(), tokens=40)
        for i, (t, lines) in enumerate([("one", (1, 1)), ("two\nthree", (3, 4))])])
    entry = put_entry(a, range(300, 340), levels=["high"], document_id=doc.id, passage=True,
                      passage_hash=text_hash("two\nthree"))
    (pushed,) = sync.push_all(a, remote_tier, FP)["pushed"]
    # (It said "a passage of book.txt", which one untold.)
    assert pushed["title"] == "book.txt #1 [lines 3-4]" and pushed["objects"] == 1
    assert checking.check(a, remote_tier, entry)["title"] == "book.txt #1 [lines 3-4]"


def test_kvdesk_remote_push_counts_objects_in_words(capsys):
    from desktop_app.cli.remote import _transfer

    _transfer(False, lambda progress, cancel: {
        "pushed": [{"title": "book.txt #1 [lines 3-4]", "tokens": 40, "objects": 1,
                    "bytes": 2_000}], "already_remote": 0, "failed": []},
        "push", "pushed", "already_remote")
    assert "pushed book.txt #1 [lines 3-4]: 40 tokens, 1 object, 0.0 MB" in \
        capsys.readouterr().out  # (it said "1 objects")


def test_a_second_push_uploads_nothing(a, remote_tier, monkeypatch):
    attached(a)
    sync.push_all(a, remote_tier, FP)
    puts = recorded_puts(monkeypatch, remote_tier)
    assert sync.push_all(a, remote_tier, FP) == {"pushed": [], "already_remote": 1,
                                                  "failed": [], "not_done": 0}
    assert puts == []


def test_an_interrupted_push_is_invisible_and_resumes(a, b, remote_tier, monkeypatch):
    attached(a)
    put = remote_tier.put

    def dies_before_the_manifest(key, data):
        if key.endswith(".json"):
            raise RemoteError("the laptop lid closed")
        put(key, data)

    monkeypatch.setattr(remote_tier, "put", dies_before_the_manifest)
    with pytest.raises(RemoteError):
        sync.push_all(a, remote_tier, FP)
    monkeypatch.setattr(remote_tier, "put", put)
    assert sync.find(remote_tier, FP, TOKENS) is None
    assert sync.pull_all(b, remote_tier, FP)["pulled"] == [] and b.entries() == []

    puts = recorded_puts(monkeypatch, remote_tier)
    assert sync.push_all(a, remote_tier, FP)["pushed"][0]["objects"] == 0
    assert len(puts) == 1 and puts[0].endswith(".json")  # the chunks were already there
    assert sync.find(remote_tier, FP, TOKENS).token_end == 600


def cancelled_after(n: int) -> tuple[threading.Event, callable]:
    """A cancel event and a progress callback that sets it after `n` objects (a Ctrl-C)."""
    cancel, calls = threading.Event(), iter(range(1, 10**6))
    return cancel, lambda done, total: next(calls) >= n and cancel.set()


def test_a_stopped_pull_keeps_what_it_finished_drops_the_copy_under_way_and_resumes(
        a, b, remote_tier):
    for i in range(3):
        attached(a, list(range(1000 * i, 1000 * i + 600)), title=f"doc{i}.md")
    sync.push_all(a, remote_tier, FP)
    cancel, progress = cancelled_after(8)  # (6 objects an entry: in the second one)
    report = sync.pull_all(b, remote_tier, FP, progress=progress, cancel=cancel)
    assert len(report["pulled"]) == 1 and report["not_done"] == 2 and report["failed"] == []
    assert len(b.entries()) == 1 and len(b.documents()) == 1  # no half copy, no orphan
    checked = b.verify()
    assert checked["corrupt"] == checked["abandoned"] == [] and b.attaching() == {}
    again = sync.pull_all(b, remote_tier, FP)
    assert len(again["pulled"]) == 2 and again["already_local"] == 1 and again["not_done"] == 0


def test_a_stopped_push_shares_nothing_half_sent_and_resumes(a, b, remote_tier):
    for i in range(2):
        attached(a, list(range(1000 * i, 1000 * i + 600)), title=f"doc{i}.md")
    cancel, progress = cancelled_after(2)
    report = sync.push_all(a, remote_tier, FP, progress=progress, cancel=cancel)
    assert report["pushed"] == [] and report["not_done"] == 2
    assert checking.status(b, remote_tier, FP)["remote_entries"] == 0  # no manifest yet
    assert len(sync.push_all(a, remote_tier, FP)["pushed"]) == 2
    cancel = threading.Event()
    cancel.set()
    assert checking.check_all(a, remote_tier, FP, cancel=cancel)["not_done"] == 2


def test_concurrent_pushes_of_one_entry_leave_one_whole_manifest(tmp_path, b, remote_tier):
    # Two machines prefilled the same document; their bytes differ (other threads, other
    # rounding): each writes its own chunk objects and a complete manifest, the last wins.
    stores = [open_store(tmp_path / name) for name in ("x", "y")]
    for store, salt in zip(stores, (b"x", b"y"), strict=True):
        attached(store, salt=salt)
    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda store: sync.push_all(store, remote_tier, FP), stores))
    assert all(r["failed"] == [] and len(r["pushed"]) + r["already_remote"] == 1
               for r in reports)
    for store in stores:
        store.close()
    sync.pull_all(b, remote_tier, FP)
    match = b.longest_prefix(FP, TOKENS)
    chunks = [b.read_chunk(s.entry_id, s.chunk_index, lv) for s in match.spans for lv in LEVELS]
    assert {chunk[:1] for chunk in chunks} in ({b"x"}, {b"y"})  # one machine's, never mixed


def test_fingerprints_and_prefixes_isolate(a, b, remote_tier, s3_server):
    attached(a)
    sync.push_all(a, remote_tier, FP)
    b.register_model("model-b", "/models/b.gguf", {})
    assert sync.find(remote_tier, "model-b", TOKENS) is None
    assert sync.pull_all(b, remote_tier, "model-b")["pulled"] == []
    # A manifest planted under another model's folder is refused, never loaded.
    (key,) = [k for k in bucket_keys(s3_server, remote_tier) if k.endswith(".json")]
    planted = key.replace("/manifests/model-a/", "/manifests/model-b/")
    s3_server.client().copy_object(Bucket=remote_tier.config.bucket, Key=planted,
                                   CopySource={"Bucket": remote_tier.config.bucket, "Key": key})
    report = sync.pull_all(b, remote_tier, "model-b")
    assert report["pulled"] == [] and "made under model" in report["failed"][0]["error"]
    assert b.entries() == []

    other_team = RemoteTier(RemoteConfig(bucket=remote_tier.config.bucket,
                                         prefix=remote_tier.prefix + "-other",
                                         endpoint_url=s3_server.endpoint_url))
    assert checking.status(b, other_team, FP)["remote_entries"] == 0
    assert sync.find(other_team, FP, TOKENS) is None


def test_a_damaged_level_is_left_out_and_an_entry_damaged_at_every_level_fails_alone(
        a, b, remote_tier, s3_server):
    attached(a)
    attached(a, list(range(1000, 1300)), title="other.md")
    sync.push_all(a, remote_tier, FP)
    client, bucket = s3_server.client(), remote_tier.config.bucket
    manifest = sync.find(remote_tier, FP, TOKENS)
    key = remote_tier.chunk_key(FP, manifest.prefix_hash, "compact", 1,
                                manifest.chunks["compact"][1].sha256)
    client.put_object(Bucket=bucket, Key=key, Body=b"rot" * 100)
    with pytest.raises(CorruptObjectError, match="bytes where|SHA-256"):
        sync.read_chunk(remote_tier, manifest, 1, "compact")
    # One level damaged: the entry is kept at the levels intact, the one left out named.
    report = sync.pull_all(b, remote_tier, FP)
    assert sorted(t["title"] for t in report["pulled"]) == ["notes.md", "other.md"]
    assert report["failed"] == []
    (partial,) = report["levels_left_out"]
    assert partial["title"] == "notes.md" and partial["levels"] == ("lossless",)
    assert list(partial["left_out"]) == ["compact"] and key in partial["left_out"]["compact"]
    (kept,) = [e for e in b.entries() if e.token_end == 600]
    assert kept.levels == ("lossless",) and b.verify()["corrupt"] == []
    b.delete_document(kept.document_id)

    # Every level damaged (one gone, one rotten): the entry fails, its document named.
    client.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(NotFoundError, match="does not exist"):
        sync.read_chunk(remote_tier, manifest, 1, "compact")
    client.put_object(Bucket=bucket, Body=b"rot", Key=remote_tier.chunk_key(
        FP, manifest.prefix_hash, "lossless", 0, manifest.chunks["lossless"][0].sha256))
    (failed,) = sync.pull_all(b, remote_tier, FP)["failed"]
    assert failed["title"] == "notes.md"
    # Nothing half-copied stays behind, visible or not.
    assert [e.token_end for e in b.entries()] == [300]
    assert count(b, "kv_entries") == 1 and count(b, "kv_chunks") == 2 * len(LEVELS)
    assert [d.title for d in b.documents()] == ["other.md"]


def test_verify_finds_objects_damaged_or_gone_there_and_repair_puts_them_back(
        a, b, remote_tier, s3_server):
    attached(a)
    sync.push_all(a, remote_tier, FP)
    client, bucket = s3_server.client(), remote_tier.config.bucket
    manifest = sync.find(remote_tier, FP, TOKENS)
    keys = [remote_tier.chunk_key(FP, manifest.prefix_hash, "compact", i,
                                  manifest.chunks["compact"][i].sha256) for i in (0, 1)]
    good = client.get_object(Bucket=bucket, Key=keys[0])["Body"].read()
    client.put_object(Bucket=bucket, Key=keys[0], Body=bytes([good[0] ^ 1]) + good[1:])
    client.delete_object(Bucket=bucket, Key=keys[1])  # (same size, one byte flipped; gone)
    assert sync.push_all(a, remote_tier, FP)["already_remote"] == 1  # push sees nothing
    found = checking.check_all(a, remote_tier, FP)
    assert found["checked"] == 1 and found["repaired"] == 0
    assert sorted(d["key"] for d in found["damaged"]) == sorted(keys)
    assert "SHA-256" in " ".join(d["error"] for d in found["damaged"])
    with open_store(a.data_dir.parent / "c") as c:  # a machine that does not hold it: told
        attached(c, list(range(1000, 1100)), title="mine.md")
        assert checking.check_all(c, remote_tier, FP)["checked"] == 0
    fixed = checking.check_all(a, remote_tier, FP, repair=True)
    assert fixed["repaired"] == 2
    assert checking.check_all(a, remote_tier, FP)["damaged"] == []
    # A damaged manifest is written again, and the chunks are still read back after it.
    manifest_key = remote_tier.manifest_key(FP, manifest.token_end, manifest.prefix_hash)
    client.put_object(Bucket=bucket, Key=manifest_key, Body=b"{not json")
    client.put_object(Bucket=bucket, Key=keys[0], Body=bytes([good[0] ^ 1]) + good[1:])
    found = checking.check_all(a, remote_tier, FP)
    assert [d["key"] for d in found["damaged"]] == [manifest_key]  # (nothing to read past it)
    fixed = checking.check_all(a, remote_tier, FP, repair=True)
    assert sorted(d["key"] for d in fixed["damaged"]) == sorted([manifest_key, keys[0]])
    assert fixed["repaired"] == 2 and checking.check_all(a, remote_tier, FP)["damaged"] == []
    report = sync.pull_all(b, remote_tier, FP)  # the other machine reads it whole again
    assert report["failed"] == [] and len(report["pulled"]) == 1


def test_a_local_copy_is_invisible_until_complete(a, b, remote_tier):
    attached(a)
    sync.push_all(a, remote_tier, FP)
    copy = sync.LocalCopy(b, sync.find(remote_tier, FP, TOKENS))
    copy.add(0, "compact", sync.read_chunk(remote_tier, copy.manifest, 0, "compact"))
    assert len(copy.missing()) == 5
    assert b.longest_prefix(FP, TOKENS).n_tokens == 0 and b.entries() == []
    entry, fetched = sync.complete(remote_tier, copy)
    assert entry.token_end == 600 and fetched == entry.nbytes - len(payload(0, 256, "compact"))
    assert b.longest_prefix(FP, TOKENS).n_tokens == 600


def test_a_document_a_copy_brings_is_unfinished_until_the_copy_is(a, b, remote_tier):
    """A pull killed mid-way left its document listed with no cache ("none"), as if the
    copy had finished: now it is unfinished, as a killed attach's, and the next pull
    finishes it; a copy that fails takes its new document with it."""
    attached(a)
    sync.push_all(a, remote_tier, FP)
    manifest = sync.find(remote_tier, FP, TOKENS)
    copy = sync.LocalCopy(b, manifest)
    assert b.attaching() == {copy.document_id: True} and b.entries() == []
    copy.abort()
    assert b.documents() == [] and b.attaching() == {}
    killed = sync.LocalCopy(b, manifest)  # the process is killed here: its mark stays
    conn = sqlite3.connect(b.path)
    with conn:
        conn.execute("UPDATE documents SET attach_pid = ?", (dead_pid(),))
    conn.close()
    assert b.attaching() == {killed.document_id: False}
    report = sync.pull_all(b, remote_tier, FP)
    assert report["failed"] == [] and len(report["pulled"]) == 1
    assert [d.id for d in b.documents()] == [killed.document_id] and b.attaching() == {}
    # A document already here is neither marked nor dropped by a copy that fails.
    again = sync.LocalCopy(b, manifest)
    again.abort()
    assert [d.id for d in b.documents()] == [killed.document_id] and b.attaching() == {}


class _SlowDown(BaseHTTPRequestHandler):
    """An S3 endpoint that only ever says "slow down" (HTTP 503)."""

    hits = 0

    def do_GET(self):  # noqa: N802 - http.server's naming
        type(self).hits += 1
        body = b"<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_PUT = do_HEAD = do_GET

    def log_message(self, *args):
        pass


def _tier(endpoint: str) -> RemoteTier:
    return RemoteTier(RemoteConfig(bucket="kvdesk-tests", endpoint_url=endpoint,
                                   connect_timeout_s=0.5, read_timeout_s=0.5, max_attempts=2))


def test_an_endpoint_port_botocore_refuses_is_a_remote_error(aws_env):
    # (settings refuse it first; a config made in code gets one clear error, no traceback)
    for endpoint, where in (("http://127.0.0.1:99999", "http://127.0.0.1:99999"),
                            ("http://127.0.0.1:abc", "http://127.0.0.1:abc"),
                            ("http://127.0.0.1:9000", "http://127.0.0.1:9000")):
        assert RemoteConfig(bucket="b", endpoint_url=endpoint).where == where
    assert RemoteConfig(bucket="b", endpoint_url="http://127.0.0.1:0").where.endswith(":0")
    with pytest.raises(RemoteError, match=r"^http://127.0.0.1:99999 did not answer head_bucket"):
        _tier("http://127.0.0.1:99999").check()


def test_throttling_and_5xx_are_retried_a_bounded_number_of_times(aws_env):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowDown)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RemoteError, match=r"SlowDown \(HTTP 503\)"):
            _tier(f"http://127.0.0.1:{server.server_port}").get("kvdesk/x")
        assert _SlowDown.hits == 2
    finally:
        server.shutdown()


class _NoBucket(BaseHTTPRequestHandler):
    """An S3 endpoint without the bucket: a HEAD gets a bare 404, with no error code."""

    def do_HEAD(self):  # noqa: N802 - http.server's naming
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_bucket_that_does_not_exist_is_named_as_a_bucket(aws_env):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoBucket)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RemoteError, match="bucket 'kvdesk-tests' does not exist at"):
            _tier(f"http://127.0.0.1:{server.server_port}").check()
    finally:
        server.shutdown()


def test_timeouts_and_refused_connections_fail_in_bounded_time(aws_env):
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)  # accepts connections, never answers
    endpoint = f"http://127.0.0.1:{hole.getsockname()[1]}"
    try:
        t0 = time.perf_counter()
        with pytest.raises(RemoteError, match="ReadTimeoutError"):
            _tier(endpoint).get("kvdesk/x")
        assert time.perf_counter() - t0 < 10
    finally:
        hole.close()
    with pytest.raises(RemoteError, match="EndpointConnectionError"):
        _tier(endpoint).get("kvdesk/x")


def test_a_hung_bucket_s_retries_are_said_as_they_come(aws_env):
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)  # accepts connections, never answers
    said: list[str] = []
    tier = RemoteTier(RemoteConfig(bucket="kvdesk-tests",
                                   endpoint_url=f"http://127.0.0.1:{hole.getsockname()[1]}",
                                   read_timeout_s=0.5, max_attempts=3),
                      on_retry=said.append)
    try:
        with pytest.raises(RemoteError, match="ReadTimeoutError, 3 attempts"):
            tier.check()
        # Each of the two retries is said when it starts, not only the error at the end.
        assert said == [
            f"http://127.0.0.1:{hole.getsockname()[1]}: head_bucket failed (no answer in "
            f"0.5 s); trying again (attempt {n} of 3)" for n in (2, 3)]
    finally:
        hole.close()


def test_a_lookup_on_an_answers_way_gives_a_hung_bucket_one_short_try(aws_env):
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)  # accepts connections, never answers
    tier = RemoteTier(RemoteConfig(bucket="kvdesk-tests",
                                   endpoint_url=f"http://127.0.0.1:{hole.getsockname()[1]}",
                                   read_timeout_s=3.0, max_attempts=3, lookup_timeout_s=0.3))
    try:
        t0 = time.perf_counter()
        with pytest.raises(RemoteError, match="ReadTimeoutError, one attempt"):
            sync.find(tier, FP, list(range(100)))
        assert time.perf_counter() - t0 < 2.5  # not 3 attempts of 3 s
        with pytest.raises(RemoteError, match="ReadTimeoutError, 3 attempts"):
            tier.list_folder(tier.manifest_folder(FP))  # a command's listing waits longer
    finally:
        hole.close()


def test_credentials_are_never_shown_nor_stored(a, remote_tier, s3_server, monkeypatch, tmp_path):
    attached(a)
    sync.push_all(a, remote_tier, FP)
    with open_store(tmp_path / "c") as c:
        sync.pull_all(c, remote_tier, FP)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert s3_server.secret_key.encode() not in data, path
            assert s3_server.access_key.encode() not in data, path

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    with pytest.raises(RemoteError, match="refused access") as refused:
        RemoteTier(remote_tier.config).check()
    assert "wrong-secret" not in str(refused.value)
    assert s3_server.access_key not in str(refused.value)

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(RemoteError, match="no usable AWS credentials"):
        RemoteTier(remote_tier.config).check()

