"""A long document's passage KV under a small storage budget: every question is answered,
what is stored is what the notes say, and a question's own stores never evict the passages
it reads. The engine and passages are tests/test_longdoc.py's."""

from __future__ import annotations

import test_longdoc
from test_longdoc import GREEDY, passage_entries

make_engine = test_longdoc.make_engine  # (its fixture: an engine over the island guide)

BOTH = "When does the Saturday ferry leave, and what does the museum keep?"  # passages 0, 1
MUSEUM = "What does the museum keep?"  # passage 1


def fresh(eng, question, **kwargs):
    """`question` in a new chat, from the passages' own KV: no chat's exact prefix stored
    (a new chat over the same passages would restore it instead of blending them)."""
    assert eng.exactness.idle.wait(300)
    for e in eng.store.entries():
        if e.chat_id is not None:
            eng.store.delete_entry(e.id)
    eng.runtime.reset()
    return eng.ask(question, doc_ids=[eng.doc], generation=GREEDY, **kwargs)


def test_a_budget_smaller_than_one_passage_still_answers_and_says_nothing_was_stored(
        make_engine):
    """It failed with "no KV entry 1": the passage's entry, too large to keep, was looked up
    after it had been removed again."""
    eng = make_engine(fill_passages=False)
    eng.store.budget_bytes = 1000  # a passage's KV is tens of kB
    out = fresh(eng, BOTH)
    assert out.answer and [s["passage_id"] for s in out.sources] == [eng.ids[0], eng.ids[1]]
    assert not passage_entries(eng)
    assert any(m.startswith("2 passage(s) not stored") and "larger than the whole storage "
               "budget" in m for m in out.messages), out.messages
    assert not any("with no stored KV" in m for m in out.messages)  # ("... and stored")


def test_a_questions_stores_never_evict_the_passages_it_reads(make_engine):
    """At a budget holding one passage, a question reading two kept the one stored and said
    "computed and stored" of the other, which evicted it on the way: the note was false and
    the question computed both."""
    eng = make_engine(fill_passages=False)
    eng.session.longdocs.top_k = 1
    fresh(eng, MUSEUM)
    (museum,) = passage_entries(eng).values()
    eng.session.longdocs.top_k = 2
    eng.store.budget_bytes = museum.nbytes + museum.nbytes // 4  # no room for another
    out = fresh(eng, BOTH)
    assert out.answer
    assert set(passage_entries(eng)) == {museum.id}  # kept; the ferry's not stored
    assert any(m.startswith("1 passage(s) not stored") and "beside the passages this question"
               in m for m in out.messages), out.messages
    assert not any("with no stored KV" in m or m.startswith("storing this evicted")
                   for m in out.messages), out.messages
    assert out.blended["reused_tokens"] > 0  # the museum's part read from its KV

