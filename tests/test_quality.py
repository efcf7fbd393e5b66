"""The quality evaluation on a short real text: an exact restore loses nothing, llama.cpp's
q8_0 cache a little, a deliberately crude codec config a lot; the CLI prints the issue's JSON."""

from __future__ import annotations

import json
import pydoc_data.topics
import subprocess
import sys

import numpy as np
import pytest

from desktop_app.app import App
from desktop_app.calibration import calibrate, quality
from desktop_app.settings import Settings

pytestmark = pytest.mark.model

TEXT = "\n\n".join(pydoc_data.topics.topics[k] for k in ("if", "while", "for", "try", "with"))
PREFIX, CONT, GREEDY = 192, 32, 16

# Four bins (three symbols) per layer-wide step, no exact sink tokens: far too coarse.
CRUDE = {"id": "kvdesk.kv", "name": "crude", "mode": "quantized", "lanes": 32, "states": 4,
         "sink_tokens": 0, "anchor_group": 0,
         "keys": {"scale": "layer", "bins": [4], "layer_edges": []},
         "values": {"scale": "layer", "bins": [4], "layer_edges": []}}


@pytest.fixture(scope="module")
def evaluator(model_path):
    with quality.Evaluator(model_path, TEXT, prefix_tokens=PREFIX, cont_tokens=CONT,
                           greedy_tokens=GREEDY) as ev:
        yield ev


@pytest.fixture(scope="module")
def q8_row(evaluator):
    return evaluator.row("q8_0")


def test_exact_restore_loses_nothing(evaluator):
    row = evaluator.row("fp16")
    assert row == {"config": "fp16", "bits_per_element": 16.0, "kld": 0.0, "top1": 1.0,
                   "ppl": row["ppl"], "greedy_match": True}
    assert 1 < row["ppl"] < 100


def test_q8_0_loses_a_little(q8_row):
    assert q8_row["bits_per_element"] == 8.5
    assert 0 < q8_row["kld"] < 0.05
    assert q8_row["top1"] >= 0.8


def test_noise_floor_row_moves_the_logits(evaluator, q8_row):
    """One ulp on 0.01 % of the elements: no codec loss, but the quantized model's 8-bit
    activations turn it into a KLD of the same order as q8_0's."""
    row = evaluator.row(quality.FLOOR)
    assert row["config"] == "fp16-ulp" and row["bits_per_element"] == 16.0
    assert 0 < row["kld"] < max(0.01, 5 * q8_row["kld"])


def test_nudge_moves_few_elements_by_one_ulp():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 50, 64)).astype(np.float16)
    a[:, :, 0] = 0.0
    a[:, :, 1] = -0.0
    a[:, :, 2] = 65504.0
    positions = np.arange(50, dtype=np.int32)[::-1]  # cell order need not be position order
    b = quality.nudge(a, positions, np.random.default_rng(0), fraction=0.2)
    moved = a.view(np.uint16) != b.view(np.uint16)
    diff = b.view(np.uint16).astype(np.int32) - a.view(np.uint16).astype(np.int32)
    assert 0.15 < moved.mean() < 0.2 and set(np.unique(diff[moved])) == {-1, 1}
    assert not moved[:, positions == 0].any() and not moved[..., 2].any()
    assert np.isfinite(b.astype(np.float32)).all()
    assert (np.abs(b[..., :2].astype(np.float32)) < 1e-7).all()
    with pytest.raises(quality.EvalError):
        quality.nudge(a.astype(np.float32), positions, rng)


def test_crude_codec_config_loses_a_lot(evaluator, q8_row):
    row = evaluator.row(CRUDE)
    assert row["config"] == "crude" and row["bits_per_element"] < 1.0
    assert row["kld"] > max(0.2, 20 * q8_row["kld"])
    assert row["top1"] < 0.9


def test_noise_added_to_the_kv_loses_a_lot(evaluator):
    kv = evaluator.seq_state.sections[0]
    rng = np.random.default_rng(0)
    noisy = [(a + a.astype(np.float32).std() * rng.standard_normal(a.shape)).astype(a.dtype)
             for a in (kv.keys, kv.values)]
    broken = type(kv)(*noisy, kv.positions, kv.v_trans, kv.seq_id)
    row = evaluator.measure_state("noise", evaluator.state_with([broken]), 16.0)
    assert row["kld"] > 0.2 and row["top1"] < 0.9


def test_unknown_config_and_short_text_are_refused(model_path):
    with pytest.raises(quality.EvalError, match="unknown configuration"):
        quality.evaluate(model_path, TEXT, configs=["q9_9"])
    with pytest.raises(quality.EvalError, match="tokens; .* are needed"):
        quality.evaluate(model_path, "too short", prefix_tokens=64, cont_tokens=8,
                         configs=["fp16"])


def test_every_model_run_pauses_between_its_slices_and_a_cancel_stops_it(evaluator,
                                                                         model_path):
    """The calibration's runs yield to a question at each slice (`pause`), not only between
    runs: the reference's prefill (192 tokens: 2 slices), its scoring (32: 1), a
    measurement's scoring and greedy tokens (16: one each); a cancel stops the next one."""
    import threading

    from desktop_app.errors import Cancelled

    tokens = evaluator.prefix + evaluator.cont
    paused, cancel = [], threading.Event()
    with quality.Evaluator(model_path, tokens=tokens, prefix_tokens=PREFIX, cont_tokens=CONT,
                           greedy_tokens=GREEDY, pause=lambda: paused.append(1)) as ev:
        assert len(paused) == 2 + 1 + GREEDY
        paused.clear()
        ev.measure_state("fp16", ev.reference.state, 16.0)
        assert len(paused) == 1 + GREEDY
    with pytest.raises(Cancelled):  # stopped at the second slice of the reference's prefill
        quality.Evaluator(model_path, tokens=tokens, prefix_tokens=PREFIX, cont_tokens=CONT,
                          greedy_tokens=GREEDY, cancel=cancel, pause=cancel.set)


def test_a_fitted_evaluator_shrinks_to_a_short_text_and_reports_its_noise(evaluator,
                                                                            model_path):
    tokens = evaluator.prefix + evaluator.cont  # 225 tokens, for 300 + 100 asked
    with quality.Evaluator(model_path, tokens=tokens, prefix_tokens=300, cont_tokens=100,
                           greedy_tokens=0, fit=True) as ev:
        assert (ev.prefix_tokens, ev.cont_tokens) == (168, 56)  # 224 in the same proportion
        row = ev.measure_state("fp16", ev.reference.state, 16.0, noise=True)
    assert row["kld"] == 0.0 and row["kld_se"] == 0.0 and row["top1_se"] == 0.0
    noisy = evaluator.measure_state("crude", evaluator.compressed_state(CRUDE)[0], 1.0,
                                    noise=True)
    top1 = noisy["top1"]
    assert noisy["top1_se"] == pytest.approx(np.sqrt(top1 * (1 - top1) / CONT))
    assert 0 < noisy["kld_se"] < noisy["kld"]


def test_cli_eval_refuses_a_bad_file_before_calibrating(tmp_path, model_path):
    """An uncalibrated model: an empty file is refused at once, not after the minutes of
    calibration the command would otherwise start with."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = subprocess.run([sys.executable, "-m", "desktop_app", "eval", str(empty)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "the file is empty" in out.stderr, out.stderr
    assert "calibrating" not in out.stderr, out.stderr
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT)
    out = subprocess.run([sys.executable, "-m", "desktop_app", "eval", str(doc), "--configs",
                          "fp16,default-balanced,superb", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "unknown configuration 'superb'" in out.stderr, out.stderr
    assert "calibrating" not in out.stderr and json.loads(out.stdout)["kind"] == "EvalError"
    # A text too short for the tokens asked for, too, and a run of configurations none of
    # which is calibrated needs no calibration at all.
    out = subprocess.run([sys.executable, "-m", "desktop_app", "eval", str(doc),
                          "--prefix-tokens", "100000"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "100,257 are needed" in out.stderr, out.stderr
    assert "smaller --prefix-tokens and --cont-tokens" in out.stderr
    assert "calibrating" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "desktop_app", "eval", str(doc), "--configs",
                          "fp16,q8_0", "--prefix-tokens", "96", "--cont-tokens", "16",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "calibrating" not in out.stderr, out.stderr
    assert [r["config"] for r in json.loads(out.stdout)["rows"]] == ["fp16", "q8_0"]


def test_cli_eval_json(tmp_path, model_path):
    # the model calibrated first with tiny settings (the product's own calibration takes
    # minutes), in the data directory the command reads
    app = App(Settings(data_dir=str(tmp_path / "data")))
    try:
        tiny = calibrate.Settings(prefix_tokens=96, cont_tokens=24, iterations=2)
        app.engine.calibrations.adopt(calibrate.calibrate(
            model_path, fingerprint=app.engine.fingerprint, settings=tiny))
    finally:
        app.close()
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT)
    out = subprocess.run(
        [sys.executable, "-m", "desktop_app", "eval", str(doc), "--prefix-tokens", "96",
         "--cont-tokens", "16", "--configs", "fp16,balanced", "--json"],
        capture_output=True, text=True, check=True, timeout=300)
    report = json.loads(out.stdout)
    assert report["model"].endswith(".gguf")
    assert (report["prefix_tokens"], report["cont_tokens"]) == (96, 16)
    assert [r["config"] for r in report["rows"]] == ["fp16", "balanced"]
    assert set(report["rows"][1]) == {"config", "bits_per_element", "kld", "top1", "ppl",
                                      "greedy_match"}
    assert report["rows"][0]["kld"] == 0.0 and 0 < report["rows"][1]["bits_per_element"] < 16
