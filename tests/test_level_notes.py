"""What a restore says of chunks read at another level than the one asked (`kv.levels`), without
a model: notes kept as data, a blend's summed by adding, the sentences made only when shown."""

from __future__ import annotations

from dataclasses import replace

import pytest

from desktop_app.kv.levels import LevelNote, level_notes, merged_level_notes, said


def test_a_read_notes_the_chunks_not_stored_and_those_that_failed_apart():
    read = ["high", "compact", "balanced", "compact", "high"]
    assert level_notes("high", read, not_stored=3) == [
        LevelNote("not stored", 3, 5, "high", ("balanced", "compact"))]
    assert level_notes("high", read, not_stored=1) == [
        LevelNote("not stored", 1, 5, "high", ("balanced", "compact")),
        LevelNote("failed", 2, 5, "high", ("balanced", "compact"))]
    assert level_notes("high", ["high", "high"], not_stored=0) == []
    # Chunks of an entry kept at one level by design (a passage's) are no news.
    assert level_notes("high", read, not_stored=1, kept=2) == [
        LevelNote("not stored", 1, 5, "high", ("balanced", "compact"))]
    assert level_notes("high", ["balanced", "balanced"], not_stored=0, kept=2) == []
    # Chunks the restore asked for but never read (recomputed after a failure) are counted.
    assert level_notes("high", ["balanced"], not_stored=0, chunks=3) == [
        LevelNote("failed", 1, 3, "high", ("balanced",))]
    # A chunk its entry is stored at the level asked but that was set aside (or is missing)
    # is damaged, not "not stored".
    assert level_notes("high", read, not_stored=1, damaged=1) == [
        LevelNote("not stored", 1, 5, "high", ("balanced", "compact")),
        LevelNote("damaged", 1, 5, "high", ("balanced", "compact")),
        LevelNote("failed", 1, 5, "high", ("balanced", "compact"))]


def test_the_sentences_are_made_when_shown():
    assert said(["recomputing from token 64: it failed",
                 LevelNote("not stored", 1, 1, "high", ("compact",)),
                 LevelNote("not stored", 3, 4, "high", ("balanced", "compact")),
                 LevelNote("failed", 1, 4, "balanced", ("compact",)),
                 LevelNote("failed", 2, 4, "lossless", ("high",)),
                 LevelNote("damaged", 1, 4, "high", ("balanced",)),
                 LevelNote("damaged", 2, 4, "high", ("balanced", "compact"))]) == [
        "recomputing from token 64: it failed",
        "1 of 1 chunk is not stored at 'high': read at compact instead",
        "3 of 4 chunks are not stored at 'high': read at balanced, compact instead",
        "1 of 4 chunks failed its check at 'balanced': read at compact instead; "
        "`kvdesk verify --repair` computes it again",
        "2 of 4 chunks failed their check at 'lossless': read at high instead; "
        "`kvdesk verify --repair` computes them again",
        "1 of 4 chunks is damaged at 'high' (set aside after a failed check, or missing): "
        "read at balanced instead; `kvdesk verify --repair` computes it again",
        "2 of 4 chunks are damaged at 'high' (set aside after a failed check, or missing): "
        "read at balanced, compact instead; `kvdesk verify --repair` computes them again"]


def test_notes_add_up_per_kind_and_level_asked():
    a = LevelNote("not stored", 2, 5, "high", ("compact",))
    b = LevelNote("not stored", 1, 3, "high", ("balanced", "compact"))
    assert a + b == LevelNote("not stored", 3, 8, "high", ("balanced", "compact"))
    with pytest.raises(ValueError):
        a + LevelNote("failed", 1, 3, "high", ("compact",))
    with pytest.raises(ValueError):
        a + LevelNote("not stored", 1, 3, "balanced", ("compact",))


def test_a_blend_says_each_note_once_where_the_first_was_over_all_its_chunks():
    head = ["chunk 3: checksum mismatch: read at 'compact' instead",
            *level_notes("high", ["high", "compact", "compact"], not_stored=1)]
    part = [*level_notes("high", ["balanced", "balanced"], not_stored=2),
            "the cache of a passage could not be read whole: computing it"]
    merged = merged_level_notes([*head, *part], chunks=9)
    assert merged == [
        "chunk 3: checksum mismatch: read at 'compact' instead",
        LevelNote("not stored", 3, 9, "high", ("balanced", "compact")),
        LevelNote("failed", 1, 9, "high", ("compact",)),
        "the cache of a passage could not be read whole: computing it"]
    assert said(merged)[1:3] == [
        "3 of 9 chunks are not stored at 'high': read at balanced, compact instead",
        "1 of 9 chunks failed its check at 'high': read at compact instead; "
        "`kvdesk verify --repair` computes it again"]
    # A lone note counts the blend's chunks too; text that reads like a note stays text.
    lone = "1 of 2 chunks is not stored at 'high': read at compact instead"
    assert merged_level_notes([lone, LevelNote("failed", 1, 2, "high", ("compact",))], 6) == [
        lone, LevelNote("failed", 1, 6, "high", ("compact",))]


def test_a_chunk_of_the_shared_cache_that_fails_is_not_sent_to_local_repair():
    """`kvdesk verify --repair` mends this machine's store only: a copy in the shared cache
    that failed its check is put back by `kvdesk remote verify --repair` where it is held."""
    shared = LevelNote("failed", 1, 4, "high", ("compact",), shared=True)
    assert said([shared]) == [
        "1 of 4 chunks failed its check at 'high': read at compact instead; the shared "
        "cache's copy is damaged: `kvdesk remote verify --repair` puts it back from a "
        "machine that holds the entry"]
    assert level_notes("high", ["compact", "high"], 0, shared=True) == [LevelNote(
        "failed", 1, 2, "high", ("compact",), shared=True)]
    local = LevelNote("failed", 2, 4, "high", ("compact",))
    with pytest.raises(ValueError):
        local + shared
    assert merged_level_notes([local, shared], 8) == [replace(local, chunks=8),
                                                      replace(shared, chunks=8)]
