"""The facts a model's KV cache depends on: its layout, and the fingerprint caches are keyed by.

A cache is reused only under an equal fingerprint: the model file's content hash and the layout
facts (layers, KV heads, head size, cache type, V layout, llama.cpp version, and for a
sliding-window model its window). A sliding-window (iSWA) model's state has two sections: the
full-attention layers hold every position, the sliding-window layers only the window that the
last position attends to (`window_start`); what a stored entry holds of each is `kvcache`'s.

Pure data: it loads nothing and knows no files; `check_fits` refuses KV made for another layout.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import RuntimeStateError


@dataclass(frozen=True)
class ModelLayout:
    """The facts a KV cache depends on. Caches are only reused under an equal fingerprint.

    A sliding-window (iSWA) model's state has two sections: its `n_layer - swa_layers`
    full-attention layers hold every position, its `swa_layers` sliding-window layers only the
    window the last position sees (`window_start`).
    """

    model_hash: str
    n_layer: int
    n_head_kv: int
    head_dim: int
    cache_type: str
    v_trans: bool
    llama_cpp_version: str
    swa_layers: int = 0
    n_swa: int = 0  # the window, in positions
    swa_chunked: bool = False  # attention restarts at multiples of n_swa (llama4) vs slides

    @property
    def channels(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def full_layers(self) -> int:
        return self.n_layer - self.swa_layers

    @property
    def itemsize(self) -> int:
        return 2 if self.cache_type == "f16" else 4

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float16 if self.cache_type == "f16" else np.float32)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of every position's cache (the full-attention layers')."""
        return self.full_layers * 2 * self.channels * self.itemsize

    @property
    def window_bytes_per_token(self) -> int:
        return self.swa_layers * 2 * self.channels * self.itemsize

    def window_start(self, n_tokens: int) -> int:
        """The first position a state of n_tokens holds in its sliding-window section: the
        first one its last position attends to (n_tokens without such a section)."""
        if not self.swa_layers or n_tokens == 0:
            return n_tokens
        if self.swa_chunked:
            return (n_tokens - 1) // self.n_swa * self.n_swa
        return max(0, n_tokens - self.n_swa)

    def check_fits(self, shapes: list[tuple], dtype: np.dtype, v_trans: bool | None,
                   n_tokens: int) -> None:
        """Refuse KV of n_tokens that a context of this layout would load but that was not
        made for it: sections of other shapes, another V layout (None: any) or dtype."""
        n = n_tokens
        expected = [(self.full_layers, n, self.channels)]
        if self.swa_layers:
            expected.append((self.swa_layers, n - self.window_start(n), self.channels))
        if n and shapes != expected:
            raise RuntimeStateError(
                f"KV of shape {' + '.join(map(str, shapes))} does not fit this model: "
                f"expected {' + '.join(map(str, expected))}")
        if v_trans is not None and v_trans != self.v_trans:
            raise RuntimeStateError("the state's V layout does not match this context")
        if dtype != self.dtype:
            raise RuntimeStateError(f"KV of {dtype} for a {self.cache_type} cache")

    def raw_bytes(self, n_tokens: int) -> int:
        """The fp16/fp32 bytes of a state of n_tokens (its window included)."""
        window = n_tokens - self.window_start(n_tokens) if self.swa_layers else 0
        return n_tokens * self.kv_bytes_per_token + window * self.window_bytes_per_token

    @property
    def fingerprint(self) -> str:
        facts = asdict(self)
        if not self.swa_layers:  # plain caches keep the fingerprint they had before iSWA
            for key in ("swa_layers", "n_swa", "swa_chunked"):
                del facts[key]
        blob = json.dumps(facts, sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=16).hexdigest()
