"""Exact transforms (codec/calibrated/intinverse.py): a basis inverted in integer sums, the
same bytes by BLAS, by int64 arithmetic and on every backend, within a stated distance of the
float64 inverse, and refused cleanly where the format cannot carry them."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from codec_helpers import FIXTURES, calibration_of, real_kv, refresh_crc

import codec
from codec import Calibration, CodecError, KindTransform, backend
from codec.calibrated import intinverse, transform

CPU, REF = backend.get("cpu"), backend.get("reference")
GOLDEN = FIXTURES / "golden"


def orthonormal(rng, shape) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal(shape))[0].astype(np.float32)


@pytest.mark.parametrize("block", [8, 64, 192, 256])
def test_integer_basis_keeps_every_sum_exact_in_float32_and_is_close(block):
    rng = np.random.default_rng(block)
    basis = orthonormal(rng, (2, 1, block, block))
    mt, shift = intinverse.integer_basis(basis)
    m = mt.swapaxes(2, 3).astype(np.int64)
    assert np.array_equal(mt, np.rint(mt))  # integer valued
    assert (np.abs(m).sum(axis=3) * intinverse.MAX_Q).max() < 2**24  # every partial sum exact
    # the largest shift that holds (one more bit would break the bound) ...
    assert ((np.abs(np.rint(np.ldexp(basis.astype(np.float64), shift[..., None, None] + 1)))
             .sum(axis=3).max(axis=2)) * intinverse.MAX_Q >= 2**24).all()
    # ... and the matrix is the basis rounded to that grid
    err = np.abs(np.ldexp(m.astype(np.float64), -shift[..., None, None])
                 - basis.astype(np.float64))
    assert (err <= np.ldexp(0.5, -shift)[..., None, None]).all()
    assert err.max() <= 2**-11 * np.abs(basis).max()


@pytest.mark.parametrize("block", [64, 192])
def test_blas_sums_equal_int64_sums_bit_for_bit(block):
    rng = np.random.default_rng(3)
    mt, _ = intinverse.integer_basis(orthonormal(rng, (3, 192 // block, block, block)))
    q = rng.integers(-63, 64, (3, 50, 192)).astype(np.float32)
    q[:, :, ::3] = 63  # the extremes the bound is for
    q[1] = -63
    got = intinverse.sums(q, mt, np.empty_like(q))
    assert np.array_equal(got, intinverse.reference_sums(q, mt))


@pytest.mark.parametrize("rope", ["norm", "neox"])
def test_exact_inverse_is_near_the_float64_one_within_its_bound(rope):
    rng = np.random.default_rng(5)
    n_layer, n_tok, d, n_head = 2, 30, 16, 4
    c = d * n_head
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)
    tf = KindTransform(d, rope, theta, rng.standard_normal((n_layer, c)).astype(np.float32),
                       orthonormal(rng, (n_layer, 1, c, c)), exact=True)
    q = rng.integers(-63, 64, (n_layer, n_tok, c)).astype(np.float32)
    scales = np.array([3.0, 0.02], np.float16).view(np.uint16)
    maxq = np.array([63, 7])
    q[1] = np.clip(q[1], -7, 7)
    mt, shift = tf.integer_basis
    gain = intinverse.gains(scales, maxq, shift, tf.block)
    cos, sin = transform.angles(tf, 100, n_tok)
    got = transform.inverse(intinverse.reference_sums(q, mt), tf, cos, sin, gain)
    got = got.view(np.float16).astype(np.float64)
    step = scales.view(np.float16).astype(np.float64) / maxq
    u = np.einsum("lij,ltj->lti", tf.basis[:, 0].astype(np.float64), q) * step[:, None, None]
    u += tf.mean[:, None, :]
    want = transform.inverse(u.astype(np.float32), KindTransform(d, rope, theta), cos, sin)
    want = want.view(np.float16).astype(np.float64)
    # the basis' rounding to its integer grid, then fp16's half ulp (twice: both sides round)
    grid = np.ldexp(0.5, -shift[:, 0]) * step * np.abs(q).sum(axis=2).max(axis=1)
    ulp = 2.0**-10 * np.maximum(np.abs(want), 2.0**-14)
    assert (np.abs(got - want) <= grid[:, None, None] + ulp + 1e-6 * np.abs(want)).all()


@pytest.fixture(scope="module")
def kv():
    keys, values = real_kv(120)
    return np.ascontiguousarray(keys), np.ascontiguousarray(values)


@pytest.mark.parametrize("block", [64, 192])
def test_exact_blobs_decode_alike_on_every_backend_within_the_error_bound(kv, block):
    keys, values = kv
    cal = Calibration.from_bytes(calibration_of(keys, values, block=block).to_bytes())
    assert cal.parts[0].keys.exact and cal.parts[0].keys.block == block
    blob = codec.encode(keys, values, "high", calibration=cal)
    assert codec.encode(keys, values, "high", calibration=cal, backend=REF) == blob
    got = [codec.decode(blob, calibrations={cal.id: cal}, backend=be) for be in (CPU, REF)]
    for a, b in zip(*got, strict=True):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    k, v = got[0]
    assert np.array_equal(k[:, 0], keys[:, 0])  # the sink token stays exact
    for got_, want in ((k, keys), (v, values)):
        err = got_[:, 1:].astype(np.float32) - want[:, 1:].astype(np.float32)
        assert np.sqrt((err**2).mean()) < 0.5 * want[:, 1:].astype(np.float32).std()


def test_exact_transforms_need_layer_scales(kv):
    keys, values = (a[:, :20] for a in kv)
    cal = calibration_of(keys, values, block=64)
    cfg = cal.config("high").get_config()
    cfg["keys"]["scale"] = "channel"
    with pytest.raises(CodecError, match="layer"):
        codec.encode(keys, values, cfg, calibration=cal)


def test_exact_transform_fields_are_checked():
    basis = np.eye(16, dtype=np.float32)[None, None]
    with pytest.raises(CodecError, match="needs a basis"):
        KindTransform(8, exact=True)
    with pytest.raises(CodecError, match="basis of shape"):  # blocks of two heads, not exact
        KindTransform(8, basis=basis)
    with pytest.raises(CodecError, match="basis of shape"):  # not whole heads
        KindTransform(6, basis=basis, exact=True)
    assert KindTransform(8, basis=basis, exact=True).block == 16


def test_calibration_version_follows_what_it_uses(kv):
    keys, values = (a[:, :20] for a in kv)
    plain = calibration_of(keys, values).to_bytes()
    exact = calibration_of(keys, values, block=192).to_bytes()
    assert plain[4:6] == b"\x01\x00" and exact[4:6] == b"\x02\x00"
    again = Calibration.from_bytes(exact)
    assert again.to_bytes() == exact and again.parts[0].keys.exact
    # a version 1 file claiming an exact transform is malformed, never read as a float one
    with pytest.raises(CodecError, match="exact"):
        Calibration.from_bytes(refresh_crc(exact[:4] + b"\x01\x00" + exact[6:]))
    with pytest.raises(CodecError, match="version 3"):
        Calibration.from_bytes(refresh_crc(exact[:4] + b"\x03\x00" + exact[6:]))


@pytest.mark.parametrize("name", ["calibrated-pca-high", "calibrated-pca-high-packed-ids"])
def test_golden_exact_blob_still_decodes(name):
    expected = json.loads((GOLDEN / "expected.json").read_text())[name]
    cal = Calibration.from_bytes((GOLDEN / "calibration-pca.kvcl").read_bytes())
    blob = (GOLDEN / f"{name}.kvc").read_bytes()
    assert cal.id == expected["calibration"] == codec.peek(blob).calibration
    assert cal.parts[0].keys.exact
    for be in (CPU, REF):
        k, v = codec.decode(blob, calibrations={cal.id: cal}, backend=be)
        assert hashlib.sha256(k.tobytes() + v.tobytes()).hexdigest() == \
            expected["decoded_sha256"]
