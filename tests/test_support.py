"""Honest refusals and per-model defaults: states kvdesk cannot keep are refused naming what
was found (crafted states of a recurrent and a hybrid model, several streams, quantized KV),
and the context size and flash attention follow the model."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest

from desktop_app.app import App
from desktop_app.errors import EngineError, KVStateError, UnsupportedModelError
from desktop_app.model import contextsize, support
from desktop_app.model.gguf_header import HeaderFacts
from desktop_app.model.kvstate import KVState, build_seq_state, parse_seq_sections
from desktop_app.settings import Settings

HEAD = struct.pack("<Ii", 0xAF143CD8, 0)


def kv_section(n_layer=2, n_tokens=1, channels=8) -> bytes:
    rng = np.random.default_rng(0)
    shape = (n_layer, n_tokens, channels)
    kv = KVState(rng.standard_normal(shape).astype(np.float16),
                 rng.standard_normal(shape).astype(np.float16),
                 np.arange(n_tokens, dtype=np.int32), v_trans=True)
    return build_seq_state(kv)[len(HEAD):]


def recurrent_section(n_layer=2, r_row=48, s_row=64) -> bytes:
    """What llama_memory_recurrent writes for one sequence: one cell (its last position, no
    sequence ids), s_trans 0, the layer count, then R rows and S rows of every layer."""
    out = struct.pack("<IiII", 1, 6, 0, 0) + struct.pack("<I", n_layer)
    for row in (r_row, s_row):
        for _ in range(n_layer):
            out += struct.pack("<iQ", 0, row) + bytes(row)
    return out


def test_a_recurrent_models_state_is_named_and_refused():
    with pytest.raises(KVStateError, match="the state holds a recurrent memory \\(2 layers"):
        parse_seq_sections(HEAD + recurrent_section())
    with pytest.raises(UnsupportedModelError) as refused:
        support.check_state(HEAD + recurrent_section(), name="mamba-130m.gguf", n_layer=2,
                            channels=8)
    message = str(refused.value)
    assert message.startswith("mamba-130m.gguf: kvdesk cannot keep this model's cache")
    assert "recurrent memory" in message and "Gemma 2 and 3" in message
    assert "kvdesk models" in message


def test_a_hybrid_models_state_is_named_and_refused():
    state = HEAD + kv_section() + recurrent_section(n_layer=3)
    with pytest.raises(KVStateError, match="after 1 KV cache section.*recurrent memory"):
        parse_seq_sections(state)
    with pytest.raises(UnsupportedModelError, match="recurrent memory"):
        support.check_state(state, name="jamba.gguf", n_layer=4, channels=8)


def test_several_streams_and_quantized_caches_are_refused_saying_so():
    several = bytearray(HEAD + kv_section())
    several[8:12] = struct.pack("<I", 2)
    with pytest.raises(UnsupportedModelError, match="2 KV streams found"):
        support.check_state(bytes(several), name="m.gguf", n_layer=2, channels=8)
    quantized = bytearray(HEAD + kv_section())
    k_type_at = len(HEAD) + 8 + 12 + 8  # n_stream, cell count; one cell; v_trans, n_layer
    quantized[k_type_at:k_type_at + 4] = struct.pack("<i", 8)
    with pytest.raises(UnsupportedModelError, match="cache type q8_0 is not supported"):
        support.check_state(bytes(quantized), name="m.gguf", n_layer=2, channels=8)


def test_a_cache_unlike_the_model_is_refused():
    with pytest.raises(UnsupportedModelError, match="layers sharing a cache"):
        support.check_state(HEAD + kv_section(n_layer=2), name="m.gguf", n_layer=3, channels=8)
    facts = support.check_state(HEAD + kv_section(n_layer=2) + kv_section(n_layer=3),
                                name="m.gguf", n_layer=5, channels=8)
    assert (facts.full_layers, facts.swa_layers) == (2, 3)


def test_header_status_by_architecture():
    assert support.header_status("gemma3")[0] == support.SUPPORTED
    assert support.header_status("qwen2")[0] == support.UNTESTED
    for arch, word in [("rwkv7", "recurrent"), ("falcon-h1", "hybrid"), ("qwen2vl", "M-RoPE"),
                       ("deepseek2", "MLA"), ("clip", "a vision projector"),
                       ("bert", "not a text generator")]:
        status, why = support.header_status(arch)
        assert status == support.REFUSED and word in why
    # A file that is not a model says so by its general.type, whatever its architecture
    assert support.header_status("gemma3", "adapter", "lora") == (
        support.REFUSED, "a LoRA adapter, not a model: it applies to the model it was made "
                         "for, which is the one to load")
    assert support.header_status("gemma3", "mmproj")[1].startswith("a vision projector (mmpr")
    assert support.header_status("gemma3", "model")[0] == support.SUPPORTED
    with pytest.raises(UnsupportedModelError, match="hybrid memory"):
        support.check_arch("x.gguf", "lfm2", recurrent=False, hybrid=True)


FACTS = HeaderFacts(architecture="llama", name="big", parameters=8_000_000_000,
                    quantization="Q4_K_M", context_length=131072, n_layer=32, n_head=32,
                    n_vocab=128256, kv_bytes_per_token=131072, sliding_window=None,
                    kv_window_bytes=None, status="supported", reason="")


def test_the_context_is_the_trained_one_capped_by_memory():
    fits = contextsize.choose(replace(FACTS, context_length=8192), model_bytes=5 << 30,
                              flash_attn=True, available=64 << 30)
    assert fits.n_ctx == 8192 and "trained context (8,192 tokens); it fits" in fits.why
    capped = contextsize.choose(FACTS, model_bytes=5 << 30, flash_attn=True,
                                available=16 << 30)
    assert 2048 <= capped.n_ctx < 131072 and "capped by memory" in capped.why
    assert capped.estimate_bytes <= 0.6 * (16 << 30)
    bigger = contextsize.choose(FACTS, model_bytes=5 << 30, flash_attn=True,
                                available=32 << 30)
    assert bigger.n_ctx > capped.n_ctx
    # Without flash attention the scores of a long context need more: a smaller context.
    assert contextsize.choose(FACTS, model_bytes=5 << 30, flash_attn=False,
                              available=16 << 30).n_ctx <= capped.n_ctx
    tight = contextsize.choose(FACTS, model_bytes=5 << 30, flash_attn=True, available=1 << 30)
    assert tight.n_ctx == 2048 and "may not fit" in tight.why
    unknown = contextsize.choose(FACTS, model_bytes=5 << 30, flash_attn=True, available=None)
    assert unknown.n_ctx == 131072 and "unknown" in unknown.why
    assert contextsize.available_memory() is None or contextsize.available_memory() > 0


def test_the_memory_available_is_the_room_under_the_processs_own_cgroup_limits(tmp_path):
    """(Under `systemd-run -p MemoryMax=600M`, a v1 cgroup's limit too, kvdesk read only the
    root's and sized its context for the machine's 23 GB: the kernel ended it after an
    answer, without a word.)"""
    root, own = tmp_path / "cgroup", tmp_path / "self-cgroup"
    for folder, files in {"app.slice/kv.scope": {"memory.max": 600 << 20,
                                                  "memory.current": 100 << 20},
                          "app.slice": {"memory.max": "max", "memory.current": 1 << 30},
                          "memory/probe": {"memory.limit_in_bytes": 900 << 20,
                                           "memory.usage_in_bytes": 100 << 20},
                          "memory": {"memory.limit_in_bytes": 1 << 62,
                                     "memory.usage_in_bytes": 5 << 30}}.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            (root / folder / name).write_text(f"{value}\n")
    own.write_text("4:memory:/probe\n3:cpu:/\n0::/app.slice/kv.scope\n")
    assert sorted(contextsize.cgroup_room(root, own)) == [500 << 20, 800 << 20,
                                                          (1 << 62) - (5 << 30)]
    # The file cache charged to it is given back before anything is ended: room too (a 1 GB
    # file written under a 1.2 GB limit left "0.1 GB available"; review 73).
    (root / "app.slice/kv.scope/memory.stat").write_text("anon 10\ninactive_file 209715200\n")
    (root / "memory/probe/memory.stat").write_text("cache 5\ntotal_inactive_file 1048576\n")
    assert sorted(contextsize.cgroup_room(root, own)) == [700 << 20, 801 << 20,
                                                          (1 << 62) - (5 << 30)]
    own.write_text("0::/gone.scope\n")  # (a cgroup not mounted here: none of its folders)
    assert contextsize.cgroup_room(root, own) == []
    assert contextsize.cgroup_room(root, tmp_path / "none") == []


def test_a_context_set_larger_than_memory_holds_is_refused_naming_one_that_fits():
    """(A context of 1,048,576 tokens set in the settings had the system end every command,
    `info` too, for want of memory, with no word.)"""
    kw = {"model_bytes": 5 << 30, "flash_attn": True}
    assert contextsize.unallocatable(FACTS, 131072, available=64 << 30, **kw) is None
    assert contextsize.unallocatable(FACTS, 131072, available=None, **kw) is None
    why = contextsize.unallocatable(FACTS, 131072, available=16 << 30, **kw)
    fits = int(why.split(": ")[1].split(" tokens fit")[0].replace(",", ""))
    assert why.startswith("a context of 131,072 tokens needs 40.3 GB") and "--n-ctx" in why
    assert 2048 <= fits < 131072
    assert contextsize.unallocatable(FACTS, fits, available=16 << 30, **kw) is None
    assert "not even 2,048 tokens fit" in contextsize.unallocatable(
        FACTS, 131072, available=4 << 30, **kw)


@pytest.mark.model
def test_the_app_refuses_a_context_memory_cannot_hold_before_a_command_loads_it(
        model_path, monkeypatch):
    monkeypatch.setattr(contextsize, "available_memory", lambda: 1 << 30)
    with pytest.raises(EngineError, match="a context of 1,048,576 tokens needs"):
        _ = App(Settings(model=str(model_path), n_ctx=1 << 20)).context
    assert App(Settings(model=str(model_path), n_ctx=4096)).context.n_ctx == 4096


def test_a_window_cache_costs_its_window_not_the_context():
    gemma = replace(FACTS, architecture="gemma3", n_layer=18, n_head=4, n_vocab=262144,
                    kv_bytes_per_token=3072, sliding_window=512, kv_window_bytes=7864320)
    one = contextsize.estimate(gemma, 32768, flash_attn=True)
    # 3 x (full layers' KV + 1,024 window cells) + the logits of a 512-token batch
    assert one == 3 * (3072 * 32768 + 15 * 1024 * 1024) + 262144 * 512 * 4


@pytest.mark.model
def test_flash_attention_and_context_follow_the_model(gemma_path, model_path):
    gemma = App(Settings(model=str(gemma_path)))
    assert gemma.flash_attn[0] is False and "sliding-window" in gemma.flash_attn[1]
    assert App(Settings(model=str(model_path))).flash_attn[0] is True
    assert App(Settings(model=str(gemma_path), flash_attn=True)).flash_attn == (
        True, "set in the settings")
    assert App(Settings(model=str(gemma_path), n_ctx=1024)).context.n_ctx == 1024
    assert gemma.context.n_ctx <= 32768
