"""Calibrated transforms: exact inverses, identical bytes on every backend, a calibration that
round-trips through its bytes, and blobs that are refused cleanly without the calibration
they name."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from codec_helpers import FIXTURES, calibration_of, real_kv, refresh_crc
from numba import njit

import codec
from codec import Calibration, CalibrationMissing, CodecError, KindTransform, backend
from codec.calibrated import transform
from codec.kernels import tkernel
from codec.kernels.tkernel import f16_bits

CPU, REF = backend.get("cpu"), backend.get("reference")
GOLDEN = FIXTURES / "golden"


@pytest.fixture(scope="module")
def kv():
    keys, values = real_kv(80)
    return np.ascontiguousarray(keys), np.ascontiguousarray(values)


@pytest.fixture(scope="module")
def cal(kv):
    return calibration_of(*kv)


def random_transform(rng, n_layer=3, n_head=2, d=8, rope="neox") -> KindTransform:
    q, _ = np.linalg.qr(rng.standard_normal((n_layer * n_head, d, d)))
    theta = 10000.0 ** (-np.arange(0, d - 2, 2) / d)  # partial rotary: 6 of 8 channels
    return KindTransform(d, rope, theta, rng.standard_normal((n_layer, n_head * d)).astype(
        np.float32), q.reshape(n_layer, n_head, d, d).astype(np.float32))


@pytest.mark.parametrize("rope", ["none", "norm", "neox"])
def test_transforms_are_exact_inverses_within_float_tolerance(rope):
    rng = np.random.default_rng(1)
    tf = random_transform(rng, rope=rope) if rope != "none" else KindTransform(
        8, mean=rng.standard_normal((3, 16)).astype(np.float32))
    x = (rng.standard_normal((3, 50, 16)) * 4).astype(np.float16)
    cos, sin = transform.angles(tf, 1000, 50)
    y = transform.forward(x, tf, cos, sin)
    back = transform.inverse(y.astype(np.float16).astype(np.float32), tf, cos, sin)
    err = np.abs(back.view(np.float16).astype(np.float32) - x.astype(np.float32))
    # the coefficients' fp16 rounding (2^-11 relative) carried through an orthogonal map
    assert err.max() <= 2**-9 * np.abs(x.astype(np.float32)).max()


@pytest.mark.parametrize("rope", ["norm", "neox"])
def test_kernel_writes_the_reference_bytes_in_any_layout(rope):
    rng = np.random.default_rng(2)
    tf = random_transform(rng, rope=rope)
    y = (rng.standard_normal((3, 40, 16)) * 2).astype(np.float16).astype(np.float32)
    cos, sin = transform.angles(tf, 7, 40)
    y[0, 3, :5] = 0  # zero coefficients are skipped by the kernel
    want = transform.inverse(y, tf, cos, sin)
    rows = np.empty(y.shape, np.uint16)
    backend.jit().untransform(y.copy(), rows, tf, cos, sin)
    cols = np.empty((3, 16, 40), np.uint16).transpose(0, 2, 1)  # channel-major
    backend.jit().untransform(y.copy(), cols, tf, cos, sin)
    assert np.array_equal(rows, want) and np.array_equal(cols, want)


@pytest.mark.parametrize("rope", ["none", "norm", "neox"])
def test_fast_forward_equals_the_definition(rope):
    rng = np.random.default_rng(4)
    tf = random_transform(rng, rope=rope) if rope != "none" else random_transform(rng)
    tf = KindTransform(tf.head_dim, rope, tf.theta if rope != "none" else np.zeros(0), tf.mean)
    x = (rng.standard_normal((3, 30, 16)) * 3).astype(np.float16)
    cos, sin = transform.angles(tf, 11, 30)
    fast = tkernel.forward_fast(x.view(np.uint16), tf.mean, tf.rope, cos, sin, tf.head_dim)
    assert np.array_equal(fast, transform.forward(x, tf, cos, sin))


def test_f16_rounding_matches_numpy():
    @njit
    def convert(a):
        out = np.empty(a.size, np.uint16)
        for i in range(a.size):
            out[i] = f16_bits(a[i])
        return out

    rng = np.random.default_rng(3)
    bits = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    exps = rng.integers(0x60, 0x92, bits.size).astype(np.uint32)  # around fp16's range
    f = ((bits & np.uint32(0x807FFFFF)) | (exps << 23)).view(np.float32)
    edges = np.array([0, -0.0, 65504, 65519.99, 65520, 6e-8, 2.98e-8, 1e-30, np.inf], np.float32)
    f = np.concatenate([f, edges, np.nextafter(edges, np.float32(0))])
    with np.errstate(over="ignore"):
        assert np.array_equal(convert(f), f.astype(np.float16).view(np.uint16))


def test_rotation_angles_are_accurate():
    x = np.concatenate([np.linspace(-10, 10, 1001), np.arange(0, 1.4e6, 977.3)])
    cos, sin = transform.cos_sin(x)
    assert np.abs(cos - np.cos(x)).max() < 1e-7 and np.abs(sin - np.sin(x)).max() < 1e-7
    with pytest.raises(CodecError, match="too large"):
        transform.cos_sin(np.array([2e6]))


def test_a_chunks_angles_are_kept_for_the_next_at_its_positions_and_never_shared():
    tf = transform.KindTransform(head_dim=64, rope="neox", theta=10000.0 ** (-np.arange(32) / 32))
    expected = transform.cos_sin(np.arange(30, 190, dtype=np.float64)[:, None] * tf.theta)
    first = transform.angles(tf, 30, 160)
    for got, want in zip(first, expected, strict=True):
        assert np.array_equal(got, want)
    first[0][...] = 7  # a caller writing into its rows changes nobody else's
    again = transform.angles(tf, 30, 160)
    assert np.array_equal(again[0], expected[0]) and again[0] is not first[0]
    moved = transform.angles(tf, 31, 160)  # other positions, other rows
    assert np.array_equal(moved[0][:-1], expected[0][1:])


def test_fitted_basis_is_orthonormal_and_decorrelates(kv):
    keys = kv[0][:, 1:]
    tf = calibration_of(*kv).parts[0].keys
    eye = np.einsum("lhji,lhjk->lhik", tf.basis, tf.basis)
    np.testing.assert_allclose(eye, np.broadcast_to(np.eye(64), eye.shape), atol=1e-5)
    y = transform.forward(keys, tf, *transform.angles(tf, 1, keys.shape[1]))
    var = y.reshape(*y.shape[:2], 3, 64).var(axis=1)
    assert (np.diff(var, axis=-1) <= 1e-3 * var[..., :1]).all()  # largest variance first


def test_calibration_round_trips_through_its_bytes(cal):
    again = Calibration.from_bytes(cal.to_bytes())
    assert again.id == cal.id == hashlib.sha256(cal.to_bytes()).hexdigest()
    assert again.meta == cal.meta and again.level_names == ["high"]
    for kind in ("keys", "values"):
        a, b = cal.parts[0].transform(kind), again.parts[0].transform(kind)
        for name in ("theta", "mean", "basis"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or np.array_equal(x, y)
    assert again.config("high").calibration == (cal.id, 0)
    with pytest.raises(CodecError, match="no level"):
        cal.config("compact")


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "array"])
def test_damaged_calibrations_are_refused(cal, damage):
    data = bytearray(cal.to_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 1
    elif damage == "magic":
        data[:4] = b"XXXX"
    else:  # a well-checksummed directory pointing outside the arrays
        start = data.index(b'"offset":') + len(b'"offset":')
        data[start:start + 1] = b"9"
        data = bytearray(refresh_crc(data))
    with pytest.raises(CodecError):
        Calibration.from_bytes(bytes(data))


def test_calibrated_blobs_are_identical_on_every_backend(kv, cal):
    keys, values = (a[:, :24] for a in kv)
    blob = codec.encode(keys, values, "high", calibration=cal, backend=CPU, first_token=3)
    assert codec.encode(keys, values, "high", calibration=cal, backend=REF,
                        first_token=3) == blob
    got = [codec.decode(blob, calibrations={cal.id: cal}, backend=be) for be in (CPU, REF)]
    assert all(np.array_equal(a.view(np.uint16), b.view(np.uint16))
               for a, b in zip(*got, strict=True))
    info = codec.peek(blob)
    assert (info.format_version, info.calibration) == (2, cal.id)


@pytest.mark.parametrize("backend", [CPU, REF], ids=["cpu", "reference"])
def test_calibrated_blob_decodes_into_a_channel_major_buffer(kv, cal, backend):
    """llama.cpp's V without flash attention is [layer, channel, token]: the inverse
    transform's output reaches such a view through a token-major scratch, bytes unchanged."""
    keys, values = (a[:, :40] for a in kv)
    blob = codec.encode(keys, values, "high", calibration=cal, first_token=0)
    want = codec.decode(blob, calibrations={cal.id: cal}, backend=backend)
    n_layer, n_tok, n_ch = keys.shape
    big = np.full((n_layer, n_ch, n_tok + 30), np.float16(7))
    view = big.transpose(0, 2, 1)[:, 10:10 + n_tok]
    k, v = codec.decode(blob, out=(np.empty_like(keys), view), calibrations={cal.id: cal},
                        backend=backend)
    assert np.array_equal(k.view(np.uint16), want[0].view(np.uint16))
    assert np.array_equal(view.view(np.uint16), want[1].view(np.uint16))
    assert np.all(big[:, :, :10] == 7) and np.all(big[:, :, 10 + n_tok:] == 7)


def test_calibrated_level_is_accurate_and_keeps_sinks_exact(kv, cal):
    keys, values = kv
    blob = codec.encode(keys, values, "high", calibration=cal)
    k, v = codec.decode(blob, calibrations=lambda i: cal if i == cal.id else None)
    assert np.array_equal(k[:, 0], keys[:, 0]) and np.array_equal(v[:, 0], values[:, 0])
    for got, want in ((k, keys), (v, values)):
        err = got[:, 1:].astype(np.float32) - want[:, 1:].astype(np.float32)
        assert np.sqrt((err**2).mean()) < 0.5 * want[:, 1:].astype(np.float32).std()


def test_blobs_without_their_calibration_are_refused_cleanly(kv, cal):
    keys, values = (a[:, :16] for a in kv)
    blob = codec.encode(keys, values, "high", calibration=cal)
    other = calibration_of(keys[:, ::-1].copy(), values)
    for calibrations in (None, {}, {other.id: other}, lambda _: None):
        with pytest.raises(CalibrationMissing, match=cal.id[:12]):
            codec.decode(blob, calibrations=calibrations)
    with pytest.raises(CalibrationMissing):  # a config naming a calibration not given
        codec.encode(keys, values, cal.config("high"))
    with pytest.raises(CodecError, match="not 2 x"):  # the calibration is for 4 layers
        codec.encode(keys[:2], values[:2], "high", calibration=cal)


@pytest.mark.parametrize("name", ["calibrated-high", "calibrated-high-packed-ids"])
def test_golden_calibrated_blob_still_decodes(name):
    expected = json.loads((GOLDEN / "expected.json").read_text())[name]
    cal = Calibration.from_bytes((GOLDEN / "calibration.kvcl").read_bytes())
    blob = (GOLDEN / f"{name}.kvc").read_bytes()
    assert cal.id == expected["calibration"] == codec.peek(blob).calibration
    k, v = codec.decode(blob, calibrations={cal.id: cal})
    assert hashlib.sha256(k.tobytes() + v.tobytes()).hexdigest() == expected["decoded_sha256"]
