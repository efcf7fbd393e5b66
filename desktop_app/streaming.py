"""Streaming restore: stored KV chunks back into the model, a level chosen per chunk.

CacheGen's adaptation, on a desktop: the prefix to restore is a chain of stored chunks, each
kept at several codec levels. A reader thread fetches chunk after chunk (optionally throttled
to a declared bandwidth, to stand for a slow disk, a network share or a remote store) while the
calling thread verifies and decodes the previous one into the assembled KV arrays, so reading
and decoding overlap. For every chunk the reader picks the best-quality level whose expected
cost — bytes over the bandwidth measured on earlier chunks (or declared), plus bytes of output
over the decode speed measured so far — fits the share of the time budget left to it. If no
level fits, the cheapest wins, unless recomputing the rest from text would be cheaper still.

A missing or corrupt chunk, or a chunk the codec refuses, ends the stored part: everything
from that chunk on is recomputed from text, and the caller is told why. Nothing decoded from a
bad chunk ever reaches the model.

This module knows the store's and codec's APIs but owns no policy about what gets cached.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

import codec
from store import Span, Store, StoreError

from .kvstate import KVState
from .results import Progress, RestoreReport
from .runtime import Cancelled, Runtime

TEXT = "text"  # the chunk_levels name of a chunk recomputed from its tokens

# Priors until the first measurement of a session (the engine keeps measured values).
DEFAULT_DECODE_MBPS = 1000.0  # fp16 output per second
DEFAULT_READ_MBPS = 2000.0  # a local SSD with a warm page cache
DEFAULT_PREFILL_TPS = 140.0  # tokens per second: the default model on 2 cores


@dataclass
class Speeds:
    """Measured speeds, updated as chunks stream; persisted by the engine between runs."""

    decode_MBps: dict[str, float] = field(default_factory=dict)  # per level, fp16 output MB/s
    read_MBps: float = DEFAULT_READ_MBPS
    prefill_tps: float = DEFAULT_PREFILL_TPS

    def decode(self, level: str) -> float:
        return self.decode_MBps.get(level, DEFAULT_DECODE_MBPS)

    def observe_decode(self, level: str, out_bytes: int, seconds: float) -> None:
        if seconds > 0:
            now = out_bytes / 1e6 / seconds
            old = self.decode_MBps.get(level)
            self.decode_MBps[level] = now if old is None else 0.5 * old + 0.5 * now


@dataclass(frozen=True)
class Options:
    level: str = "auto"  # "auto" or a codec level name to force
    budget_ms: float | None = None  # for the whole restore; None: best quality stored
    bandwidth_MBps: float | None = None  # declared (and enforced) read bandwidth


@dataclass(frozen=True)
class Choice:
    level: str  # a codec level, or TEXT: recompute this chunk and all after it


class Throttle:
    """Paces reads to `MBps` on average, as a slow link would."""

    def __init__(self, MBps: float | None):
        self.rate = MBps * 1e6 if MBps else None
        self.start = time.perf_counter()
        self.sent = 0

    def wait(self, nbytes: int) -> None:
        if self.rate is None:
            return
        self.sent += nbytes
        delay = self.start + self.sent / self.rate - time.perf_counter()
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
    error: str | None = None


def restore(
    runtime: Runtime,
    store: Store,
    fingerprint: str,
    tokens: Sequence[int],
    *,
    levels: Sequence[str],
    options: Options,
    speeds: Speeds,
    progress: Callable[[Progress], None] | None = None,
    cancel: threading.Event | None = None,
) -> RestoreReport:
    """Bring `tokens` into the runtime's context: stored chunks first, then text for the rest.

    `levels` are the codec levels in quality order (best first). Raises runtime.Cancelled.
    """
    t0 = time.perf_counter()
    tokens = list(tokens)
    messages: list[str] = []
    match = store.longest_prefix(fingerprint, tokens)
    spans = list(match.spans)
    if options.level != "auto":
        levels = [options.level]
    sizes = store.chunk_sizes({s.entry_id for s in spans})
    lay = runtime.layout
    bytes_per_token = lay.kv_bytes_per_token

    state = runtime.new_state_buffer(match.n_tokens)  # chunks are decoded into it in place
    fetched: queue.Queue[_Fetched | None] = queue.Queue(maxsize=3)
    stop = threading.Event()
    io = {"read_bytes": 0, "read_s": 0.0}
    crashed: list[BaseException] = []
    declared = options.bandwidth_MBps
    budget_s = options.budget_ms / 1000 if options.budget_ms is not None else None

    def reader() -> None:
        throttle = Throttle(declared)
        try:
            for i, span in enumerate(spans):
                if stop.is_set():
                    return
                n_tok = span.token_end - span.token_start
                chunk_sizes = {lvl: sizes[(span.entry_id, span.chunk_index, lvl)]
                               for lvl in levels
                               if (span.entry_id, span.chunk_index, lvl) in sizes}
                measured = (io["read_bytes"] / 1e6 / io["read_s"]
                            if io["read_s"] > 0 else speeds.read_MBps)
                elapsed = time.perf_counter() - t0
                choice = choose_level(
                    levels=levels, sizes=chunk_sizes, raw_bytes=n_tok * bytes_per_token,
                    remaining_tokens=len(tokens) - span.token_start,
                    remaining_chunks=len(spans) - i,
                    time_left_s=None if budget_s is None else budget_s - elapsed,
                    read_MBps=declared or measured, speeds=speeds,
                )
                if choice.level == TEXT:
                    fetched.put(_Fetched(span, TEXT, None,
                                         None if chunk_sizes else
                                         f"chunk {i} is stored at none of {list(levels)}"))
                    return
                r0 = time.perf_counter()
                try:
                    data = store.read_chunk(span.entry_id, span.chunk_index, choice.level)
                except StoreError as e:  # corrupt, evicted meanwhile, unreadable...
                    fetched.put(_Fetched(span, choice.level, None, str(e)))
                    return
                throttle.wait(len(data))
                io["read_s"] += time.perf_counter() - r0
                io["read_bytes"] += len(data)
                fetched.put(_Fetched(span, choice.level, data))
        except BaseException as e:  # a bug: handed to the restoring thread, never swallowed
            crashed.append(e)
        finally:
            fetched.put(None)

    thread = threading.Thread(target=reader, name="kv-reader", daemon=True)
    thread.start()
    chunk_levels: list[str] = []
    n_restored = 0
    try:
        while (item := fetched.get()) is not None:
            if cancel is not None and cancel.is_set():
                raise Cancelled("restore cancelled")
            if item.data is None:
                if item.error:
                    messages.append(f"recomputing from token {item.span.token_start}: "
                                    f"{item.error}")
                break
            d0 = time.perf_counter()
            t0_, t1_ = item.span.token_start, item.span.token_end
            try:
                # Straight into the state bytes; the codec refuses a chunk of another shape.
                k, v = codec.decode(item.data, out=(state.keys[:, t0_:t1_],
                                                    state.values[:, t0_:t1_]))
            except codec.CodecError as e:
                messages.append(f"recomputing from token {item.span.token_start}: chunk "
                                f"{item.span.chunk_index} of entry {item.span.entry_id} "
                                f"cannot be decoded ({e})")
                break
            speeds.observe_decode(item.level, k.nbytes + v.nbytes, time.perf_counter() - d0)
            n_restored = item.span.token_end
            chunk_levels.append(item.level)
            if progress is not None:
                progress(Progress("restore", n_restored, len(tokens)))
    finally:
        stop.set()
        while thread.is_alive():  # unblock a reader waiting on a full queue
            try:
                fetched.get_nowait()
            except queue.Empty:
                thread.join(0.01)
    if crashed:
        raise crashed[0]
    if io["read_s"] > 0 and not declared:
        speeds.read_MBps = io["read_bytes"] / 1e6 / io["read_s"]

    if n_restored == match.n_tokens and n_restored:
        runtime.restore_buffer(state, tokens[:n_restored])
    elif n_restored:  # the stored part ended early: only its first chunks are usable
        kv = KVState(state.keys[:, :n_restored], state.values[:, :n_restored],
                     np.arange(n_restored, dtype=np.int32), v_trans=lay.v_trans)
        runtime.restore(kv, tokens[:n_restored])
    else:
        runtime.reset()
    rest = tokens[n_restored:]
    if rest:
        # Chunks not restored are recomputed, reported per stored chunk size (or 256).
        chunk = spans[0].token_end - spans[0].token_start if spans else 256
        chunk_levels += [TEXT] * -(-len(rest) // max(1, chunk))
        r0 = time.perf_counter()
        runtime.prefill(rest, cancel=cancel, progress=None if progress is None else (
            lambda done, total: progress(Progress("recompute", n_restored + done, len(tokens)))))
        if len(rest) >= 64:
            speeds.prefill_tps = len(rest) / (time.perf_counter() - r0)
    return RestoreReport(
        tokens=len(tokens),
        restore_s=time.perf_counter() - t0,
        bytes_read=io["read_bytes"],
        chunk_levels=chunk_levels,
        recomputed_tokens=len(rest),
        messages=messages,
    )
