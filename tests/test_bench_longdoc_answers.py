"""benchmarks.bench_longdoc_answers' bookkeeping: each miss's cause and the causes' counts
(no model: the rows are written here)."""

from __future__ import annotations

from benchmarks.bench_longdoc_answers import cause, causes


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
