"""The model runtime: one llama.cpp model and context, driven token by token.

`Runtime` wraps `llama_cpp.Llama` for what kvdesk needs and nothing else: tokenize and render
the model's chat template, prefill in batches with a progress callback and cancellation,
stream generated tokens through llama.cpp's sampler chain, and capture or restore the exact KV
cache of the one sequence it holds (through `kvstate`). It owns the agreement between
llama.cpp's cache and the Llama object's own token bookkeeping, so that a restored context
continues exactly as a freshly prefilled one would.

It must never touch files other than the model, the store, the codec or any GUI: callers
decide what to cache and where.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from ..errors import Cancelled, RuntimeStateError
from ..options import GenerationOptions
from . import chat_templates, gguf_header, kvstate, layout, llamacalls, llamalog, sampling

# Prefill slice: small enough that progress and cancellation react within about a second on
# two cores (~144 tokens/s), large enough to keep llama.cpp's batched matmuls efficient.
PREFILL_SLICE = 128

# The slot alignment of a restored sliding-window section (llama.cpp pads caches to 256 cells).
WINDOW_ALIGN = 256

# Cache types (llama_cpp GGML_TYPE_* ids): f16 and f32 are what the exact bridge represents;
# q8_0 and q4_0 (flash attention only) are for measuring against, their states refused.
CACHE_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32,
               "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
# Rows of logits turned into log-probabilities at a time (Gemma's vocabulary: 262,144 wide).
SCORE_ROWS = 16

ProgressFn = Callable[[int, int], None]  # (tokens done, tokens total)

@dataclass(frozen=True)
class Token:
    """One generated token and the text it completes (possibly empty mid-UTF-8)."""

    id: int
    text: str


class Runtime:
    """A loaded model with one context holding one sequence (seq_id 0; `inplace` computes
    tokens in a second one, gone when it returns)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        model_hash: str,
        n_ctx: int,
        flash_attn: bool = False,
        cache_type: str = "f16",
        n_threads: int | None = None,
        logits_all: bool = False,
    ):
        # llama-cpp-python defaults to half the cores for generation; a desktop app answering
        # one user wants all of them (single-token decode: ~19 ms with 2 threads vs ~32 with 1).
        n_threads = n_threads or os.cpu_count() or 1
        if cache_type not in CACHE_TYPES:
            raise ValueError(f"cache type {cache_type!r}: expected one of {sorted(CACHE_TYPES)}")
        self.model_path = Path(model_path)
        self._lock = threading.RLock()
        try:
            with llamalog.loading():
                self.llm = llama_cpp.Llama(
                    model_path=str(self.model_path),
                    n_ctx=n_ctx,
                    n_batch=512,
                    n_threads=n_threads,
                    flash_attn=flash_attn,
                    type_k=CACHE_TYPES[cache_type],
                    type_v=CACHE_TYPES[cache_type],
                    logits_all=logits_all,
                    # A sliding-window cache of the window, not of n_ctx cells: the point of
                    # such models, and a restore sets only the window (RESULTS.md, Gemma 3).
                    swa_full=False,
                    verbose=True,  # quiet through llamalog: nothing else is silenced
                )
        except (ValueError, RuntimeError) as e:
            raise RuntimeStateError(gguf_header.load_failure(self.model_path, e)) from e
        self.llm.verbose, self._vocab = False, self.llm._model.vocab  # later calls print nothing
        self.pieces_exact = llamacalls.splits_exactly(self.llm)  # (`tokenize` a piece at a time)
        try:
            self.layout = layout.probe(self, model_hash, cache_type, flash_attn)
        except BaseException:
            self.llm.close()
            raise
        self._spare: np.ndarray | None = None  # the last state buffer, reused when it fits
        # The first position whose sliding-window KV the context really holds (a restore sets
        # the window only; positions before it are absent or placeholders).
        self._window_floor = 0
        # The token count after the last evaluation, while the logits it left belong to the
        # sequence's last token (None once a reset, restore or truncation makes them stale).
        self._logits_at: int | None = None
        self.chat_template = chat_templates.ChatTemplate.of(self.llm, adds_bos=self.adds_bos)
        # What the model file recommends (general.sampling.*), and what in it is unusable.
        self.model_sampling, self.model_sampling_notes = sampling.from_model(self.llm.metadata)

    # -- facts ---------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        # llama.cpp pads the context (to a multiple of 256); the Llama object's token buffer
        # keeps the requested size, and that is the real limit.
        return min(self.llm.n_ctx(), len(self.llm.input_ids))

    @property
    def fingerprint(self) -> str:
        return self.layout.fingerprint

    @property
    def n_tokens(self) -> int:
        return self.llm.n_tokens

    @property
    def tokens(self) -> list[int]:
        return self.llm.input_ids[: self.llm.n_tokens].tolist()

    # -- text ----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        return llamacalls.tokenize(self.llm, text, add_bos, special, self.pieces_exact)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(llamacalls.piece(self.llm, t) for t in tokens).decode("utf-8", "replace")

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    @property
    def fim_tokens(self) -> tuple[int, int, int] | None:
        """The model's fill-in-the-middle tokens (prefix, suffix, middle), if it has them."""
        v = self._vocab
        ids = (llama_cpp.llama_vocab_fim_pre(v), llama_cpp.llama_vocab_fim_suf(v),
               llama_cpp.llama_vocab_fim_mid(v))
        return ids if min(ids) >= 0 else None

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
        """The chat template applied to `messages` ({"role", "content"} dicts); ending with
        system messages, up to where the next user turn's text begins."""
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    # -- evaluation ----------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every token: an empty cache and empty bookkeeping."""
        with self._lock:
            self.llm.reset()
            self._logits_at = None
            self._window_floor = 0
            # Metadata only: zeroing the whole cache's data (~190 MB at n_ctx 8192) costs
            # ~25 ms per restore and nothing reads cells that are not in use.
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm._ctx.ctx), False)

    def can_truncate(self, n: int) -> bool:
        """Whether the context can be cut back to its first n tokens and continue exactly.

        Always, with a plain cache. A sliding-window section keeps only the positions the
        latest tokens attend to (a restore sets just the window): cutting back is possible
        while it still holds every position the token after the first n would attend to.
        """
        if not self.layout.swa_layers or n >= self.llm.n_tokens:
            return True
        held = llama_cpp.llama_memory_seq_pos_min(llama_cpp.llama_get_memory(self.llm._ctx.ctx), 0)
        return 0 <= max(held, self._window_floor) <= self.layout.window_start(n + 1)

    def truncate(self, n: int) -> None:
        """Keep only the first n tokens of the sequence (`can_truncate` says whether)."""
        with self._lock:
            if not 0 <= n <= self.llm.n_tokens:
                raise ValueError(f"cannot truncate {self.llm.n_tokens} tokens to {n}")
            if not self.can_truncate(n):
                raise RuntimeStateError(
                    f"cannot cut {self.llm.n_tokens} tokens back to {n}: the sliding-window "
                    "cache no longer holds the positions they would attend to")
            if n < self.llm.n_tokens:
                self.llm._ctx.kv_cache_seq_rm(0, n, -1)
                self._logits_at = None
            self.llm.n_tokens = n

    @property
    def has_logits(self) -> bool:
        """Whether the next-token logits after the sequence's last token are at hand."""
        return self.llm.n_tokens > 0 and self._logits_at == self.llm.n_tokens

    def _eval(self, tokens: Sequence[int], *, logits: bool = True) -> None:
        if logits:
            self.llm.eval(tokens)
        else:
            llamacalls.kv_only(self.llm, tokens)
        self._logits_at = self.llm.n_tokens if logits else None

    def prefill(
        self,
        tokens: Sequence[int],
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        logits: bool = True,
    ) -> None:
        """Evaluate `tokens` after what the context holds, slice by slice; `logits` False
        when only their KV is wanted (then no next-token logits are left: `ensure_logits`).

        On cancellation the context keeps the slices already evaluated (callers that must not
        keep a partial prefix truncate back) and `Cancelled` is raised.
        """
        tokens = list(tokens)
        with self._lock:
            if self.llm.n_tokens + len(tokens) > self.n_ctx:
                raise RuntimeStateError(f"{self.llm.n_tokens} + {len(tokens)} tokens do not "
                                        f"fit the context of {self.n_ctx}")
            done = 0
            for start in range(0, len(tokens), PREFILL_SLICE):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(f"stopped after {done} of {len(tokens)} tokens")
                piece = tokens[start : start + PREFILL_SLICE]
                self._eval(piece, logits=logits)
                done += len(piece)
                if progress is not None:
                    progress(done, len(tokens))

    def ensure_logits(self) -> None:
        """Make the last token's logits available (a restore brings KV, not logits)."""
        with self._lock:
            n = self.llm.n_tokens
            if n == 0:
                raise RuntimeStateError("no tokens to continue from")
            if self.has_logits:
                return
            last = int(self.llm.input_ids[n - 1])
            self.truncate(n - 1)
            self._eval([last])

    def logits(self) -> np.ndarray:
        """A copy of the next-token logits after the last evaluated token."""
        ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),)).copy()

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        """Evaluate `tokens` after what the context holds, keeping every position's logits:
        log-probabilities float32 [len(tokens), n_vocab] of the token after each of them
        (teacher forcing). The tokens join the sequence."""
        tokens = list(tokens)
        n_vocab = self.llm.n_vocab()
        out = np.empty((len(tokens), n_vocab), np.float32)
        with self._lock:
            if self.llm.n_tokens + len(tokens) > self.n_ctx:
                raise RuntimeStateError(f"{len(tokens)} more tokens do not fit the context")
            for start, n in llamacalls.decode(self.llm, tokens, logits=True):
                ptr = llama_cpp.llama_get_logits(self.llm._ctx.ctx)
                logits = np.ctypeslib.as_array(ptr, shape=(n, n_vocab))
                for i in range(0, n, SCORE_ROWS):
                    x = logits[i : i + SCORE_ROWS]
                    x = x - x.max(1, keepdims=True)
                    x -= np.log(np.exp(x).sum(1, keepdims=True))
                    out[start + i : start + i + len(x)] = x
            self._logits_at = self.llm.n_tokens
        return out

    def is_end_of_generation(self, token: int, *, chat: bool = True) -> bool:
        """End of generation; in a chat, also where its template ends an answer (a line)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token)) or chat and \
            self.chat_template.ends_answer(llamacalls.piece(self.llm, token)
                                           .decode("utf-8", errors="replace"))

    def generate(
        self,
        max_tokens: int,
        *,
        options: GenerationOptions = GenerationOptions(),
        cancel: threading.Event | None = None,
        chat: bool = True,
        grammar: str | None = None,
    ) -> Iterator[Token]:
        """Stream tokens continuing the sequence until end-of-generation, max_tokens or cancel;
        in a `chat` (not a prompt as it is), also where its template ends a begun answer.

        `options` are run as they are: a stage whose field is None is off (greedy without
        penalties by default); the engine resolves the layers of defaults first. The context
        must end with freshly evaluated logits (after `prefill` of at least one token, or
        `ensure_logits`). Generated tokens join the sequence, except the final
        end-of-generation token, which is sampled but not evaluated.
        """
        sampler = llamacalls.chain(options, self.llm, self.n_ctx, grammar)  # (GBNF: AnswerFormat)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = None  # sampled and yielded, not yet evaluated
        said = False  # any text yet: a plain template's line break before it ends nothing
        try:
            with self._lock:
                for _ in range(max_tokens):
                    if pending is not None:
                        self._eval([pending])
                        pending = None
                    if cancel is not None and cancel.is_set():
                        return
                    if self.llm.n_tokens >= self.n_ctx:
                        raise RuntimeStateError(f"the context of {self.n_ctx} tokens is full")
                    tok = sampler.sample(self.llm._ctx, -1)
                    if self.is_end_of_generation(tok, chat=chat and said):
                        return
                    piece = llamacalls.piece(self.llm, tok)
                    # The token reaches the caller before it is evaluated: the first token's
                    # latency is one decode shorter. It is evaluated before the next sample,
                    # or when the caller stops iterating, so every yielded token is in context.
                    pending = tok
                    text = decoder.decode(piece)
                    yield Token(tok, text)
                    said = said or bool(text.strip())
        finally:
            if pending is not None:
                with self._lock:
                    self._eval([pending])
            sampler.close()

    # -- KV state ------------------------------------------------------------------------

    def state_bytes(self, flags: int = 0) -> bytes:
        """llama.cpp's exact per-sequence state of the context's sequence (flags 1: only
        the sliding-window section of an iSWA cache)."""
        with self._lock:
            ctx = self.llm._ctx.ctx
            size = llama_cpp.llama_state_seq_get_size_ext(ctx, 0, flags)
            buf = (ctypes.c_uint8 * size)()
            written = llama_cpp.llama_state_seq_get_data_ext(ctx, buf, size, 0, flags)
            if written != size:
                raise RuntimeStateError(f"llama.cpp wrote {written} of {size} state bytes")
            return bytes(buf)

    def capture(self) -> kvstate.SeqState:
        """The sequence's KV cache as numpy arrays: one section, or an iSWA cache's two (the
        full-attention layers', then the window of the sliding-window layers')."""
        return kvstate.parse_seq_sections(self.state_bytes())

    def capture_window(self) -> kvstate.KVState:
        """Only the sliding-window section (a few MB, however long the sequence)."""
        if not self.layout.swa_layers:
            raise RuntimeStateError("this model's cache has no sliding-window section")
        return kvstate.parse_seq_state(self.state_bytes(llama_cpp.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY))

    def restore_bytes(self, data: bytes, tokens: Sequence[int]) -> None:
        """Replace the context's sequence with state bytes and the tokens they were made from
        (one cache section, or the two of a sliding-window model).

        The bytes are parsed and checked against this model's layout first: llama.cpp itself
        would load any state of the right shapes, from whatever model it came. A quantized
        cache's state (q8_0, q4_0: the bridge cannot parse it) is only llama.cpp's to check:
        give such a runtime back only states it wrote itself.
        """
        if self.layout.cache_type in layout.BRIDGED:
            seq = kvstate.parse_seq_sections(data)
            self.layout.check_fits([kv.keys.shape for kv in seq.sections],
                                   seq.sections[0].dtype, seq.sections[0].v_trans, len(tokens))
        self._set_state(data, tokens)

    def restore(self, seq: kvstate.SeqState, tokens: Sequence[int]) -> None:
        """Load a KV cache (e.g. decoded from the codec) for `tokens` into the context: its
        sections in position order, the window's ending with the last token."""
        # Any V layout: the buffer is laid out for this context.
        self.layout.check_fits([kv.keys.shape for kv in seq.sections], seq.sections[0].dtype,
                               None, len(tokens))
        buf = self.new_state_buffer(len(tokens))
        buf.keys[...] = seq.sections[0].keys
        buf.values[...] = seq.sections[0].values
        if buf.window_keys is not None:
            window = seq.sections[1].n_tokens
            buf.window_keys[:, buf.window_keys.shape[1] - window:] = seq.sections[1].keys
            buf.window_values[:, buf.window_values.shape[1] - window:] = seq.sections[1].values
        self.restore_buffer(buf, tokens)

    @property
    def cache_dtype(self) -> np.dtype:
        return self.layout.dtype

    def new_state_buffer(self, n_tokens: int, *, fresh: bool = False) -> kvstate.StateBuffer:
        """A state of n_tokens for this model, to fill in place and `restore_buffer`: every
        position of the full-attention layers, and for an iSWA model the window of the
        sliding-window layers (positions window_start(n_tokens) to n_tokens - 1; fill
        `window_keys[:, -window:]`, after the placeholders `window_positions` starts with).

        Its bytes may be those of the previous buffer of the same size (llama.cpp copies a
        state in when it is set), so fill every token before restoring it; `fresh`: never
        (the previous buffer is still being read).
        """
        lay = self.layout
        window = None
        if lay.swa_layers and n_tokens:
            start = lay.window_start(n_tokens)
            # Placeholder cells (zero KV, positions the window masks) put each window cell in
            # the slot of the same residue modulo WINDOW_ALIGN as a plain prefill gives it:
            # llama.cpp's kernels sum a cell's terms in a lane fixed by its slot, so the
            # restored window attends bit for bit as the prefilled one did.
            pad = min(start, start % WINDOW_ALIGN)
            window = (lay.swa_layers, np.arange(start - pad, n_tokens))
        buf = kvstate.StateBuffer(lay.full_layers, n_tokens, lay.channels, self.cache_dtype,
                                  v_trans=lay.v_trans, reuse=None if fresh else self._spare,
                                  window=window)
        if window is not None:
            buf.window_keys[:, :pad] = 0
            buf.window_values[:, :pad] = 0
        self._spare = buf.data
        return buf

    def restore_buffer(self, buf: kvstate.StateBuffer, tokens: Sequence[int]) -> None:
        """Load a filled StateBuffer without copying it."""
        n = len(tokens)
        shapes = [buf.keys.shape]
        if buf.window_keys is not None:  # besides placeholders, it must hold the window
            pos, start = buf.window_positions, self.layout.window_start(n)
            held = n - start if pos[-1] == n - 1 and pos[0] <= start else len(pos)
            shapes.append((buf.window_keys.shape[0], held, buf.window_keys.shape[2]))
        self.layout.check_fits(shapes, buf.keys.dtype, buf.v_trans, n)
        self._set_state(buf.data, tokens)
        self._window_floor = self.layout.window_start(n)

    def _set_state(self, data: bytes | np.ndarray, tokens: Sequence[int]) -> None:
        tokens = list(tokens)
        if len(tokens) > self.n_ctx:
            raise RuntimeStateError(f"{len(tokens)} tokens do not fit the context of {self.n_ctx}")
        with self._lock:
            self.reset()
            if isinstance(data, np.ndarray):
                buf = (ctypes.c_uint8 * len(data)).from_buffer(data)  # no copy
            else:
                buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            read = llama_cpp.llama_state_seq_set_data(self.llm._ctx.ctx, buf, len(data), 0)
            if read != len(data):
                self.reset()
                raise RuntimeStateError(
                    "llama.cpp refused the KV state (layout or size does not match this context)"
                )
            self.llm.input_ids[: len(tokens)] = tokens
            self.llm.n_tokens = len(tokens)

    def close(self) -> None:
        self.llm.close()
