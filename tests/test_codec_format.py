"""The wire format: golden blobs, backends byte-identical, and hostile or damaged input."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib

import numpy as np
import pytest
from codec_helpers import FIXTURES, custom, random_kv, real_kv, refresh_crc, section_offsets

import codec
from codec import CodecError, backend
from codec.format import container
from codec.kernels import rans, tables

GOLDEN = FIXTURES / "golden"
REF = backend.get("reference")
CPU = backend.get("cpu")


def digest(keys, values) -> str:
    return hashlib.sha256(keys.tobytes() + values.tobytes()).hexdigest()


def golden_cases():
    """Format version 1 blobs (test_codec_calibration.py decodes the calibrated one)."""
    return sorted((name, e) for name, e in json.loads((GOLDEN / "expected.json").read_text())
                  .items() if "calibration" not in e)


@pytest.mark.parametrize("name, expected", golden_cases())
def test_golden_blobs_still_decode_and_reencode(name, expected):
    blob = (GOLDEN / f"{name}.kvc").read_bytes()
    # each layout frozen as written: the raw ids of the first blobs, packed ones after
    packed = name.endswith("-packed-ids")
    assert container.peek(blob).flags == (container.PACKED_IDS if packed else 0)
    keys, values = codec.decode(blob)
    assert digest(keys, values) == expected["decoded_sha256"]
    # Today's encoder may pick other tables (smaller blobs), but never other values.
    info = codec.peek(blob)
    src_k, src_v = real_kv(expected["n_tokens"])
    src_k, src_v = src_k[: expected["n_layer"]], src_v[: expected["n_layer"]]
    again = codec.encode(src_k, src_v, info.config, first_token=info.first_token)
    assert digest(*codec.decode(again)) == expected["decoded_sha256"]


def test_every_level_has_a_golden_blob():
    assert {n for n, _ in golden_cases()} >= set(codec.levels())


CONFIGS = [*codec.levels(),
           custom("layer", keys={"scale": "layer", "bins": [6, 64], "layer_edges": [0.5]}),
           custom("delta", anchor_group=4, sink_tokens=3)]


@pytest.mark.parametrize("level", CONFIGS, ids=str)
def test_numba_and_reference_write_identical_bytes(level):
    keys, values = random_kv((2, 19, 11), seed=7)
    keys[1, 2] = 0
    blob = codec.encode(keys, values, level, backend=CPU)
    assert codec.encode(keys, values, level, backend=REF) == blob
    k1, v1 = codec.decode(blob, backend=CPU)
    k2, v2 = codec.decode(blob, backend=REF)
    assert digest(k1, v1) == digest(k2, v2)


def test_numba_and_reference_agree_on_real_kv():
    keys, values = real_kv(24)
    for level in ("balanced", "cachegen-1"):
        blob = codec.encode(keys[:2], values[:2], level, backend=CPU)
        assert codec.encode(keys[:2], values[:2], level, backend=REF) == blob


@pytest.fixture(scope="module")
def blob():
    keys, values = random_kv((2, 24, 20), seed=9)
    return codec.encode(keys, values, "balanced")


def test_every_truncation_is_refused(blob):
    for n in range(len(blob)):
        with pytest.raises(CodecError):
            codec.decode(blob[:n])


def test_every_bit_flip_is_refused(blob):
    for pos in range(len(blob)):
        bad = bytearray(blob)
        bad[pos] ^= 1 << (pos % 8)
        with pytest.raises(CodecError):
            codec.decode(bytes(bad))


def test_damage_behind_a_valid_checksum_never_crashes(blob):
    """An adversary can fix the CRC: every section must still be validated before use.

    Flips one bit in every byte of the header and of every fixed section (counts, sink
    tokens, scales, table ids) and in every 5th byte of the streams."""
    parts = codec.layout(blob)
    start = section_offsets(blob)["header"]
    payload = section_offsets(blob)["payload"]
    streams = payload + sum(parts[p] for p in ("counts", "sinks", "scales", "tables"))
    positions = [*range(start, streams), *range(streams, len(blob) - 4, 5)]
    refused = 0
    for pos in positions:
        bad = bytearray(blob)
        bad[pos] ^= 1 << (pos % 8)
        try:
            k, v = codec.decode(refresh_crc(bad))
        except CodecError:
            refused += 1
        else:
            assert k.shape == v.shape == (2, 24, 20)
    assert refused > len(positions) // 3  # the format checks alone catch much of it


@pytest.mark.parametrize("data", [
    b"", b"KVDC", b"\x89PNG\r\n\x1a\n" + bytes(64), bytes(100), b"KVDC" + bytes(96),
    "not bytes", None,
])
def test_foreign_input_is_refused(data):
    with pytest.raises(CodecError):
        codec.decode(data)


def make_blob(meta: dict, payload: bytes = b"", version: int = 1) -> bytes:
    text = json.dumps(meta).encode()
    body = struct.pack("<4sHHI", b"KVDC", version, 0, len(text)) + text + payload
    return body + struct.pack("<I", zlib.crc32(body))


GOOD_META = {"config": codec.levels()["balanced"].get_config(), "dtype": "float16",
             "n_layer": 2, "n_tokens": 4, "channels": 3, "first_token": 0}


@pytest.mark.parametrize("meta", [
    {**GOOD_META, "n_layer": 0},
    {**GOOD_META, "n_tokens": 1 << 40},
    {**GOOD_META, "n_layer": 4000, "n_tokens": 1 << 20, "channels": 65536},
    {**GOOD_META, "channels": "3"},
    {**GOOD_META, "config": {"id": "kvdesk.kv"}},
    {**GOOD_META, "extra": True},
    {**GOOD_META, "dtype": "bfloat16"},
    [1, 2, 3],
    GOOD_META,  # well-formed header, empty payload
])
def test_hostile_headers_are_refused(meta):
    with pytest.raises(CodecError):
        codec.decode(make_blob(meta))


def test_future_format_version_is_refused_clearly():
    with pytest.raises(CodecError, match="format version 3"):
        codec.decode(make_blob(GOOD_META, version=3))
    with pytest.raises(CodecError, match="version 2 lacks a calibration"):
        codec.decode(make_blob(GOOD_META, version=2))


def test_rans_decoder_survives_garbage_streams():
    """Kernel-level: random words with consistent counts must not read or write out of bounds."""
    rng = np.random.default_rng(1)
    bank, _ = tables.kind_bank((15,))
    out = np.zeros((2, 50, 6), np.uint16)
    dq = np.zeros((2, 1, 6, 15), np.uint16)
    ent = rng.integers(0, tables.n_entries(15), (2, 6))
    for _ in range(200):
        counts = rng.integers(0, 40, (2, 2)).astype(np.uint32)
        words = rng.integers(0, 1 << 16, int(counts.sum())).astype(np.uint16)
        ok = rans.decode(words, counts, ent, bank.fc, bank.lut, dq,
                         np.zeros(50, np.int64), np.arange(6), out, 0, 4, 3)
        assert ok in (True, False)


def test_encoder_reciprocals_divide_exactly():
    """The rANS encoder divides x < f * 2^20 by f as (x * ceil(2^32 / f)) >> 32 and a fix-up
    of at most one; check that identity for every frequency at the range's edges."""
    f = np.arange(1, tables.PROB_SCALE + 1, dtype=np.int64)
    bank = tables.bank_of(f[None, :])
    recip = bank.recip[0].astype(np.uint64)
    rng = np.random.default_rng(3)
    top = f << 20
    for x in (np.zeros_like(f), f - 1, f, top // 2 + 1, top - 1, rng.integers(0, top)):
        q = ((x.astype(np.uint64) * recip) >> np.uint64(32)).astype(np.int64)
        assert np.all((q == x // f) | (q == x // f + 1))
        q -= (x - q * f) < 0
        assert np.array_equal(q, x // f)


@pytest.mark.parametrize("nsym", [2, 3, 4, 7, 16, 31, 59, 63, 127])
def test_vectorized_codebook_equals_the_reference(nsym):
    """The fast codebook is the format's: entry for entry the pure-Python definition's."""
    from codec.backend import reference

    assert np.array_equal(tables.codebook_freq(nsym), reference.codebook_freq(nsym))


def test_decoder_rows_are_built_on_demand_and_match_the_codebooks():
    bank, base = tables.kind_bank((7, 15))
    ids = np.array([[base[7] + 3, base[15] + 100], [base[15] + 100, 5]])
    rows, fc, lut = bank.decoder_tables(ids)
    assert sorted(set(rows.ravel().tolist())) == [0, 1, 2]
    books = {7: tables.codebook_freq(7), 15: tables.codebook_freq(15)}
    for e, r in zip(ids.ravel().tolist(), rows.ravel().tolist(), strict=True):
        n = 7 if e < base[15] else 15
        want = books[n][e - base[n]]
        assert np.array_equal(fc[r, :n] & 0xFFFF, want) and np.array_equal(fc[r], bank.fc[e])
        # slot s decodes to the symbol whose [cum, cum + freq) holds it
        assert np.array_equal(lut[r], np.repeat(np.arange(n, dtype=np.uint8), want))
        assert np.array_equal(lut[r], bank.lut[e])
    assert np.array_equal(bank.freq[base[15]:, :15], books[15])  # the encoder's: every row
