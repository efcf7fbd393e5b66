"""A quantized blob's codebook ids packed (container flag PACKED_IDS): smaller, the same KV as
the raw layout that older blobs hold, and every damaged or hostile packed section refused."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from codec_helpers import real_kv, refresh_crc, section_offsets

import codec
from codec import CodecError
from codec.format import container
from codec.kernels import tables


@pytest.fixture(scope="module")
def kv():
    keys, values = real_kv(150)  # a passage's chunk: where the ids weigh most
    return keys[:4], values[:4]


def cut(blob: bytes) -> dict:
    """A packed blob's parts: everything before the id sizes, the sizes, the sinks and scales,
    the two packed id streams (unpadded), and the words."""
    parts = codec.layout(blob)
    at = section_offsets(blob)["payload"] + parts["counts"]
    sizes = struct.unpack_from("<2I", blob, at)
    mid = at + 8 + parts["sinks"] + parts["scales"]
    streams, pos = [], mid
    for n in sizes:
        streams.append(bytes(blob[pos:pos + n]))
        pos += n + n % 2
    return {"head": bytes(blob[:at]), "mid": bytes(blob[at + 8:mid]), "ids": streams,
            "words": bytes(blob[pos:-4])}


def join(p: dict, ids: list[bytes], *, pad: bytes = b"\0") -> bytes:
    body = p["head"] + struct.pack("<2I", *map(len, ids)) + p["mid"]
    body += b"".join(s + pad * (len(s) % 2) for s in ids) + p["words"]
    return refresh_crc(body + b"\0" * 4)


def with_flags(blob: bytes, flags: int) -> bytes:
    return refresh_crc(blob[:6] + struct.pack("<H", flags) + blob[8:])


def raw_form(blob: bytes) -> bytes:
    """The same chunk in the layout of blobs written before PACKED_IDS: raw u16 ids."""
    p = cut(blob)
    ids = [np.frombuffer(zlib.decompress(s), np.uint8).reshape(3, -1).astype(np.uint16)
           for s in p["ids"]]
    raw = b"".join(((lo | hi << 8) * tables.N_RHO + w).tobytes() for lo, hi, w in ids)
    return with_flags(refresh_crc(p["head"] + p["mid"] + raw + p["words"] + b"\0" * 4), 0)


@pytest.mark.parametrize("level", ["high", "balanced", "compact", "cachegen-2"])
def test_packed_ids_are_smaller_and_decode_as_the_raw_layout_does(kv, level):
    keys, values = kv
    blob = codec.encode(keys, values, level)
    assert container.peek(blob).flags == container.PACKED_IDS
    raw_ids = 2 * keys.shape[0] * keys.shape[2] * 2  # K and V, 2 bytes an id
    assert codec.layout(blob)["tables"] < raw_ids * 0.6
    old = raw_form(blob)
    assert container.peek(old).flags == 0 and codec.layout(old)["tables"] == raw_ids
    got, want = codec.decode(blob), codec.decode(old)
    assert all(np.array_equal(a.view(np.uint16), b.view(np.uint16))
               for a, b in zip(got, want, strict=True))


def test_a_lossless_blob_is_written_as_before(kv):
    blob = codec.encode(*kv, "lossless")
    assert container.peek(blob).flags == 0
    with pytest.raises(CodecError, match="lossless level says its table ids are packed"):
        codec.decode(with_flags(blob, container.PACKED_IDS))


def planes(shape: tuple[int, int], *, width: int = 3, extra: int = 0) -> bytes:
    data = np.zeros((3, *shape), np.uint8)
    data[2] = width
    return zlib.compress(data.tobytes() + bytes(extra))


@pytest.mark.parametrize("damage, message", [
    (lambda s, shape: planes(shape, extra=1 << 20), "wrong size"),  # inflates past its planes
    (lambda s, shape: planes((shape[0], shape[1] - 1)), "wrong size"),
    (lambda s, shape: s + b"\0", "wrong size"),  # bytes after the deflate stream
    (lambda s, shape: s[:-5], "wrong size|corrupt"),
    (lambda s, shape: bytes(len(s)), "corrupt"),
    (lambda s, shape: planes(shape, width=tables.N_RHO), "table that does not exist"),
    (lambda s, shape: b"", "wrong size"),
])
def test_a_damaged_packed_id_section_is_refused(kv, damage, message):
    keys, values = kv
    blob = codec.encode(keys, values, "balanced")
    p, shape = cut(blob), (keys.shape[0], keys.shape[2])
    bad = join(p, [damage(p["ids"][0], shape), p["ids"][1]])
    with pytest.raises(CodecError, match=message):
        codec.decode(bad)


def test_a_packed_section_of_an_impossible_size_or_padding_is_refused(kv):
    blob = codec.encode(*kv, "balanced")
    p = cut(blob)
    assert any(len(s) % 2 for s in p["ids"])  # this chunk's streams need their padding byte
    with pytest.raises(CodecError, match="padding"):
        codec.decode(join(p, p["ids"], pad=b"\1"))
    huge = p["head"] + struct.pack("<2I", 1 << 31, 4) + blob[len(p["head"]) + 8:-4]
    with pytest.raises(CodecError, match="truncated"):
        codec.decode(refresh_crc(huge + b"\0" * 4))


def test_an_unknown_flag_is_refused_clearly(kv):
    blob = codec.encode(*kv, "balanced")
    with pytest.raises(CodecError, match=r"unsupported codec blob format version 1 \(flags 3\)"):
        codec.decode(with_flags(blob, 3))
