"""The window's pure helpers: Markdown rendering, report phrasing, date groups."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from desktop_app.results import AskResult, AttachResult, Progress, RestoreReport, size_text
from ui.library.sidebar import date_group
from ui.text.formatting import (
    answer_stats,
    attach_notices,
    calibrating_line,
    calibration_line,
    restore_line,
)
from ui.text.markdown import LIGHT, render


def test_markdown_escapes_markup_from_the_text():
    html = render("<script>alert(1)</script> **<b>x</b>** `<i>`").html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<b>&lt;b&gt;x&lt;/b&gt;</b>" in html
    assert "&lt;i&gt;</code>" in html


def test_markdown_blocks_and_inline():
    html = render("# Title\n\nsome *it* and **bold** and [a link](https://x.org)\n\n"
                  "- one\n- two\n\n3. three\n\n> quoted\n\n---").html
    assert "<b>Title</b>" in html
    assert "<i>it</i>" in html and "<b>bold</b>" in html
    assert '<a href="https://x.org"' in html
    assert html.count("<li>") == 3 and "<ul>" in html and '<ol start="3">' in html
    assert "<blockquote" in html and "<hr>" in html


def test_snake_case_is_not_italic():
    assert "<i>" not in render("call my_long_name here").html


def test_code_blocks_are_highlighted_and_kept_for_copying():
    out = render("intro\n```python\ndef f(x):  # note\n    return 'a' + 1\n```\nafter",
                 LIGHT, code_link=lambda j: f"kvdesk:code/0/{j}")
    assert out.code_blocks == ["def f(x):  # note\n    return 'a' + 1"]
    assert f'<span style="color:{LIGHT.keyword}">def</span>' in out.html
    assert f'<span style="color:{LIGHT.comment};font-style:italic"># note</span>' in out.html
    assert f"<span style=\"color:{LIGHT.string}\">'a'</span>" in out.html
    assert 'href="kvdesk:code/0/0"' in out.html
    assert "<p>after</p>" in out.html


def test_an_unfinished_fence_renders_as_code_while_streaming():
    out = render("look:\n```js\nlet x = 1")
    assert out.code_blocks == ["let x = 1"] and "<pre" in out.html


def test_restore_line_is_brief_and_counts_levels():
    report = RestoreReport(tokens=4096, restore_s=0.12, bytes_read=1, recomputed_tokens=0,
                           chunk_levels=["high"] * 14 + ["balanced"] * 2)
    assert restore_line(report) == ("restored 4,096 tokens in 120 ms — "
                                    "16 chunks: 14 high, 2 balanced")
    fallback = RestoreReport(tokens=10, restore_s=0.01, bytes_read=0, recomputed_tokens=10,
                             chunk_levels=["text"], messages=["the cache was stale"],
                             recompute_s=0.5)
    assert restore_line(fallback) == ("nothing restored; 10 computed in 500 ms\n"
                                      "the cache was stale")
    # a context partly restored: what came from the cache and what was computed, each timed
    partly = RestoreReport(tokens=1973, restore_s=0.09, bytes_read=1, recomputed_tokens=1770,
                           chunk_levels=["balanced"], recompute_s=0.85)
    assert restore_line(partly) == ("restored 203 of 1,973 tokens in 90 ms — 1 chunk: "
                                    "1 balanced; 1,770 computed in 850 ms")


def test_answer_stats_and_attach_notices():
    result = AskResult(chat_id=1, answer="x", ttft_s=0.25, restore_s=0, bytes_read=0,
                       chunk_levels=[], recomputed_tokens=0, tokens_generated=50)
    assert answer_stats(result, 2.0) == "50 tokens · 25.0 tokens/s · first token after 0.25 s"
    cut = replace(result, finish_reason="length")
    assert answer_stats(cut, 2.0).endswith(" · stopped at the token limit: it may be cut short")
    long = AttachResult(doc_id=1, title="big.txt", tokens=9000, kept_tokens=8192, prefill_s=1,
                        encode_s=1, raw_bytes=1, stored_bytes={}, warnings=["odd bytes"])
    assert attach_notices(long) == ["odd bytes", "big.txt: only the first 8,192 of 9,000 tokens "
                                    "fit the context; the rest is left out"]
    split = AttachResult(doc_id=2, title="book.txt", tokens=90_000, kept_tokens=0, prefill_s=0,
                         encode_s=1, raw_bytes=0, stored_bytes={}, passages=300,
                         warnings=["book.txt: longer than the context; kept as passages"])
    assert attach_notices(split) == split.warnings  # nothing is left out of it
    assert size_text(999) == "999 B" and size_text(70_500_000) == "70.5 MB"


def test_date_groups_follow_calendar_days():
    now = dt.datetime(2026, 3, 10, 0, 30).timestamp()
    at = lambda *args: dt.datetime(*args).timestamp()  # noqa: E731
    assert date_group(at(2026, 3, 10, 0, 5), now) == "Today"
    assert date_group(at(2026, 3, 9, 23, 50), now) == "Yesterday"
    assert date_group(at(2026, 3, 3, 12), now) == "Previous 7 days"
    assert date_group(at(2026, 3, 2, 12), now) == "Older"


def test_calibration_progress_in_words():
    line = "Calibrating the codec for this model… "
    assert calibrating_line(Progress("calibrate", 0, 100, "reference")) == \
        "Calibrating the codec for this model… measuring the model's own cache"
    assert calibrating_line(Progress("calibrate", 65, 100, "balanced")) == \
        line + "fitting balanced 65%"
    assert calibrating_line(Progress("calibrate", 12, 100, "sensitivity")) == \
        line + "measuring each part's sensitivity 12%"
    assert calibrating_line(Progress("calibrate", 0, 0)) == line.rstrip()
    assert calibrating_line(Progress("calibrate", 0, 100, "waiting", "another kvdesk")) == \
        line + "waiting for another kvdesk process calibrating it"
    assert calibrating_line(Progress("calibrate", 12, 100, "sensitivity", "going on from")) == \
        line + "measuring each part's sensitivity 12% (resumed)"
    assert calibration_line(None).startswith("Model-independent levels")


def test_a_title_becomes_a_file_name_every_system_takes():
    from ui.text.formatting import file_name

    assert file_name("What is multi-head attention?") == "What is multi-head attention"
    assert file_name('a/b\\c: "d" <e>|f*') == "a b c d e f"
    assert file_name("..hidden\tfile\n") == "hidden file"
    assert file_name("  ") == file_name("???") == "chat" and len(file_name("x" * 300)) == 80


def test_a_count_is_written_with_its_noun_singular_or_plural():
    from desktop_app.results import counted

    assert [counted(n, "token") for n in (0, 1, 2, 2048)] == [
        "0 tokens", "1 token", "2 tokens", "2,048 tokens"]


def test_the_engines_notes_are_said_in_window_terms_each_on_its_own_line():
    """The window showed two notes joined by "; " as one paragraph, with a backticked
    `kvdesk calibrate` a window user cannot run (the probe's M4)."""
    from ui.text.formatting import notes_text
    report = RestoreReport(tokens=10, restore_s=0.01, bytes_read=0, recomputed_tokens=10,
                           chunk_levels=["text"], recompute_s=0.5, messages=[
                               "read as text until calibrated; calibrate it with "
                               "`kvdesk calibrate` (a few minutes, once)",
                               "fix it with `kvdesk verify --repair`"])
    lines = restore_line(report).split("\n")
    assert lines[1:] == ["read as text until calibrated; calibrate it with Tools ▸ Calibrate "
                         "the codec for this model (a few minutes, once)",
                         "fix it with kvdesk verify --repair"]
    assert "`" not in notes_text(report.messages)
