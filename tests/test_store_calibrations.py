"""Codec calibrations in the store: content-addressed, checked on read, kept while an entry
needs them, and carried by the shared tier with the chunks that need them."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest
from test_remote_store import TOKENS, attached, bucket_keys
from test_store_helpers import FP, LEVELS, open_store, payload

from store import NotFoundError, StoreError
from store.shared import sync
from store.shared.manifest import Manifest

CAL = b"KVCL calibration bytes, opaque to the store" * 10
CAL_ID = hashlib.sha256(CAL).hexdigest()


def test_calibrations_are_content_addressed_and_listed_by_model(tmp_path):
    with open_store(tmp_path) as store:
        assert store.put_calibration(FP, CAL, {"levels": 3}) == CAL_ID
        assert store.put_calibration(FP, CAL) == CAL_ID  # the same bytes: stored once
        newer = store.put_calibration(FP, CAL + b"!")
        store.put_calibration("model-b", b"other")
        assert store.calibration(CAL_ID) == CAL
        assert [r.id for r in store.calibrations(FP)] == [newer, CAL_ID]
        assert store.calibrations(FP)[1].meta == {"levels": 3}
        assert store.calibrations(FP)[1].nbytes == len(CAL)
        assert len(store.calibrations()) == 3
        with pytest.raises(NotFoundError):
            store.calibration("0" * 64)


def test_a_corrupt_calibration_is_refused(tmp_path):
    with open_store(tmp_path) as store:
        store.put_calibration(FP, CAL)
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    conn.execute("UPDATE calibrations SET data = ?", (b"X" + CAL[1:],))
    conn.commit()
    conn.close()
    with open_store(tmp_path) as store, pytest.raises(StoreError, match="corrupt"):
        store.calibration(CAL_ID)


def test_an_entry_names_its_calibration_which_stays_while_needed(tmp_path):
    with open_store(tmp_path) as store:
        store.put_calibration(FP, CAL)
        with store.write_entry(FP, range(300), levels=LEVELS, calibration=CAL_ID) as w:
            for span in w.spans:
                for level in LEVELS:
                    w.put_chunk(span.chunk_index, level, payload(span.token_start,
                                                                 span.token_end, level))
        assert store.entry(w.entry.id).calibration == CAL_ID
        with pytest.raises(StoreError, match="needed by 1"):
            store.delete_calibration(CAL_ID)
        store.delete_entry(w.entry.id)
        store.delete_calibration(CAL_ID)
        assert store.calibrations() == []


def with_calibration(store):
    store.put_calibration(FP, CAL)
    doc = store.add_document("hash-cal", "cal.md", "text", type="markdown", n_tokens=600)
    with store.write_entry(FP, TOKENS, levels=LEVELS, document_id=doc.id,
                           calibration=CAL_ID) as writer:
        for span in writer.spans:
            for level in LEVELS:
                writer.put_chunk(span.chunk_index, level,
                                 payload(span.token_start, span.token_end, level))
    return writer.entry


def test_push_carries_the_calibration_and_pull_fetches_it(tmp_path, remote_tier, s3_server):
    a, b = open_store(tmp_path / "a"), open_store(tmp_path / "b")
    entry = with_calibration(a)
    sync.push(a, remote_tier, entry)
    keys = bucket_keys(s3_server, remote_tier)
    assert f"{remote_tier.prefix}/calibrations/{FP}/{CAL_ID}" in keys
    (manifest_key,) = [k for k in keys if "/manifests/" in k]
    manifest = Manifest.from_json(remote_tier.get(manifest_key), key=manifest_key,
                                  fingerprint=FP)
    assert manifest.calibration == CAL_ID
    pulled = sync.pull(b, remote_tier, manifest)
    assert pulled.calibration == CAL_ID and b.calibration(CAL_ID) == CAL
    assert [r.model for r in b.calibrations()] == [FP]
    a.close()
    b.close()


def test_an_entry_without_calibration_travels_as_before(tmp_path, remote_tier, s3_server):
    a, b = open_store(tmp_path / "a"), open_store(tmp_path / "b")
    sync.push(a, remote_tier, attached(a))
    assert not [k for k in bucket_keys(s3_server, remote_tier) if "/calibrations/" in k]
    (manifest,) = [sync.read_manifest(remote_tier, FP, e, h)
                   for e, h in sync.remote_index(remote_tier, FP)]
    assert manifest.calibration is None and sync.fetch_calibration(b, remote_tier, manifest) is None
    a.close()
    b.close()


def test_a_calibration_corrupted_in_the_bucket_is_refused(tmp_path, remote_tier, s3_server):
    a, b = open_store(tmp_path / "a"), open_store(tmp_path / "b")
    sync.push(a, remote_tier, with_calibration(a))
    s3_server.client().put_object(Bucket=remote_tier.config.bucket,
                                  Key=remote_tier.calibration_key(FP, CAL_ID), Body=b"junk")
    (manifest,) = [sync.read_manifest(remote_tier, FP, e, h)
                   for e, h in sync.remote_index(remote_tier, FP)]
    with pytest.raises(sync.CorruptObjectError):
        sync.pull(b, remote_tier, manifest)
    assert b.calibrations() == [] and b.entries() == []
    a.close()
    b.close()
