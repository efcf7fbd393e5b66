"""The exact bridge between llama.cpp's per-sequence state bytes and numpy KV arrays.

`parse_seq_state` turns the bytes of `llama_state_seq_get_data` (llama-cpp-python 0.3.36,
llama.cpp 0c1e57098) into a `KVState`: keys and values as [n_layer, n_tokens, channels]
arrays plus the cell positions and the few layout facts needed to rebuild the bytes.
`build_seq_state` is its exact inverse: `build_seq_state(parse_seq_state(x)) == x`, byte for
byte. Values are always returned token-major, whatever the cache's V layout (llama.cpp stores
V channel-major, "transposed", when flash attention is off).

Models with interleaved sliding-window attention (iSWA: Gemma 2/3) write two cache sections
back to back after one header: the full-attention layers' cache (every token), then the
sliding-window layers' cache (only the cells inside the window of the sequence's last
position, whatever `swa_full` says: llama.cpp drops masked cells when it writes a sequence).
`parse_seq_sections` / `build_seq_sections` represent such a state exactly as a `SeqState`
holding one `KVState` per section; `parse_seq_state` keeps accepting exactly one section.

This module must never guess. The byte layout changes between llama.cpp versions and
llama.cpp itself checks almost nothing of a state's origin, so every count read here is
checked against the bytes that remain, and anything this bridge does not understand
(quantized cache types, several streams, per-cell extensions, more than the two sections of
an iSWA cache, hybrid/recurrent sections, layers of different widths) is refused with a
`KVStateError` that says what was found. It knows nothing of models, files, the codec or the
store.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from .errors import KVStateError

SEQ_STATE_MAGIC = 0xAF143CD8

# ggml type ids of the float cache types this bridge understands (ggml.h).
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
_FLOAT_TYPES = {GGML_TYPE_F32: np.dtype("<f4"), GGML_TYPE_F16: np.dtype("<f2")}
_GGML_TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
                    30: "bf16"}



@dataclass(eq=False)
class KVState:
    """One sequence's KV cache, token-major.

    keys, values: [n_layer, n_tokens, channels] arrays of the cache dtype (float16 or float32),
    channels = n_head_kv * head_dim, in cache-slot order (the order of `positions`).
    """

    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray  # int32 [n_tokens]
    v_trans: bool  # how llama.cpp lays V out in the state bytes (True: channel-major)
    seq_id: int = 0  # the source sequence id written in the header (ignored on load)
    extra: dict = field(default_factory=dict)

    @property
    def n_layer(self) -> int:
        return self.keys.shape[0]

    @property
    def n_tokens(self) -> int:
        return self.keys.shape[1]

    @property
    def channels(self) -> int:
        return self.keys.shape[2]

    @property
    def dtype(self) -> np.dtype:
        return self.keys.dtype

    def __post_init__(self) -> None:
        if self.keys.ndim != 3 or self.keys.shape != self.values.shape:
            raise KVStateError(
                f"keys {self.keys.shape} and values {self.values.shape} must both be "
                "[n_layer, n_tokens, channels]"
            )
        if self.keys.dtype != self.values.dtype or self.keys.dtype not in _FLOAT_TYPES.values():
            raise KVStateError(f"unsupported KV dtypes {self.keys.dtype}/{self.values.dtype}")
        if self.positions.shape != (self.keys.shape[1],):
            raise KVStateError(
                f"{len(self.positions)} positions for {self.keys.shape[1]} tokens"
            )


def in_position_order(kv: KVState) -> KVState:
    """`kv` with its cells sorted by position: token i of the sequence at index i.

    llama.cpp writes cells in cache-slot order, which after removals and re-evaluation need
    not be position order; everything that slices KV by token range needs this order.
    """
    order = np.argsort(kv.positions, kind="stable")
    if np.array_equal(order, np.arange(kv.n_tokens)):
        return kv
    return KVState(kv.keys[:, order], kv.values[:, order], kv.positions[order], kv.v_trans,
                   kv.seq_id, dict(kv.extra))


class _Reader:
    """Bounds-checked little-endian reads; every overrun is a KVStateError, never garbage."""

    def __init__(self, data: bytes | bytearray | memoryview):
        self.buf = memoryview(data).cast("B")
        self.pos = 0

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.remaining():
            raise KVStateError(
                f"truncated state: {what} needs {n} bytes at offset {self.pos}, "
                f"{self.remaining()} left"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> int:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def array(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        return np.frombuffer(self.take(count * dtype.itemsize, what), dtype=dtype)


def _float_dtype(type_id: int, what: str) -> np.dtype:
    if type_id not in _FLOAT_TYPES:
        name = _GGML_TYPE_NAMES.get(type_id, f"ggml type {type_id}")
        raise KVStateError(f"{what} cache type {name} is not supported (only f16 and f32 are)")
    return _FLOAT_TYPES[type_id]


def parse_seq_state(data: bytes | bytearray | memoryview) -> KVState:
    """Parse one sequence's state (the bytes of llama_state_seq_get_data) exactly.

    Only single-section states (one plain KV cache); see `parse_seq_sections` for iSWA.
    """
    r = _Reader(data)
    seq_id = _parse_header(r)
    kv = _parse_section(r, seq_id)
    if r.remaining():
        raise KVStateError(
            f"{r.remaining()} bytes follow the KV cache section: a second cache section "
            "(sliding-window/iSWA, hybrid or recurrent model) needs parse_seq_sections"
        )
    return kv


@dataclass(eq=False)
class SeqState:
    """A sequence state of one or more cache sections, in the order llama.cpp writes them.

    For an iSWA model: sections[0] is the full-attention cache (all tokens), sections[1] the
    sliding-window cache (the window's tokens only; its positions are a suffix of the first's).
    """

    sections: list[KVState]
    seq_id: int = 0

    @property
    def is_iswa(self) -> bool:
        return len(self.sections) == 2


# iSWA is the only multi-section layout understood here: base cache, then sliding-window cache.
MAX_SECTIONS = 2


def parse_seq_sections(data: bytes | bytearray | memoryview) -> SeqState:
    """Parse a state of one KV cache section or of an iSWA cache's two sections exactly."""
    r = _Reader(data)
    seq_id = _parse_header(r)
    sections = [_parse_section(r, seq_id)]
    while r.remaining():
        if len(sections) == MAX_SECTIONS:
            raise KVStateError(
                f"{r.remaining()} bytes follow {MAX_SECTIONS} cache sections: a hybrid or "
                "recurrent state is not supported"
            )
        sections.append(_parse_section(r, seq_id))
    if len(sections) == 2:
        full, swa = sections
        if swa.n_tokens and not np.isin(swa.positions, full.positions).all():
            raise KVStateError(
                "the second section's positions are not a subset of the first's: not an iSWA "
                "cache this bridge understands"
            )
    return SeqState(sections, seq_id)


def _parse_header(r: _Reader) -> int:
    magic = r.scalar("<I", "magic")
    if magic != SEQ_STATE_MAGIC:
        raise KVStateError(f"not a llama.cpp sequence state (magic {magic:#010x})")
    return r.scalar("<i", "seq_id")


def _parse_section(r: _Reader, seq_id: int) -> KVState:
    """One cache's part of the state: n_stream, cells, then K and V of its layers."""
    n_stream = r.scalar("<I", "n_stream")
    if n_stream != 1:
        raise KVStateError(f"{n_stream} KV streams found; only a single stream is supported")
    n_cells = r.scalar("<I", "cell_count")

    # Each cell: i32 pos, u32 n_seq_id, i32 seq_ids[n_seq_id]. A state of one sequence has
    # exactly one id per cell, equal to the header's; anything else means per-cell extensions
    # (M-RoPE) or a whole-context dump, which would be mis-read as positions.
    if n_cells == 0:
        meta = np.zeros((0, 3), dtype="<i4")
    else:
        meta = r.array(np.dtype("<i4"), 3 * n_cells, "cell metadata").reshape(n_cells, 3)
        bad = np.flatnonzero((meta[:, 1] != 1) | (meta[:, 2] != seq_id))
        if bad.size:
            i = int(bad[0])
            raise KVStateError(
                f"cell {i} has n_seq_id={int(meta[i, 1])}, seq_id={int(meta[i, 2])}: expected "
                f"one id {seq_id} per cell (per-cell extensions or several sequences?)"
            )
    positions = meta[:, 0].astype(np.int32)

    if n_cells == 0:
        # llama.cpp writes nothing after an empty stream's cell count.
        empty = np.zeros((0, 0, 0), dtype=np.float16)
        return KVState(empty, empty.copy(), positions, v_trans=False, seq_id=seq_id)

    v_trans = r.scalar("<I", "v_trans")
    if v_trans not in (0, 1):
        raise KVStateError(f"v_trans is {v_trans}, expected 0 or 1")
    n_layer = r.scalar("<I", "n_layer")
    if n_layer == 0 or n_layer > 4096:
        raise KVStateError(f"implausible layer count {n_layer}")

    keys, k_dtype, channels = [], None, None
    for il in range(n_layer):
        dt = _float_dtype(r.scalar("<i", f"layer {il} K type"), f"layer {il} K")
        row = r.scalar("<Q", f"layer {il} K row size")
        if row % dt.itemsize or row == 0:
            raise KVStateError(f"layer {il} K row size {row} is not a whole number of {dt}")
        ch = row // dt.itemsize
        if (k_dtype, channels) not in ((None, None), (dt, ch)):
            raise KVStateError(
                f"layer {il} K is {ch} x {dt}, layer 0 was {channels} x {k_dtype}: "
                "layers of different widths or types are not supported"
            )
        k_dtype, channels = dt, ch
        keys.append(r.array(dt, n_cells * ch, f"layer {il} K").reshape(n_cells, ch))

    values = []
    for il in range(n_layer):
        dt = _float_dtype(r.scalar("<i", f"layer {il} V type"), f"layer {il} V")
        if dt != k_dtype:
            raise KVStateError(f"layer {il}: V is {dt} but K is {k_dtype}")
        if v_trans:
            el = r.scalar("<I", f"layer {il} V element size")
            ch = r.scalar("<I", f"layer {il} V channels")
            if el != dt.itemsize:
                raise KVStateError(f"layer {il} V element size {el} does not match {dt}")
            if ch != channels:
                raise KVStateError(f"layer {il} V has {ch} channels, K has {channels}")
            v = r.array(dt, ch * n_cells, f"layer {il} V").reshape(ch, n_cells).T
        else:
            row = r.scalar("<Q", f"layer {il} V row size")
            if row != channels * dt.itemsize:
                raise KVStateError(
                    f"layer {il} V row size {row}, expected {channels * dt.itemsize}"
                )
            v = r.array(dt, n_cells * channels, f"layer {il} V").reshape(n_cells, channels)
        values.append(v)

    return KVState(
        keys=np.stack(keys),
        values=np.ascontiguousarray(np.stack(values)),
        positions=positions,
        v_trans=bool(v_trans),
        seq_id=seq_id,
    )


class StateBuffer:
    """The bytes of a sequence state, with writable KV views into them.

    `keys` and `values` are [n_layer, n_tokens, channels] numpy views of the exact places
    llama.cpp will read (values as a transposed view when v_trans), so a streaming restore
    decodes chunks straight into the state it hands to llama_state_seq_set_data — no
    intermediate arrays, no concatenation, no copy of the whole cache.
    """

    def __init__(self, n_layer: int, n_tokens: int, channels: int, dtype, *, v_trans: bool,
                 positions: np.ndarray | None = None, seq_id: int = 0,
                 reuse: bytearray | None = None):
        dt = np.dtype(dtype).newbyteorder("<")
        type_id = next((t for t, d in _FLOAT_TYPES.items() if d == dt), None)
        if type_id is None:
            raise KVStateError(f"unsupported KV dtype {dtype}")
        self.v_trans = v_trans
        head = struct.pack("<IiII", SEQ_STATE_MAGIC, seq_id, 1, n_tokens)
        if n_tokens == 0:
            self.data = bytearray(head)
            self.keys = self.values = np.zeros((0, 0, 0), dt)
            return
        row = channels * dt.itemsize
        layer = n_tokens * row
        k_head = struct.pack("<iQ", type_id, row)
        v_head = (struct.pack("<iII", type_id, dt.itemsize, channels) if v_trans
                  else struct.pack("<iQ", type_id, row))
        cells_at = len(head)
        k_at = cells_at + 12 * n_tokens + 8
        v_at = k_at + n_layer * (len(k_head) + layer)
        size = v_at + n_layer * (len(v_head) + layer)
        # Reusing the previous restore's buffer spares allocating and zero-filling ~100 MB
        # (page faults included) on every restore; every byte is rewritten below or decoded.
        if reuse is not None and len(reuse) == size:
            self.data = reuse
        else:
            self.data = bytearray(size)
        mv = memoryview(self.data)
        mv[:cells_at] = head
        meta = np.frombuffer(mv[cells_at : cells_at + 12 * n_tokens], "<i4").reshape(-1, 3)
        meta[:, 0] = np.arange(n_tokens) if positions is None else positions
        meta[:, 1] = 1
        meta[:, 2] = seq_id
        mv[k_at - 8 : k_at] = struct.pack("<II", int(v_trans), n_layer)
        for il in range(n_layer):
            mv[k_at + il * (len(k_head) + layer) :][: len(k_head)] = k_head
            mv[v_at + il * (len(v_head) + layer) :][: len(v_head)] = v_head
        # Views over the per-layer payloads: strides skip each layer's small header.
        self.keys = np.ndarray((n_layer, n_tokens, channels), dt, self.data,
                               offset=k_at + len(k_head),
                               strides=(len(k_head) + layer, row, dt.itemsize))
        if v_trans:
            self.values = np.ndarray((n_layer, n_tokens, channels), dt, self.data,
                                     offset=v_at + len(v_head),
                                     strides=(len(v_head) + layer, dt.itemsize,
                                              n_tokens * dt.itemsize))
        else:
            self.values = np.ndarray((n_layer, n_tokens, channels), dt, self.data,
                                     offset=v_at + len(v_head),
                                     strides=(len(v_head) + layer, row, dt.itemsize))


def build_seq_state(kv: KVState) -> bytes:
    """Build the exact state bytes for `kv`, ready for llama_state_seq_set_data."""
    buf = StateBuffer(*kv.keys.shape, kv.keys.dtype, v_trans=kv.v_trans,
                      positions=kv.positions, seq_id=kv.seq_id)
    buf.keys[...] = kv.keys
    buf.values[...] = kv.values
    return bytes(buf.data)


def build_seq_sections(state: SeqState) -> bytes:
    """Build the exact state bytes of all sections, ready for llama_state_seq_set_data."""
    if not 1 <= len(state.sections) <= MAX_SECTIONS:
        raise KVStateError(f"{len(state.sections)} sections: expected 1 to {MAX_SECTIONS}")
    head = struct.pack("<Ii", SEQ_STATE_MAGIC, state.seq_id)
    # Each section's bytes are a one-section state minus the shared magic and seq_id.
    return head + b"".join(
        build_seq_state(_with_seq_id(kv, state.seq_id))[len(head):] for kv in state.sections)


def _with_seq_id(kv: KVState, seq_id: int) -> KVState:
    if kv.seq_id == seq_id:
        return kv
    return KVState(kv.keys, kv.values, kv.positions, kv.v_trans, seq_id, dict(kv.extra))
