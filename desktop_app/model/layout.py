"""The facts a model's KV cache depends on: its layout, probed once at load (`probe`), and the
fingerprint caches are keyed by.

A cache is reused only under an equal fingerprint: the model file's content hash and the layout
facts (layers, KV heads, head size, cache type, V layout, llama.cpp version, and for a
sliding-window model its window). A sliding-window (iSWA) model's state has two sections: the
full-attention layers hold every position, the sliding-window layers only the window that the
last position attends to (`window_start`); what a stored entry holds of each is `kvcache`'s.

`ModelLayout` is pure data; `check_fits` refuses KV made for another layout. `probe` reads the
layout from a loaded model's hyperparameters and from the state of one evaluated token; it
loads nothing itself and knows no files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np

from ..errors import RuntimeStateError
from . import support

if TYPE_CHECKING:
    from .runtime import Runtime


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


# The cache types whose states the exact bridge reads (f16, f32); others are for measuring.
BRIDGED = ("f16", "f32")


def probe(rt: Runtime, model_hash: str, cache_type: str, flash_attn: bool) -> ModelLayout:
    """A freshly loaded model's cache layout, from its hyperparameters and the state of one
    evaluated token (the context is reset after, the token not kept); raises
    UnsupportedModelError for a cache kvdesk cannot keep (`support`), before any document is
    prefilled."""
    llm = rt.llm
    model = llm._model.model
    arch = llm.metadata.get("general.architecture", "")
    name = rt.model_path.name
    support.check_arch(name, arch, recurrent=llama_cpp.llama_model_is_recurrent(model),
                       hybrid=llama_cpp.llama_model_is_hybrid(model))
    n_head = llama_cpp.llama_model_n_head(model)
    head_dim = int(llm.metadata.get(f"{arch}.attention.key_length", 0)) or (
        llama_cpp.llama_model_n_embd(model) // n_head)
    n_layer = llama_cpp.llama_model_n_layer(model)
    n_head_kv = llama_cpp.llama_model_n_head_kv(model)
    if cache_type in BRIDGED:
        tok = llm.token_bos()
        llm.eval([tok if tok >= 0 else 0])
        facts = support.check_state(rt.state_bytes(), name=name, n_layer=n_layer,
                                    channels=n_head_kv * head_dim)
        rt.reset()
    else:  # measuring only (quality.py): llama.cpp alone reads its quantized states
        facts = support.CacheFacts(n_layer, 0, n_head_kv * head_dim)
    return ModelLayout(
        model_hash=model_hash, n_layer=n_layer, n_head_kv=n_head_kv, head_dim=head_dim,
        cache_type=cache_type,
        # llama.cpp keeps V transposed exactly when flash attention is off.
        v_trans=not flash_attn, llama_cpp_version=llama_cpp.__version__,
        swa_layers=facts.swa_layers,
        n_swa=int(llama_cpp.llama_model_n_swa(model)) if facts.swa_layers else 0,
        swa_chunked=bool(facts.swa_layers) and arch in support.CHUNKED_SWA)
