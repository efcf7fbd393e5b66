"""A long document's passages taken from the shared cache (a real S3 server) under a small
storage budget: every question is answered, a pulled passage never evicts the others the
question reads, and one that does not fit is computed in place and said. The engine and
passages are tests/test_longdoc.py's."""

from __future__ import annotations

import test_longdoc
from test_longdoc import passage_entries
from test_longdoc_budget import BOTH, MUSEUM, fresh

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
        b.store.budget_bytes = 1000  # a passage's KV is tens of kB
        out = fresh(b, BOTH)
        assert out.answer and [s["passage_id"] for s in out.sources] == [b.ids[0], b.ids[1]]
        assert not passage_entries(b)
        assert any(m.startswith("2 passage(s) not stored") and "larger than the whole "
                   "storage budget" in m for m in out.messages), out.messages
    finally:
        b.close()
        b.store.close()


def test_a_pulled_passage_never_evicts_the_others_the_question_reads(
        make_engine, remote_tier, tmp_path):
    """At a budget holding one passage, the ferry's copy evicted the museum's the question
    was about to read."""
    b = shared_then_another(make_engine, remote_tier, tmp_path)
    try:
        b.session.longdocs.top_k = 1
        fresh(b, MUSEUM)
        (museum,) = passage_entries(b).values()
        b.session.longdocs.top_k = 2
        b.store.budget_bytes = museum.nbytes + museum.nbytes // 4  # no room for another
        out = fresh(b, BOTH)
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
