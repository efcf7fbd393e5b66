"""benchmarks.bench_longdoc_answers' bookkeeping: each miss's cause, the causes' counts, and
the sentences `--quote` repeats (no model: the rows and passages are written here)."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.bench_longdoc_answers import cause, causes, naming_sentences


def row(states, source_hit=True, exact=None, ceiling=True, passages=1):
    r = {"states": states, "source_hit": source_hit, "ceiling_states": ceiling,
         "passages": passages}
    if exact is not None:
        r["exact_states"] = exact
    return r


def test_each_miss_gets_its_cause():
    assert cause(row(True)) is None
    assert cause(row(False, source_hit=False, exact=True)) == "not_read"
    assert cause(row(False, exact=False)) == "exact_misses"
    assert cause(row(False, exact=True)) == "blend"
    assert cause(row(False)) == "unknown"  # run without --exact


def test_causes_count_only_where_the_ceiling_states_it():
    rows = [row(False, exact=False, passages=2), row(False, exact=False, passages=1),
            row(False, exact=True), row(False, exact=True, ceiling=False), row(True)]
    for r in rows:
        r["cause"] = cause(r)
    assert causes(rows) == {"exact_misses": {"n": 2, "by_passages": {2: 1, 1: 1}},
                            "blend": {"n": 1, "by_passages": {1: 1}}}


def test_naming_sentences_are_those_holding_a_rare_word():
    counts = {"clue": 0, "the": 40, "martenmar": 1, "login": 0}
    app = SimpleNamespace(store=SimpleNamespace(
        passage_frequencies=lambda doc, question, at_most: counts))
    hits = [SimpleNamespace(index=7, text="Other text. The password hint for the Martenmar "
                                          "account is 'falcon falcon'. More text."),
            SimpleNamespace(index=2, text="Nothing here.\n\nMartenmar's logs are kept.")]
    assert naming_sentences(app, 1, "What is the clue for the Martenmar login?", hits) == [
        "Martenmar's logs are kept.",  # (in document order)
        "The password hint for the Martenmar account is 'falcon falcon'."]
    assert naming_sentences(app, 1, "q", hits, most=1) == ["Martenmar's logs are kept."]
    counts.clear()
    counts["the"] = 40  # a question with no rare word: nothing to quote
    assert naming_sentences(app, 1, "What is the?", hits) == []


def test_rarest_quotes_only_the_words_in_fewest_passages():
    counts = {"kept": 3, "vokmarune": 1, "the": 40}
    app = SimpleNamespace(store=SimpleNamespace(
        passage_frequencies=lambda doc, question, at_most: counts))
    hits = [SimpleNamespace(index=1, text="Many are kept here. The warehouse in Vokmarune "
                                          "stores exactly 817 crates.")]
    q = "How many boxes are kept at the Vokmarune depot?"
    assert naming_sentences(app, 1, q, hits) == [
        "Many are kept here.", "The warehouse in Vokmarune stores exactly 817 crates."]
    assert naming_sentences(app, 1, q, hits, rarest=True) == [
        "The warehouse in Vokmarune stores exactly 817 crates."]
