"""Per-model calibration on the real default model with tiny settings: three levels with their
measurements, progress and cancellation, a stored calibration that round-trips and is refused
under another model, and a contract check that catches a deliberately broken level."""

from __future__ import annotations

import pydoc_data.topics
import threading
import time

import numpy as np
import pytest

import codec
from desktop_app.calibration import calibrate, calibrations, quality, runs, steps
from desktop_app.model.runtime import Cancelled
from store import Store

pytestmark = pytest.mark.model

TINY = calibrate.Settings(prefix_tokens=96, cont_tokens=24, iterations=2)
FP = "fp-of-the-default-model"
TEXT = "\n\n".join(pydoc_data.topics.topics[k] for k in ("if", "while", "for", "try", "with"))


@pytest.fixture(scope="module")
def calibrated(model_path):
    stages, pauses = [], []
    cal = calibrate.calibrate(model_path, fingerprint=FP, settings=TINY,
                              progress=lambda stage, f: stages.append((stage, f)),
                              pause=lambda: pauses.append(stages[-1][0] if stages else None))
    return cal, stages, pauses


def test_calibration_makes_every_level_and_says_how_far_it_is(calibrated):
    cal, stages, _ = calibrated
    assert cal.level_names == list(calibrate.LEVELS)
    fractions = [f for _, f in stages]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert {"reference", "sensitivity", "high", "compact", "done"} <= {s for s, _ in stages}
    meta = cal.meta
    assert meta["fingerprint"] == FP and meta["variant"] in TINY.variants
    assert meta["q8_0"]["bits_per_element"] == 8.5 and meta["fp16-ulp"]["kld"] > 0
    scales = [meta["levels"][name]["scale"] for name in calibrate.LEVELS]
    assert 0 < scales[0] <= scales[1] <= scales[2]  # a better level never gets coarser steps
    assert all(meta["levels"][name]["bits_per_element"] > 0 for name in calibrate.LEVELS)
    for part in cal.parts:  # every layer has its own bins, within the codec's range
        for name in calibrate.LEVELS:
            bins = part.levels[name]["keys"]["bins"]
            assert len(bins) == part.n_layer and all(4 <= b <= 128 for b in bins)


def test_a_stored_calibration_round_trips_and_is_refused_under_another_model(calibrated,
                                                                             tmp_path):
    cal, _, _ = calibrated
    with Store(tmp_path) as store:
        assert calibrations.save(store, cal) == cal.id
        again = calibrations.latest(store, FP)
        assert again.id == cal.id and again.to_bytes() == cal.to_bytes()
        assert calibrations.latest(store, "another-model") is None
        part = again.parts[0]
        rng = np.random.default_rng(0)
        keys, values = (rng.standard_normal((part.n_layer, 40, part.channels)).astype(np.float16)
                        for _ in range(2))
        blob = codec.encode(keys, values, "high", calibration=again)
        codec.decode(blob, calibrations=calibrations.Resolver(store, FP))
        with pytest.raises(codec.CalibrationMissing, match=cal.id[:12]):
            codec.decode(blob, calibrations=calibrations.Resolver(store, "another-model"))


def test_calibration_pauses_between_its_steps(calibrated):
    """Beside a server's or the window's questions it waits (`pause`) at each layer of the
    sensitivity pass and each step of the levels' search, not only between stages."""
    _, _, pauses = calibrated
    assert pauses.count("sensitivity") >= 2 * min(part.n_layer for part in calibrated[0].parts)
    assert all(pauses.count(level) >= 2 for level in calibrate.LEVELS)


def test_calibration_stops_when_cancelled(model_path):
    stop = threading.Event()

    def progress(stage, _):
        if stage == "sensitivity":
            stop.set()

    with pytest.raises(Cancelled):
        calibrate.calibrate(model_path, fingerprint=FP, settings=TINY, progress=progress,
                            cancel=stop)


def test_a_calibration_stopped_goes_on_where_it_was_and_comes_out_the_same(
        model_path, calibrated, tmp_path, monkeypatch):
    """What a stopped run measured is kept in the store as it goes (a window closed, a server
    stopped, a kill): the next run, in another process, reads it back instead of running the
    model again, and ends with the calibration an unstopped run makes."""
    probes = []
    measure_state = quality.Evaluator.measure_state
    monkeypatch.setattr(quality.Evaluator, "measure_state", lambda ev, name, *a, **k: (
        probes.append(name), measure_state(ev, name, *a, **k))[1])
    stop = threading.Event()
    with Store(tmp_path) as store:
        with pytest.raises(Cancelled):
            calibrate.calibrate(model_path, fingerprint=FP, settings=TINY, cancel=stop,
                                keep=steps.KeptSteps(store, FP),
                                progress=lambda stage, _: stage == "balanced" and stop.set())
        first = len(probes)
        assert probes.count("probe") > 0 and "high" in probes
        probes.clear()
        again = steps.KeptSteps(store, FP)  # as the next process finds them
        said = []
        cal = calibrate.calibrate(model_path, fingerprint=FP, settings=TINY, keep=again,
                                  progress=lambda stage, _: said.append(again.note))
        assert "probe" not in probes and "high" not in probes  # all read back
        assert again.resumed > 0 and said[0] == (  # and the user is told so from its start
            f"going on from the stopped calibration: {again.resumed} of its measurements are "
            "kept (the model's own cache is measured again)")
        assert 0 < len(probes) < first
        unstopped = calibrated[0]
        assert [p.levels for p in cal.parts] == [p.levels for p in unstopped.parts]
        assert cal.meta["levels"] == unstopped.meta["levels"]
        # Another run (other settings) starts afresh; a finished one's steps are dropped.
        other = steps.KeptSteps(store, FP)
        other.begin(steps.run_key(FP, calibrate.Settings(), calibrate.calibration_text()))
        assert other.get("q8_0") is None and other.note == ""
        again.clear()
        assert store.setting(steps.SETTING + FP) is None


def until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_second_process_waits_for_the_models_calibration_and_takes_its_result(
        calibrated, tmp_path, monkeypatch):
    """The window and `kvdesk serve` both calibrate a new model by themselves: the second
    waits for the first (said) and measures nothing."""
    made, measured, release = calibrated[0], [], threading.Event()

    def measure(model_path, *, fingerprint, **_):
        measured.append(fingerprint)
        release.wait(30)
        return made

    monkeypatch.setattr(calibrate, "calibrate", measure)
    results, said = {}, []
    with Store(tmp_path) as one, Store(tmp_path) as two:  # two processes' stores
        first = threading.Thread(target=lambda: results.update(first=runs.calibrate_once(
            one, calibrations.Calibrations(one), "model.gguf", FP)))
        first.start()
        until(lambda: measured)
        second = threading.Thread(target=lambda: results.update(second=runs.calibrate_once(
            two, calibrations.Calibrations(two), "model.gguf", FP, progress=said.append)))
        second.start()
        until(lambda: said or len(measured) > 1)
        release.set()
        first.join(30)
        second.join(30)
    assert measured == [FP]  # once
    assert results["second"].to_bytes() == made.to_bytes()
    assert said[0].title == "waiting" and said[0].note == runs.WAITING
    # one stored between a process's own look and its turn: taken, though it never waited
    with Store(tmp_path / "b") as three, Store(tmp_path / "b") as four:
        late = calibrations.Calibrations(three)
        assert late.current(FP) is None
        calibrations.Calibrations(four).adopt(made)
        assert runs.calibrate_once(three, late, "model.gguf", FP).to_bytes() == made.to_bytes()
    assert measured == [FP]


def test_a_cancel_reaches_the_reference_prefill(model_path):
    # The reference stage prefills the text twice (f16, q8_0): a server stopping during it
    # must not wait for both (~25 s on two cores with the product's settings).
    stop = threading.Event()
    with pytest.raises(Cancelled, match="stopped after 0 of"):
        calibrate.calibrate(model_path, fingerprint=FP, settings=TINY, cancel=stop,
                            progress=lambda stage, _: stop.set())


def test_the_contract_check_catches_a_broken_level(model_path, calibrated):
    cal, _, _ = calibrated
    crude = {"scale": "layer", "bins": [4], "layer_edges": []}
    part = cal.parts[0]
    broken_levels = {**part.levels, "high": {**part.levels["high"], "keys": crude,
                                             "values": crude}}
    broken = codec.Calibration((codec.Part(part.n_layer, part.channels, part.keys, part.values,
                                           broken_levels),), cal.meta)
    report = quality.evaluate(model_path, TEXT, prefix_tokens=96, cont_tokens=24,
                              greedy_tokens=0, configs=[quality.FLOOR, "q8_0", "high"],
                              calibration=broken)
    verdict = report["contracts"]["high"]
    assert report["calibration"] == broken.id and verdict["met"] is False
    assert verdict["value"] > 5 * verdict["target"]


def test_contract_verdicts_follow_the_q8_0_and_floor_rows():
    rows = [{"config": "q8_0", "kld": 0.004, "top1": 0.97},
            {"config": quality.FLOOR, "kld": 0.003, "top1": 0.97},
            {"config": "high", "kld": 0.0069, "top1": 0.9},
            {"config": "balanced", "kld": 0.05, "top1": 0.94},
            {"config": "compact", "kld": 0.2, "top1": 0.88}]
    verdicts = quality.contracts(rows)
    assert {k: v["met"] for k, v in verdicts.items()} == {"high": True, "balanced": True,
                                                           "compact": False}
    assert verdicts["high"]["target"] == pytest.approx(0.007)
    assert quality.contracts(rows[2:]) == {}  # no reference rows: no verdict


def test_the_engine_encodes_new_caches_with_the_models_calibration(calibrated, model_path,
                                                                   model_hash, tmp_path):
    """Before a calibration: model-independent levels, said. After: new entries name it and
    restore through it, also in a fresh engine (a restart); a chunk whose calibration is
    damaged is refused and recomputed, never decoded with the wrong transforms."""
    import sqlite3

    from desktop_app.engine import Engine
    from desktop_app.model.runtime import Runtime
    from desktop_app.options import GenerationOptions, RestoreOptions

    def engine():
        return Engine(Store(tmp_path / "data"), lambda: Runtime(
            model_path, model_hash=model_hash, n_ctx=1024), chunk_tokens=64)

    (tmp_path / "a.txt").write_text(TEXT[:1500])
    (tmp_path / "b.txt").write_text(TEXT[1500:3000])
    eng = engine()
    try:
        assert eng.calibration() is None
        assert eng.attach(tmp_path / "a.txt").calibration is None
        cal, _, _ = calibrated  # the same model's, for this engine's fingerprint
        cal = codec.Calibration(cal.parts, {**cal.meta, "fingerprint": eng.fingerprint})
        assert eng.calibrations.adopt(cal) == cal.id
        assert eng.calibration().id == cal.id and eng.calibration().levels["high"]["kld"] > 0
        doc = eng.attach(tmp_path / "b.txt")
        assert doc.calibration == cal.id
        entry = eng.store.document_entry(doc.doc_id, eng.fingerprint)
        assert entry.calibration == cal.id
    finally:
        eng.close()
        eng.store.close()

    def ask(eng, level):
        return eng.ask("What does the text describe?", doc_ids=[doc.doc_id],
                       restore=RestoreOptions(level=level),
                       generation=GenerationOptions(max_tokens=4, temperature=0))

    eng = engine()  # a restart: the calibration comes from the store
    try:
        assert eng.calibration().id == cal.id
        res = ask(eng, "high")
        assert res.recomputed_tokens == 0 and set(res.chunk_levels) == {"high"}
    finally:
        eng.close()
        eng.store.close()
    with sqlite3.connect(tmp_path / "data" / "kvdesk.sqlite") as db:
        db.execute("UPDATE calibrations SET data = ? WHERE id = ?",
                   (b"not a calibration", cal.id))
    eng = engine()
    try:
        assert eng.calibration() is None  # the damaged one is never used
        res = ask(eng, "high")
        assert res.recomputed_tokens > 0 and set(res.chunk_levels) == {"text"}
        assert any("calibration" in m and cal.id[:12] in m for m in res.messages)
    finally:
        eng.close()
        eng.store.close()


def test_a_calibration_on_two_registers_holds_each_level_on_both(model_path):
    settings = calibrate.Settings(prefix_tokens=96, cont_tokens=24, iterations=3,
                                  registers=("calibration-structured.txt",),
                                  register_prefix_tokens=64)
    cal = calibrate.calibrate(model_path, fingerprint=FP, settings=settings)
    other = cal.meta["registers"]["calibration-structured.txt"]
    assert other["tokens"] == [64, 24] and set(other["targets"]) == set(calibrate.LEVELS)
    for name in calibrate.LEVELS:
        row = cal.meta["levels"][name]
        got = row["registers"]["calibration-structured.txt"]
        if row["met"] and "kld_goal" not in row:
            goal = row["register_goals"]["calibration-structured.txt"]
            assert got["kld"] <= goal if name == "high" else got["top1"] >= goal
    # the stored summary reads as before
    assert set(calibrations.summary(cal)["levels"]["high"]) == {"bits_per_element", "kld",
                                                                "top1"}


def test_the_engines_calibration_waits_at_each_step_while_a_question_is_answered(
        tmp_path, model_path, model_hash, calibrated, monkeypatch):
    """Engine.calibrate hands its steps the chat lock's wait: a step waits while a question
    holds the chat context, goes on once it is answered, and a cancel ends the wait."""
    from desktop_app.engine import Engine
    from desktop_app.model.runtime import Runtime

    stepped, done = [], threading.Event()

    def steps(path, *, fingerprint, cancel, pause, progress, keep):
        for i in range(2):
            pause()
            stepped.append(i)
        return codec.Calibration(calibrated[0].parts,
                                 {**calibrated[0].meta, "fingerprint": fingerprint})

    monkeypatch.setattr(calibrate, "calibrate", steps)
    eng = Engine(Store(tmp_path / "data"), lambda: Runtime(
        model_path, model_hash=model_hash, n_ctx=512), chunk_tokens=64)
    try:
        assert eng.runtime is not None  # (loaded before the question holds the lock)
        answering, answered = threading.Event(), threading.Event()

        def question():
            with eng.session.lock:
                answering.set()
                answered.wait(10)

        asker = threading.Thread(target=question)
        asker.start()
        answering.wait(10)
        calibrating = threading.Thread(target=lambda: (eng.calibrate(), done.set()))
        calibrating.start()
        calibrating.join(0.5)
        assert stepped == [] and not done.is_set()  # waiting at its first step
        answered.set()
        calibrating.join(10)
        assert stepped == [0, 1] and done.is_set()
        assert eng.calibration() is not None  # adopted
        asker.join()
        # A cancel ends a wait the question would make long
        stepped.clear()
        cancel, answered = threading.Event(), threading.Event()
        asker = threading.Thread(target=question)
        answering.clear()
        asker.start()
        answering.wait(10)
        calibrating = threading.Thread(target=lambda: eng.calibrate(cancel=cancel))
        calibrating.start()
        calibrating.join(0.3)
        assert stepped == []
        cancel.set()
        calibrating.join(10)
        assert not calibrating.is_alive() and stepped == [0, 1]
        answered.set()
        asker.join()
    finally:
        eng.close()
        eng.store.close()


def test_steps_a_store_cannot_keep_leave_the_calibration_going():
    """A read-only or full data directory keeps no steps: the calibration goes on without
    them (a resume is only a saving), and says so once."""
    from types import SimpleNamespace

    from store import ReadOnlyError

    def refuse(key, value):
        raise ReadOnlyError("the data directory is read-only")

    kept = steps.KeptSteps(SimpleNamespace(setting=lambda key: None, set_setting=refuse), FP)
    kept.begin("run")
    kept.put("q8_0", {"kld": 0.004})
    kept.put("fp16-ulp", {"kld": 0.003})  # (not tried again)
    assert kept.get("q8_0") == {"kld": 0.004} and kept.run is None
