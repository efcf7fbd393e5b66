"""Per-component steps under the alphabet limit (a kind's "ranges", codec/intinverse.py): the
least shifts that fit, packed and unpacked, integer sums still exact with their headroom, the
same bytes on every backend within a stated error bound, clean refusals, versions written
only when used, and a golden blob that keeps decoding."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from codec_helpers import FIXTURES, calibration_of, ranged, real_kv, refresh_crc

import codec
from codec import Calibration, CodecError, backend, intinverse, pipeline, transform
from codec.levels import KindConfig

CPU, REF = backend.get("cpu"), backend.get("reference")
GOLDEN = FIXTURES / "golden"


def test_shifts_are_the_least_that_fit_the_range_and_pack_losslessly():
    rng = np.random.default_rng(1)
    coef = (rng.standard_normal((3, 20, 37)) * rng.uniform(0.1, 30, (3, 1, 37))).astype(
        np.float32)
    ranges = np.array([1.0, 4.0, 0.25])
    m = intinverse.component_shifts(coef, ranges)
    top = np.abs(coef).max(axis=1).astype(np.float64)
    room = ranges[:, None] * 2.0 ** m
    assert m.dtype == np.uint8 and m.max() == intinverse.MAX_SHIFT and m.min() == 0
    assert ((top <= room) | (m == intinverse.MAX_SHIFT)).all()  # fits, unless capped
    assert ((m == 0) | (top > room / 2)).all()  # and one power of two less would not
    packed = intinverse.pack_shifts(m)
    assert packed.shape == (3, 10)
    assert np.array_equal(intinverse.unpack_shifts(packed, 37), m)
    bad = packed.copy()
    bad[0, -1] |= 0xC0  # a padding component (37 of 40) that is not zero
    with pytest.raises(CodecError, match="shifts"):
        intinverse.unpack_shifts(bad, 37)


@pytest.mark.parametrize("block", [64, 192])
def test_wide_integer_basis_keeps_shifted_sums_exact(block):
    rng = np.random.default_rng(block)
    basis = np.linalg.qr(rng.standard_normal((2, 192 // block, block, block)))[0].astype(
        np.float32)
    mt, shift = intinverse.integer_basis(basis, intinverse.MAX_SHIFT)
    narrow = intinverse.integer_basis(basis)[1]
    assert (shift == narrow - intinverse.MAX_SHIFT).all() or (shift < narrow).all()
    m = mt.swapaxes(2, 3).astype(np.int64)
    largest = intinverse.MAX_Q << intinverse.MAX_SHIFT
    assert (np.abs(m).sum(axis=3) * largest).max() < 2**24
    q = rng.integers(-63, 64, (2, 40, 192)).astype(np.float32)
    q[:, :, ::5] = 63
    shifts = rng.integers(0, intinverse.MAX_SHIFT + 1, (2, 192)).astype(np.uint8)
    shifts[:, ::5] = intinverse.MAX_SHIFT  # the extremes the headroom is for
    intinverse.widen(q, shifts)
    assert np.abs(q).max() == largest
    assert np.array_equal(intinverse.sums(q, mt, np.empty_like(q)),
                          intinverse.reference_sums(q, mt))


@pytest.fixture(scope="module")
def kv():
    keys, values = real_kv(120)
    return np.ascontiguousarray(keys), np.ascontiguousarray(values)


@pytest.fixture(scope="module")
def cals(kv):
    keys, values = kv
    plain = calibration_of(keys, values, block=keys.shape[2])
    return plain, Calibration.from_bytes(ranged(plain, 0.5).to_bytes())


def test_ranged_blobs_are_identical_on_every_backend_and_within_their_bound(kv, cals):
    keys, values = kv
    _, cal = cals
    blob = codec.encode(keys, values, "high", calibration=cal)
    assert codec.encode(keys, values, "high", calibration=cal, backend=REF) == blob
    got = [codec.decode(blob, calibrations={cal.id: cal}, backend=be) for be in (CPU, REF)]
    for a, b in zip(*got, strict=True):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    parsed = pipeline._parse(blob)
    m = parsed.shifts[0]
    assert parsed.shifts[1] is None  # the values' transform is not exact: no ranges
    assert m.max() > 0 and (m == 0).any()  # some components shifted, the rest not
    k = got[0][0]
    assert np.array_equal(k[:, 0], keys[:, 0])  # the sink token stays exact
    # the bound: coefficient j of layer l is within half its step, s_l * 2^m_j (s_l the
    # layer's scale / maxq, at most its range unless a shift was capped), of the fp16 of the
    # exact coefficient; the basis is orthonormal, so per token the squared error of the KV is
    # the coefficients' plus fp16's rounding of the input coefficients and of the output
    tf = cal.parts[0].keys
    cos, sin = transform.angles(tf, 1, keys.shape[1] - 1)
    y = transform.forward(keys[:, 1:], tf, cos, sin).astype(np.float64)
    cfg = codec.peek(blob).config
    maxq = codec.CodecConfig.from_config(cfg).keys.layer_bins(keys.shape[0]) // 2 - 1
    step = parsed.scales[0].reshape(-1).view(np.float16).astype(np.float64) / maxq
    capped = (m == intinverse.MAX_SHIFT).any(axis=1)
    assert ((step * maxq <= 0.5 * (1 + 2**-10)) | capped).all()  # the range was kept
    half = 0.5 * step[:, None] * 2.0 ** m  # [L, C]
    per_coef = half[:, None, :] + 2**-11 * np.abs(y)
    x = keys[:, 1:].astype(np.float64)
    err2 = ((k[:, 1:].astype(np.float64) - x) ** 2).sum(axis=2)
    bound = (1.01 * np.sqrt((per_coef**2).sum(axis=2)) + np.sqrt(
        ((2**-10 * np.abs(x) + 2**-24) ** 2).sum(axis=2))) ** 2
    assert (err2 <= bound).all()


def test_ranges_refine_the_steps_the_alphabet_bound(kv, cals):
    keys, values = kv
    plain, cal = cals
    errs = []
    for c in (plain, cal):
        k, _ = codec.decode(codec.encode(keys, values, "high", calibration=c),
                            calibrations={c.id: c})
        errs.append(((k[:, 1:].astype(np.float32) - keys[:, 1:]) ** 2).mean(axis=(1, 2)))
    assert (errs[1] < errs[0]).all()  # every layer: its small components keep a finer step


def test_ranges_are_validated():
    base = {"scale": "layer", "bins": [8, 8], "layer_edges": [0.5], "transform": "calibrated"}
    ok = KindConfig.from_config({**base, "ranges": [1.0, 2]})
    assert ok.ranges == (1.0, 2.0) and ok.get_config()["ranges"] == [1.0, 2.0]
    assert list(ok.layer_ranges(4)) == [1.0, 1.0, 2.0, 2.0]
    for bad in ({**base, "ranges": [1.0]}, {**base, "ranges": [1.0, float("nan")]},
                {**base, "ranges": [1.0, -1.0]}, {**base, "ranges": [1.0, True]},
                {**base, "scale": "token", "ranges": [1.0, 1.0]},
                {k: v for k, v in {**base, "ranges": [1.0, 1.0]}.items() if k != "transform"}):
        with pytest.raises(CodecError, match="invalid codec config"):
            KindConfig.from_config(bad)


def test_ranges_need_an_exact_transform(kv):
    keys, values = (a[:, :20] for a in kv)
    cal = calibration_of(keys, values)  # per-head float bases: not exact
    cfg = cal.config("high").get_config()
    cfg["keys"]["ranges"] = [1.0] * len(cfg["keys"]["bins"])
    with pytest.raises(CodecError, match="exact"):
        codec.encode(keys, values, cfg, calibration=cal)


def test_versions_follow_what_is_used(kv, cals):
    keys, values = kv
    plain, cal = cals
    assert plain.to_bytes()[4:6] == b"\x02\x00" and cal.to_bytes()[4:6] == b"\x03\x00"
    assert codec.encode(keys, values, "high", calibration=plain)[4:6] == b"\x02\x00"
    blob = codec.encode(keys, values, "high", calibration=cal)
    assert blob[4:6] == b"\x03\x00"
    with pytest.raises(CodecError, match="version 2 names per-component steps"):
        codec.decode(refresh_crc(blob[:4] + b"\x02\x00" + blob[6:]),
                     calibrations={cal.id: cal})
    raw = cal.to_bytes()
    with pytest.raises(CodecError, match="per-component"):  # ranged levels before version 3
        Calibration.from_bytes(refresh_crc(raw[:4] + b"\x02\x00" + raw[6:]))


def test_a_ranged_blob_without_its_shifts_is_refused(kv, cals):
    keys, values = kv
    _, cal = cals
    blob = codec.encode(keys[:, :30], values[:, :30], "high", calibration=cal)
    with pytest.raises(CodecError, match="truncated|trailing"):
        codec.decode(refresh_crc(blob[:-5] + blob[-4:]), calibrations={cal.id: cal})


def test_golden_ranged_blob_still_decodes():
    expected = json.loads((GOLDEN / "expected.json").read_text())["calibrated-pca-steps-high"]
    cal = Calibration.from_bytes((GOLDEN / "calibration-pca-steps.kvcl").read_bytes())
    blob = (GOLDEN / "calibrated-pca-steps-high.kvc").read_bytes()
    assert cal.id == expected["calibration"] == codec.peek(blob).calibration
    assert blob[4:6] == b"\x03\x00" and pipeline._parse(blob).shifts[0].max() > 0
    for be in (CPU, REF):
        k, v = codec.decode(blob, calibrations={cal.id: cal}, backend=be)
        assert hashlib.sha256(k.tobytes() + v.tobytes()).hexdigest() == \
            expected["decoded_sha256"]


def test_a_chunk_of_only_sink_tokens_codes_with_ranges(kv, cals):
    keys, values = (np.ascontiguousarray(a[:, :1]) for a in kv)
    _, cal = cals
    blob = codec.encode(keys, values, "high", calibration=cal)
    assert not pipeline._parse(blob).shifts[0].any()
    k, v = codec.decode(blob, calibrations={cal.id: cal})
    assert np.array_equal(k, keys) and np.array_equal(v, values)
