"""Streaming restore: stored KV chunks back into the model, a level chosen per chunk.

CacheGen's adaptation, on a desktop: the prefix to restore is a chain of stored chunks, each
kept at several codec levels, read from a source (`sources`: the local store, or the remote
tier) by a `reading.ChunkReader`, which plans each chunk's level against the time budget and
keeps reads in flight, while the calling thread verifies and decodes the chunks in order
straight into the state bytes llama.cpp will load (`kvstate.StateBuffer`), so reading and
decoding overlap. A chunk missing or corrupt at one level is read at another; with none left,
or when the source fails, or for a chunk the codec refuses, the stored part ends: from there
everything is recomputed from text, and the caller is told why. Nothing decoded from a bad
chunk ever reaches the model.

A sliding-window (iSWA) model's state is restored where a stored entry ends: its
full-attention layers from the chunks (every position up to there), its sliding-window layers
from that entry's window (`kvcache`), since only a state that ends exactly there holds them. So
the restore reads the chunks up to the last entry end within the tokens asked for, then that
entry's window. A stored chunk that goes on past the tokens asked for (a tail) cannot be cut
back (the window it ends with is not the one wanted): it is not read. If the reading stops
early — a chunk or a window part unreadable at every level, the budget choosing to recompute —
the restore falls back to the latest earlier entry end whose chunks were all decoded, reads
that entry's window, and recomputes from there (with none, from the start).

This module knows the store's and codec's APIs but owns no policy about what gets cached.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

import codec
from store import Span, Store, StoreError

from ..errors import Cancelled
from ..model.kvstate import KVState, SeqState, StateBuffer
from ..model.layout import ModelLayout
from ..model.runtime import PREFILL_SLICE, Runtime
from ..options import AUTO, GenerationOptions, RestoreOptions
from ..results import Progress, RestoreReport
from .exactprefix import exact_part
from .levels import EXACT, Message, level_notes, said
from .reading import TEXT, ChunkReader
from .sources import ChunkSource
from .speeds import Speeds

Views = tuple[np.ndarray, np.ndarray]
FAILED = "recomputing from token "  # what a read that stopped at a chunk says, then where


def warm_up(levels: Sequence[str], shapes: Sequence[tuple[int, int, int]],
            calibration: codec.Calibration | None = None,
            cancel: threading.Event | None = None,
            pause: Callable[[], None] | None = None) -> None:
    """Ready the codec for chunks of `shapes` ([n_layer, chunk tokens, channels]: a model's
    cache sections, in order) at `levels`, calibrated by `calibration` when given.

    The first use of each level and shape costs up to a second: the codec builds its
    per-shape plans and tables. Done in the background when a model loads, the user's first
    attach or restore does not pay for it. `cancel` stops it between levels; `pause()`,
    called before each, returns when the next may run.
    """
    found = None if calibration is None else {calibration.id: calibration}
    for part, shape in enumerate(shapes):
        k = np.random.default_rng(0).standard_normal(shape).astype(np.float16)
        for level in levels:
            if pause is not None:
                pause()
            if cancel is not None and cancel.is_set():
                return
            codec.decode(codec.encode(k, k, level, calibration=calibration, part=part),
                         calibrations=found)


def warm_up_restore(store: Store, levels: Sequence[str],
                    resolver: Callable[[str], codec.Resolver],
                    cancel: threading.Event | None = None) -> None:
    """Decode one stored chunk of the most recently used entry at each of `levels` it has
    (its model's calibrations found by `resolver(fingerprint)`): the kernels and tables a
    restore's first chunks need (per shape and calibration, with rows for the codebook
    entries real chunks name), from what the user is likely to restore next, without encoding
    anything and without the model loaded. `cancel` stops it between levels; an unreadable
    chunk is skipped (a restore will say what is wrong with it)."""
    stored = store.entries()
    heads = {e.parent_id for e in stored if e.passage}  # (the passages': one level)
    entries = [e for e in stored if not e.passage and e.id not in heads]
    if not entries:
        return
    newest = entries[-1]  # least recently used first
    found = resolver(newest.model)
    for level in levels:
        if cancel is not None and cancel.is_set():
            return
        if level in newest.levels:
            try:
                codec.decode(store.read_chunk(newest.id, 0, level), calibrations=found)
            except (StoreError, codec.CodecError):
                continue


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
    calibrations: codec.Resolver | None = None,
    messages: list[Message] | None = None,
) -> RestoreReport:
    """Bring `tokens` into the runtime's context: `source`'s chunks first, then text for the
    rest (`source` covers a prefix of `tokens`; None: recompute them all, the baseline).

    `levels` are the codec levels in quality order (best first); tokens recomputed are
    reported as chunks of `chunk_tokens` named TEXT; `calibrations` finds the codec
    calibration a chunk names (a chunk whose calibration it lacks is refused like a corrupt
    one); `messages`, when given, takes what the report would say, its level notes as data (a
    blend adds its parts' to them). Raises Cancelled.
    """
    t0 = time.perf_counter()
    tokens = list(tokens)
    run = _Restore(runtime, tokens, levels, options, speeds, progress, cancel, t0, calibrations)
    kind = source.kind if source is not None else "local"
    exact_why: list[Message] = []
    if source is not None and options.level == EXACT:  # as --no-cache computes it, bit for bit
        source, exact_why = exact_part(source, tokens, bool(runtime.layout.swa_layers))
    if source is not None and source.n_tokens:
        n_restored = run.windowed(source) if runtime.layout.swa_layers else run.plain(source)
        run.finish(source)
    else:
        n_restored = 0
        runtime.reset()
    if not any(isinstance(m, str) and m.startswith(FAILED) for m in run.messages):
        run.messages[:0] = exact_why  # (a read that stopped before lossless's cut says where)
    rest = tokens[n_restored:]
    r0 = time.perf_counter()  # restoring ends here: recomputing is reported apart
    if rest:
        run.chunk_levels += [TEXT] * -(-len(rest) // max(1, chunk_tokens))
        runtime.prefill(rest, cancel=cancel, progress=None if progress is None else (
            lambda done, total: progress(Progress("recompute", n_restored + done, len(tokens)))))
        if len(rest) >= 64:
            speeds.prefill_tps = len(rest) / (time.perf_counter() - r0)
    if messages is not None:
        messages += run.messages
    return RestoreReport(
        tokens=len(tokens),
        restore_s=r0 - t0,
        recompute_s=time.perf_counter() - r0,
        bytes_read=run.bytes_read,
        chunk_levels=run.chunk_levels,
        recomputed_tokens=len(rest),
        messages=said(run.messages) if messages is None else [],
        source=kind,
        adapted_chunks=run.adapted,
    )


class _Reading:
    """Reading passes over stored chunks: what they decoded, read and had to say."""

    def __init__(self, tokens: list[int], levels: Sequence[str], options: RestoreOptions,
                 speeds: Speeds, progress, cancel, t0: float,
                 calibrations: codec.Resolver | None):
        self.tokens, self.levels = tokens, levels
        self.calibrations = calibrations
        self.options, self.speeds = options, speeds
        self.progress, self.cancel, self.t0 = progress, cancel, t0
        self.chunk_levels: list[str] = []
        self.messages: list[Message] = []
        self.bytes_read = 0
        self.adapted = 0
        self.not_stored = 0  # chunks read at another level as none is stored at the one asked
        self.kept = 0  # the same, of an entry kept at one level by design (`one_level`)
        self.damaged = 0  # the same, of an entry stored at it: the chunk set aside or missing
        self.asked = 0  # the most chunks one pass set out to read (those it did not: recomputed)
        self.measured: list[float] = []

    def _read(self, source: ChunkSource, spans: list[Span], dest: Callable[[Span], Views], *,
              raw: Callable[[Span], int], restart: Callable[[Span], int] | None = None
              ) -> tuple[list[str], tuple[Span, str] | None]:
        """Decode `spans` in order into `dest(span)` as the reader delivers them; (the level
        of each chunk decoded, in order; the chunk where it stopped and why, if it did and
        it is worth saying). Fallbacks to another level are said in `messages`."""
        self.asked = max(self.asked, len(spans))
        # Progress in tokens, as the bytes decoded go: a window's parts come after the chunks
        # but hold positions before their end, so their own positions would run backwards.
        sizes = np.cumsum([raw(s) for s in spans]) if spans else np.zeros(1)
        reach = min(max((s.token_end for s in spans), default=0), len(self.tokens))
        reader = ChunkReader(source, spans, self.tokens, self.levels, self.options,
                             self.speeds, raw_bytes=raw, t0=self.t0, restart=restart)
        fetched = reader.fetched
        thread = threading.Thread(target=reader.run, name="kv-reader", daemon=True)
        thread.start()
        got: list[str] = []
        failed = None
        try:
            while (item := self._next(fetched)) is not None:
                if item.note:
                    self.messages.append(f"chunk {item.span.chunk_index}: {item.note}")
                if item.data is None:
                    failed = (item.span, item.error) if item.error else None
                    break
                d0 = time.perf_counter()
                try:
                    # Straight into the state bytes; the codec refuses a chunk of another shape.
                    k, v = codec.decode(item.data, out=dest(item.span),
                                        calibrations=self.calibrations)
                except codec.CodecError as e:
                    failed = (item.span, f"chunk {item.span.chunk_index} of entry "
                                         f"{item.span.entry_id} cannot be decoded ({e})")
                    break
                self.speeds.observe_decode(item.level, k.nbytes + v.nbytes,
                                           time.perf_counter() - d0)
                got.append(item.level)
                level = self.options.level
                if item.level != level and level not in source.sizes(item.span):
                    if item.span.entry_id in source.one_level:
                        self.kept += 1
                    elif source.damaged(item.span, level):
                        self.damaged += 1
                    else:
                        self.not_stored += 1
                if self.progress is not None:
                    done = round(reach * sizes[len(got) - 1] / max(sizes[-1], 1))
                    self.progress(Progress("restore", int(done), len(self.tokens)))
        finally:
            reader.stop.set()
            while thread.is_alive():  # unblock a reader waiting on a full queue
                try:
                    fetched.get_nowait()
                except queue.Empty:
                    thread.join(0.01)
        if reader.crashed:
            raise reader.crashed[0]
        self.bytes_read += reader.meter.bytes
        self.adapted += reader.adapted
        if (measured := reader.meter.MBps()) is not None:
            self.measured.append(measured)
        return got, failed

    def _next(self, fetched: queue.Queue):
        """The reader's next chunk, or Cancelled as soon as the restore is (a chunk on a slow
        link may take long to come)."""
        while True:
            if self.cancel is not None and self.cancel.is_set():
                raise Cancelled("restore cancelled")
            try:
                return fetched.get(timeout=0.05)
            except queue.Empty:
                pass

    def finish(self, source: ChunkSource) -> None:
        if self.options.level != AUTO:
            self.messages += level_notes(self.options.level, self.chunk_levels,
                                         self.not_stored, self.kept, self.damaged,
                                         shared=source.kind == "remote", chunks=self.asked)
        if self.measured and not self.options.bandwidth_MBps:
            self.speeds.observe_read(source.kind, self.measured[0])


class _Restore(_Reading):
    """One restore's reading passes into the runtime's context."""

    def __init__(self, runtime: Runtime, *args):
        super().__init__(*args)
        self.runtime = runtime

    def plain(self, source: ChunkSource) -> int:
        """Every position of every layer from the chunks; tokens restored."""
        rt, lay = self.runtime, self.runtime.layout
        held = [*self.tokens[:source.n_tokens], *source.beyond]  # what the chunks hold
        state = rt.new_state_buffer(len(held))  # chunks are decoded into it in place
        spans = list(source.spans)
        got, failed = self._read(
            source, spans, _full(state),
            raw=lambda s: (s.token_end - s.token_start) * lay.kv_bytes_per_token)
        self.chunk_levels += got
        if failed is not None:
            self.messages.append(f"{FAILED}{failed[0].token_start}: {failed[1]}")
        n_restored = spans[len(got) - 1].token_end if got else 0
        if n_restored == len(held):
            rt.restore_buffer(state, held)
            rt.truncate(source.n_tokens)  # a tail's tokens past the ones asked for go
            return source.n_tokens
        n_restored = min(n_restored, source.n_tokens)
        if self.options.level == EXACT:  # (computed on from a whole slice: `exactprefix`)
            n_restored -= n_restored % PREFILL_SLICE
        if n_restored:  # the stored part ended early: only its first chunks are usable
            kv = KVState(state.keys[:, :n_restored], state.values[:, :n_restored],
                         np.arange(n_restored, dtype=np.int32), v_trans=lay.v_trans)
            rt.restore(SeqState([kv]), self.tokens[:n_restored])
            return n_restored
        rt.reset()
        return 0

    def windowed(self, source: ChunkSource) -> int:
        """The chunks up to the last entry end with a window, then that window (falling back
        to an earlier entry end if anything on the way fails); tokens restored."""
        rt, lay = self.runtime, self.runtime.layout
        ends = resume_points(source, lay)
        if not ends or ends[0] < source.n_tokens:
            self.messages.append(
                (f"only {ends[0]:,} of the {source.n_tokens:,} tokens" if ends else
                 f"none of the {source.n_tokens:,} tokens")
                + " stored for this context could be reused, since this model picks up a "
                "stored cache only where one was saved; "
                + ("the rest are" if ends else "they are")
                + " computed again, so the answer starts later")
        if not ends:
            rt.reset()
            return 0
        end = ends[0]
        state = rt.new_state_buffer(end)
        spans = [s for s in source.spans if s.token_end <= end]
        parts = list(source.windows[end])
        earlier = dict(zip(ends, [*ends[1:], 0], strict=True))
        got, failed = self._read(
            source, spans + parts, _full(state, _window(state, parts)),
            raw=self._raw_bytes(parts), restart=lambda s: earlier[end] if s in parts else
            s.token_start)
        if failed is None and len(got) == len(spans) + len(parts):
            self.chunk_levels += got
            rt.restore_buffer(state, self.tokens[:end])
            return end
        decoded = spans[len(got) - 1].token_end if got and len(got) <= len(spans) else (
            end if got else 0)
        if failed is not None:
            what = "its window" if failed[0] in parts else f"the chunk at token " \
                f"{failed[0].token_start:,}"
            self.messages.append(f"the entry ending at token {end:,} cannot be restored "
                                 f"({what}: {failed[1]})")
        for back in ends[1:]:
            if back <= decoded and (n := self._fall_back(source, state, back, spans, got)):
                return n
        rt.reset()
        return 0

    def _fall_back(self, source: ChunkSource, state: StateBuffer, end: int,
                   spans: list[Span], got: list[str]) -> int:
        """Restore at an earlier entry end: the chunks already decoded, its window read now."""
        fresh = self.runtime.new_state_buffer(end, fresh=True)
        fresh.keys[...] = state.keys[:, :end]
        fresh.values[...] = state.values[:, :end]
        parts = list(source.windows[end])
        window, failed = self._read(source, parts, _window(fresh, parts),
                                    raw=self._raw_bytes(parts))
        if failed is not None or len(window) < len(parts):
            return 0
        self.chunk_levels += got[:sum(s.token_end <= end for s in spans)] + window
        self.messages.append(f"restored up to token {end:,}, where an earlier entry ends with "
                             "its window; recomputing from there")
        self.runtime.restore_buffer(fresh, self.tokens[:end])
        return end

    def _raw_bytes(self, parts: Sequence[Span]) -> Callable[[Span], int]:
        lay = self.runtime.layout
        return lambda s: (s.token_end - s.token_start) * (
            lay.window_bytes_per_token if s in parts else lay.kv_bytes_per_token)


def read_chunks(source: ChunkSource, tokens: Sequence[int], keys: np.ndarray,
                values: np.ndarray, *, levels: Sequence[str], options: RestoreOptions,
                speeds: Speeds, bytes_per_token: int, cancel=None,
                calibrations: codec.Resolver | None = None,
                chunk_levels: list[str], messages: list[Message]) -> tuple[int, int]:
    """Decode `source`'s chunks in order into keys and values ([n_layer, tokens, channels]
    arrays or views, indexed by the chunks' own token positions) as the reader delivers them.

    Returns (the end of the run of chunks decoded from the first one, bytes read): a missing,
    corrupt or undecodable chunk ends the run (said in `messages`). Appends each chunk's level.
    """
    run = _Reading(list(tokens), levels, options, speeds, None, cancel, time.perf_counter(),
                   calibrations)
    spans = list(source.spans)
    got, failed = run._read(
        source, spans, lambda s: (keys[:, s.token_start:s.token_end],
                                  values[:, s.token_start:s.token_end]),
        raw=lambda s: (s.token_end - s.token_start) * bytes_per_token)
    if failed is not None:
        run.messages.append(f"{FAILED}{failed[0].token_start}: {failed[1]}")
    run.chunk_levels += got
    run.finish(source)
    chunk_levels += run.chunk_levels
    messages += run.messages
    return (spans[len(got) - 1].token_end if got else 0), run.bytes_read


def resume_points(source: ChunkSource, layout: ModelLayout) -> list[int]:
    """Where a sliding-window model's restore from `source` can end, last first: the ends of
    the entries covered whose window is stored whole."""
    return sorted((end for end, parts in source.windows.items()
                   if end <= source.n_tokens and _covers(parts, layout.window_start(end), end)),
                  reverse=True)


def _covers(parts: Sequence[Span], start: int, end: int) -> bool:
    """Whether window parts hold exactly the positions [start, end), in order."""
    bounds = [start] + [p.token_end for p in parts]
    return bool(parts) and parts[0].token_start == start and bounds[-1] == end and all(
        p.token_start == b for p, b in zip(parts, bounds, strict=False))


def _window(state: StateBuffer, parts: Sequence[Span]) -> Callable[[Span], Views | None]:
    """Where each window part decodes: its positions in the state's sliding-window section."""
    chosen = set(parts)
    start = int(state.window_positions[0])

    def dest(span: Span) -> Views | None:
        if span not in chosen:
            return None
        a, b = span.token_start - start, span.token_end - start
        return state.window_keys[:, a:b], state.window_values[:, a:b]

    return dest


def _full(state: StateBuffer,
          window: Callable[[Span], Views | None] | None = None) -> Callable[[Span], Views]:
    """Where each chunk decodes: its window part's place, else its tokens' in the first
    section."""
    def dest(span: Span) -> Views:
        if window is not None and (views := window(span)) is not None:
            return views
        return state.keys[:, span.token_start:span.token_end], \
            state.values[:, span.token_start:span.token_end]

    return dest


def adaptation_note(report: RestoreReport, sampling: GenerationOptions) -> list[str]:
    """What a user who asked for one answer every time (temperature 0, or a seed) must know
    when "auto" read chunks below their best stored level: the plan follows this machine's
    speed at that moment, so another run may read other levels and answer otherwise. A
    fixed level reads the same bytes every time (if they stay sound), hence one answer."""
    if not report.adapted_chunks or not (sampling.temperature == 0 or
                                         sampling.seed is not None):
        return []
    return [f"{report.adapted_chunks} chunk(s) were read below their best stored level to fit "
            "the time budget at this machine's speed right now: at the level auto the same "
            "request can answer differently another time; a fixed level (e.g. high: --level, "
            "the local API's kvdesk.level, the window's quality slider) gives one answer "
            "for a given seed or temperature 0"]
