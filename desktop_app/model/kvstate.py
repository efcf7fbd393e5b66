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
an iSWA cache, hybrid/recurrent sections — recognized and named as such —, layers of different
widths) is refused with a `KVStateError` that says what was found. It knows nothing of models,
files, the codec or the store.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import KVStateError

# numpy asks the kernel for 2 MB pages for every large array (madvise). A process's first state
# buffers (75 MB for 3,200 SmolLM2 tokens) then fault in whole huge pages: measured on the
# 2-core VM, 0.58-0.74 s for the first buffer against 0.3 ms with 4 KB pages, which made a
# server's first restore after a restart 3.5x its next (RESULTS.md, "Cold paths"); the warm
# restores ran as fast either way. So this process's arrays get plain pages.
getattr(np._core.multiarray, "_set_madvise_hugepage", lambda enabled: None)(False)

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
    kv = _next_section(r, seq_id, 0)
    if r.remaining():
        _refuse_recurrent(r, 1)
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
    sections = [_next_section(r, seq_id, 0)]
    while r.remaining():
        if len(sections) == MAX_SECTIONS:
            _refuse_recurrent(r, len(sections))
            raise KVStateError(
                f"{r.remaining()} bytes follow {MAX_SECTIONS} cache sections: a hybrid or "
                "recurrent state is not supported"
            )
        sections.append(_next_section(r, seq_id, len(sections)))
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


def _next_section(r: _Reader, seq_id: int, index: int) -> KVState:
    _refuse_recurrent(r, index)
    return _parse_section(r, seq_id)


def _refuse_recurrent(r: _Reader, index: int) -> None:
    """Name a recurrent memory's section (Mamba, RWKV; the second part of a hybrid model's
    state) when the remaining bytes are exactly one: llama_memory_recurrent writes u32 cells,
    (i32 pos, u32 n_seq_id = 0) per cell, u32 s_trans = 0, u32 n_layer, then per layer an R and
    an S block of (i32 type, u64 row size, rows). A KV section never reads as one (its first
    cell's n_seq_id would be a layer count)."""
    start = r.pos
    try:
        n_cells = r.scalar("<I", "cells")
        cells = r.array(np.dtype("<i4"), 2 * n_cells, "cells").reshape(-1, 2)
        s_trans, n_layer = r.scalar("<I", "s_trans"), r.scalar("<I", "n_layer")
        blocks = 0
        while r.remaining() and 0 < n_layer <= 4096 and blocks < 2 * n_layer:
            if r.scalar("<i", "type") not in _GGML_TYPE_NAMES:
                break
            r.take(r.scalar("<Q", "row") * n_cells, "rows")
            blocks += 1
        recurrent = (n_cells and not cells[:, 1].any() and s_trans == 0 and not r.remaining()
                     and blocks and blocks % 2 == 0)
    except KVStateError:
        recurrent = False
    finally:
        r.pos = start
    if recurrent:
        where = "the state" if index == 0 else f"after {index} KV cache section(s), the state"
        raise KVStateError(
            f"{where} holds a recurrent memory ({blocks // 2} layers of R and S state, as "
            "Mamba- or RWKV-style layers keep): not a KV cache this bridge can represent")


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

    With `window` = (its layers, its positions), the state has the second section of an iSWA
    cache after the first: `window_keys` and `window_values` are its views, [window layers,
    len(positions), channels] (the sliding-window layers' cells, same width, type and V layout).
    """

    def __init__(self, n_layer: int, n_tokens: int, channels: int, dtype, *, v_trans: bool,
                 positions: np.ndarray | None = None, seq_id: int = 0,
                 reuse: np.ndarray | None = None,
                 window: tuple[int, np.ndarray] | None = None):
        dt = np.dtype(dtype).newbyteorder("<")
        type_id = next((t for t, d in _FLOAT_TYPES.items() if d == dt), None)
        if type_id is None:
            raise KVStateError(f"unsupported KV dtype {dtype}")
        self.v_trans = v_trans
        first = np.arange(n_tokens) if positions is None else np.asarray(positions)
        sections = [_Section(n_layer, first, channels, dt, type_id, v_trans)]
        if window is not None:
            sections.append(_Section(window[0], np.asarray(window[1]), channels, dt, type_id,
                                     v_trans))
        size = 8 + sum(s.size for s in sections)
        # Every byte is written below or decoded into, so the buffer is never zero-filled
        # (bytearray's ~40 ms a 57 MB state, one thread): its pages are first touched by the
        # decoders. Reusing the previous restore's buffer spares even the page faults.
        if reuse is not None and len(reuse) == size:
            self.data = reuse
        else:
            self.data = np.empty(size, np.uint8)
        memoryview(self.data)[:8] = struct.pack("<Ii", SEQ_STATE_MAGIC, seq_id)
        at = 8
        views = []
        for section in sections:
            views.append(section.lay_out(self.data, at, seq_id))
            at += section.size
        self.keys, self.values = views[0]
        self.window_keys, self.window_values = views[1] if window is not None else (None, None)
        self.window_positions = sections[1].positions if window is not None else None


class _Section:
    """Where one cache section's bytes go in a state, and its header and cell records."""

    def __init__(self, n_layer: int, positions: np.ndarray, channels: int, dt: np.dtype,
                 type_id: int, v_trans: bool):
        self.n_layer, self.positions, self.channels = n_layer, positions, channels
        self.dt, self.v_trans = dt, v_trans
        n = len(positions)
        self.row = channels * dt.itemsize
        self.layer = n * self.row
        self.k_head = struct.pack("<iQ", type_id, self.row)
        self.v_head = (struct.pack("<iII", type_id, dt.itemsize, channels) if v_trans
                       else struct.pack("<iQ", type_id, self.row))
        # n_stream, cell_count; then (unless empty) cells, v_trans, n_layer, K and V layers.
        self.k_at = 8 + 12 * n + 8
        self.v_at = self.k_at + n_layer * (len(self.k_head) + self.layer)
        self.size = 8 if n == 0 else self.v_at + n_layer * (len(self.v_head) + self.layer)

    def lay_out(self, data: np.ndarray, at: int, seq_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Write the section's header and cells at `at`; its K and V views."""
        n, n_layer, dt = len(self.positions), self.n_layer, self.dt
        mv = memoryview(data)[at : at + self.size]
        mv[:8] = struct.pack("<II", 1, n)
        if n == 0:  # llama.cpp writes nothing after an empty stream's cell count
            empty = np.zeros((0, 0, 0), dt)
            return empty, empty
        meta = np.frombuffer(mv[8 : 8 + 12 * n], "<i4").reshape(-1, 3)
        meta[:, 0] = self.positions
        meta[:, 1] = 1
        meta[:, 2] = seq_id
        mv[self.k_at - 8 : self.k_at] = struct.pack("<II", int(self.v_trans), n_layer)
        k_step, v_step = len(self.k_head) + self.layer, len(self.v_head) + self.layer
        for il in range(n_layer):
            mv[self.k_at + il * k_step :][: len(self.k_head)] = self.k_head
            mv[self.v_at + il * v_step :][: len(self.v_head)] = self.v_head
        # Views over the per-layer payloads: strides skip each layer's small header.
        keys = np.ndarray((n_layer, n, self.channels), dt, data,
                          offset=at + self.k_at + len(self.k_head),
                          strides=(k_step, self.row, dt.itemsize))
        v_strides = ((v_step, dt.itemsize, n * dt.itemsize) if self.v_trans
                     else (v_step, self.row, dt.itemsize))
        values = np.ndarray((n_layer, n, self.channels), dt, data,
                            offset=at + self.v_at + len(self.v_head), strides=v_strides)
        return keys, values


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
