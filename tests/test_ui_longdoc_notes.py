"""What the window says of long documents: why their passages stopped getting their KV, the
titles of a chat's documents (deleted ones too), which passage a source is, how far an attach
is. The window runs on the scripted FakeEngine; the engine's side, on the test model."""

from __future__ import annotations

from dataclasses import replace

import test_longdoc
from ui_fixtures import (
    engine_fixture,  # noqa: F401 (a fixture)
    window_fixture,  # noqa: F401 (a fixture)
)

make_engine = test_longdoc.make_engine  # (its fixture: an engine over the island guide)

BUDGET_FULL = "the storage budget (30.0 MB) is full"


def _refreshed(qtbot, window):
    with qtbot.waitSignal(window.documents_changed, timeout=5000):
        window.refresh_documents()


def test_a_passage_pass_stopped_by_the_budget_says_why_on_its_row_and_in_the_status_bar(
        qtbot, window, engine):
    """The row stayed at "60 of 630 passages cached" with no reason: the reason only went to
    the log, naming the document by its id."""
    (doc_id, info), *_ = engine._docs.items()
    engine._docs[doc_id] = replace(info, passages=630, passages_cached=60)
    engine.passage_stops[doc_id] = BUDGET_FULL
    _refreshed(qtbot, window)
    row = window.doc_list.list.item(0).text()
    assert f"60 of 630 passages cached — stopped: {BUDGET_FULL}" in row
    said = window.statusBar().currentMessage()
    assert info.title in said and BUDGET_FULL in said and "60 of 630" in said, said
    assert f"document {doc_id}" not in said
    engine.passage_stops.clear()  # going again (a larger budget): no reason left to show
    _refreshed(qtbot, window)
    assert "stopped" not in window.doc_list.list.item(0).text()


def test_the_engine_says_why_its_passage_pass_stopped_until_a_larger_budget_lets_it_go_on(
        make_engine):
    eng = make_engine()
    eng.store.budget_bytes = 1
    eng.warm_up()  # (a long-running engine: the pass starts)
    assert eng.passage_fill.idle.wait(300)
    assert eng.passage_notes() == {eng.doc: "the storage budget (1 B) is full"}
    eng.set_storage_budget(10.0)  # the window's settings: the pass goes on at once
    assert eng.passage_fill.idle.wait(300)
    assert eng.passage_notes() == {}
    info = {d.doc_id: d for d in eng.documents()}[eng.doc]
    assert info.passages_cached == info.passages == 5
