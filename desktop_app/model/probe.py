"""What a freshly loaded model's KV cache is: its layout, probed once at load.

From the model's hyperparameters and from the state of one evaluated token: how many layers
keep every position and how many a sliding window, how wide they are, how V is laid out. A
cache kvdesk could not store and restore (recurrent or hybrid state, several streams, layers
sharing a cache, a quantized KV type) is refused here (`support`), before any document is
prefilled. It never keeps the probe's token: the context is reset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llama_cpp

from . import support
from .layout import ModelLayout

if TYPE_CHECKING:
    from .runtime import Runtime

# The cache types whose states the exact bridge reads (f16, f32); others are for measuring.
BRIDGED = ("f16", "f32")


def layout(rt: Runtime, model_hash: str, cache_type: str, flash_attn: bool) -> ModelLayout:
    """The cache's layout; raises UnsupportedModelError for a cache kvdesk cannot keep."""
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
