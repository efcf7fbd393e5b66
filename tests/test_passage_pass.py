"""The background passage pass, seen and controlled (probe 119): what it is doing, read from
memory (`passage_pass`), a pause until resumed, what `kvdesk serve` prints of it, and what an
attach says it will take of the disk. The engine's side on the test model (five passages);
the words on records."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import test_longdoc

from desktop_app.chat import passagefill
from desktop_app.kv import passagekv
from desktop_app.passagepass import LOGGER, PassagePass, duration
from desktop_app.results import AttachResult, size_text

make_engine = test_longdoc.make_engine  # (its fixture: an engine over the island guide)
passage_entries = test_longdoc.passage_entries


def _attached(eng) -> AttachResult:
    return AttachResult(doc_id=eng.doc, title="Island guide", tokens=200, kept_tokens=0,
                        prefill_s=0.0, encode_s=0.0, raw_bytes=0, stored_bytes={}, passages=5)


def _until(check, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_pass_says_what_it_does_and_a_pause_holds_it_until_resumed(
        make_engine, caplog, monkeypatch):
    """The window and serve showed nothing of hours of work: no document, no count, no
    estimate, and no way to pause it but a setting."""
    monkeypatch.setattr(passagefill, "SAY_EVERY_S", 0)  # (every passage says how far)
    caplog.set_level(logging.INFO, logger=LOGGER)
    eng = make_engine()
    assert eng.passage_pass() == PassagePass()  # nothing to do before a long-running start
    eng.pause_passages(True)
    eng.warm_up()
    _until(lambda: eng.passage_pass().doc_id == eng.doc)
    time.sleep(1.0)  # (paused: nothing is computed meanwhile)
    state = eng.passage_pass()
    assert (state.title, state.done, state.total, state.paused) == ("Island guide", 0, 5, True)
    assert state.per_minute is None and not passage_entries(eng)
    eng.pause_passages(False)
    assert eng.passage_fill.idle.wait(300)
    assert len(passage_entries(eng)) == 5
    state = eng.passage_pass()
    assert state.doc_id is None and not state.paused and state.per_minute > 0  # measured
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("caching the KV of 5 passages of document" in s and "(Island guide)" in s
               and "stops when the storage budget" in s for s in said), said
    assert any(s.startswith(f"caching passages of document {eng.doc}: Island guide 4 of 5 (")
               for s in said), said
    assert any("is done: its 5 passages all have their KV" in s for s in said), said
    assert any("paused until resumed" in s for s in said) and any("resumed" == s[-7:]
                                                                   for s in said), said


def test_closing_stops_a_paused_pass_at_once_and_says_where(make_engine, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    eng = make_engine()
    eng.pause_passages(True)
    eng.warm_up()
    _until(lambda: eng.passage_pass().doc_id == eng.doc)
    t0 = time.monotonic()
    eng.close()
    assert time.monotonic() - t0 < 5
    assert any("(Island guide) stopped at 0 of its 5 passages as kvdesk closed; the next start "
               "goes on" in r.getMessage() for r in caplog.records)


def test_an_attach_says_what_the_passages_will_take_of_the_disk(make_engine, monkeypatch):
    """Six books filled 15 GB in the background, unannounced: an attach now says what the
    passages' KV takes, measured (the passages stored, else the codec's calibration), and
    says less where nothing is measured."""
    eng = make_engine()
    note = eng.passage_fill.attach_notes(_attached(eng), None, True)
    assert note == ["Island guide: its 5 passages' caches are computed in the background "
                    "while kvdesk runs (the window or `kvdesk serve`), one at a time: it stops "
                    "when the storage budget (10.0 GB) is full; the setting "
                    "passages_in_background turns this off"]
    assert eng.passage_fill.attach_notes(_attached(eng), None, False) == []  # (setting off)
    # Calibrated: its bits per element at the passage level, over the model's KV per token.
    cal = SimpleNamespace(meta={"levels": {"balanced": {"bits_per_element": 4.0}}})
    monkeypatch.setattr(eng.passage_fill.kv.kv.calibrations, "current", lambda fp: cal)
    layout = eng.runtime.layout
    size = 0.5 * 200 * (layout.kv_bytes_per_token + layout.window_bytes_per_token) / layout.itemsize
    (note,) = eng.passage_fill.attach_notes(_attached(eng), None, True)
    assert f"about {size_text(round(size))} at the passage level (balanced, by the codec's " \
           "calibration), within the storage budget (10.0 GB);" in note, note
    monkeypatch.undo()
    # Measured on the passages stored: one left to compute, what one takes.
    eng.warm_up()
    assert eng.passage_fill.idle.wait(300)
    monkeypatch.setattr(passagekv, "MEASURED_TOKENS", 1)
    (dropped, entry), *_ = passage_entries(eng).items()
    eng.store.delete_entry(dropped)
    eng.store.budget_bytes = 10**4
    (note,) = eng.passage_fill.attach_notes(_attached(eng), None, True)
    assert "1 of its 5 passages' caches" in note and "as the passages stored take); it stops " \
           "when the storage budget (10.0 KB) is full, and questions compute the rest" in note
    assert eng.passage_fill.attach_notes(_attached(eng), ["high"], True)[0].startswith(
        "the levels asked for (high) do not apply")


def test_kvdesk_serve_prints_the_pass_from_info_on_once(capsys):
    from desktop_app.cli import serve

    serve.say_the_passage_pass()
    serve.say_the_passage_pass()  # (a second server in the process: still said once)
    logging.getLogger(LOGGER).info("caching passages of document %s", 1)
    assert capsys.readouterr().err == "caching passages of document 1\n"


def test_the_pass_line_says_how_far_and_how_long_at_the_measured_rate():
    state = PassagePass(1, "manbook.txt", 89, 4003, per_minute=30.0, queued=2)
    assert state.line() == "manbook.txt 89 of 4,003 (about 2 h 10 min left; 2 more " \
                           "documents after it)"
    assert PassagePass(1, "a.txt", 0, 40).line() == "a.txt 0 of 40 (measuring its speed)"
    assert PassagePass(1, "a.txt", 3, 40, per_minute=30.0, paused=True).line() == \
        "a.txt 3 of 40"
    assert [duration(s) for s in (0.2, 75, 3600, 3900, 11 * 3600)] == \
        ["1 s", "1 min", "1 h", "1 h 5 min", "11 h"]
