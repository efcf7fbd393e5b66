"""A document cached at the model-independent levels before its model was calibrated: `docs`
says which levels its cache uses, and the calibration computes it again from its text at the
calibrated levels (probe 120: it kept the model-independent ones for good, unsaid)."""

from __future__ import annotations

import pydoc_data.topics

import pytest

import codec
from codec.calibrated.calibration import fitted
from codec.format.levels import levels
from desktop_app.cli.listings import level_words
from desktop_app.engine import Engine
from desktop_app.kv.levels import EXACT
from desktop_app.model.kvstate import in_position_order
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from desktop_app.results import CalibrationInfo, Progress
from store import Store

pytestmark = pytest.mark.model

TEXT = "\n\n".join(pydoc_data.topics.topics[k] for k in ("if", "while", "for"))[:1500]


def calibration_of(eng: Engine) -> codec.Calibration:
    """A calibration of the engine's model with one level, `balanced`, fitted in seconds on
    the KV of the text (a real one takes minutes; only its being used is tested here)."""
    rt = eng.runtime
    rt.reset()
    rt.prefill(rt.tokenize(TEXT, add_bos=True, special=False))
    kv = in_position_order(rt.capture().sections[0])
    rt.reset()
    part = fitted(kv.keys, kv.values, levels()["balanced"], "balanced").parts[0]
    return codec.Calibration((part,), {"fingerprint": eng.fingerprint})


def test_a_calibration_computes_the_documents_cached_before_it_again_at_its_levels(
        tmp_path, model_path, model_hash):
    eng = Engine(Store(tmp_path / "data"), lambda: Runtime(
        model_path, model_hash=model_hash, n_ctx=1024), chunk_tokens=64, levels=("balanced",))
    try:
        (tmp_path / "a.txt").write_text(TEXT)
        (tmp_path / "kept.txt").write_text(TEXT.replace("while", "until"))
        doc = eng.attach(tmp_path / "a.txt").doc_id
        exact = eng.attach(tmp_path / "kept.txt", levels=["balanced", EXACT]).doc_id
        chat = eng.ask("What does the text describe?", doc_ids=[doc],
                       generation=GenerationOptions(max_tokens=4, temperature=0)).chat_id
        assert {d.doc_id: d.levels for d in eng.documents()} == {
            doc: "model-independent", exact: "model-independent"}
        assert eng.relevel()["entries"] == 0  # (not calibrated: nothing to do)
        before = eng.store.document_entry(doc, eng.fingerprint)
        chats_own = [e for e in eng.store.entries() if e.chat_id == chat]
        cal = calibration_of(eng)
        eng.calibrations.adopt(cal)
        said: list[Progress] = []
        report = eng.relevel(progress=said.append)
        # One computed again from its text, one encoded from its lossless chunks.
        assert (report["entries"], report["computed"], report["skipped"]) == (2, 1, 0)
        assert said[-1].title == "relevel" and said[-1].done == said[-1].total
        after = eng.store.document_entry(doc, eng.fingerprint)
        assert after.id == before.id and (after.levels, after.calibration) == (
            ("balanced",), cal.id)
        assert eng.store.document_entry(exact, eng.fingerprint).levels == (EXACT, "balanced")
        assert {d.levels for d in eng.documents()} == {"calibrated"}
        # A chat's own cache stays as it was stored, and still reopens over the moved one.
        assert [(e.levels, e.calibration) for e in eng.store.entries()
                if e.chat_id == chat] == [(e.levels, e.calibration) for e in chats_own]
        found = eng.store.verify()
        assert not (found["database"] or found["corrupt"] or found["missing"])
        eng.runtime.reset()
        back = eng.reopen(chat)
        assert back.recomputed_tokens == 0 and "text" not in back.chunk_levels
        # A new chat reads the document at its calibrated level, nothing computed.
        res = eng.ask("And what else?", doc_ids=[doc], restore=RestoreOptions(level="balanced"),
                      generation=GenerationOptions(max_tokens=2, temperature=0))
        assert set(res.chunk_levels) == {"balanced"} and not res.messages
        assert eng.relevel()["entries"] == 0  # (done once)
    finally:
        eng.close()
        eng.store.close()


def test_docs_says_which_levels_a_cache_uses():
    words = level_words(None)
    assert words["model-independent"] == (" at model-independent levels until this model is "
                                           "calibrated (kvdesk calibrate)")
    assert words["lossless-until-calibrated"].startswith(", lossless only until this model "
                                                         "is calibrated")
    cal = CalibrationInfo("c" * 64, "m.gguf", 1_700_000_000.0, 1.0, "centred", {}, {})
    assert "(calibrated ones since 2023-11-1" in level_words(cal)["model-independent"]
    assert "kvdesk calibrate moves it to them" in level_words(cal)["model-independent"]
