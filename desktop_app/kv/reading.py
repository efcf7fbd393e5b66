"""Reading stored chunks ahead of decoding, a level chosen per chunk (CacheGen's adaptation).

A `ChunkReader` reads a list of chunks from a source (`sources`: the local store, or the remote
tier) in order, keeping the source's number of reads in flight (one for the local store,
several for the network; optionally throttled to a declared bandwidth, to stand for a slow
link), while the restoring thread decodes what it delivered (`streaming`). For every chunk it
picks, as its read starts, the best-quality level whose expected cost — bytes over the
bandwidth measured on the reads finished so far (or declared), plus bytes of output over the
decode speed measured so far — fits the share of the time budget left to it (`choose_level`).
If no level fits, the cheapest wins, unless recomputing from text would be cheaper still.

"auto" chooses among the app's levels (what it stores by default), and among the levels a chunk
is stored at when it has none of those (a passage level outside them, `attach --levels
lossless`). A level the caller forces is read wherever it is stored; a chunk not stored at it,
or missing or corrupt, is read at another level (or, when exact KV was asked for, not read:
recomputing is exact too). With no level left, or when the source fails (an unreachable remote
tier), the reading ends there and says why.

It decodes nothing and touches no model: what the chunks become is `streaming`'s.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass

from store import CorruptChunkError, CorruptObjectError, NotFoundError, Span, StoreError

from ..options import AUTO, RestoreOptions
from .levels import EXACT, quality_order
from .sources import ChunkSource
from .speeds import Speeds

TEXT = "text"  # the chunk_levels name of a chunk recomputed from its tokens


@dataclass(frozen=True)
class Choice:
    level: str  # a codec level, or TEXT: recompute this chunk and all after it


class Throttle:
    """Paces reads to `MBps` on average, as a slow link would (reads in parallel share it)."""

    def __init__(self, MBps: float | None):
        self.rate = MBps * 1e6 if MBps else None
        self.start = time.perf_counter()
        self.sent = 0
        self._lock = threading.Lock()

    def wait(self, nbytes: int, stop: threading.Event) -> None:
        """Until `nbytes` more are due at the rate, or `stop` (a restore ended meanwhile: a
        slow link's wait may be hours, and is never waited out)."""
        if self.rate is None:
            return
        with self._lock:
            self.sent += nbytes
            sent = self.sent
        delay = self.start + sent / self.rate - time.perf_counter()
        if delay > 0:
            stop.wait(delay)


def choose_level(
    *,
    levels: Sequence[str],
    sizes: dict[str, int],
    raw_bytes: int,
    remaining_tokens: int,
    remaining_chunks: int,
    time_left_s: float | None,
    read_MBps: float,
    speeds: Speeds,
) -> Choice:
    """CacheGen's rule: the best level (levels are best first) that fits the budget share."""
    def cost(level: str) -> float:
        return sizes[level] / 1e6 / read_MBps + raw_bytes / 1e6 / speeds.decode(level)

    stored = [lvl for lvl in levels if lvl in sizes]
    if not stored:
        return Choice(TEXT)
    if time_left_s is None:
        return Choice(stored[0])
    share = time_left_s / max(1, remaining_chunks)
    for level in stored:
        if cost(level) <= share:
            return Choice(level)
    cheapest = min(stored, key=cost)
    # Recomputing is all-or-nothing from here on (later KV depends on this chunk's tokens):
    # compare it with streaming every remaining chunk at the cheapest level.
    if remaining_tokens / speeds.prefill_tps < cost(cheapest) * remaining_chunks:
        return Choice(TEXT)
    return Choice(cheapest)


@dataclass
class _Fetched:
    span: Span
    level: str
    data: bytes | None
    error: str | None = None  # why the stored part ends here (data is None)
    note: str | None = None  # a fallback to another level, said to the user


class Meter:
    """Bytes over busy time of reads that may overlap: the bandwidth the link really gave."""

    def __init__(self):
        self._lock = threading.Lock()
        self.bytes = 0
        self.busy_s = 0.0
        self._active = 0
        self._since = 0.0

    def start(self) -> None:
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1

    def stop(self, nbytes: int) -> None:
        with self._lock:
            self._active -= 1
            self.bytes += nbytes
            if self._active == 0:
                self.busy_s += time.perf_counter() - self._since

    def MBps(self) -> float | None:
        with self._lock:
            busy = self.busy_s + (time.perf_counter() - self._since if self._active else 0.0)
            return self.bytes / 1e6 / busy if self.bytes and busy > 0 else None


# A missing or corrupt chunk is that object's problem: another level of it may be sound.
_BAD_OBJECT = (NotFoundError, CorruptChunkError, CorruptObjectError)


class ChunkReader:
    """Plans and reads `spans` ahead of decoding, `source.parallel` in flight, in order.

    Each chunk's level is chosen when its read starts, from the bandwidth measured on the
    reads finished so far; a chunk whose object is missing or corrupt is read at another
    level, and if none is left, or the source fails outright, the stored part ends there.
    `raw_bytes(span)` is what a chunk decodes to; `restart(span)` the token from which
    everything would be recomputed were the reading to end at it (its start, by default).
    """

    def __init__(self, source: ChunkSource, spans: Sequence[Span], tokens: list[int],
                 levels: Sequence[str], options: RestoreOptions, speeds: Speeds, *,
                 raw_bytes: Callable[[Span], int], t0: float,
                 restart: Callable[[Span], int] | None = None):
        self.source = source
        self.spans = list(spans)
        self.tokens = tokens
        self.levels = levels
        # A level the caller forces: read wherever it is stored; where it is not (or is
        # corrupt), another level is chosen as "auto" would, except for exact KV.
        self.forced = options.level if options.level != AUTO else None
        # Under "auto": chunks planned below their best stored level (to fit the budget at
        # the speeds measured now, which another run may not see: `adaptation_note`).
        self.adapted = 0
        self.speeds = speeds
        self.raw_bytes = raw_bytes
        self.restart = restart or (lambda span: span.token_start)
        self.t0 = t0
        self.declared = options.bandwidth_MBps
        self.budget_s = options.budget_ms / 1000 if options.budget_ms is not None else None
        self.meter = Meter()
        self.throttle = Throttle(self.declared)
        self.fetched: queue.Queue[_Fetched | None] = queue.Queue(maxsize=3)
        self.stop = threading.Event()
        self.crashed: list[BaseException] = []

    def prior_MBps(self) -> float:
        return self.speeds.remote_MBps if self.source.kind == "remote" else self.speeds.read_MBps

    def plan(self, i: int, sizes: dict[str, int]) -> str:
        span = self.spans[i]
        if self.forced is not None:
            if self.forced in sizes:
                return self.forced
            if self.forced == EXACT:  # asked for exact KV: recomputing is the exact fallback
                return TEXT
        return choose_level(
            levels=quality_order(sizes), sizes=sizes,
            raw_bytes=self.raw_bytes(span),
            remaining_tokens=len(self.tokens) - self.restart(span),
            remaining_chunks=len(self.spans) - i,
            time_left_s=None if self.budget_s is None
            else self.budget_s - (time.perf_counter() - self.t0),
            read_MBps=self.declared or self.meter.MBps() or self.prior_MBps(),
            speeds=self.speeds,
        ).level

    def read(self, span: Span, level: str) -> bytes:
        self.meter.start()
        data = b""
        try:
            data = self.source.read(span, level)
            self.throttle.wait(len(data), self.stop)
            return data
        finally:
            self.meter.stop(len(data))

    def run(self) -> None:
        pool = ThreadPoolExecutor(self.source.parallel, thread_name_prefix="kv-read")
        window: deque[tuple[int, str, dict[str, int], Future | None]] = deque()
        planned = 0
        try:
            while not self.stop.is_set():
                while planned < len(self.spans) and len(window) < self.source.parallel:
                    # What is stored counts: a forced level is read wherever it is, even
                    # one the app does not store by default; "auto" chooses among the app's
                    # levels, or among the chunk's own when it has none of them.
                    stored = self.source.sizes(self.spans[planned])
                    sizes = {lvl: n for lvl, n in stored.items()
                             if lvl in self.levels or lvl == self.forced} or stored
                    level = self.plan(planned, sizes)
                    if self.forced is None and level != next(iter(quality_order(sizes)), TEXT):
                        self.adapted += 1
                    future = None if level == TEXT else \
                        pool.submit(self.read, self.spans[planned], level)
                    window.append((planned, level, sizes, future))
                    # Recomputing is all-or-nothing from there on: plan nothing after it.
                    planned = planned + 1 if future is not None else len(self.spans)
                if not window:
                    return
                item = self.settle(*window.popleft())
                if item is None:
                    return
                self.fetched.put(item)
                if item.data is None:
                    return
        except BaseException as e:  # a bug: handed to the restoring thread, never swallowed
            self.crashed.append(e)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self.fetched.put(None)

    def settle(self, i: int, level: str, sizes: dict[str, int],
               future: Future | None) -> _Fetched | None:
        """The chunk read (or the reason it could not be); None once stopped."""
        span = self.spans[i]
        if future is None:
            if not sizes:
                why = (f"chunk {i} has no readable level left (damaged and set aside, or "
                       "missing: `kvdesk verify --repair` computes it again)")
            elif self.forced == EXACT:
                why = (f"chunk {i} is not stored at {EXACT!r} (exact KV is opt-in): recomputing, "
                       "which is exact too")
            else:
                why = None  # the budget chose recomputing over reading
            return _Fetched(span, TEXT, None, why)
        errors: list[str] = []
        attempt = functools.partial(self._result, future)
        while True:
            try:
                data = attempt()
            except _BAD_OBJECT as e:
                errors.append(str(e))
            except StoreError as e:  # the source itself failed: no other level would do
                return _Fetched(span, level, None, "; ".join([*errors, str(e)]))
            else:
                if data is None:
                    return None
                note = f"{'; '.join(errors)}: read at {level!r} instead" if errors else None
                return _Fetched(span, level, data, note=note)
            sizes = {lvl: n for lvl, n in sizes.items() if lvl != level}
            level = self.plan(i, sizes)
            if level == TEXT:
                return _Fetched(span, level, None, "; ".join(errors))
            attempt = functools.partial(self.read, span, level)

    def _result(self, future: Future) -> bytes | None:
        # Wait in short slices: a stopped restore must not wait out a slow remote read.
        while not self.stop.is_set():
            try:
                return future.result(timeout=0.05)
            except FuturesTimeout:
                continue
        return None

