"""Streaming restore: stored KV chunks back into the model, a level chosen per chunk.

CacheGen's adaptation, on a desktop: the prefix to restore is a chain of stored chunks, each
kept at several codec levels, read from a source (`sources`: the local store, or the remote
tier). A reader thread keeps the source's number of reads in flight (one for the local store,
several for the network; optionally throttled to a declared bandwidth, to stand for a slow
link) while the calling thread verifies and decodes the chunks in order into the assembled KV
arrays, so reading and decoding overlap. For every chunk the reader picks, as its read starts,
the best-quality level whose expected cost — bytes over the bandwidth measured on the reads
finished so far (or declared), plus bytes of output over the decode speed measured so far —
fits the share of the time budget left to it. If no level fits, the cheapest wins, unless
recomputing the rest from text would be cheaper still.

A level the caller forces is read wherever it is stored; a chunk not stored at it, or missing or
corrupt, is read at another level (or, when exact KV was asked for, recomputed: exact too). With
no level left, or when the source fails (an unreachable remote tier), or for a chunk the codec
refuses, the stored part ends: from that chunk on everything is recomputed from text, and the
caller is told why. Nothing decoded from a bad chunk ever reaches the model.

This module knows the store's and codec's APIs but owns no policy about what gets cached.
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

import numpy as np

import codec
from store import CorruptChunkError, CorruptObjectError, NotFoundError, Span, StoreError

from .errors import Cancelled
from .kvstate import KVState
from .options import AUTO, RestoreOptions
from .results import Progress, RestoreReport
from .runtime import Runtime
from .sources import ChunkSource
from .speeds import Speeds

TEXT = "text"  # the chunk_levels name of a chunk recomputed from its tokens
EXACT = "lossless"  # the level whose every chunk is bit-exact

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

    def wait(self, nbytes: int) -> None:
        if self.rate is None:
            return
        with self._lock:
            self.sent += nbytes
            sent = self.sent
        delay = self.start + sent / self.rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


def warm_up(levels: Sequence[str], shape: tuple[int, int, int]) -> None:
    """Ready the codec for chunks of `shape` ([n_layer, chunk tokens, channels]) at `levels`.

    The first use of each level costs up to a second: numba loads its compiled kernels from
    its cache and the codec builds its per-shape plans and tables. Done in the background
    when a model loads, the user's first attach or restore does not pay for it.
    """
    k = np.random.default_rng(0).standard_normal(shape).astype(np.float16)
    for level in levels:
        codec.decode(codec.encode(k, k, level))


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
    """Plans and reads chunks ahead of decoding, `source.parallel` in flight, in order.

    Each chunk's level is chosen when its read starts, from the bandwidth measured on the
    reads finished so far; a chunk whose object is missing or corrupt is read at another
    level, and if none is left, or the source fails outright, the stored part ends there.
    """

    def __init__(self, source: ChunkSource, tokens: list[int], levels: Sequence[str],
                 options: RestoreOptions, speeds: Speeds, bytes_per_token: int, t0: float):
        self.source = source
        self.spans = list(source.spans)
        self.tokens = tokens
        self.levels = levels
        # A level the caller forces: read wherever it is stored; where it is not (or is
        # corrupt), another level is chosen as "auto" would, except for exact KV.
        self.forced = options.level if options.level != AUTO else None
        self.speeds = speeds
        self.bytes_per_token = bytes_per_token
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
            levels=self.levels, sizes=sizes,
            raw_bytes=(span.token_end - span.token_start) * self.bytes_per_token,
            remaining_tokens=len(self.tokens) - span.token_start,
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
            self.throttle.wait(len(data))
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
                    sizes = {lvl: n for lvl, n in self.source.sizes(self.spans[planned]).items()
                             if lvl in self.levels}
                    level = self.plan(planned, sizes)
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
                why = f"chunk {i} is stored at none of {list(self.levels)}"
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


def restore(
    runtime: Runtime,
    source: ChunkSource | None,
    tokens: Sequence[int],
    *,
    levels: Sequence[str],
    options: RestoreOptions,
    speeds: Speeds,
    chunk_tokens: int,
    progress: Callable[[Progress], None] | None = None,
    cancel: threading.Event | None = None,
) -> RestoreReport:
    """Bring `tokens` into the runtime's context: `source`'s chunks first, then text for the
    rest (`source` covers a prefix of `tokens`; None: recompute them all, the baseline).

    `levels` are the codec levels in quality order (best first); tokens recomputed are
    reported as chunks of `chunk_tokens` named TEXT. Raises Cancelled.
    """
    t0 = time.perf_counter()
    tokens = list(tokens)
    messages: list[str] = []
    chunk_levels: list[str] = []
    n_restored = 0
    bytes_read = 0
    if source is not None and source.n_tokens:
        n_restored, bytes_read = _stream(runtime, source, tokens, levels, options, speeds,
                                         progress, cancel, chunk_levels, messages)
    else:
        runtime.reset()
    rest = tokens[n_restored:]
    if rest:
        chunk_levels += [TEXT] * -(-len(rest) // max(1, chunk_tokens))
        r0 = time.perf_counter()
        runtime.prefill(rest, cancel=cancel, progress=None if progress is None else (
            lambda done, total: progress(Progress("recompute", n_restored + done, len(tokens)))))
        if len(rest) >= 64:
            speeds.prefill_tps = len(rest) / (time.perf_counter() - r0)
    return RestoreReport(
        tokens=len(tokens),
        restore_s=time.perf_counter() - t0,
        bytes_read=bytes_read,
        chunk_levels=chunk_levels,
        recomputed_tokens=len(rest),
        messages=messages,
        source=source.kind if source is not None else "local",
    )


def _stream(runtime: Runtime, source: ChunkSource, tokens: list[int], levels: Sequence[str],
            options: RestoreOptions, speeds: Speeds, progress, cancel,
            chunk_levels: list[str], messages: list[str]) -> tuple[int, int]:
    """Decode `source`'s chunks into the context, in order, as the reader delivers them;
    (tokens restored, bytes read). Appends each chunk's level and every fallback said."""
    lay = runtime.layout
    held = [*tokens[:source.n_tokens], *source.beyond]  # what the chunks hold
    state = runtime.new_state_buffer(len(held))  # chunks are decoded into it in place
    n_restored, n_bytes = read_chunks(
        source, tokens, state.keys, state.values, levels=levels, options=options,
        speeds=speeds, bytes_per_token=lay.kv_bytes_per_token, progress=progress,
        cancel=cancel, chunk_levels=chunk_levels, messages=messages)
    if n_restored == len(held):
        runtime.restore_buffer(state, held)
        runtime.truncate(source.n_tokens)  # a tail's tokens past the ones asked for go
        n_restored = source.n_tokens
    elif n_restored:  # the stored part ended early: only its first chunks are usable
        n_restored = min(n_restored, source.n_tokens)
        kv = KVState(state.keys[:, :n_restored], state.values[:, :n_restored],
                     np.arange(n_restored, dtype=np.int32), v_trans=lay.v_trans)
        runtime.restore(kv, tokens[:n_restored])
    else:
        runtime.reset()
    return n_restored, n_bytes


def read_chunks(source: ChunkSource, tokens: Sequence[int], keys: np.ndarray,
                values: np.ndarray, *, levels: Sequence[str], options: RestoreOptions,
                speeds: Speeds, bytes_per_token: int, progress=None, cancel=None,
                chunk_levels: list[str], messages: list[str]) -> tuple[int, int]:
    """Decode `source`'s chunks in order into keys and values ([n_layer, tokens, channels]
    arrays or views, indexed by the chunks' own token positions) as the reader delivers them.

    Returns (the end of the run of chunks decoded from the first one, bytes read): a missing,
    corrupt or undecodable chunk ends the run (said in `messages`). Appends each chunk's level.
    """
    t0 = time.perf_counter()
    reader = ChunkReader(source, list(tokens), levels, options, speeds, bytes_per_token, t0)
    fetched = reader.fetched
    thread = threading.Thread(target=reader.run, name="kv-reader", daemon=True)
    thread.start()
    n_read = 0
    try:
        while (item := fetched.get()) is not None:
            if cancel is not None and cancel.is_set():
                raise Cancelled("restore cancelled")
            if item.note:
                messages.append(f"chunk {item.span.chunk_index}: {item.note}")
            if item.data is None:
                if item.error:
                    messages.append(f"recomputing from token {item.span.token_start}: "
                                    f"{item.error}")
                break
            d0 = time.perf_counter()
            t0_, t1_ = item.span.token_start, item.span.token_end
            try:
                # Straight into the caller's arrays; the codec refuses a chunk of another shape.
                k, v = codec.decode(item.data, out=(keys[:, t0_:t1_], values[:, t0_:t1_]))
            except codec.CodecError as e:
                messages.append(f"recomputing from token {item.span.token_start}: chunk "
                                f"{item.span.chunk_index} of entry {item.span.entry_id} "
                                f"cannot be decoded ({e})")
                break
            speeds.observe_decode(item.level, k.nbytes + v.nbytes, time.perf_counter() - d0)
            n_read = item.span.token_end
            chunk_levels.append(item.level)
            if progress is not None:
                progress(Progress("restore", min(n_read, len(tokens)), len(tokens)))
    finally:
        reader.stop.set()
        while thread.is_alive():  # unblock a reader waiting on a full queue
            try:
                fetched.get_nowait()
            except queue.Empty:
                thread.join(0.01)
    if reader.crashed:
        raise reader.crashed[0]
    others = [lvl for lvl in chunk_levels if lvl != options.level]
    if options.level != AUTO and others:
        messages.append(f"{len(others)} of {len(chunk_levels)} chunks are not stored at "
                        f"{options.level!r} (or failed their check): read at "
                        f"{', '.join(sorted(set(others)))} instead")
    measured = reader.meter.MBps()
    if measured and not options.bandwidth_MBps:
        speeds.observe_read(source.kind, measured)
    return n_read, reader.meter.bytes
