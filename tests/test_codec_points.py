"""Reconstruction points (codec/calibrated/points.py): a calibrated level's symbols decoded at
the bins' means scaled back to the coefficients' energy. The same symbols and streams, less
error than the bins' centres within stated bounds, the energy kept, calibration version 3
frozen by a golden file, and every malformed or missing piece refused."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from codec_helpers import FIXTURES, calibration_of, real_kv, refresh_crc

import codec
from codec import Calibration, CodecError, backend
from codec.calibrated import points

CPU, REF = backend.get("cpu"), backend.get("reference")
GOLDEN = FIXTURES / "golden"


@pytest.fixture(scope="module")
def kv():
    keys, values = real_kv()
    return keys[:, :200], values[:, :200]


def errors(cal: Calibration, keys, values) -> tuple[list[float], list[float], int]:
    """Per kind: squared error past the sink token, its energy ratio to the input; and bytes."""
    blobs = codec.encode_chunks(keys, values, "high", calibration=cal, chunk_tokens=64)
    back = codec.decode_chunks(blobs, calibrations={cal.id: cal})
    mse, energy = [], []
    for x, y in zip((keys, values), back, strict=True):
        x, y = x[:, 1:].astype(np.float64), y[:, 1:].astype(np.float64)
        mse.append(float(((y - x) ** 2).mean()))
        energy.append(float((y ** 2).sum() / (x ** 2).sum()))
    return mse, energy, sum(len(b) for b in blobs)


def test_points_cut_the_error_keep_the_energy_and_code_the_same_symbols(kv):
    keys, values = kv
    plain, fitted = calibration_of(keys, values), calibration_of(keys, values, points=True)
    mse0, energy0, bytes0 = errors(plain, keys, values)
    mse1, energy1, bytes1 = errors(fitted, keys, values)
    for before, after in zip(mse0, mse1, strict=True):
        assert after <= 0.97 * before  # the bins' means, in sample: at least 3 % less error
    for e in energy1:
        assert abs(e - 1) < 0.02  # the spread kept, as the centres keep it
    # the symbols are the encoder's either way: only the header's config grows
    assert 0 < bytes1 - bytes0 <= 4 * 64  # 4 chunks, '"points": "calibrated"' twice
    a = codec.quantized(keys[:, :64], values[:, :64], "high", calibration=plain)
    b = codec.quantized(keys[:, :64], values[:, :64], "high", calibration=fitted)
    assert all(np.array_equal(x.q, y.q) for x, y in zip(a, b, strict=True))


def test_the_fit_is_each_bins_mean_scaled_to_the_energy():
    tally = points.Tally(1)
    q = np.array([[[0, 1, 1, -1, 2, -2, 0]]]).repeat(30, axis=1)
    y = np.array([[[0.1, 0.8, 0.9, -0.7, 2.0, -1.8, -0.2]]]).repeat(30, axis=1)
    tally.add(y, q, np.float32(1.0))
    got = points.fit(tally)
    mean = np.array([0, 0.8, 1.9])
    gain = np.sqrt((y[0, 0] ** 2).sum() / (2 * 0.8 ** 2 + 0.8 ** 2 + 2 * 1.9 ** 2))
    assert np.allclose(got[0, :3], mean * gain, rtol=1e-5)
    assert np.allclose(got[0, 3:], np.arange(3, points.WIDTH) * gain, rtol=1e-5)  # unseen


def test_a_layer_almost_all_zeros_keeps_a_bounded_gain():
    tally = points.Tally(1)
    q = np.zeros((1, 200, 8), np.int64)
    q[0, :30, 0] = 1
    y = np.where(q == 1, 1.0, 0.45)
    tally.add(y, q, np.float32(1.0))
    got = points.fit(tally)
    assert got[0, 1] == pytest.approx(points.MAX_GAIN)


def test_calibration_version_3_round_trips_and_says_what_it_holds(kv):
    keys, values = (a[:, :40] for a in kv)
    cal = calibration_of(keys, values, points=True)
    data = cal.to_bytes()
    assert data[4:6] == b"\x03\x00"
    again = Calibration.from_bytes(data)
    assert again.to_bytes() == data and again.id == cal.id
    assert set(again.parts[0].points) == {("high", "keys"), ("high", "values")}
    # a version 2 file claiming points is malformed, never read without them
    with pytest.raises(CodecError, match="points"):
        Calibration.from_bytes(refresh_crc(data[:4] + b"\x02\x00" + data[6:]))


@pytest.mark.parametrize("bad", ["decreasing", "nan", "zero", "shape", "huge"])
def test_malformed_points_are_refused(kv, bad):
    keys, values = (a[:, :40] for a in kv)
    cal = calibration_of(keys, values, points=True)
    good = cal.parts[0].points[("high", "keys")]
    wrong = {"decreasing": good[:, ::-1], "nan": np.where(good > 3, np.nan, good),
             "zero": good + 1, "shape": good[:, :10], "huge": good * 100}[bad]
    with pytest.raises(CodecError, match="reconstruction points"):
        cal.with_points(0, "high", {"keys": np.ascontiguousarray(wrong, np.float32)})


def test_a_blob_naming_points_the_calibration_lacks_is_refused(kv):
    keys, values = (a[:, :40] for a in kv)
    cal = calibration_of(keys, values, points=True)
    # a config of another name through the same calibration: it has no points of that level
    level = {**cal.parts[0].levels["high"], "name": "other",
             "calibration": {"id": cal.id, "part": 0}}
    blob = codec.encode(keys, values, level, calibration=cal)
    with pytest.raises(CodecError, match="no reconstruction points for level 'other'"):
        codec.decode(blob, calibrations={cal.id: cal})


def test_an_exact_transform_takes_no_points(kv):
    keys, values = (a[:, :40] for a in kv)
    cal = calibration_of(keys, values, block=keys.shape[2])
    cfg = cal.parts[0].levels["high"]
    level = {**cfg, "keys": {**cfg["keys"], "points": "calibrated"},
             "calibration": {"id": cal.id, "part": 0}}
    with pytest.raises(CodecError, match="no reconstruction points"):
        codec.encode(keys, values, level, calibration=cal)


def test_points_need_a_transform_in_the_config():
    cfg = codec.levels()["high"].get_config()
    with pytest.raises(CodecError, match="invalid codec config"):
        codec.CodecConfig.from_config({**cfg, "keys": {**cfg["keys"], "points": "calibrated"}})


def test_golden_points_blob_still_decodes_on_every_backend():
    expected = json.loads((GOLDEN / "expected.json").read_text())["calibrated-points-high"]
    cal = Calibration.from_bytes((GOLDEN / "calibration-points.kvcl").read_bytes())
    blob = (GOLDEN / "calibrated-points-high.kvc").read_bytes()
    assert cal.id == expected["calibration"] == codec.peek(blob).calibration
    assert cal.to_bytes()[4:6] == b"\x03\x00"
    # the golden's points are not the bins' centres: the file tests the points' decoding
    pts = cal.parts[0].points[("high", "keys")]
    assert np.abs(pts[:, 1:8] - np.arange(1, 8)).max() > 0.01
    for be in (CPU, REF):
        k, v = codec.decode(blob, calibrations={cal.id: cal}, backend=be)
        assert hashlib.sha256(k.tobytes() + v.tobytes()).hexdigest() == \
            expected["decoded_sha256"]
