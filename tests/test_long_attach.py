"""A document longer than the context, attached: said at once, split and indexed, never
prefilled; a document that fits keeps its prefilled cache; `kvdesk passages` shows both."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from pdf_helpers import make_pdf

from desktop_app.engine import Engine
from desktop_app.errors import Cancelled, EngineError
from desktop_app.model.runtime import Runtime
from desktop_app.results import Progress
from store import Store

pytestmark = pytest.mark.model

N_CTX = 512
FACT = "The spare key of the boathouse hangs behind the barometer."
WRAPPED = FACT.replace(" hangs ", " hangs\n")  # as a hard-wrapped text holds it


def long_text() -> str:
    """~2,500 tokens of notes in Markdown sections, one fact planted two thirds in."""
    parts = []
    for i in range(40):
        parts.append(f"## Section {i}\n\nEntry {i} of the harbour log: the tide rose at "
                     f"{i % 12 + 1} o'clock, gulls counted {i * 7}, wind from the "
                     f"{'north' if i % 2 else 'south'} at {i % 9} knots.")
        if i == 27:
            parts.append(WRAPPED)
    return "# Harbour log\n\n" + "\n\n".join(parts)


@pytest.fixture
def engine(tmp_path, model_path, model_hash):
    eng = Engine(Store(tmp_path / "data"), lambda: Runtime(
        model_path, model_hash=model_hash, n_ctx=N_CTX), chunk_tokens=64, levels=["compact"])
    yield eng
    eng.close()
    eng.store.close()


def test_a_long_document_is_said_at_once_split_and_never_prefilled(engine, tmp_path):
    path = tmp_path / "log.md"
    path.write_text(long_text())
    seen: list[Progress] = []
    res = engine.attach(path, progress=seen.append)
    phases = [p.phase for p in seen]
    assert "prefill" not in phases and "encode" not in phases
    first = next(p for p in seen if p.phase != "extract")
    assert first.phase == "split" and first.done == 0  # said before the work starts
    assert "tokens, more than the 384 a context of 512 holds beside its questions and answers;" \
        in first.note and "passages" in first.note  # (the room, not the context: probe)
    # and then how far splitting has got, as it goes (it stood at 0 % until done)
    moving = [p.done for p in seen if p.phase == "split"]
    assert {p.total for p in seen if p.phase == "split"} == {100}  # one unit throughout
    assert len(moving) > 3 and moving == sorted(moving) and moving[-1] == 100
    assert res.passages > 3 and res.kept_tokens == 0 and res.tokens > N_CTX
    assert first.note in res.warnings and not res.reused
    assert engine.store.entries() == []  # no KV computed at attach
    (info,) = engine.documents()
    assert info.passages == res.passages and info.tokens == res.tokens
    assert info.status == "passages"  # ready for questions, not "none"

    listed = engine.passages(res.doc_id)
    assert [h.index for h in listed] == list(range(res.passages))
    assert all(h.tokens <= 512 for h in listed)
    assert "".join(h.text for h in listed).replace("\n", "") in \
        long_text().replace("\n", "")  # nothing invented, nothing reordered
    hits = engine.passages(res.doc_id, query="Where is the spare key of the boathouse?", k=2)
    assert WRAPPED in hits[0].text and hits[0].heading[-1] in ("Section 27", "Section 28")
    assert hits[0].location.startswith("line")

    again = engine.attach(path)
    assert again.reused and again.passages == res.passages
    assert [p.id for p in engine.store.passages(res.doc_id)] == [h.passage_id for h in listed]
    assert not any("levels asked for" in w for w in again.warnings)
    # Levels asked for do not apply to passages: said, not silently ignored.
    asked = engine.attach(path, levels=["lossless"])
    assert any("levels asked for (lossless) do not apply" in w and "passage_level (balanced)"
               in w for w in asked.warnings)


def test_a_document_that_fits_keeps_todays_path(engine, tmp_path):
    path = tmp_path / "short.txt"
    path.write_text(FACT)
    res = engine.attach(path)
    assert res.passages == 0 and res.kept_tokens == res.tokens and res.prefill_s > 0
    assert engine.store.passages(res.doc_id) == [] and engine.passages(res.doc_id) == []
    assert engine.documents()[0].status == "ready"


def test_a_long_pdf_keeps_its_pages_and_a_cancel_keeps_nothing(engine, tmp_path):
    pages = [[f"Page {n} line {i}: the archive holds ledger {n * 100 + i}." for i in range(20)]
             for n in range(1, 7)]
    pages[4][7] = "The lighthouse ledger was moved to the crypt in 1911."
    pdf = make_pdf(tmp_path / "archive.pdf", pages)
    stop = threading.Event()
    with pytest.raises(Cancelled):
        engine.attach(pdf, progress=lambda p: stop.set() if p.phase == "split" else None,
                      cancel=stop)
    assert engine.store.documents() == [] and engine.store.passage_counts() == {}

    res = engine.attach(pdf)
    assert res.passages > 1
    hits = engine.passages(res.doc_id, query="Where was the lighthouse ledger moved?", k=1)
    assert "crypt" in hits[0].text and hits[0].page == 5 and hits[0].location == "page 5"
    assert {h.page for h in engine.passages(res.doc_id)} == {1, 2, 3, 4, 5, 6}
    with pytest.raises(EngineError, match="no document"):
        engine.passages(res.doc_id + 1)
    engine.delete_document(res.doc_id)
    assert engine.store.passage_counts() == {}


def test_a_pdfs_outline_heads_its_sources_when_attached_and_when_split_later(engine,
                                                                           tmp_path):
    # A PDF's sources said only their page: its bookmarks never reached a passage.
    pages = [[f"{n}. Part {n}"] + [f"Part {n} line {i}: the ledger holds entry {n * 100 + i}."
                                   for i in range(20)] for n in range(1, 5)]
    pages[2][9] = "The lighthouse ledger was moved to the crypt in 1911."
    outline = [(1, f"Part {n}", n - 1) for n in range(1, 5)]
    res = engine.attach(make_pdf(tmp_path / "ledger.pdf", pages, outline))
    assert res.passages > 1
    (hit,) = engine.passages(res.doc_id, query="Where was the lighthouse ledger moved?", k=1)
    assert hit.page == 3 and hit.heading == ("Part 3",)
    assert all(h.heading == (f"Part {h.page}",) for h in engine.passages(res.doc_id))
    # One attached whole, split later for a chat that cannot hold it: from its file again.
    short = make_pdf(tmp_path / "short.pdf", [["1. Opening", "The gate opens at six."],
                                              ["2. Closing", "The gate shuts at nine."]],
                     [(1, "Opening", 0), (1, "Closing", 1)])
    whole = engine.attach(short)
    assert not whole.passages
    doc = engine.store.document(whole.doc_id)
    assert engine.attacher.split_stored(engine.runtime, doc) == 2
    assert [(h.page, h.heading) for h in engine.passages(whole.doc_id)] == [
        (1, ("Opening",)), (2, ("Closing",))]


def test_embed_gives_unit_vectors(engine):
    vectors = engine.embed(["harbour log", "tide tables"])
    assert vectors.shape == (2, engine.embedder.dimension)
    assert abs(float(vectors[0] @ vectors[0]) - 1) < 1e-5


def kvdesk(data_dir, *args):
    return subprocess.run([sys.executable, "-m", "desktop_app", "--data-dir", str(data_dir),
                           "--n-ctx", str(N_CTX), *args], capture_output=True, text=True,
                          timeout=180)


def test_the_command_line_says_it_and_shows_passages(tmp_path):
    path = tmp_path / "log.md"
    path.write_text(long_text())
    data = tmp_path / "data"
    proc = kvdesk(data, "attach", "--no-server", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("holds beside its questions and answers") == 1  # a note, said once
    assert "passages" in proc.stdout and "Traceback" not in proc.stderr
    listed = kvdesk(data, "docs").stdout
    assert "passages (0 with their KV)" in listed and "none" not in listed
    assert "read as text" not in listed + proc.stdout  # (this model keeps passage KV)
    found = kvdesk(data, "passages", "1", "--query", "boathouse spare key", "-k", "3", "--json")
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)
    # BM25 returns only passages holding a word of the query: here the fact's alone.
    assert len(hits) == 1 and WRAPPED in hits[0]["text"] and hits[0]["location"].startswith("line")
    # A rare word ("barometer") among common ones: a chat reads the passage holding it;
    # --wide lists the k best, as the chat's retrieval ranks them.
    asked = ["passages", "1", "-q", "Which tide and wind hang near the barometer?", "-k", "3"]
    focused = json.loads(kvdesk(data, *asked, "--json").stdout)
    assert [WRAPPED in h["text"] for h in focused] == [True]
    # The sentence naming "barometer" is the one the question's turn quotes, as written
    # (its tokens are the passage's); shown on one line.
    assert focused[0]["evidence"] == [WRAPPED]
    assert f'quoted with the question: "{FACT}"' in kvdesk(data, *asked).stdout
    wide = json.loads(kvdesk(data, *asked, "--wide", "--json").stdout)
    assert len(wide) == 3 and wide[0]["passage_id"] == focused[0]["passage_id"]
    dense = kvdesk(data, "passages", "1", "-q", "boathouse spare key", "--mode", "dense")
    assert dense.returncode == 0 and "score" in dense.stdout
    wrong = kvdesk(data, "passages", "1", "-q", "key", "--mode", "magic")
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    listing = kvdesk(data, "passages", "1")
    assert listing.returncode == 0 and "#0 [line" in listing.stdout
    docs = kvdesk(data, "docs")
    assert "passages" in docs.stdout
    bad = kvdesk(data, "passages", "7", "--json")
    assert bad.returncode == 1 and "no document 7" in json.loads(bad.stdout)["error"]


def test_passages_retrieved_as_a_follow_up_in_a_chat(engine, tmp_path):
    """`kvdesk passages --query Q --chat C`: what a follow-up retrieves after the chat's turns
    (which say what "it" is), not what the question alone does."""
    path = tmp_path / "log.md"
    path.write_text(long_text())
    doc = engine.attach(path).doc_id
    chat = engine.store.create_chat("c", [doc])
    engine.store.add_message(chat.id, "user", "Where is the spare key of the boathouse?")
    engine.store.add_message(chat.id, "assistant", "Behind the barometer.")
    follow_up = "Who put it there?"
    alone = engine.passages(doc, query=follow_up)
    after = engine.passages(doc, query=follow_up, chat_id=chat.id)
    assert not any(WRAPPED in h.text for h in alone)
    assert any(WRAPPED in h.text for h in after)
    other = engine.store.create_chat("about nothing", [])
    with pytest.raises(EngineError, match=f"chat {other.id} is not about document {doc}"):
        engine.passages(doc, query=follow_up, chat_id=other.id)
    with pytest.raises(EngineError, match="no chat 99"):
        engine.passages(doc, query=follow_up, chat_id=99)
    with pytest.raises(EngineError, match="give a query too"):
        engine.passages(doc, chat_id=chat.id)
