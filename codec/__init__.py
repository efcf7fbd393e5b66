"""kvdesk's KV-cache codec: CacheGen-style quantization + rANS, in self-describing chunk blobs.

The KV of a document arrives as two float16 arrays, keys and values, each
[n_layer, n_tokens, channels] (channels = n_head_kv * head_dim, token-major). The codec turns
any run of tokens (a "chunk", typically 256 tokens) into one blob that decodes on its own.

API
    encode(keys, values, level="balanced", *, first_token=0) -> bytes
        One chunk (any token count >= 1) -> blob. first_token is the position of the chunk's
        first token in the document: the document's first `sink_tokens` tokens (attention
        sinks) are kept exact, so pass it when encoding later chunks.
    decode(blob, *, out=None) -> (keys, values)
        float16 arrays [n_layer, n_tokens, channels]; with out=(keys, values) it decodes into
        those (e.g. views of a whole document's buffer) instead of allocating.
    encode_chunks(keys, values, level="balanced", *, chunk_tokens=256, first_token=0)
        -> list[bytes]; decode_chunks(blobs) -> (keys, values) joins consecutive chunks.
    peek(blob) -> BlobInfo (level, config, n_layer, n_tokens, channels, first_token, nbytes,
        bits_per_element, format_version) from the header alone (no checksum, no decoding).
    layout(blob) -> {part: bytes} for header, counts, sinks, scales, tables, streams: where
        the bytes of a blob go (verifies the checksum, decodes nothing).
    levels() -> {name: CodecConfig}; CodecConfig.get_config() -> JSON-able dict with an "id";
        CodecConfig.from_config(dict) -> CodecConfig. `level` may be a name, a CodecConfig or
        such a dict.
    CodecError (a ValueError): every refusal: bad input, NaN/Inf, unknown level, and corrupt,
        truncated or foreign blobs; CalibrationMissing (a CodecError): a blob (or config) of
        a calibrated level without the calibration it names.

Calibrated levels (calibrated/calibration.py, calibrated/transform.py): a model's
`Calibration` (made by the app's calibration, stored by the app, identified by the SHA-256 of
its bytes) holds per KV part the keys' and values' transforms (RoPE removed, centred,
optionally per-head KLT) and the level configs calibrated for that model (per-layer bins).
encode(..., level="high", calibration=cal, part=p) encodes through them; the blob names the
calibration, and decode(blob, calibrations=resolver) gets it from the caller's resolver (a
mapping or a function id -> Calibration | None). calibrated.transform.fit fits a transform on
KV (no model needed).

Levels (data in format/level_table.py): lossless (bit-exact fp16), high, balanced, compact (the
model-independent defaults, tuned on SmolLM2), and CacheGen's published bins cachegen-1/2/3
(per-token scale, bins by layer thirds).

Blob format (format/container.py, pipeline.py): magic, format version (1; 2 when the config names a
calibration), a JSON header holding the full codec config and the shapes, aligned payload
sections (sink tokens, scales, table ids, stream word counts, rANS streams), CRC-32 of
everything. Every stream's table is a 2-byte id into a frozen codebook (kernels/tables.py), so
a chunk carries its own tables for ~0.06 bits per element and there is no shared per-document
table blob to lose or mismatch.

Kernels run on numba (CPU, parallel), or CUDA when a GPU is present; every backend writes
identical bytes; encode, decode and the chunk helpers take backend=codec.backend.get("cpu" |
"cuda" | "reference") to force one (see backend/). Their machine code comes from numba's
cache, or from one shipped with a bundle (jit/jitcache.py); a fresh process's first restores
run the decoder's kernels compiled ahead of time instead, without importing numba
(backend/aot.py), until its warm-up has loaded numba's.

Modules and rooms, top to bottom, each importing only those below it (the import-linter
contract in pyproject.toml; `|`: side by side, neither importing the other):
    bench | precompile  the benchmark | every kernel compiled ahead of use
    chunks              chunk lists cut and joined
    pipeline            one blob's stages wired together
    plan                one quantized kind's layout, dequantization tables and anchors
    backend/            the kernels that run them: numba CPU, CUDA, the pure reference
    calibrated/         a model's calibration and its transforms
    format/ | kernels/  the container and the level configs | the numba kernels and tables
    jit/                where the kernels' machine code comes from
    errors              CodecError, CalibrationMissing
The package must never import llama.cpp, SQLite, Qt, the store or the app.
"""

# First, before any module defines a kernel: which CPU target and cache the kernels use.
from .jit import jitcache  # noqa: F401, I001 - configures numba as it is imported
from .calibrated.calibration import Calibration, Part
from .errors import CalibrationMissing, CodecError
from .format.levels import CodecConfig, KindConfig, levels
from .pipeline import BlobInfo, Resolver, decode, encode, layout, peek
from .plan import release_tables
from .chunks import decode_chunks, encode_chunks
from .calibrated.transform import KindTransform

__all__ = ["BlobInfo", "Calibration", "CalibrationMissing", "CodecConfig", "CodecError",
           "KindConfig", "KindTransform", "Part", "Resolver", "decode", "decode_chunks", "encode",
           "encode_chunks", "layout", "levels", "peek", "release_tables"]
