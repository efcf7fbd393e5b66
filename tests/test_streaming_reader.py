"""The streaming reader without a model: reads in parallel delivered in order, the level of a
missing chunk replaced, a failing source ending the stored part, bandwidth over busy time."""

from __future__ import annotations

import threading
import time

import pytest

from desktop_app.kv.reading import TEXT, ChunkReader, Meter
from desktop_app.kv.speeds import Speeds
from desktop_app.options import RestoreOptions as Options
from store import CorruptObjectError, NotFoundError, RemoteError, Span

LEVELS = ["lossless", "high"]


class FakeSource:
    kind = "remote"

    def __init__(self, n_chunks: int, parallel: int, *, missing=(), down_at=None,
                 stored=None):
        self.stored = {"lossless": 4000, "high": 1000} if stored is None else stored
        self.spans = [Span(7, i, 10 * i, 10 * i + 10) for i in range(n_chunks)]
        self.n_tokens = 10 * n_chunks
        self.parallel = parallel
        self.missing = set(missing)
        self.down_at = down_at
        self.reads: list[tuple[int, str]] = []
        self.active = self.most_active = 0
        self._lock = threading.Lock()

    def sizes(self, span):
        return self.stored

    def read(self, span, level):
        with self._lock:
            self.reads.append((span.chunk_index, level))
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            # Later chunks arrive sooner: delivery must still follow token order.
            time.sleep(0.02 * (len(self.spans) - span.chunk_index))
            if span.chunk_index == self.down_at:
                raise RemoteError("http://127.0.0.1:1 did not answer")
            if (span.chunk_index, level) in self.missing:
                raise NotFoundError(f"remote object {span.chunk_index}/{level} does not exist")
            if (span.chunk_index, "corrupt") in self.missing:
                raise CorruptObjectError(f"{span.chunk_index}/{level}", "SHA-256 mismatch")
            return f"{span.chunk_index}:{level}".encode()
        finally:
            with self._lock:
                self.active -= 1


def drain(source, options: Options | None = None, levels=LEVELS):
    reader = ChunkReader(source, source.spans, list(range(source.n_tokens)), levels,
                         options or Options(), Speeds(),
                         raw_bytes=lambda span: 100 * (span.token_end - span.token_start),
                         t0=time.perf_counter())
    thread = threading.Thread(target=reader.run)
    thread.start()
    items = []
    while (item := reader.fetched.get()) is not None:
        items.append(item)
    thread.join()
    assert not reader.crashed
    return items, reader


def test_parallel_reads_arrive_in_token_order():
    source = FakeSource(8, parallel=4)
    items, reader = drain(source)
    assert [i.data for i in items] == [f"{n}:lossless".encode() for n in range(8)]
    assert source.most_active == 4
    assert reader.meter.bytes == 8 * len(b"0:lossless")


def test_a_missing_object_is_read_at_another_level():
    source = FakeSource(4, parallel=2, missing={(1, "lossless")})
    items, _ = drain(source)
    assert [i.level for i in items] == ["lossless", "high", "lossless", "lossless"]
    assert "does not exist: read at 'high' instead" in items[1].note


def test_auto_reads_the_apps_levels_else_what_the_chunk_is_stored_at():
    """A passage stored at a level the app does not store documents at (`passage_level`), or a
    document at `attach --levels lossless` only, is read at its own levels, never recomputed
    for lack of the app's; where one of the app's is stored, "auto" keeps to those."""
    app = ["high", "balanced", "compact"]
    own = FakeSource(3, parallel=1, stored={"compact": 500, "lossless": 4000, "cachegen-2": 900})
    items, _ = drain(own, levels=app)
    assert [i.level for i in items] == ["compact"] * 3
    only = FakeSource(3, parallel=1, stored={"cachegen-2": 900, "lossless": 4000})
    items, _ = drain(only, levels=app)
    assert [i.level for i in items] == ["lossless"] * 3
    assert all(i.data is not None and i.error is None for i in items)
    items, _ = drain(FakeSource(2, parallel=1, stored={}), levels=app)
    assert items[0].level == TEXT and "no readable level left" in items[0].error


def test_with_every_level_corrupt_the_stored_part_ends_there():
    source = FakeSource(4, parallel=2, missing={(2, "corrupt")})
    items, _ = drain(source)
    assert [i.level for i in items] == ["lossless", "lossless", TEXT]
    assert items[-1].data is None and items[-1].error.count("SHA-256 mismatch") == 2


def test_a_failing_source_ends_the_stored_part_without_trying_other_levels():
    source = FakeSource(6, parallel=2, down_at=2)
    items, _ = drain(source)
    assert [i.data is not None for i in items] == [True, True, False]
    assert "did not answer" in items[-1].error
    assert (2, "high") not in source.reads


def test_a_tight_budget_on_a_slow_link_steps_the_level_down():
    # 0.004 MB/s: lossless (4 kB) takes a second a chunk, high 0.25 s; 1 s for all three.
    items, _ = drain(FakeSource(3, parallel=2), Options(budget_ms=1000, bandwidth_MBps=0.004))
    assert [i.level for i in items] == ["high"] * 3
    items, _ = drain(FakeSource(3, parallel=2), Options(budget_ms=4000, bandwidth_MBps=0.004))
    assert [i.level for i in items] == ["lossless"] * 3


def test_the_meter_counts_overlapping_reads_once():
    meter = Meter()
    meter.start()
    meter.start()
    time.sleep(0.1)
    meter.stop(1_000_000)
    meter.stop(1_000_000)
    assert meter.MBps() == pytest.approx(20, rel=0.3)  # 2 MB in 0.1 s, not 2 MB in 0.2 s
    assert Meter().MBps() is None
