"""Encoding and decoding of one chunk blob (`chunks` builds the chunk-list helpers on it).

A chunk is the KV of consecutive tokens, all layers: keys and values [L, T, C] float16. Its
blob decodes on its own (tables are codebook ids, scales and sink tokens travel inside).
Here the stages are wired together: sink split, (delta), quantization, table choice, rANS,
container. Kernels come from `backend`; this module must never hold per-element loops.

Payload sections, in order (u32 ones first so that every section is aligned):
    quantized: word counts K, V | packed id sizes K, V | sink tokens K, V | scales K, V |
               packed table ids K, V | words K, V
    lossless:  word counts | frequency tables | words, each for K-high, K-low, V-high, V-low
Every size follows from the header, except the words, whose sizes are the counts' sums, and
the packed ids, whose sizes are stored. Packed ids (container flag PACKED_IDS): a kind's
codebook ids [L, C] as three byte planes, the centres' low and high bytes and the widths,
deflated together, then a zero byte where that made an odd size. A chunk's channels repeat a
few centres and widths: raw, 2 bytes an id are 5-7 % of a 150-token chunk at `balanced`, and
deflate keeps a third of them. Blobs without the flag hold the ids raw (u16 [L, C]) and no
sizes, in the place of the packed ones.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .backend import active
from .calibrated import intinverse, transform
from .calibrated.calibration import Calibration, Part
from .errors import CalibrationMissing, CodecError
from .format import container
from .format.container import Header
from .format.levels import CodecConfig, KindConfig, resolve
from .kernels import tables
from .kernels.tables import F16_TO_F32
from .kernels.workspace import scratch
from .plan import Plan, apply_anchors, residuals

BYTE_SYMBOLS = 256
# zlib's fastest: 0.36 ms a 256-token SmolLM2 chunk (2 % of its encode); the default, 6,
# takes 3.3x that to save another 0.07 % of the blob
DEFLATE_LEVEL = 1
# Lossless planes decode straight into their place in the fp16 bit pattern (high | low).
_BYTE_DQ = {shift: (np.arange(BYTE_SYMBOLS, dtype=np.uint16) << shift).reshape(1, 1, 1, -1)
            for shift in (8, 0)}


@dataclass(frozen=True)
class BlobInfo:
    """What `peek` tells about a blob without decoding it."""

    level: str
    config: dict
    n_layer: int
    n_tokens: int
    channels: int
    first_token: int
    nbytes: int
    format_version: int
    calibration: str | None = None  # SHA-256 of the model calibration it needs, if any

    @property
    def bits_per_element(self) -> float:
        return self.nbytes * 8 / (2 * self.n_layer * self.n_tokens * self.channels)


def check_input(keys: np.ndarray, values: np.ndarray) -> tuple[int, int, int]:
    for name, a in (("keys", keys), ("values", values)):
        if not isinstance(a, np.ndarray) or a.dtype != np.float16 or a.ndim != 3:
            raise CodecError(f"{name} must be a float16 array [n_layer, n_tokens, channels]")
    if keys.shape != values.shape:
        raise CodecError(f"keys {keys.shape} and values {values.shape} differ in shape")
    n_layer, n_tok, n_ch = keys.shape
    if not (1 <= n_layer <= container.MAX_LAYERS and 1 <= n_tok <= container.MAX_TOKENS
            and 1 <= n_ch <= container.MAX_CHANNELS) or keys.size > container.MAX_ELEMENTS:
        raise CodecError(f"unsupported KV shape {keys.shape}")
    return n_layer, n_tok, n_ch


def _n_sink(cfg: CodecConfig, first_token: int, n_tok: int) -> int:
    return min(max(cfg.sink_tokens - first_token, 0), n_tok)


def _refuse_nonfinite(found: bool) -> None:
    if found:
        raise CodecError("KV contains NaN or Inf; the codec refuses it")


Resolver = Callable[[str], Calibration | None] | Mapping[str, Calibration]


def _level(level: str | CodecConfig | dict, calibration: Calibration | None,
           part: int) -> CodecConfig:
    if isinstance(level, str) and calibration is not None and level in calibration.level_names:
        return calibration.config(level, part)
    return resolve(level)


def _part(cfg: CodecConfig, calibration: Calibration | None, n_layer: int,
          n_ch: int) -> Part | None:
    """The calibration part a config's transforms come from (None: it names none)."""
    if cfg.calibration is None:
        return None
    cal_id, index = cfg.calibration
    if calibration is None or calibration.id != cal_id:
        raise CalibrationMissing(cal_id)
    if index >= len(calibration.parts):
        raise CodecError(f"codec calibration {cal_id[:12]} has no part {index}")
    part = calibration.parts[index]
    if (part.n_layer, part.channels) != (n_layer, n_ch):
        raise CodecError(f"codec calibration {cal_id[:12]} part {index} is for KV of "
                         f"{part.n_layer} layers x {part.channels} channels, not "
                         f"{n_layer} x {n_ch}")
    return part


def encode(keys: np.ndarray, values: np.ndarray, level: str | CodecConfig | dict = "balanced",
           *, first_token: int = 0, backend=None, calibration: Calibration | None = None,
           part: int = 0) -> bytes:
    """Encode one chunk (any token count >= 1) into a blob that decodes on its own, or with
    `calibration` when its level is calibrated (a level name of the calibration's `part`, or
    a config naming it)."""
    cfg = _level(level, calibration, part)
    n_layer, n_tok, n_ch = check_input(keys, values)
    cal_part = _part(cfg, calibration, n_layer, n_ch)
    if not (isinstance(first_token, int) and 0 <= first_token <= 1 << 48):
        raise CodecError(f"first_token must be a non-negative int, not {first_token!r}")
    be = backend or active()
    bits = [a.view(np.uint16) for a in (keys, values)]
    if cfg.mode == "lossless":
        header = Header(cfg, n_layer, n_tok, n_ch, first_token)
        _refuse_nonfinite(any(be.any_nonfinite(b) for b in bits))
        planes = [np.ascontiguousarray(p, np.uint8) for b in bits for p in (b >> 8, b & 0xFF)]
        counts, freqs, words = zip(*(_encode_bytes(p, cfg, be) for p in planes), strict=True)
        return container.pack(header, [*counts, *freqs, *words])
    n_sink = _n_sink(cfg, first_token, n_tok)
    sinks = [np.ascontiguousarray(b[:, :n_sink]) for b in bits]
    _refuse_nonfinite(any(be.any_nonfinite(s) for s in sinks if s.size))  # a launch: ~0.1 ms
    coded = [_transformed(b[:, n_sink:], kind, cal_part, name, first_token + n_sink)
             for b, kind, name in ((bits[0], cfg.keys, "keys"), (bits[1], cfg.values, "values"))]
    scales, ids, counts, words = zip(*(
        _encode_kind(b, kind, cfg, be)
        for b, kind in ((coded[0], cfg.keys), (coded[1], cfg.values))), strict=True)
    packed = [_pack_ids(i) for i in ids]
    sizes = np.array([len(p) for p in packed], np.uint32)
    padded = [np.frombuffer(p + bytes(len(p) % 2), np.uint8) for p in packed]
    header = Header(cfg, n_layer, n_tok, n_ch, first_token, flags=container.PACKED_IDS)
    return container.pack(header, [*counts, sizes, *sinks, *scales, *padded, *words])


def _transformed(bits: np.ndarray, kind: KindConfig, part: Part | None, name: str,
                 first_position: int) -> np.ndarray:
    """The fp16 bits the quantizer codes: the calibrated transform's coefficients, if any."""
    if not kind.transform or bits.shape[1] == 0:
        return bits
    tf = part.transform(name)
    _check_exact(kind, tf)
    cos, sin = transform.angles(tf, first_position, bits.shape[1])
    with np.errstate(over="ignore", invalid="ignore"):  # non-finite input is refused after
        if tf.basis is None:  # one numba pass (the encoder's only float step: every backend)
            from .kernels import tkernel  # here: decoding must not import numba (backend/aot)

            y = tkernel.forward_fast(np.ascontiguousarray(bits), tf.mean, tf.rope, cos, sin,
                                     tf.head_dim)
        else:
            y = transform.forward(bits.view(np.float16), tf, cos, sin)
        return y.astype(np.float16).view(np.uint16)


def _check_exact(kind: KindConfig, tf: transform.KindTransform) -> None:
    # an exact transform's inverse takes one quantizer step per layer (calibrated/intinverse.py)
    if tf.exact and kind.scale != "layer":
        raise CodecError(f"an exact calibrated transform needs \"layer\" scales, not "
                         f"{kind.scale!r}")


def _encode_bytes(sym: np.ndarray, cfg: CodecConfig, be):
    """One lossless byte plane -> (counts, freq tables [L, 256] uint16, words)."""
    n_layer, _, n_ch = sym.shape
    hist = np.bincount((sym + (np.arange(n_layer) * BYTE_SYMBOLS)[:, None, None].astype(
        np.int64)).ravel(), minlength=n_layer * BYTE_SYMBOLS).reshape(n_layer, BYTE_SYMBOLS)
    freq = tables.explicit(hist)
    bank = tables.bank_of(freq)
    ent = np.repeat(np.arange(n_layer)[:, None], n_ch, axis=1)
    words, counts = be.encode(sym, ent, bank.freq, bank.cum, bank.recip, cfg.lanes,
                              cfg.states)
    return counts, freq.astype(np.uint16), words


def _encode_kind(bits: np.ndarray, kind: KindConfig, cfg: CodecConfig, be):
    """One quantized kind -> (scales fp16 bits, local entry ids uint16, counts, words).

    Its temporaries are per-thread scratch arrays (kernels/workspace.py), and a contiguous copy of a
    strided input (~0.3 ms a 256-token kind) lets the quantizer's loops vectorize: on a view
    of a document they ran 2.5x slower."""
    n_layer, n_tok, n_ch = bits.shape
    plan = Plan.of(kind, n_layer, n_tok, n_ch, cfg.anchor_group)
    if cfg.anchor_group:
        bits, bad = residuals(bits, plan, cfg.anchor_group, be)
        _refuse_nonfinite(bad)
    elif not bits.flags.c_contiguous:
        copy = scratch("encode.bits", bits.shape, np.uint16)
        np.copyto(copy, bits)
        bits = copy
    sym, scales, hist, bad = be.quantize(
        bits, plan.maxq, plan.akey, plan.bkey, plan.n_a, plan.n_b, F16_TO_F32,
        scratch("encode.sym", bits.shape, np.uint8),
        scratch("encode.hist", (n_layer, n_ch, int(plan.nsym.max())), np.int64))
    _refuse_nonfinite(bad)
    bank, base = plan.bank
    ent = be.choose_entries(hist, plan.nsym, base, bank.cost, tables.N_RHO)
    words, counts = be.encode(sym, ent + base[:, None], bank.freq, bank.cum, bank.recip,
                              cfg.lanes, cfg.states)
    return scales, ent.astype(np.uint16), counts, words


def _pack_ids(ids: np.ndarray) -> bytes:
    """A kind's codebook ids [L, C] deflated as the byte planes of their centres and widths."""
    centre, width = np.divmod(ids.astype(np.int64), tables.N_RHO)
    planes = np.stack([centre & 0xFF, centre >> 8, width]).astype(np.uint8)
    return zlib.compress(planes.tobytes(), DEFLATE_LEVEL)


def _unpack_ids(reader: container.Reader, size: int, shape: tuple[int, int]) -> np.ndarray:
    """The ids [L, C] (int64) `_pack_ids` wrote in `size` bytes (then its padding): exactly
    three planes of `shape`, never inflated beyond them, every width in the codebook."""
    data = reader.take(np.uint8, (size,)).tobytes()
    if size % 2 and reader.take(np.uint8, (1,))[0]:
        raise CodecError("codec blob's table ids are corrupt (padding)")
    want = 3 * shape[0] * shape[1]
    inflater = zlib.decompressobj()
    try:
        planes = inflater.decompress(data, want)
    except zlib.error as err:
        raise CodecError(f"codec blob's table ids are corrupt ({err})") from err
    if len(planes) != want or not inflater.eof or inflater.unconsumed_tail or \
            inflater.unused_data:
        raise CodecError("codec blob's table ids are corrupt (wrong size)")
    low, high, width = np.frombuffer(planes, np.uint8).reshape(3, *shape).astype(np.int64)
    if np.any(width >= tables.N_RHO):
        raise CodecError("codec blob names a table that does not exist")
    return (low | high << 8) * tables.N_RHO + width


@dataclass(frozen=True)
class _Parsed:
    """A verified blob cut into its sections (per kind, or per lossless byte plane)."""

    header: Header
    counts: list[np.ndarray]
    sinks: list[np.ndarray]
    scales: list[np.ndarray]
    tables: list[np.ndarray]  # codebook ids [L, C], or lossless frequencies [L, 256]
    words: list[np.ndarray]
    table_bytes: int  # the tables as stored (packed ids: their sizes and padded streams)


def _parse(blob: bytes) -> _Parsed:
    header, reader = container.unpack(blob)
    cfg, n_layer, n_tok, n_ch = header.config, header.n_layer, header.n_tokens, header.channels
    n_grp = -(-n_ch // cfg.lanes)
    packed = header.flags & container.PACKED_IDS
    if cfg.mode == "lossless":
        if packed:
            raise CodecError("codec blob of a lossless level says its table ids are packed")
        counts = [reader.take(np.uint32, (n_layer, n_grp)) for _ in range(4)]
        freqs = [reader.take(np.uint16, (n_layer, BYTE_SYMBOLS)) for _ in range(4)]
        return _Parsed(header, counts, [], [], freqs, _take_words(reader, counts),
                       sum(f.nbytes for f in freqs))
    n_sink = _n_sink(cfg, header.first_token, n_tok)
    plans = [Plan.of(k, n_layer, n_tok - n_sink, n_ch, cfg.anchor_group)
             for k in (cfg.keys, cfg.values)]
    counts = [reader.take(np.uint32, (n_layer, n_grp)) for _ in range(2)]
    sizes = reader.take(np.uint32, (2,)).astype(np.int64) if packed else None
    sinks = [reader.take(np.uint16, (n_layer, n_sink, n_ch)) for _ in range(2)]
    scales = [reader.take(np.uint16, (n_layer, p.n_a, p.n_b)) for p in plans]
    if sizes is None:
        ents = [reader.take(np.uint16, (n_layer, n_ch)) for _ in range(2)]
        stored = sum(e.nbytes for e in ents)
    else:
        ents = [_unpack_ids(reader, int(n), (n_layer, n_ch)) for n in sizes]
        stored = sizes.nbytes + int((sizes + sizes % 2).sum())
    return _Parsed(header, counts, sinks, scales, ents, _take_words(reader, counts), stored)


def _resolve(cfg: CodecConfig, calibrations: Resolver | None) -> Calibration | None:
    if cfg.calibration is None:
        return None
    cal_id = cfg.calibration[0]
    if calibrations is None:
        found = None
    elif isinstance(calibrations, Mapping):
        found = calibrations.get(cal_id)
    else:
        found = calibrations(cal_id)
    if found is None:
        raise CalibrationMissing(cal_id)
    return found


def decode(blob: bytes, *, out: tuple[np.ndarray, np.ndarray] | None = None,
           backend=None, calibrations: Resolver | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Decode one chunk blob -> (keys, values) float16 [n_layer, n_tokens, channels].

    out: optional (keys, values) float16 arrays of that shape to decode into, e.g. views of a
    whole document's buffer (big[:, t0:t0 + n]); float16 views of them are returned. On error
    their contents are undefined. Without out, keys and values are the two halves of one new
    array (one allocation: fewer page faults).
    calibrations: where a blob of a calibrated level finds the calibration its header names:
    a mapping or a function from the calibration's id (`peek(blob).calibration`) to it (or
    None). Without it such a blob raises CalibrationMissing (a CodecError).
    """
    parts = _parse(blob)
    header = parts.header
    cfg, n_layer, n_tok, n_ch = header.config, header.n_layer, header.n_tokens, header.channels
    cal_part = _part(cfg, _resolve(cfg, calibrations), n_layer, n_ch)
    be = backend or active()
    out = _outputs(out, (n_layer, n_tok, n_ch))
    if cfg.mode == "lossless":
        ent = np.repeat(np.arange(n_layer)[:, None], n_ch, axis=1)
        for k in range(2):
            low = np.empty_like(out[k])
            for i, target, shift in ((2 * k, out[k], 8), (2 * k + 1, low, 0)):
                freq = parts.tables[i].astype(np.int64)
                if np.any(freq.sum(axis=1) != tables.PROB_SCALE):
                    raise CodecError("codec blob has an invalid lossless frequency table")
                _run_decode(be, parts.words[i], parts.counts[i], ent, tables.bank_of(freq),
                            np.broadcast_to(_BYTE_DQ[shift], (n_layer, 1, 1, BYTE_SYMBOLS)),
                            np.zeros(n_tok, np.int64), np.zeros(n_ch, np.int64), target, 0,
                            cfg)
            out[k] |= low
        return out[0].view(np.float16), out[1].view(np.float16)
    n_sink = _n_sink(cfg, header.first_token, n_tok)
    for i, kind in enumerate((cfg.keys, cfg.values)):
        plan = Plan.of(kind, n_layer, n_tok - n_sink, n_ch, cfg.anchor_group)
        scales, ents = parts.scales[i], parts.tables[i]
        if scales.size and scales.max() >= 0x7C00:  # negative (sign bit set), Inf or NaN
            raise CodecError("codec blob has an invalid scale")
        if np.any(ents >= plan.n_entries[:, None]):
            raise CodecError("codec blob names a table that does not exist")
        out[i][:, :n_sink] = parts.sinks[i]
        bank, base = plan.bank
        if kind.transform and n_tok > n_sink:
            # coefficients as float32 (their fp16 values, or an exact transform's integers)
            # into scratch, then the inverse transform writes the KV: no fp16 pass over out
            tf = cal_part.transform(("keys", "values")[i])
            _check_exact(kind, tf)
            if tf.exact:
                dq, gain = intinverse.symbol_values(plan.maxq, int(plan.nsym.max())), \
                    intinverse.gains(scales.reshape(n_layer), plan.maxq, tf.integer_basis[1],
                                     tf.block)
            else:
                dq, gain = plan.dequant(scales).view(np.float16).astype(np.float32), None
            coef = scratch("decode.coef", (n_layer, n_tok - n_sink, n_ch), np.float32)
            _run_decode(be, parts.words[i], parts.counts[i], ents + base[:, None], bank, dq,
                        plan.akey, plan.bkey, coef, 0, cfg)
            kv = target = out[i][:, n_sink:]
            if target.strides[1] < target.strides[2]:
                # channel-major (llama.cpp's V without flash attention): written row by row,
                # every element would land on another cache line and page (1.6x the decode)
                kv = scratch("decode.kv", target.shape, np.uint16)
            be.untransform(coef, kv, tf,
                           *transform.angles(tf, header.first_token + n_sink, n_tok - n_sink),
                           gain)
            if kv is not target:
                be.to_channel_major(kv, target, cfg.lanes)
        else:
            _run_decode(be, parts.words[i], parts.counts[i], ents + base[:, None], bank,
                        plan.dequant(scales), plan.akey, plan.bkey, out[i], n_sink, cfg)
        if cfg.anchor_group:
            apply_anchors(out[i][:, n_sink:], cfg.anchor_group)
    return out[0].view(np.float16), out[1].view(np.float16)


def _outputs(out, shape: tuple[int, int, int]) -> list[np.ndarray]:
    """The uint16 views the kernels write: fresh arrays, or the caller's validated ones."""
    if out is None:  # one block: at >= 4 MB numpy asks the kernel for huge pages
        return list(np.empty((2, *shape), np.uint16))
    if not (isinstance(out, tuple | list) and len(out) == 2 and all(
            isinstance(a, np.ndarray) and a.dtype == np.float16 and a.shape == shape
            and a.flags.writeable for a in out)):
        raise CodecError(f"out must be two writable float16 arrays of shape {shape}")
    return [a.view(np.uint16) for a in out]


def layout(blob: bytes) -> dict[str, int]:
    """Bytes of each part of a verified blob: header (prelude, JSON, checksum), stream word
    counts, sink tokens, scales, tables (codebook ids or lossless histograms) and streams."""
    parts = _parse(blob)
    sizes = {name: sum(a.nbytes for a in getattr(parts, attr))
             for name, attr in (("counts", "counts"), ("sinks", "sinks"), ("scales", "scales"))}
    sizes |= {"tables": parts.table_bytes, "streams": sum(w.nbytes for w in parts.words)}
    return {"header": len(blob) - sum(sizes.values()), **sizes}


def _take_words(reader: container.Reader, counts: list[np.ndarray]) -> list[np.ndarray]:
    words = [reader.take(np.uint16, (int(c.sum(dtype=np.int64)),)) for c in counts]
    reader.finish()
    return words


def _run_decode(be, words, counts, ent, bank, dq, akey, bkey, out, t0, cfg) -> None:
    # A GPU backend copies the tables once and keeps them: it gets every row.
    ent, fc, lut = (ent, bank.fc, bank.lut) if be.name == "cuda" else bank.decoder_tables(ent)
    if not be.decode(words, counts, ent, fc, lut, np.ascontiguousarray(dq), akey, bkey,
                     out, t0, cfg.lanes, cfg.states):
        raise CodecError("codec blob stream is corrupt (rANS check failed)")


def peek(blob: bytes) -> BlobInfo:
    """Header facts of a blob (level, shapes, sizes) without decoding or checksumming it."""
    h = container.peek(blob)
    return BlobInfo(h.config.name, h.config.get_config(), h.n_layer, h.n_tokens, h.channels,
                    h.first_token, len(blob), h.version,
                    h.config.calibration[0] if h.config.calibration else None)
