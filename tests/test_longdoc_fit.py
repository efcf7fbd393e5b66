"""Documents attached whole that a chat's context cannot hold whole — under a smaller context
than at their attach, or beside the chat's other documents — are kept as passages too and
answered from them, never read cut short; where they fit, they are read whole as before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from desktop_app.chat.readings import Readings
from desktop_app.engine import Engine
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions
from store import ReadOnlyError, Store

GREEDY = GenerationOptions(max_tokens=8, temperature=0)
TOPICS = ["harbour", "orchard", "quarry", "observatory", "railway", "glassworks", "mill",
          "library", "bridge", "market", "brewery", "lighthouse"]


def text(name: str, fact: str, paragraphs: int = 12) -> str:
    """A document of `paragraphs` plain paragraphs, `fact` in its last."""
    body = [f"The {t} of {name} was rebuilt after the flood. Its records list the workers, "
            f"the costs and the stone used, and the council met there each spring to decide "
            f"the year's repairs and the {t} wardens." for t in TOPICS[:paragraphs - 1]]
    return "\n\n".join([*body, fact])


@pytest.fixture
def make_engine(tmp_path, model_path, model_hash):
    engines = []

    def make(n_ctx: int, store: Store | None = None, flash_attn: bool = True) -> Engine:
        store = store or engines[0].store
        eng = Engine(store, lambda: Runtime(model_path, model_hash=model_hash, n_ctx=n_ctx,
                                            flash_attn=flash_attn), chunk_tokens=64)
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()
    if engines:
        engines[0].store.close()


def attach(eng: Engine, folder, name: str, fact: str, paragraphs: int = 12) -> int:
    path = folder / f"{name}.txt"
    path.write_text(text(name, fact, paragraphs))
    return eng.attach(path).doc_id


def test_a_document_attached_whole_is_answered_from_passages_under_a_smaller_context(
        make_engine, tmp_path):
    eng = make_engine(2048, Store(tmp_path / "data"))
    doc = attach(eng, tmp_path, "Tarnby", "The Tarnby ferry token costs nine copper marks.")
    assert not eng.store.passages(doc)  # it fit: attached whole
    before = eng.ask("Who met there?", doc_ids=[doc], generation=GREEDY).chat_id
    small = make_engine(512)  # (its room: 384 tokens)
    # A chat reopened before its next question is read cut, and says what that question does.
    said = small.reopen(before).messages
    assert "Tarnby.txt: longer than a context of 512 holds beside its questions and answers: " \
        "read cut to fit until this chat's next question, which splits it into passages and " \
        "reads those retrieved for it" in said, said
    assert not any("only its first" in m for m in said)  # (whose advice would be wrong)
    first = small.ask("What does the Tarnby ferry token cost?", doc_ids=[doc],
                      generation=GREEDY)
    assert any(m.startswith("Tarnby.txt: longer than a context of 512") and
               "split into passages now" in m for m in first.messages), first.messages
    assert not any("only its first" in m for m in first.messages), first.messages
    lines = len(text("Tarnby", "x").split("\n"))
    assert first.sources and any(s["lines"][1] == lines for s in first.sources), first.sources
    assert any("copper" in s["text"] for s in first.sources)
    again = small.ask("And who met there?", chat_id=first.chat_id, generation=GREEDY)
    assert not any("split into passages" in m for m in again.messages)  # split once
    # Under the context it was attached under, it is read whole again: its own cache.
    whole = eng.ask("What does the Tarnby ferry token cost?", doc_ids=[doc],
                    generation=GREEDY)
    assert whole.sources == [] and whole.blended is None
    assert whole.recomputed_tokens < 16, whole.recomputed_tokens
    # and under another model (here: another cache layout), whose context holds it too.
    other = make_engine(2048, flash_attn=False)
    assert other.ask("Who met there?", doc_ids=[doc], generation=GREEDY).sources == []


def test_documents_that_do_not_fit_together_are_read_from_passages_beside_one_read_whole(
        make_engine, tmp_path):
    eng = make_engine(1024, Store(tmp_path / "data"))  # (its room: 768 tokens)
    ids = [attach(eng, tmp_path, name, fact, 6) for name, fact in [
        ("Ashcombe", "The Ashcombe bell was cast in 1702."),
        ("Brindle", "The Brindle well is forty feet deep."),
        ("Corvale", "The Corvale banner is green and silver.")]]
    assert not any(eng.store.passages(d) for d in ids)
    # Any two fit the context together: read whole, blended as before.
    pair = eng.ask("How deep is the Brindle well?", doc_ids=ids[:2], generation=GREEDY)
    assert pair.sources == [] and not any(eng.store.passages(d) for d in ids)
    # A question still being typed is not computed ahead over a layout its sending changes.
    assert eng.prepare("What colour is the Corvale", doc_ids=ids) is None
    three = eng.ask("What colour is the Corvale banner?", doc_ids=ids, generation=GREEDY)
    assert not any("not read in this chat" in m or "only its first" in m
                   for m in three.messages), three.messages
    assert three.read_whole == [{"document_id": ids[0], "title": "Ashcombe.txt"}]
    split = [d for d in ids if eng.store.passages(d)]
    assert split == ids[1:]
    (note,) = [m for m in three.messages if "split into passages now" in m]
    assert note.startswith("Brindle.txt and Corvale.txt: do not fit this chat's context of "
                           "1,024 beside its other documents"), note
    assert any("banner" in s["text"] and s["document_id"] == ids[2] for s in three.sources)
    # The local API reads them the same way.
    api = eng.complete([{"role": "user", "content": "How deep is the Brindle well?"}],
                       documents=ids, generation=GREEDY)
    assert any("forty feet" in s["text"] for s in api.sources), api.sources
    # Reopened under a smaller context, the document read whole no longer fits beside the
    # passages: said, until the next question reads it from its passages.
    smaller = make_engine(512)
    said = smaller.reopen(three.chat_id).messages
    assert "Ashcombe.txt: does not fit this chat's context of 512 beside its other documents " \
        "and its questions and answers: not read until this chat's next question, which " \
        "splits it into passages and reads those retrieved for it" in said, said
    # A chat over one of them alone still reads it whole.
    alone = eng.ask("What colour is the Corvale banner?", doc_ids=[ids[2]],
                    generation=GREEDY)
    assert alone.sources == [] and alone.read_whole == []


def test_a_store_that_takes_no_writes_reads_the_document_cut_and_says_why(
        make_engine, tmp_path, monkeypatch):
    eng = make_engine(2048, Store(tmp_path / "data"))
    doc = attach(eng, tmp_path, "Tarnby", "The Tarnby ferry token costs nine copper marks.")
    small = make_engine(512)

    def full(rt, d):
        raise ReadOnlyError("the disk is full")
    monkeypatch.setattr(small.attacher, "split_stored", full)
    answer = small.ask("What does the Tarnby ferry token cost?", doc_ids=[doc],
                       generation=GREEDY)
    assert "Tarnby.txt: not split into passages, the store takes no writes (the disk is " \
        "full): read cut to fit" in answer.messages, answer.messages
    assert any(m.startswith("Tarnby.txt: only its first ") for m in answer.messages)
    assert answer.sources == [] and not eng.store.passages(doc)


def test_a_split_the_store_refuses_partway_names_both_what_was_split_and_what_was_not(
        monkeypatch):
    docs = [SimpleNamespace(id=i, title=f"{name}.txt") for i, name in enumerate(("A", "B"))]
    calls = []

    def splitter(rt, doc):
        calls.append(doc.id)
        if doc.id:
            raise ReadOnlyError("the disk is full")
        return 7
    readings = Readings(None, None, None, lambda: None, splitter)
    monkeypatch.setattr(readings, "unsplit", lambda rt, d: list(d))
    rt = SimpleNamespace(n_ctx=1024)
    assert readings.split_where_needed(rt, docs) == [
        "A.txt: does not fit this chat's context of 1,024 beside its other documents and its "
        "questions and answers: split into passages now (7), and each question in this chat "
        "reads those retrieved for it",
        "B.txt: not split into passages, the store takes no writes (the disk is full): read "
        "cut to fit"]
    assert calls == [0, 1]
