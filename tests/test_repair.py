"""`verify --repair` on the real default model: chunks whose rows (or span rows) were deleted are
recomputed, an entry whose codec calibration was damaged is encoded again, another model's
chunks that cannot be recomputed are dropped; afterwards nothing is reported and questions read
the cache."""

from __future__ import annotations

import sqlite3

import pytest

from codec.calibrated.calibration import fitted
from codec.format.levels import levels
from desktop_app.engine import Engine
from desktop_app.model.kvstate import in_position_order
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from store import Store

pytestmark = pytest.mark.model

DOC = """The lighthouse at Cape Morrow was built in 1871 from granite quarried on the island.
Its lamp burned whale oil until 1902, then kerosene, and it was electrified in 1938.
The keeper's cottage became a museum in 1979. The tower is 31 metres tall and its light
can be seen 40 kilometres out to sea."""
OTHER = """The orchard behind the mill has forty apple trees and six pear trees. They were
planted in 1952 by the miller's daughter, who kept bees among them until 1990."""


def make_engine(data_dir, model_path, model_hash, **options) -> Engine:
    return Engine(Store(data_dir), lambda: Runtime(model_path, model_hash=model_hash,
                                                   n_ctx=1024),
                  chunk_tokens=64, levels=("balanced", "compact"), **options)


@pytest.fixture
def engine(tmp_path, model_path, model_hash):
    eng = make_engine(tmp_path / "data", model_path, model_hash)
    yield eng
    eng.close()
    eng.store.close()


def ask(eng: Engine, doc_id: int, level: str):
    return eng.ask("When was it built?", doc_ids=[doc_id], restore=RestoreOptions(level=level),
                   generation=GenerationOptions(max_tokens=2, temperature=0))


def sql(eng: Engine, statement: str, *args) -> None:
    """Change the database behind the store's back (as a careless tool would, but with
    foreign keys on: a span's chunks go with it)."""
    with sqlite3.connect(eng.store.path) as db:
        db.execute("PRAGMA foreign_keys = ON")
        db.execute(statement, args)


def test_deleted_chunk_rows_are_reported_and_recomputed(engine, tmp_path):
    (tmp_path / "doc.txt").write_text(DOC)
    doc_id = engine.attach(tmp_path / "doc.txt").doc_id
    entry = engine.store.document_entry(doc_id, engine.fingerprint)
    assert entry.n_chunks >= 2
    # Another model's entry, whose missing chunk nothing here can recompute.
    engine.store.register_model("other-model", "/other.gguf", {})
    with engine.store.write_entry("other-model", range(100), levels=("balanced", "compact"),
                                  chunk_size=64) as writer:
        for span in writer.spans:
            for level in ("balanced", "compact"):
                writer.put_chunk(span.chunk_index, level, b"other model's bytes")
    other = writer.entry
    for entry_id, chunk, level in [(entry.id, 1, "balanced"), (entry.id, 0, "compact"),
                                   (other.id, 1, "compact")]:
        sql(engine, "DELETE FROM kv_chunks WHERE entry_id = ? AND chunk_index = ? AND"
            " level = ?", entry_id, chunk, level)
    # The last chunk's span row, and with it (foreign keys on) its chunks at every level.
    last = entry.n_chunks - 1
    sql(engine, "DELETE FROM kv_spans WHERE entry_id = ? AND chunk_index = ?", entry.id, last)

    report = engine.store.verify()
    lost = [(entry.id, 0, "compact"), (entry.id, 1, "balanced"), (entry.id, last, "balanced"),
            (entry.id, last, "compact")]
    assert report["corrupt"] == [] and report["missing"] == [
        {"entry": e, "chunk": c, "level": lvl} for e, c, lvl in [*sorted(set(lost)),
                                                                (other.id, 1, "compact")]]
    assert engine.documents()[0].damaged_chunks == len(set(lost))

    fixed = engine.repair()
    assert fixed["repaired"] == [{"entry": e, "chunk": c, "level": lvl}
                                 for e, c, lvl in sorted(set(lost))]
    assert fixed["dropped"] == [{"entry": other.id, "level": "compact"}]
    assert fixed["deleted_entries"] == [] and engine.store.entry(other.id).levels == (
        "balanced",)
    after = engine.store.verify()
    assert (after["corrupt"], after["missing"]) == ([], [])
    assert engine.documents()[0].damaged_chunks == 0
    for level in ("balanced", "compact"):
        engine.runtime.reset()
        res = ask(engine, doc_id, level)
        assert res.recomputed_tokens == 0 and set(res.chunk_levels) == {level}


def calibrate_quickly(engine: Engine, tmp_path):
    """A calibration of the engine's model with one level, fitted on a document's own KV (a
    real calibration takes minutes), adopted: new caches are encoded with it. (The id of the
    document attached for it, the calibration.)"""
    (tmp_path / "other.txt").write_text(OTHER)
    first = engine.attach(tmp_path / "other.txt", levels=["balanced"]).doc_id
    rt = engine.runtime
    rt.reset()
    rt.prefill(engine.prefix_tokens([first]))
    kv = in_position_order(rt.capture().sections[0])
    rt.reset()
    cal = fitted(kv.keys, kv.values, levels()["balanced"], "balanced", 64,
                 {"fingerprint": engine.fingerprint})
    engine.calibrations.adopt(cal)
    return first, cal


def test_an_entry_whose_calibration_was_damaged_is_encoded_again(engine, tmp_path):
    first, cal = calibrate_quickly(engine, tmp_path)
    (tmp_path / "doc.txt").write_text(DOC)
    doc_id = engine.attach(tmp_path / "doc.txt", levels=["balanced"]).doc_id
    entry = engine.store.document_entry(doc_id, engine.fingerprint)
    assert entry.calibration == cal.id
    assert ask(engine, doc_id, "balanced").recomputed_tokens == 0
    # The chat's own entry (question and answer) was encoded with it too.
    needing = [e.id for e in engine.store.entries() if e.calibration == cal.id]
    assert len(needing) == 2 and entry.id in needing

    sql(engine, "UPDATE calibrations SET data = ? WHERE id = ?", b"rotten", cal.id)
    states = {c["id"]: c for c in engine.store.verify()["calibrations"]}
    assert states[cal.id]["state"] == "damaged" and states[cal.id]["entries"] == 2
    damaged = {d.doc_id: d.damaged_chunks for d in engine.documents()}
    assert damaged == {first: 0, doc_id: entry.n_chunks}

    fixed = engine.repair()
    # The model has no other calibration: the entry now uses the model-independent level.
    assert fixed["reencoded"] == [{"entry": i, "calibration": None} for i in sorted(needing)]
    assert fixed["removed_calibrations"] == [cal.id] and fixed["dropped"] == []
    assert all(engine.store.entry(i).calibration is None for i in needing)
    report = engine.store.verify()
    assert report["calibrations"] == [] and report["corrupt"] == report["missing"] == []
    assert {d.doc_id: d.damaged_chunks for d in engine.documents()} == {first: 0, doc_id: 0}
    engine.runtime.reset()
    res = ask(engine, doc_id, "balanced")
    assert res.recomputed_tokens == 0 and set(res.chunk_levels) == {"balanced"}


def test_a_calibration_the_shared_cache_holds_is_fetched_again(tmp_path, model_path,
                                                               model_hash, remote_tier):
    eng = make_engine(tmp_path / "data", model_path, model_hash, remote=remote_tier,
                      auto_push=True)
    try:
        _, cal = calibrate_quickly(eng, tmp_path)
        (tmp_path / "doc.txt").write_text(DOC)
        res = eng.attach(tmp_path / "doc.txt", levels=["balanced"])
        assert res.pushed  # with the calibration its chunks need
        entry = eng.store.document_entry(res.doc_id, eng.fingerprint)
        stored = {c: eng.store.read_chunk(entry.id, c, "balanced") for c in
                  range(entry.n_chunks)}
        sql(eng, "DELETE FROM calibrations WHERE id = ?", cal.id)
        assert eng.store.unusable_calibrations() == {cal.id}
        fixed = eng.repair()
        assert fixed["recovered_calibrations"] == [cal.id] and fixed["reencoded"] == []
        assert eng.store.verify()["calibrations"][0]["state"] == "ok"
        # The very bytes that were there: nothing was encoded again.
        assert {c: eng.store.read_chunk(entry.id, c, "balanced") for c in stored} == stored
        eng.runtime.reset()
        again = ask(eng, res.doc_id, "balanced")
        assert again.recomputed_tokens == 0 and set(again.chunk_levels) == {"balanced"}
    finally:
        eng.close()
        eng.store.close()
