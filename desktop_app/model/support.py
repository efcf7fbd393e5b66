"""Which models kvdesk can keep the cache of, and, for the others, why not and what works.

kvdesk stores and restores a model's KV cache through the exact state bridge (`kvstate`): a
plain KV cache (every layer holds every position: Llama, Qwen, Mistral, Phi, SmolLM...) or
llama.cpp's interleaved sliding-window cache (iSWA: Gemma 2 and 3, Cohere 2, gpt-oss...: the
full-attention layers hold every position, the sliding-window layers only the last window),
with f16 or f32 cells in one stream. Everything else is refused before any work is done:

- `header_status(arch, kind)`: what a GGUF header alone says (the model list's status, and a
  refusal before any load: `refused_file`): a file that is not a model (an adapter, a vision
  projector: its `general.type`), recurrent or hybrid memory (Mamba, RWKV, Jamba, Falcon-H1,
  LFM2...), cells that carry extra positions (M-RoPE: Qwen2-VL...) and caches without V rows
  (DeepSeek's MLA) are known not to fit; the architectures tested here are "supported", the
  rest "untested" until a model of theirs loads.
- `check_state(...)`: at load, the state a context writes for one token is parsed (the runtime
  does it); a layout the bridge cannot represent is refused there, naming what was found and
  what works instead — never after a long prefill.

It knows no files and no store, and never loads a model itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import KVStateError, UnsupportedModelError
from . import kvstate

SUPPORTED, UNTESTED, REFUSED = "supported", "untested", "refused"

# Tested end to end here: attach, ask, reopen, lossless == recompute (tests/, RESULTS.md).
TESTED = {"llama": "tested: a plain KV cache (on SmolLM2-135M)",
          "gemma3": "tested: a sliding-window (iSWA) cache (on Gemma 3 270M)"}
RECURRENT = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}
HYBRID = {"jamba", "falcon-h1", "granitehybrid", "plamo2", "lfm2", "lfm2moe", "nemotron_h",
          "qwen3next"}
MROPE = {"qwen2vl", "qwen3vl", "qwen3vlmoe"}
MLA = {"deepseek2"}
NOT_LANGUAGE_MODELS = {"clip", "mmproj", "bert", "nomic-bert", "jina-bert-v2", "t5encoder"}
PROJECTORS = {"clip", "mmproj"}  # (older projectors say so by their architecture alone)
# Files whose `general.type` says they are not a model, each with what it is for.
NOT_MODELS = {"adapter": "not a model: it applies to the model it was made for, which is the "
                         "one to load",
              "mmproj": "not a model: it gives a model vision, and kvdesk reads text only",
              "imatrix": "not a model: it guides the quantization of one"}
KIND_NAMES = {"mmproj": "a vision projector (mmproj)", "imatrix": "an importance matrix"}
# Sliding-window models' layer patterns as llama.cpp sets them (one full-attention layer in N),
# for what a header alone does not say; llama4's window is "chunked" (attention restarts at
# multiples of the window) rather than sliding.
SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2, "llama4": 4,
               "exaone4": 4}
CHUNKED_SWA = {"llama4"}

WHAT_WORKS = ("kvdesk keeps the cache of models whose llama.cpp cache is plain attention "
              "(Llama, Qwen, Mistral, Phi, SmolLM...) or interleaved sliding-window attention "
              "(Gemma 2 and 3), with f16 or f32 cells; choose one of those (`kvdesk models` "
              "lists the models on this machine)")


def header_status(arch: str, kind: str | None = None,
                  adapter: str | None = None) -> tuple[str, str]:
    """(status, why) for a file of this architecture, from its GGUF header alone; `kind` is
    its `general.type` (an adapter, a projector: not a model), `adapter` its `adapter.type`."""
    if arch in PROJECTORS and kind in (None, "model"):
        kind = "mmproj"
    if kind in NOT_MODELS:
        what = KIND_NAMES.get(kind) or (f"a {'LoRA' if adapter == 'lora' else adapter} adapter"
                                        if adapter else "an adapter")
        return REFUSED, f"{what}, {NOT_MODELS[kind]}"
    if arch in NOT_LANGUAGE_MODELS:
        return REFUSED, f"a {arch} model, not a text generator"
    if arch in RECURRENT:
        return REFUSED, "recurrent memory (a state per sequence, no KV cache)"
    if arch in HYBRID:
        return REFUSED, "hybrid memory (a KV cache and a recurrent state)"
    if arch in MROPE:
        return REFUSED, "M-RoPE cells (several positions per token)"
    if arch in MLA:
        return REFUSED, "an MLA cache (compressed keys, no V rows)"
    if arch in TESTED:
        return SUPPORTED, TESTED[arch]
    return UNTESTED, "not tested with kvdesk; its cache is checked when it loads"


def refused_file(name: str, arch: str, kind: str | None, why: str) -> str:
    """What a file `header_status` refuses is, said before it loads: one that is no text
    generator (an adapter, a projector, an embedding model) is told so, the others as
    `refusal` says at load."""
    if kind in NOT_MODELS or arch in NOT_LANGUAGE_MODELS:
        return f"{name} is {why}; choose a text model (`kvdesk models` lists those here)"
    return str(refusal(name, why))


def refusal(name: str, found: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{name}: kvdesk cannot keep this model's cache: {found}. "
                                 f"{WHAT_WORKS}.")


def check_arch(name: str, arch: str, *, recurrent: bool, hybrid: bool) -> None:
    """Refuse, from what llama.cpp says of a loaded model, one whose memory is not a KV cache
    (before any state is written)."""
    if recurrent or hybrid:
        kind = "hybrid memory (a KV cache and a recurrent state)" if hybrid else \
            "recurrent memory (a state per sequence, no KV cache)"
        raise refusal(name, f"it is a {arch} model with {kind}")
    status, why = header_status(arch)
    if status == REFUSED:
        raise refusal(name, why)


@dataclass(frozen=True)
class CacheFacts:
    """What one token's state says of a model's cache: its sections' layers and width."""

    full_layers: int  # layers of the first section: every position
    swa_layers: int  # layers of the sliding-window section (0: none)
    channels: int


def check_state(data: bytes, *, name: str, n_layer: int, channels: int) -> CacheFacts:
    """Parse the state of a context that holds one token; refuse what the bridge cannot keep,
    and a cache whose layers or width are not the model's (shared or uneven layers)."""
    try:
        seq = kvstate.parse_seq_sections(data)
    except KVStateError as e:
        raise refusal(name, str(e)) from None
    layers = [s.n_layer for s in seq.sections]
    widths = {s.channels for s in seq.sections}
    if any(s.n_tokens != 1 for s in seq.sections):
        raise refusal(name, f"a state of one token holds {[s.n_tokens for s in seq.sections]} "
                            "cells per section")
    if sum(layers) != n_layer or widths != {channels}:
        raise refusal(name, f"its cache has {' + '.join(map(str, layers))} layers of "
                            f"{sorted(widths)} channels where the model has {n_layer} layers "
                            f"of {channels} (layers sharing a cache, or of several widths)")
    return CacheFacts(layers[0], layers[1] if seq.is_iswa else 0, channels)
