"""The adaptive choice of level per chunk (CacheGen's rule), without a model."""

from __future__ import annotations

import time

from desktop_app.kv.reading import TEXT, Throttle, choose_level
from desktop_app.kv.speeds import Speeds

LEVELS = ["lossless", "high", "balanced", "compact"]
SIZES = {"lossless": 4_000_000, "high": 800_000, "balanced": 550_000, "compact": 380_000}
RAW = 5_900_000  # 256 tokens of the default model at fp16


def choose(time_left_s, read_MBps, remaining_chunks=16, sizes=SIZES, speeds=None):
    return choose_level(levels=LEVELS, sizes=sizes, raw_bytes=RAW,
                        remaining_tokens=256 * remaining_chunks,
                        remaining_chunks=remaining_chunks, time_left_s=time_left_s,
                        read_MBps=read_MBps, speeds=speeds or Speeds()).level


def test_no_budget_takes_the_best_stored_level():
    assert choose(None, 100) == "lossless"
    assert choose(None, 100, sizes={"balanced": 1, "compact": 1}) == "balanced"


def test_budget_and_bandwidth_step_the_level_down():
    # 16 chunks in 1.6 s: 100 ms each; decoding a chunk takes ~6 ms at the default speed.
    assert choose(1.6, 2000) == "lossless"
    assert choose(1.6, 100) == "lossless"  # 40 ms read
    assert choose(0.7, 100) == "high"  # 44 ms a chunk: lossless needs 46, high 14
    assert choose(1.6, 10) == "high"  # high 86 ms, lossless 406
    assert choose(1.6, 5) == "compact"  # compact 82 ms, balanced 116


def test_nothing_fits_takes_the_cheapest_level_not_text_when_recompute_is_slower():
    assert choose(0.001, 1) == "compact"


def test_recompute_wins_when_reading_is_slower_than_the_model():
    speeds = Speeds(prefill_tps=1e6)  # a fast GPU: recomputing 256 tokens is nearly free
    assert choose(0.001, 0.01, speeds=speeds) == TEXT


def test_missing_chunk_is_text():
    assert choose(None, 100, sizes={}) == TEXT


def test_measured_decode_speed_counts():
    slow_lossless = Speeds(decode_MBps={"lossless": 50.0})  # 118 ms to decode a chunk
    assert choose(1.6, 2000, speeds=slow_lossless) == "high"


def test_throttle_paces_reads_until_stopped():
    import threading

    running = threading.Event()
    t = Throttle(100.0)  # 100 MB/s
    start = time.perf_counter()
    for _ in range(5):
        t.wait(2_000_000, running)
    assert time.perf_counter() - start >= 0.09
    unthrottled = Throttle(None)
    start = time.perf_counter()
    unthrottled.wait(10**12, running)
    assert time.perf_counter() - start < 0.05
    # A restore that ends meanwhile (cancelled, or done) never waits out a slow link's hours.
    stopped = threading.Event()
    threading.Timer(0.05, stopped.set).start()
    start = time.perf_counter()
    Throttle(0.001).wait(10**9, stopped)  # 11 days at 1 kB/s
    assert time.perf_counter() - start < 5
