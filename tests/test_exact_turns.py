"""A chat's next turns at `lossless` are computed bit for bit as `--no-cache` computes them.

llama.cpp's KV of a token depends on how the prefill was batched: the first answer's tokens
(generated one at a time, kept in the chat's entry and in the context) and a recompute that
starts where a document's entry ends (not where a prefill from the first token cuts its
slices) differ from a recompute from text in their last bits, and a greedy answer parted from
`--no-cache`'s (`kv.exactprefix`). Compared here through the logits a prepared question
leaves, which any such difference changes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_engine import DOC, QUESTION, ask, close, deterministic, make_engine

from desktop_app.kv.exactprefix import exact_part
from desktop_app.kv.levels import DEFAULT_LEVELS, EXACT
from desktop_app.model.runtime import PREFILL_SLICE
from desktop_app.options import RestoreOptions
from store import Span

pytestmark = pytest.mark.model

NEXT = "And what happened to the lantern glass?"


@pytest.fixture
def new_engine(tmp_path, model_path, model_hash):
    made = []

    def make(**options):
        made.append(make_engine(tmp_path / "data", model_path, model_hash, **options))
        return made[-1]

    yield make
    for eng in made:
        close(eng)


def prepared(eng, chat_id: int, **restore):
    """The restore report and next-token logits of NEXT prepared in the chat."""
    report = eng.prepare(NEXT, chat_id=chat_id, restore=RestoreOptions(**restore))
    return report, eng.runtime.logits()


@pytest.mark.parametrize("levels", [DEFAULT_LEVELS, (*DEFAULT_LEVELS, EXACT)],
                         ids=["chat-not-lossless", "chat-lossless-too"])
def test_a_chats_next_turn_at_lossless_equals_no_cache_bit_for_bit(new_engine, tmp_path,
                                                                   levels):
    eng = new_engine(levels=levels)
    path = tmp_path / "doc.txt"
    path.write_text(DOC + "\n\n" + DOC.replace("Cape Morrow", "Point Ashby"))
    doc_id = eng.attach(path, levels=[EXACT, "high"]).doc_id
    n_doc = len(eng.prefix_tokens([doc_id]))
    assert n_doc > PREFILL_SLICE and n_doc % PREFILL_SLICE  # its last slice is cut short
    first = ask(eng, QUESTION, doc=doc_id, tokens=16, level=EXACT)
    assert first.recomputed_tokens == 0  # the first turn reads the document's entry whole
    chat = first.chat_id

    # In the same process: the context holds the answer as it was generated.
    held, exact = prepared(eng, chat, level=EXACT)
    _, fresh = prepared(eng, chat, no_cache=True)
    assert np.array_equal(exact, fresh)
    # Read from the store (as a new process does): the document's entry up to a whole
    # slice, the rest computed as --no-cache computes it, and said.
    eng.runtime.reset()
    read, exact = prepared(eng, chat, level=EXACT)
    assert np.array_equal(exact, fresh)
    assert EXACT in read.chunk_levels
    assert read.recomputed_tokens == read.tokens - n_doc // PREFILL_SLICE * PREFILL_SLICE
    assert any("computed again from token" in m for m in read.messages), read.messages

    if EXACT in levels:
        return  # (the answers: once)
    # The answers: asked at lossless (the prepared context kept), and asked again without
    # the cache.
    cached = ask(eng, NEXT, chat=chat, tokens=24, level=EXACT)
    again = eng.regenerate(chat, restore=RestoreOptions(no_cache=True),
                           generation=deterministic(24))
    assert cached.answer == again.answer


def test_a_chat_of_a_document_not_stored_at_lossless_says_only_that(new_engine, tmp_path):
    """Read from the store at lossless, a document kept without it is recomputed whole: the
    restore says that chunk is not stored so, and never that the stored tokens are read up to
    a slice ("computed again from token 256") as if the rest came from the cache."""
    eng = new_engine()
    path = tmp_path / "doc.txt"
    path.write_text(DOC + "\n\n" + DOC.replace("Cape Morrow", "Point Ashby"))
    doc_id = eng.attach(path, levels=["high"]).doc_id
    assert len(eng.prefix_tokens([doc_id])) > PREFILL_SLICE
    chat = ask(eng, QUESTION, doc=doc_id, tokens=4).chat_id
    eng.runtime.reset()
    read, _ = prepared(eng, chat, level=EXACT)
    assert read.recomputed_tokens == read.tokens
    assert any("not stored at 'lossless'" in m for m in read.messages), read.messages
    assert not any("computed again from token" in m for m in read.messages), read.messages


@pytest.mark.parametrize("chat_turns", [False, True])
def test_the_lossless_notes_reason_names_a_chats_turns_only_where_they_are_read(chat_turns):
    """(Its reason named "a chat's turns" for a document's cache alone, asked for under a
    longer context: its last tokens past a whole slice were all it computed again.)"""
    doc_end = 3 * PREFILL_SLICE + 40
    spans = [Span(1, 0, 0, doc_end)] + ([Span(2, 0, doc_end, doc_end + 90)] if chat_turns
                                         else [])
    n = spans[-1].token_end
    source = SimpleNamespace(spans=spans, prefilled={1: doc_end}, n_tokens=n, windows={},
                             beyond=())
    cut, why = exact_part(source, list(range(n + 20)), windowed=False)
    assert cut.n_tokens == 3 * PREFILL_SLICE
    assert len(why) == 1 and f"computed again from token {3 * PREFILL_SLICE}" in why[0]
    assert ("a chat's turns" in why[0]) == chat_turns, why
