"""The runtime on the real default model: a restored KV cache continues exactly."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import llama_cpp
import numpy as np
import pytest

from desktop_app.errors import Cancelled, RuntimeStateError
from desktop_app.model import llamacalls
from desktop_app.model.kvstate import KVStateError, SeqState, build_seq_state, parse_seq_sections
from desktop_app.model.runtime import Runtime
from desktop_app.model.sampling import DEFAULTS
from desktop_app.options import GenerationOptions

SYSTEM = "You are a helpful assistant. Answer from the document."
DOCUMENT = (
    "The lighthouse at Cape Morrow was built in 1871 from granite quarried on the island. "
    "Its lamp burned whale oil until 1902, then kerosene, and it was electrified in 1938."
)
QUESTION = "When was the lighthouse electrified?"


def chat_prefix_and_question(rt: Runtime) -> tuple[list[int], list[int]]:
    system = [{"role": "system", "content": f"{SYSTEM}\n\n{DOCUMENT}"}]
    full = system + [{"role": "user", "content": QUESTION}]
    prefix_text = rt.render_chat(system, add_generation_prompt=False)
    full_text = rt.render_chat(full, add_generation_prompt=True)
    assert full_text.startswith(prefix_text)
    prefix = rt.tokenize(prefix_text, add_bos=rt.adds_bos)
    return prefix, rt.tokenize(full_text[len(prefix_text) :])


def greedy(rt: Runtime, n: int = 24) -> list[int]:
    return [t.id for t in rt.generate(n)]


def test_restored_state_generates_exactly_like_prefill(any_runtime, model_path, model_hash):
    rt = any_runtime
    prefix, question = chat_prefix_and_question(rt)

    rt.reset()
    rt.prefill(prefix)
    data = rt.state_bytes()
    rt.prefill(question)
    expected = greedy(rt)
    assert len(expected) > 3

    # A fresh context of a freshly loaded model: nothing shared but the state bytes.
    fresh = Runtime(model_path, model_hash=model_hash, n_ctx=1024,
                    flash_attn=not rt.layout.v_trans)
    try:
        fresh.restore(parse_seq_sections(data), prefix)
        assert fresh.tokens == prefix
        assert fresh.state_bytes() == data
        fresh.prefill(question)
        assert greedy(fresh) == expected
    finally:
        fresh.close()


def test_restore_from_rebuilt_bytes_into_same_context(runtime):
    prefix, question = chat_prefix_and_question(runtime)
    runtime.reset()
    runtime.prefill(prefix + question)
    expected = greedy(runtime, 12)
    (kv,) = runtime.capture().sections
    runtime.reset()
    runtime.restore_bytes(build_seq_state(kv), prefix + question + expected)
    # The restore brings no logits: re-evaluating the last token makes them, then the sequence
    # continues exactly where a plain prefill + generation would.
    runtime.truncate(len(prefix + question))
    runtime.ensure_logits()
    assert greedy(runtime, 12) == expected


def test_sampling_with_a_seed_is_reproducible(runtime):
    prefix, question = chat_prefix_and_question(runtime)
    runs = []
    for seed in (7, 7, 8):
        runtime.reset()
        runtime.prefill(prefix + question)
        options = DEFAULTS.model_copy(update={"temperature": 1.5, "seed": seed})
        runs.append([t.id for t in runtime.generate(24, options=options)])
    assert runs[0] == runs[1]  # the whole chain, penalties included, seeded
    assert runs[2] != runs[0]  # and the seed is what decides: another one, another answer


def test_the_repetition_penalty_is_in_the_chain_and_sees_the_answer_only(runtime):
    def continuation(**options) -> list[int]:
        runtime.reset()
        runtime.prefill(runtime.tokenize("Count: 1, 2, 3,"))
        return [t.id for t in runtime.generate(8, options=GenerationOptions(**options))]

    plain = continuation()
    assert runtime.detokenize(plain).startswith(" 4, 5, 6")  # greedy: counting on
    penalized = continuation(repeat_penalty=1.5, repeat_last_n=64)
    # The prompt's ", " and spaces are not penalized: the answer starts as greedy does; its
    # own repeated " " is, and the counting breaks off.
    assert penalized[:3] == plain[:3] and penalized != plain
    assert continuation(repeat_penalty=1.5, repeat_last_n=0) == plain  # window off


def test_a_generated_token_longer_than_32_bytes_is_streamed_whole(runtime, monkeypatch):
    """(The binding reads a token into 32 bytes and gives nothing for a longer one: an answer's
    line break and deep indentation, one token of 34 bytes to SmolLM2, vanished.)"""
    indent = "\n" + " " * 33
    (long,) = runtime.tokenize(indent)
    eog = llama_cpp.llama_vocab_eos(runtime._vocab)
    drawn = iter([long, eog])
    monkeypatch.setattr(llamacalls, "chain", lambda *a, **kw: SimpleNamespace(
        sample=lambda *a: next(drawn), close=lambda: None))
    runtime.reset()
    runtime.prefill(runtime.tokenize("def f():"))
    assert [t.text for t in runtime.generate(4, chat=False)] == [indent]


def test_generation_streams_text(runtime):
    prefix, question = chat_prefix_and_question(runtime)
    runtime.reset()
    runtime.prefill(prefix + question)
    text = "".join(t.text for t in runtime.generate(32))
    assert "1938" in text


def test_prefill_progress_and_cancel(runtime):
    tokens = runtime.tokenize("word " * 300)
    seen = []
    runtime.reset()
    runtime.prefill(tokens, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (len(tokens), len(tokens))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

    stop = threading.Event()

    def cancel_after_first(done, total):
        stop.set()

    runtime.reset()
    with pytest.raises(Cancelled):
        runtime.prefill(tokens, progress=cancel_after_first, cancel=stop)
    assert 0 < runtime.n_tokens < len(tokens)


def test_generation_stops_on_cancel(runtime):
    runtime.reset()
    runtime.prefill(runtime.tokenize("Count: 1, 2, 3,"))
    stop = threading.Event()
    out = []
    for tok in runtime.generate(50, cancel=stop):
        out.append(tok)
        if len(out) == 3:
            stop.set()
    assert len(out) == 3


def test_context_overflow_is_a_clear_error(runtime):
    runtime.reset()
    with pytest.raises(RuntimeStateError, match="do not fit"):
        runtime.prefill([1] * (runtime.n_ctx + 1))


def test_state_of_other_shape_is_refused(runtime):
    runtime.reset()
    runtime.prefill(runtime.tokenize("Hello"))
    (kv,) = runtime.capture().sections
    kv.keys = np.concatenate([kv.keys, kv.keys], axis=2)
    kv.values = np.concatenate([kv.values, kv.values], axis=2)
    tokens = runtime.tokens
    with pytest.raises(RuntimeStateError, match="does not fit this model"):
        runtime.restore(SeqState([kv]), tokens)
    with pytest.raises(RuntimeStateError, match="does not fit this model"):
        runtime.restore_bytes(build_seq_state(kv), tokens)
    with pytest.raises(KVStateError):
        runtime.restore_bytes(b"\xd8\x3c\x14\xaf" + bytes(64), tokens)
    with pytest.raises(RuntimeStateError, match="does not fit this model"):
        runtime.restore_bytes(runtime.state_bytes(), tokens + [1])


def test_state_of_other_v_layout_is_converted(runtime, runtime_fa):
    runtime_fa.reset()
    runtime_fa.prefill(runtime_fa.tokenize("Hello there, general"))
    seq = runtime_fa.capture()
    assert not seq.sections[0].v_trans
    runtime.restore(seq, runtime_fa.tokens)
    (back,) = runtime.capture().sections
    assert back.v_trans
    np.testing.assert_array_equal(back.values, seq.sections[0].values)


def test_layout_facts(runtime):
    lay = runtime.layout
    assert (lay.n_layer, lay.n_head_kv, lay.head_dim) == (30, 3, 64)
    assert lay.kv_bytes_per_token == 23_040
    assert len(runtime.fingerprint) == 32


def test_fingerprint_depends_on_kv_layout(runtime, runtime_fa):
    # Same model file, other V layout: a cache of one must never load into the other.
    assert runtime.layout.model_hash == runtime_fa.layout.model_hash
    assert runtime.fingerprint != runtime_fa.fingerprint


def test_a_prefill_for_its_kv_alone_leaves_the_same_kv_and_no_logits(any_runtime):
    rt = any_runtime
    prefix, question = chat_prefix_and_question(rt)
    rt.reset()
    rt.prefill(prefix + question)
    state, expected = rt.state_bytes(), greedy(rt, 8)
    rt.reset()
    rt.prefill(prefix + question, logits=False)
    assert rt.tokens == prefix + question and rt.state_bytes() == state
    # llama.cpp computed no output row (no logits to read), and the runtime knows it.
    assert not rt.has_logits
    assert not llama_cpp.llama_get_logits_ith(rt.llm._ctx.ctx, -1)
    rt.ensure_logits()
    assert greedy(rt, 8) == expected
