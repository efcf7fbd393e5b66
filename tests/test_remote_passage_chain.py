"""A passage's entry extending the passages' head on the shared tier (a real S3 server): it
travels with the head's chunks (manifest version 5), lands as a local passage entry extending
a local head (one held already, else one made from those chunks), is checked and repaired
there, and leaves the older manifests and root passages' entries as they were. No model."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_store_helpers import FP, LEVELS, open_store, put_entry

from store import CorruptObjectError, text_hash
from store.shared import checking, sync
from store.shared import manifest as manifest_module
from store.shared.heads import PassageHeadError
from store.shared.manifest import ChunkObject, Manifest, RemoteDocument

CS = 64  # chunk size: the head's 100 tokens are two chunks, a passage's 150 three
HEAD = list(range(10_000, 10_100))  # the passages' head (their system prompt)
TEXTS = ["The ferry leaves at nine.", "The museum opens at ten."]
PASSAGES = [list(range(20_000, 20_150)), list(range(30_000, 30_150))]


def long_document(store):
    """The long document both machines hold, with its two passages."""
    doc = store.add_document("h" * 64, "guide.txt", "\n\n".join(TEXTS), type="text")
    store.add_passages(doc.id, [
        SimpleNamespace(index=i, text=t, start=0, end=len(t), page=None, lines=(i + 1, i + 1),
                        heading=(), tokens=150) for i, t in enumerate(TEXTS)])
    return doc


def head_entry(store, levels=LEVELS):
    return put_entry(store, HEAD, levels=levels, chunk_size=CS)


def passage_entry(store, head, doc, i, levels=LEVELS, **kwargs):
    return put_entry(store, HEAD + PASSAGES[i], levels=levels, chunk_size=CS,
                     parent_id=head.id, document_id=doc.id, passage=True,
                     passage_hash=text_hash(TEXTS[i]), **kwargs)


def shared(a, remote_tier, n=1):
    """Machine A's head and `n` passages extending it, pushed."""
    doc, head = long_document(a), head_entry(a)
    children = [passage_entry(a, head, doc, i) for i in range(n)]
    report = sync.push_all(a, remote_tier, FP)
    assert report["failed"] == [] and len(report["pushed"]) == n
    return head, children


def pull_passage(b, remote_tier, doc, i, **kwargs):
    manifest = sync.find(remote_tier, FP, HEAD + PASSAGES[i], longer_than=len(HEAD) + 149)
    return sync.pull(b, remote_tier, manifest, document_id=doc.id,
                     passage_hash=text_hash(TEXTS[i]), **kwargs)


def chunk_bytes(store, entry_id):
    """Every chunk of an entry's chain, in token order: {(start, end, level): bytes}."""
    chain = store.longest_prefix(FP, store.tokens(entry_id), touch=False)
    levels = store.entry(entry_id).levels
    return {(s.token_start, s.token_end, level): store.read_chunk(s.entry_id, s.chunk_index,
                                                                  level)
            for s in chain.spans for level in levels}


def test_a_passage_extending_the_head_travels_and_lands_on_a_head_of_its_own(
        a, b, remote_tier):
    head, (child,) = shared(a, remote_tier)
    manifest = sync.find(remote_tier, FP, HEAD + PASSAGES[0])
    assert (manifest.head_end, manifest.passage, manifest.token_end) == (100, True, 250)
    assert manifest.spans == [(0, 64), (64, 100), (100, 164), (164, 228), (228, 250)]
    assert manifest.prefix_hash == child.prefix_hash  # the key a root passage's has
    raw = remote_tier.get(remote_tier.manifest_key(FP, 250, child.prefix_hash))
    assert b'"version": 7' in raw and b'"head_end": 100' in raw

    doc = long_document(b)
    entry = pull_passage(b, remote_tier, doc, 0)
    here = b.entry(entry.parent_id)
    assert (here.parent_id, here.document_id, here.chat_id, here.passage) == (
        None, None, None, False)
    assert (here.token_start, here.token_end, here.levels) == (0, 100, LEVELS)
    assert (entry.token_start, entry.token_end, entry.passage, entry.document_id,
            entry.passage_hash) == (100, 250, True, doc.id, text_hash(TEXTS[0]))
    assert b.tokens(entry.id) == a.tokens(child.id) == HEAD + PASSAGES[0]
    assert chunk_bytes(b, entry.id) == chunk_bytes(a, child.id)
    assert sorted(e.id for e in b.entries()) == sorted([here.id, entry.id])
    found = b.verify()
    assert (found["corrupt"], found["missing"], found["abandoned"]) == ([], [], [])
    assert list(b.passage_kv(FP)[doc.id].values()) == [entry.id]
    assert b.attaching() == {}
    # Either form there already is the same entry: a push of it is skipped.
    assert sync.push(b, remote_tier, entry).skipped
    assert sync.document_entries(b, FP) == [entry]  # (the head has no document: stays)


def test_a_second_passage_reuses_the_head_held_here(a, b, remote_tier):
    shared(a, remote_tier, n=2)
    doc = long_document(b)
    first = pull_passage(b, remote_tier, doc, 0)
    second = pull_passage(b, remote_tier, doc, 1)
    assert first.parent_id == second.parent_id
    assert [e.token_end for e in b.entries() if e.parent_id is None] == [100]  # one head
    with open_store(b.data_dir.parent / "c") as c:  # a head computed here already: taken
        mine = head_entry(c)
        entry = pull_passage(c, remote_tier, long_document(c), 1)
        assert entry.parent_id == mine.id and len(c.entries()) == 2
        assert chunk_bytes(c, entry.id)[(100, 164, "compact")] == \
            chunk_bytes(b, second.id)[(100, 164, "compact")]


def test_a_head_held_here_without_the_level_asked_for(a, b, remote_tier):
    shared(a, remote_tier)
    doc = long_document(b)
    compact = head_entry(b, levels=("compact",))
    # A head made for the passage would be this one (identical): refused, nothing left.
    with pytest.raises(PassageHeadError, match="without the level"):
        pull_passage(b, remote_tier, doc, 0)
    assert b.entries() == [compact] and b.verify()["abandoned"] == []
    entry = pull_passage(b, remote_tier, doc, 0, levels=["compact"])
    assert entry.parent_id == compact.id and entry.levels == ("compact",)


def test_a_passage_copy_that_fails_keeps_the_head_it_made(a, b, remote_tier, s3_server):
    _, (child,) = shared(a, remote_tier)
    manifest = sync.find(remote_tier, FP, HEAD + PASSAGES[0])
    client = s3_server.client()
    for level in LEVELS:  # (the passage's last chunk gone at every level)
        client.delete_object(Bucket=remote_tier.config.bucket, Key=remote_tier.chunk_key(
            FP, manifest.prefix_hash, level, 4, manifest.chunks[level][4].sha256))
    doc = long_document(b)
    with pytest.raises(sync.NotFoundError):
        pull_passage(b, remote_tier, doc, 0)
    (kept,) = b.entries()
    assert (kept.token_end, kept.document_id, kept.passage) == (100, None, False)
    assert b.verify()["abandoned"] == [] and b.documents() == [doc]


def test_a_local_copy_of_the_passage_names_the_manifest_s_chunks(a, b, remote_tier):
    shared(a, remote_tier)
    manifest = sync.find(remote_tier, FP, HEAD + PASSAGES[0])
    doc = long_document(b)
    with pytest.raises(ValueError, match="head"):
        sync.LocalCopy(b, manifest, document_id=doc.id)  # (no head: not copied so)
    head = head_entry(b)
    copy = sync.LocalCopy(b, manifest, ["compact"], document_id=doc.id, parent_id=head.id)
    assert copy.missing() == [(2, "compact"), (3, "compact"), (4, "compact")]
    assert copy.nbytes == sum(c.nbytes for c in manifest.chunks["compact"][2:])
    copy.add(2, "compact", sync.read_chunk(remote_tier, manifest, 2, "compact"))
    copy.add(0, "compact", b"not this copy's")  # (the head's chunk: ignored)
    assert copy.missing() == [(3, "compact"), (4, "compact")]
    entry, _ = sync.complete(remote_tier, copy)
    assert entry.parent_id == head.id and entry.nbytes == copy.nbytes


def test_a_pulled_passage_never_evicts_its_head(a, b, remote_tier):
    head, (child,) = shared(a, remote_tier)
    doc = long_document(b)
    b.budget_bytes = head.nbytes + child.nbytes  # the chain alone
    evicted: list[dict] = []
    entry = pull_passage(b, remote_tier, doc, 0, evicted=evicted)
    assert evicted == [] and {e.id for e in b.entries()} == {entry.id, entry.parent_id}
    b.budget_bytes = head.nbytes + child.nbytes // 2  # room for the head, not the passage
    b.delete_entry(entry.id)
    entry = pull_passage(b, remote_tier, doc, 0, evicted=evicted)
    assert [(c["entry"], c.get("too_large")) for c in evicted] == [(entry.id, True)]
    assert [e.token_end for e in b.entries()] == [100]  # the head stays


def test_push_refuses_what_cannot_travel_as_one(a, remote_tier):
    doc = long_document(a)
    lean = head_entry(a, levels=("compact",))
    child = passage_entry(a, lean, doc, 0)  # at a level its head lacks
    with pytest.raises(PassageHeadError, match="lacks the level"):
        sync.push(a, remote_tier, child)
    (failed,) = sync.push_all(a, remote_tier, FP)["failed"]
    assert failed["entry"] == child.id and "lacks" in failed["error"]
    a.delete_entry(lean.id)  # (and the passage's extending it)
    head = head_entry(a)
    windowed = passage_entry(a, head, doc, 1, window_start=120)
    with pytest.raises(PassageHeadError, match="window"):
        sync.push(a, remote_tier, windowed)
    # A passage's entry extending a document's, or a chat's entry, never travels.
    root = put_entry(a, HEAD, chunk_size=CS, document_id=doc.id)  # (a document's entry)
    under_doc = passage_entry(a, root, doc, 0)
    assert under_doc.id not in {e.id for e in sync.document_entries(a, FP)}
    with pytest.raises(PassageHeadError, match="not the passages' head"):
        sync.push(a, remote_tier, under_doc)
    assert remote_tier.list_folder(remote_tier.manifest_folder(FP)) == {}


def test_verify_checks_and_repairs_the_head_s_chunks_too(a, b, remote_tier, s3_server):
    _, (child,) = shared(a, remote_tier)
    manifest = sync.find(remote_tier, FP, HEAD + PASSAGES[0])
    client, bucket = s3_server.client(), remote_tier.config.bucket
    keys = [remote_tier.chunk_key(FP, manifest.prefix_hash, "lossless", i,
                                  manifest.chunks["lossless"][i].sha256) for i in (1, 3)]
    for key in keys:  # (a head chunk and a passage chunk gone)
        client.delete_object(Bucket=bucket, Key=key)
    found = checking.check_all(a, remote_tier, FP)
    assert found["checked"] == 1 and found["objects"] == 10
    assert sorted(d["key"] for d in found["damaged"]) == sorted(keys)
    assert checking.check_all(a, remote_tier, FP, repair=True)["repaired"] == 2
    assert checking.check_all(a, remote_tier, FP)["damaged"] == []
    entry = pull_passage(b, remote_tier, long_document(b), 0)  # and another machine's copy
    assert checking.check(b, remote_tier, entry)["damaged"] == []
    # A damaged manifest is written again (version 5) from the chain held here.
    key = remote_tier.manifest_key(FP, 250, child.prefix_hash)
    client.put_object(Bucket=bucket, Key=key, Body=b"{not json")
    assert checking.check(a, remote_tier, child, repair=True)["repaired"] == 1
    assert sync.find(remote_tier, FP, HEAD + PASSAGES[0]).head_end == 100


CALS = [b"KVCL calibration %d, opaque to the store" % i * 10 for i in range(2)]
CAL_IDS = [hashlib.sha256(c).hexdigest() for c in CALS]


def calibrated(a, remote_tier, head_cal=None, cal=CAL_IDS[0]):
    """Machine A's head (of calibration `head_cal`) and a passage of `cal` extending it, pushed
    (a head stored before the model was calibrated, its passage after, by default)."""
    for data in CALS:
        a.put_calibration(FP, data)
    doc = long_document(a)
    head = put_entry(a, HEAD, chunk_size=CS, calibration=head_cal)
    child = passage_entry(a, head, doc, 0, calibration=cal)
    sync.push(a, remote_tier, child)
    return head, child


def test_a_head_and_its_passage_travel_each_with_its_own_calibration(a, b, remote_tier):
    head, child = calibrated(a, remote_tier)
    key = remote_tier.manifest_key(FP, 250, child.prefix_hash)
    raw = remote_tier.get(key)
    assert b'"version": 7' in raw and b'"head_calibration": null' in raw
    manifest = sync.find(remote_tier, FP, HEAD + PASSAGES[0])
    assert (manifest.calibration, manifest.head_calibration) == (CAL_IDS[0], None)
    assert remote_tier.exists(remote_tier.calibration_key(FP, CAL_IDS[0]))
    assert not remote_tier.exists(remote_tier.calibration_key(FP, CAL_IDS[1]))
    entry = pull_passage(b, remote_tier, long_document(b), 0)
    here = b.entry(entry.parent_id)
    assert (here.calibration, entry.calibration) == (None, CAL_IDS[0])
    assert b.calibration(CAL_IDS[0]) == CALS[0] and len(b.calibrations()) == 1
    assert chunk_bytes(b, entry.id) == chunk_bytes(a, child.id)
    assert b.unusable_calibrations() == set()
    assert checking.check(b, remote_tier, entry)["damaged"] == []


def test_a_head_of_another_calibration_lands_with_it_or_on_one_held_here(
        a, b, remote_tier, s3_server):
    head, child = calibrated(a, remote_tier, head_cal=CAL_IDS[1])
    manifest = sync.find(remote_tier, FP, HEAD + PASSAGES[0])
    assert (manifest.calibration, manifest.head_calibration) == tuple(CAL_IDS)
    entry = pull_passage(b, remote_tier, long_document(b), 0)
    assert (b.entry(entry.parent_id).calibration, entry.calibration) == (CAL_IDS[1], CAL_IDS[0])
    assert [b.calibration(i) for i in CAL_IDS] == CALS and b.unusable_calibrations() == set()
    # Verify reads both calibrations back, and puts back the head's from a copy held here.
    found = checking.check(a, remote_tier, child)
    assert (found["objects"], found["damaged"]) == (12, [])
    cal_key = remote_tier.calibration_key(FP, CAL_IDS[1])
    s3_server.client().delete_object(Bucket=remote_tier.config.bucket, Key=cal_key)
    found = checking.check(b, remote_tier, entry, repair=True)
    assert [d["key"] for d in found["damaged"]] == [cal_key] and found["repaired"] == 1
    assert remote_tier.get(cal_key) == CALS[1]
    # A head held here under another calibration serves (each chunk names its own): its
    # calibration only has to be held intact; the manifest's head's is then not fetched.
    where = b.data_dir.parent / "c"
    with open_store(where) as c:
        c.put_calibration(FP, CALS[0])
        mine = put_entry(c, HEAD, chunk_size=CS, calibration=CAL_IDS[0])
        entry = pull_passage(c, remote_tier, long_document(c), 0)
        assert (entry.parent_id, entry.calibration) == (mine.id, CAL_IDS[0])
        assert [r.id for r in c.calibrations()] == [CAL_IDS[0]]
        c.delete_entry(mine.id)  # (and the passage's)
        c.put_calibration(FP, CALS[1] + b"!")  # (another, whose bytes are then damaged)
        mine = put_entry(c, HEAD, chunk_size=CS,
                         calibration=hashlib.sha256(CALS[1] + b"!").hexdigest())
    conn = sqlite3.connect(where / "kvdesk.sqlite")
    conn.execute("UPDATE calibrations SET data = ? WHERE id = ?", (b"X", mine.calibration))
    conn.commit()
    conn.close()
    with open_store(where) as c, pytest.raises(PassageHeadError, match="cannot read"):
        pull_passage(c, remote_tier, c.documents()[0], 0)
    assert checking.status(b, remote_tier, FP) == {
        "reachable": True, "local_entries": 1, "remote_entries": 1, "only_local": 0,
        "only_remote": 0, "damaged": []}


def test_pull_all_leaves_passages_extending_the_head(a, b, remote_tier):
    shared(a, remote_tier, n=2)
    report = sync.pull_all(b, remote_tier, FP)
    assert (report["pulled"], report["passages_left"], report["failed"]) == ([], 2, [])
    assert b.entries() == []


def test_a_root_passage_s_entry_travels_as_before(a, b, remote_tier):
    doc = long_document(a)
    root = put_entry(a, HEAD + PASSAGES[0], chunk_size=CS, document_id=doc.id, passage=True,
                     passage_hash=text_hash(TEXTS[0]))
    sync.push_all(a, remote_tier, FP)
    raw = remote_tier.get(remote_tier.manifest_key(FP, 250, root.prefix_hash))
    assert b'"version": 7' in raw and b"head_end" not in raw
    entry = pull_passage(b, remote_tier, long_document(b), 0)
    assert (entry.parent_id, entry.token_start, entry.passage) == (None, 0, True)
    assert chunk_bytes(b, entry.id) == chunk_bytes(a, root.id) and len(b.entries()) == 1
    # The chain of the same tokens is that entry already: skipped.
    with open_store(a.data_dir.parent / "c") as c:
        chain = passage_entry(c, head_entry(c), long_document(c), 0)
        assert sync.push(c, remote_tier, chain).skipped


MANIFEST = Manifest(
    fingerprint=FP, tokens=tuple(range(300)), chunk_size=256, levels=("high",),
    chunks={"high": (ChunkObject(10, "a" * 64), ChunkObject(5, "b" * 64))},
    document=RemoteDocument("h", "T", "text", 300, "text"), created=1.0)


FIXTURES = Path(__file__).parent / "fixtures"
OBJECTS = tuple(ChunkObject(i + 1, f"{i:x}" * 64) for i in range(3))
CHAINED = replace(MANIFEST, passage=True, head_end=260, chunks={"high": OBJECTS},
                  document=RemoteDocument("", "T", "passage", None, ""),
                  calibration="d" * 64, head_calibration="d" * 64)
# What the kvdesk of each version wrote for these (tests/fixtures/manifests, frozen): read
# as they were meant, and what this one writes for the same, version 7, reads the same.
WRITTEN_BEFORE = {
    "v2-document": MANIFEST,
    "v3-window": replace(MANIFEST, window_start=44, chunks={"high": (
        *MANIFEST.chunks["high"], ChunkObject(7, "c" * 64))}),
    "v4-passage": replace(MANIFEST, passage=True, calibration="d" * 64,
                          document=RemoteDocument("", "T", "passage", None, "")),
    "v5-head": CHAINED,
    "v6-head-calibration": replace(CHAINED, head_calibration="e" * 64),
}


@pytest.mark.parametrize("name", WRITTEN_BEFORE)
def test_manifests_of_every_earlier_version_are_read_as_written(name):
    data = (FIXTURES / "manifests" / f"{name}.json").read_bytes()
    assert json.loads(data)["version"] == int(name[1])
    assert Manifest.from_json(data, key="k", fingerprint=FP) == WRITTEN_BEFORE[name]
    now = WRITTEN_BEFORE[name].to_json()
    assert json.loads(now)["version"] == 7
    assert Manifest.from_json(now, key="k", fingerprint=FP) == WRITTEN_BEFORE[name]


def test_every_manifest_written_now_is_refused_by_the_kvdesk_before(monkeypatch):
    """(Its chunks are blobs that kvdesk cannot decode: it computes the entry itself.)"""
    monkeypatch.setattr(manifest_module, "VERSION", 6)
    for m in WRITTEN_BEFORE.values():
        with pytest.raises(CorruptObjectError, match="version 7 is newer"):
            Manifest.from_json(m.to_json(), key="k", fingerprint=FP)


def test_a_manifest_with_a_head_is_checked_and_refused_by_older_readers(monkeypatch):
    objects = tuple(ChunkObject(i + 1, f"{i:x}" * 64) for i in range(3))
    chained = replace(MANIFEST, passage=True, head_end=260, chunks={"high": objects},
                      document=RemoteDocument("", "T", "passage", None, ""))
    assert chained.spans == [(0, 256), (256, 260), (260, 300)]  # the head's grid, then its own
    data = chained.to_json()
    key = "p/manifests/x.json"
    assert Manifest.from_json(data, key=key, fingerprint=FP) == chained
    for bad, why in [(dict(head_end=0), "head ending at token 0"),
                     (dict(head_end=300), "head ending at token 300"),
                     (dict(head_end=-3), "head ending"),
                     (dict(passage=False), "head ending"),
                     (dict(window_start=50), "head ending"),
                     (dict(chunks={"high": objects[:2]}), "3 chunks"),
                     (dict(head_end=200), "2 chunks")]:  # (the head's grid is another)
        with pytest.raises(CorruptObjectError, match=why):
            Manifest.from_json(replace(chained, **bad).to_json(), key=key, fingerprint=FP)
    monkeypatch.setattr(manifest_module, "VERSION", 4)  # a kvdesk before this one
    with pytest.raises(CorruptObjectError, match="newer than this kvdesk understands"):
        Manifest.from_json(data, key=key, fingerprint=FP)


def test_a_head_of_another_calibration_is_named(monkeypatch):
    objects = tuple(ChunkObject(i + 1, f"{i:x}" * 64) for i in range(3))
    chained = replace(MANIFEST, passage=True, head_end=260, chunks={"high": objects},
                      document=RemoteDocument("", "T", "passage", None, ""),
                      calibration="d" * 64, head_calibration="d" * 64)
    # The head's calibration the entry's: not named, the head's read as the entry's.
    assert b"head_calibration" not in chained.to_json()
    key = "p/manifests/x.json"
    assert Manifest.from_json(chained.to_json(), key=key, fingerprint=FP) == chained
    for head_cal in (None, "e" * 64):
        other = replace(chained, head_calibration=head_cal)
        data = other.to_json()
        assert b'"head_calibration": ' in data
        assert Manifest.from_json(data, key=key, fingerprint=FP) == other
        assert other.calibrations == (("d" * 64,) if head_cal is None else ("d" * 64, head_cal))
    for bad in ("E" * 64, "e" * 63, 7, ["e" * 64]):
        with pytest.raises(CorruptObjectError, match="head's calibration"):
            Manifest.from_json(replace(chained, head_calibration=bad).to_json(), key=key,
                               fingerprint=FP)
    six = json.loads((FIXTURES / "manifests" / "v6-head-calibration.json").read_bytes())
    del six["checksum"], six["head_calibration"]  # (version 6 always names it)
    with pytest.raises(CorruptObjectError, match="malformed"):
        Manifest.from_json(json.dumps({**six, "checksum": manifest_module._checksum(six)}),
                           key=key, fingerprint=FP)
    body = json.loads(replace(chained, head_calibration="e" * 64).to_json())
    del body["checksum"], body["head_end"]  # (a head's calibration, and no head)
    with pytest.raises(CorruptObjectError, match="head's calibration"):
        Manifest.from_json(json.dumps({**body, "checksum": manifest_module._checksum(body)}),
                           key=key, fingerprint=FP)
    monkeypatch.setattr(manifest_module, "VERSION", 5)  # a kvdesk before version 6
    with pytest.raises(CorruptObjectError, match="version 7 is newer"):
        Manifest.from_json(replace(chained, head_calibration=None).to_json(), key=key,
                           fingerprint=FP)
