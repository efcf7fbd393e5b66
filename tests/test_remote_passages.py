"""A long document's passages taken from the shared cache (a real S3 server) under a small
storage budget: every question is answered, a pulled passage never evicts the others the
question reads, and one that does not fit is computed in place and said. The engine and
passages are tests/test_longdoc.py's."""

from __future__ import annotations

import test_longdoc
from test_longdoc import passage_entries
from test_longdoc_budget import (
    BOTH,
    both_with_room_for_one,
    fresh,
    nothing_stored_at_a_tiny_budget,
)

from store import Store

pytestmark = __import__("pytest").mark.model

make_engine = test_longdoc.make_engine  # (its fixture: an engine over the island guide)


def shared_then_another(make_engine, remote_tier, tmp_path):
    """Machine A computed and pushed both passages BOTH reads; machine B, a fresh store on
    the same bucket, has none of them."""
    a = make_engine(remote=remote_tier, auto_push=True, fill_passages=False)
    fresh(a, BOTH)
    assert len(passage_entries(a)) == 2
    b = make_engine(store=Store(tmp_path / "b"), remote=remote_tier, fill_passages=False)
    assert not passage_entries(b)
    return b


def test_a_pulled_passage_larger_than_the_budget_is_computed_in_place_and_said(
        make_engine, remote_tier, tmp_path):
    """It failed the question with "no KV entry N": the copy, too large to keep, was looked
    up after it had been removed again."""
    b = shared_then_another(make_engine, remote_tier, tmp_path)
    try:
        nothing_stored_at_a_tiny_budget(b)
    finally:
        b.close()
        b.store.close()


def test_a_pulled_passage_never_evicts_the_others_the_question_reads(
        make_engine, remote_tier, tmp_path):
    """At a budget holding one passage, the ferry's copy evicted the museum's the question
    was about to read."""
    b = shared_then_another(make_engine, remote_tier, tmp_path)
    try:
        museum, out = both_with_room_for_one(b)
        assert out.answer
        assert set(passage_entries(b)) == {museum.id}  # kept; the ferry's not stored
        assert any(m.startswith("1 passage(s) not stored") and "beside the passages this "
                   "question" in m for m in out.messages), out.messages
        assert not any(m.startswith("storing this evicted") for m in out.messages), \
            out.messages
        assert out.blended["reused_tokens"] > 0  # the museum's part read from its KV
    finally:
        b.close()
        b.store.close()
