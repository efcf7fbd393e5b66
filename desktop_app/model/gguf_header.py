"""What a GGUF file says about its model, from its header alone: never a tensor's data.

`read(path)` returns `HeaderFacts`: architecture, name, parameter count (from the tensor
shapes), quantization, trained context length, the KV cache's bytes per token at f16 (and, for
a sliding-window model, its window's fixed cost), and whether kvdesk supports the
architecture (`support`). It reads at most `HEADER_LIMIT` bytes, whatever the file's size, and
anything that is not a readable GGUF header — another file type, a truncated download, counts
that overrun the file, an old GGUF version — raises `HeaderError` with what was wrong.
`cut_short` compares the file's size with where its header says the last tensor ends, and
`verdict` says, before a load, what in a file keeps it from loading (what `kvdesk models` lists
as unreadable or refused), where llama.cpp's own refusal gives no reason.

The gguf package (llama.cpp's own) names the value types, keys, file types and quantizations;
its `GGUFReader` is not used: it builds a numpy object per vocabulary string (a 262,144-token
vocabulary takes tens of seconds on two cores), where only the few scalars below are needed and
arrays are skipped by their lengths.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from gguf import (
    GGML_QUANT_SIZES,
    MODEL_ARCH_NAMES,
    GGMLQuantizationType,
    GGUFValueType,
    Keys,
    LlamaFileType,
)

from . import support

HEADER_LIMIT = 256 << 20  # a header (vocabulary and merges included) is a few MB at most
MAX_COUNT = 1 << 26  # keys, tensors, array items: anything larger is not a header
_SCALARS = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
            GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
            GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
            GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}
_U64 = struct.Struct("<Q")
# Numeric arrays kept (per-layer head counts, window patterns); longer ones are skipped.
SMALL_ARRAY = 4096


class HeaderError(ValueError):
    """Not a GGUF header kvdesk can read; the message says what was found."""


@dataclass(frozen=True)
class HeaderFacts:
    architecture: str
    name: str | None
    parameters: int | None
    quantization: str | None
    context_length: int | None
    n_layer: int | None
    n_head: int | None
    n_vocab: int | None
    kv_bytes_per_token: int | None  # f16 KV of every position (the full-attention layers')
    sliding_window: int | None  # the window of its sliding-window layers, if any
    kv_window_bytes: int | None  # f16 KV of those layers' window: a fixed cost
    status: str  # support.SUPPORTED | UNTESTED | REFUSED
    reason: str
    split: tuple[int, int] | None = None  # (this part, parts) of a model split in files
    file_size: int | None = None  # where its last tensor ends: a shorter file is cut short
    kind: str | None = None  # general.type: "model", "adapter", "mmproj"... (None: not said)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class _Cursor:
    """Little-endian reads from a file's first bytes, fetched as needed up to a limit."""

    def __init__(self, f, limit: int):
        self.f, self.limit = f, limit
        self.buf = bytearray()
        self.pos = 0

    def _need(self, n: int) -> None:
        end = self.pos + n
        if end <= len(self.buf):
            return
        if end > self.limit:
            raise HeaderError(f"the header runs past {self.limit >> 20} MB: not a model header")
        more = self.f.read(max(end - len(self.buf), len(self.buf), 1 << 20))
        self.buf += more
        if end > len(self.buf):
            raise HeaderError(f"the file ends inside its header (byte {len(self.buf):,}): "
                              "truncated or not a GGUF file")

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        self._need(size)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def count(self, what: str) -> int:
        n = self.unpack("<Q")
        if n > MAX_COUNT:
            raise HeaderError(f"{n:,} {what}: not a model header")
        return n

    def string(self) -> str:
        n = self.count("bytes in a string")
        self._need(n)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip(self, n: int) -> None:
        self._need(n)
        self.pos += n

    def skip_strings(self, n: int) -> None:
        """Skip an array of n strings. A vocabulary is 50-260 K of them, and its merges as
        many: one local loop, not a method call per string (0.38 s for SmolLM2's otherwise)."""
        length = _U64.unpack_from
        pos = self.pos
        for _ in range(n):
            if pos + 8 > len(self.buf):
                self.pos = pos
                self._need(8)
            size = length(self.buf, pos)[0]
            if size > MAX_COUNT:
                raise HeaderError(f"{size:,} bytes in a string: not a model header")
            pos += 8 + size
        self.pos = pos
        self._need(0)


def _value(c: _Cursor, vtype: int):
    """A value of `vtype`: scalars and strings as such, short numeric arrays as lists, other
    arrays as their length (an int) after skipping them."""
    try:
        vtype = GGUFValueType(vtype)
    except ValueError:
        raise HeaderError(f"unknown GGUF value type {vtype}") from None
    if vtype in _SCALARS:
        return c.unpack(_SCALARS[vtype])
    if vtype == GGUFValueType.STRING:
        return c.string()
    item = c.unpack("<I")
    n = c.count("array items")
    if item == GGUFValueType.STRING:
        c.skip_strings(n)
        return n
    if item not in _SCALARS:
        raise HeaderError(f"an array of GGUF value type {item}: not supported in a header")
    if n <= SMALL_ARRAY:
        return [_value(c, item) for _ in range(n)]
    c.skip(n * struct.calcsize(_SCALARS[GGUFValueType(item)]))
    return n


def read(path: str | Path) -> HeaderFacts:
    """The header's facts; HeaderError if it is not one (OSError if unreadable)."""
    with open(path, "rb") as f:
        c = _Cursor(f, HEADER_LIMIT)
        try:
            magic = c.unpack("<I")
        except HeaderError:
            raise HeaderError("not a GGUF file (shorter than its magic)") from None
        if magic != 0x46554747:  # b"GGUF" little-endian
            raise HeaderError("not a GGUF file")
        version = c.unpack("<I")
        if version not in (2, 3):
            raise HeaderError(f"GGUF version {version} (kvdesk reads versions 2 and 3)")
        n_tensors, n_kv = c.count("tensors"), c.count("metadata keys")
        meta = {}
        for _ in range(n_kv):
            key = c.string()
            meta[key] = _value(c, c.unpack("<I"))
        types: Counter[int] = Counter()
        parameters = data_end = 0
        for _ in range(n_tensors):
            c.string()
            n_dims = c.unpack("<I")
            if n_dims > 8:
                raise HeaderError(f"a tensor of {n_dims} dimensions: not a model header")
            n = 1
            for _ in range(n_dims):
                n *= c.unpack("<Q")
            ggml_type = c.unpack("<I")
            offset = c.unpack("<Q")  # (from the start of the data, after the header)
            block, size = GGML_QUANT_SIZES.get(ggml_type, (1, 0))  # (an unknown type: 0)
            data_end = max(data_end, offset + n // block * size)
            parameters += n
            if n_dims >= 2:
                types[ggml_type] += n
    align = _int(meta.get(Keys.General.ALIGNMENT)) or 32
    data_start = -(-c.pos // align) * align
    return replace(_facts(meta, parameters if n_tensors else None, types),
                   file_size=data_start + data_end if n_tensors else None)


def verdict(path: str | Path) -> tuple[HeaderFacts | None, str | None]:
    """The header's facts (None: no readable header), and what in the file keeps kvdesk from
    loading it (None: nothing its header shows): what `kvdesk models` lists as unreadable or
    refused, said before llama.cpp is asked, whose own refusal names no reason."""
    try:
        facts, size = read(path), os.path.getsize(path)
    except HeaderError as e:
        return None, f"{path} cannot be read as a model: {e}"
    except OSError:
        return None, None  # (opening it for the load says why, with the system's words)
    if said := short_by(size, facts.file_size):
        return facts, f"{path} is {said}"
    if facts.status == support.REFUSED:
        return facts, support.refused_file(str(path), facts.architecture, facts.kind,
                                           facts.reason)
    return facts, None


def load_failure(path: str | Path, error: Exception) -> str:
    """What llama.cpp's refusal to load the model file `path` means for the user."""
    facts, problem = verdict(path)
    if problem is not None:
        return problem
    if facts is not None and facts.architecture not in MODEL_ARCH_NAMES.values():
        return (f"could not load {path}: its header names the architecture "
                f"{facts.architecture!r}, which llama.cpp does not know. {support.WHAT_WORKS}")
    return f"could not load {path}: {error}"


def cut_short(path: str | Path) -> str | None:
    """What is wrong with a model file shorter than its header says it must be (an
    interrupted download or copy); None where it is not (or its header cannot say)."""
    try:
        facts, size = read(path), os.path.getsize(path)
    except (OSError, HeaderError):
        return None
    said = short_by(size, facts.file_size)
    return f"{path} is {said}" if said else None


def short_by(size: int, file_size: int | None) -> str | None:
    """"cut short: 10.0 MB of the 253.1 MB ...", for a file of `size` bytes whose header's
    tensors end at `file_size` beyond it; None where they end within it."""
    if file_size is None or size >= file_size:
        return None
    return (f"cut short: {size / 1e6:,.1f} MB of the {file_size / 1e6:,.1f} MB its header "
            "says it holds (an interrupted download or copy): download it again")


def _facts(meta: dict, parameters: int | None, types: Counter) -> HeaderFacts:
    arch = meta.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        raise HeaderError("no general.architecture in the header: not a model")

    def get(key: str):
        return meta.get(key.format(arch=arch))

    n_layer = _int(get(Keys.LLM.BLOCK_COUNT))
    window = _int(get(Keys.Attention.SLIDING_WINDOW))
    kind, adapter = meta.get(Keys.General.TYPE), meta.get(Keys.Adapter.TYPE)
    kind = kind if isinstance(kind, str) else None
    status, reason = support.header_status(
        arch, kind, adapter if isinstance(adapter, str) else None)
    kv, kv_window = _kv_bytes(arch, meta, n_layer, window)
    tokens = meta.get(Keys.Tokenizer.LIST)
    split = (_int(meta.get(Keys.Split.LLM_KV_SPLIT_NO)),
             _int(meta.get(Keys.Split.LLM_KV_SPLIT_COUNT)))
    return HeaderFacts(
        architecture=arch, name=meta.get(Keys.General.NAME) or None, parameters=parameters,
        quantization=_quantization(meta.get(Keys.General.FILE_TYPE), types),
        context_length=_int(get(Keys.LLM.CONTEXT_LENGTH)), n_layer=n_layer,
        n_head=max(heads) if isinstance(heads := get(Keys.Attention.HEAD_COUNT), list) and heads
        else _int(heads),
        n_vocab=tokens if isinstance(tokens, int) else _int(get(Keys.LLM.VOCAB_SIZE)),
        kv_bytes_per_token=kv, sliding_window=window, kv_window_bytes=kv_window,
        status=status, reason=reason,
        split=((split[0] or 0) + 1, split[1]) if split[1] and split[1] > 1 else None,
        kind=kind)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _quantization(file_type, types: Counter) -> str | None:
    try:
        return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        pass
    if types:  # no file type recorded: the weights' most common type
        try:
            return GGMLQuantizationType(types.most_common(1)[0][0]).name
        except ValueError:
            return None
    return None


def _kv_bytes(arch: str, meta: dict, n_layer: int | None,
              window: int | None) -> tuple[int | None, int | None]:
    """f16 KV bytes per token of the full-attention layers, and of the window (fixed)."""
    if n_layer is None:
        return None, None

    def get(key: str):
        return meta.get(key.format(arch=arch))

    heads = get(Keys.Attention.HEAD_COUNT)
    kv_heads = get(Keys.Attention.HEAD_COUNT_KV)
    per_layer = kv_heads if isinstance(kv_heads, list) else [
        _int(kv_heads) if _int(kv_heads) is not None else _int(heads)] * n_layer
    embd = _int(get(Keys.LLM.EMBEDDING_LENGTH))
    head_dim = embd // _int(heads) if embd and _int(heads) else None
    k_len = _int(get(Keys.Attention.KEY_LENGTH)) or head_dim
    v_len = _int(get(Keys.Attention.VALUE_LENGTH)) or head_dim
    if None in (k_len, v_len) or len(per_layer) != n_layer or None in per_layer:
        return None, None
    layer_bytes = [2 * h * (k_len + v_len) for h in per_layer]  # f16: 2 bytes an element
    if not window:
        return sum(layer_bytes), None
    pattern = support.SWA_PATTERN.get(arch)
    if pattern is None:
        return None, None  # which layers slide is not in the header
    full = [i % pattern == pattern - 1 for i in range(n_layer)]
    return (sum(b for b, f in zip(layer_bytes, full, strict=True) if f),
            window * sum(b for b, f in zip(layer_bytes, full, strict=True) if not f))
