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
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import _internals
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from . import kvstate, sampling
from .errors import Cancelled, RuntimeStateError
from .options import GenerationOptions

# Prefill slice: small enough that progress and cancellation react within about a second on
# two cores (~144 tokens/s), large enough to keep llama.cpp's batched matmuls efficient.
PREFILL_SLICE = 128

# Cache types (llama_cpp GGML_TYPE_* ids): f16 and f32 are what the exact bridge represents
# (capture, restore); llama.cpp's quantized q8_0 and q4_0 (flash attention only) are for
# measuring against (quality.py): their states are refused by kvstate.
CACHE_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32,
               "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
# Rows of logits turned into log-probabilities at a time (Gemma's vocabulary: 262,144 wide).
SCORE_ROWS = 16

ProgressFn = Callable[[int, int], None]  # (tokens done, tokens total)


@dataclass(frozen=True)
class ModelLayout:
    """The facts a KV cache depends on. Caches are only reused under an equal fingerprint."""

    model_hash: str
    n_layer: int
    n_head_kv: int
    head_dim: int
    cache_type: str
    v_trans: bool
    llama_cpp_version: str

    @property
    def channels(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        itemsize = 2 if self.cache_type == "f16" else 4
        return self.n_layer * 2 * self.channels * itemsize

    @property
    def fingerprint(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Token:
    """One generated token and the text it completes (possibly empty mid-UTF-8)."""

    id: int
    text: str


class Runtime:
    """A loaded model with one context holding one sequence (seq_id 0)."""

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
            self.llm = llama_cpp.Llama(
                model_path=str(self.model_path),
                n_ctx=n_ctx,
                n_batch=512,
                n_threads=n_threads,
                flash_attn=flash_attn,
                type_k=CACHE_TYPES[cache_type],
                type_v=CACHE_TYPES[cache_type],
                logits_all=logits_all,
                verbose=False,
            )
        except (ValueError, RuntimeError) as e:
            raise RuntimeStateError(f"could not load {self.model_path}: {e}") from e
        model = self.llm._model.model
        n_head = llama_cpp.llama_model_n_head(model)
        arch = self.llm.metadata.get("general.architecture", "")
        head_dim = int(self.llm.metadata.get(f"{arch}.attention.key_length", 0)) or (
            llama_cpp.llama_model_n_embd(model) // n_head
        )
        self.layout = ModelLayout(
            model_hash=model_hash,
            n_layer=llama_cpp.llama_model_n_layer(model),
            n_head_kv=llama_cpp.llama_model_n_head_kv(model),
            head_dim=head_dim,
            cache_type=cache_type,
            # llama.cpp keeps V transposed exactly when flash attention is off.
            v_trans=not flash_attn,
            llama_cpp_version=llama_cpp.__version__,
        )
        self._vocab = self.llm._model.vocab
        self._spare: bytearray | None = None  # the last state buffer, reused when it fits
        # The token count after the last evaluation, while the logits it left belong to the
        # sequence's last token (None once a reset, restore or truncation makes them stale).
        self._logits_at: int | None = None
        self._formatter = self._chat_formatter()
        self._template_lock = threading.Lock()
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
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.llm.detokenize(list(tokens)).decode("utf-8", errors="replace")

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def _chat_formatter(self) -> Jinja2ChatFormatter:
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            # ChatML: what most small instruct models (SmolLM2 included) were tuned on.
            template = (
                "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}"
            )

        def piece(tok: int) -> str:
            return self.llm._model.token_get_text(tok) if tok >= 0 else ""

        return Jinja2ChatFormatter(
            template,
            eos_token=piece(self.llm.token_eos()),
            bos_token=piece(self.llm.token_bos()),
        )

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
        """The chat template applied to `messages` ({"role", "content"} dicts)."""
        with self._template_lock:  # the formatter holds the flag: one rendering at a time
            self._formatter.add_generation_prompt = add_generation_prompt
            return self._formatter(messages=list(messages)).prompt

    # -- evaluation ----------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every token: an empty cache and empty bookkeeping."""
        with self._lock:
            self.llm.reset()
            self._logits_at = None
            # Metadata only: zeroing the whole cache's data (~190 MB at n_ctx 8192) costs
            # ~25 ms per restore and nothing reads cells that are not in use.
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm._ctx.ctx), False)

    def truncate(self, n: int) -> None:
        """Keep only the first n tokens of the sequence."""
        with self._lock:
            if not 0 <= n <= self.llm.n_tokens:
                raise ValueError(f"cannot truncate {self.llm.n_tokens} tokens to {n}")
            if n < self.llm.n_tokens:
                self.llm._ctx.kv_cache_seq_rm(0, n, -1)
                self._logits_at = None
            self.llm.n_tokens = n

    @property
    def sliding_window(self) -> int:
        """The attention window of the model's sliding-window layers (0: none)."""
        return int(llama_cpp.llama_model_n_swa(self.llm._model.model))

    @property
    def has_logits(self) -> bool:
        """Whether the next-token logits after the sequence's last token are at hand."""
        return self.llm.n_tokens > 0 and self._logits_at == self.llm.n_tokens

    def _eval(self, tokens: Sequence[int]) -> None:
        self.llm.eval(tokens)
        self._logits_at = self.llm.n_tokens

    def prefill(
        self,
        tokens: Sequence[int],
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        """Evaluate `tokens` after what the context holds, slice by slice.

        On cancellation the context keeps the slices already evaluated (callers that must not
        keep a partial prefix truncate back) and `Cancelled` is raised.
        """
        tokens = list(tokens)
        with self._lock:
            if self.llm.n_tokens + len(tokens) > self.n_ctx:
                raise RuntimeStateError(
                    f"{self.llm.n_tokens} + {len(tokens)} tokens do not fit the context "
                    f"of {self.n_ctx}"
                )
            done = 0
            for start in range(0, len(tokens), PREFILL_SLICE):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(f"stopped after {done} of {len(tokens)} tokens")
                piece = tokens[start : start + PREFILL_SLICE]
                self._eval(piece)
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
            batch = self.llm._batch
            for start in range(0, len(tokens), self.llm.n_batch):
                piece = tokens[start : start + self.llm.n_batch]
                n_past = self.llm.n_tokens
                batch.set_batch(piece, n_past, True)
                self.llm._ctx.decode(batch)
                self.llm.input_ids[n_past : n_past + len(piece)] = piece
                self.llm.n_tokens = n_past + len(piece)
                ptr = llama_cpp.llama_get_logits(self.llm._ctx.ctx)
                logits = np.ctypeslib.as_array(ptr, shape=(len(piece), n_vocab))
                for i in range(0, len(piece), SCORE_ROWS):
                    x = logits[i : i + SCORE_ROWS]
                    x = x - x.max(1, keepdims=True)
                    x -= np.log(np.exp(x).sum(1, keepdims=True))
                    out[start + i : start + i + len(x)] = x
            self._logits_at = self.llm.n_tokens
        return out

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def generate(
        self,
        max_tokens: int,
        *,
        options: GenerationOptions = GenerationOptions(),
        cancel: threading.Event | None = None,
    ) -> Iterator[Token]:
        """Stream tokens continuing the sequence until end-of-generation, max_tokens or cancel.

        `options` are run as they are: a stage whose field is None is off (greedy without
        penalties by default); the engine resolves the layers of defaults first. The context
        must end with freshly evaluated logits (after `prefill` of at least one token, or
        `ensure_logits`). Generated tokens join the sequence, except the final
        end-of-generation token, which is sampled but not evaluated.
        """
        sampler = self._sampler(options)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = None  # sampled and yielded, not yet evaluated
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
                    if self.is_end_of_generation(tok):
                        return
                    # (_model.token_to_piece returns its whole 32-byte buffer, NULs included.)
                    piece = self.llm._model.detokenize([tok], special=False)
                    # The token reaches the caller before it is evaluated: the first token's
                    # latency is one decode shorter. It is evaluated before the next sample,
                    # or when the caller stops iterating, so every yielded token is in context.
                    pending = tok
                    yield Token(tok, decoder.decode(piece))
        finally:
            if pending is not None:
                with self._lock:
                    self._eval([pending])
            sampler.close()

    def _sampler(self, o: GenerationOptions) -> _internals.LlamaSampler:
        """llama.cpp's sampler chain for `o`, its stages in llama.cpp's own order: penalties,
        top-k, top-p, min-p, temperature, then the draw (the most likely token at 0)."""
        sampler = _internals.LlamaSampler()
        last_n = self.n_ctx if o.repeat_last_n == -1 else o.repeat_last_n or 0
        penalized = last_n and (o.repeat_penalty or 1.0, o.presence_penalty or 0.0,
                                o.frequency_penalty or 0.0) != (1.0, 0.0, 0.0)
        if penalized:
            sampler.add_penalties(self.llm.n_vocab(), last_n, o.repeat_penalty or 1.0,
                                  o.frequency_penalty or 0.0, o.presence_penalty or 0.0)
        if not o.temperature:
            sampler.add_greedy()
        else:
            if o.top_k:
                sampler.add_top_k(o.top_k)
            if o.top_p is not None and o.top_p < 1:
                sampler.add_top_p(o.top_p, 1)
            if o.min_p:
                sampler.add_min_p(o.min_p, 1)
            sampler.add_temp(o.temperature)
            sampler.add_dist(llama_cpp.LLAMA_DEFAULT_SEED if o.seed is None else o.seed)
        # The penalties look at the answer's own tokens only (the chain sees each token it
        # draws): an answer should be free to use the question's and the document's words,
        # and to end as the question's turn did (measured: benchmarks/RESULTS.md).
        return sampler

    # -- KV state ------------------------------------------------------------------------

    def state_bytes(self) -> bytes:
        """llama.cpp's exact per-sequence state of the context's sequence."""
        with self._lock:
            ctx = self.llm._ctx.ctx
            size = llama_cpp.llama_state_seq_get_size(ctx, 0)
            buf = (ctypes.c_uint8 * size)()
            written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
            if written != size:
                raise RuntimeStateError(f"llama.cpp wrote {written} of {size} state bytes")
            return bytes(buf)

    def capture(self) -> kvstate.KVState:
        """The sequence's KV cache as numpy arrays."""
        return kvstate.parse_seq_state(self.state_bytes())

    def restore_bytes(self, data: bytes, tokens: Sequence[int]) -> None:
        """Replace the context's sequence with state bytes and the tokens they were made from
        (one cache section, or the two of a sliding-window model).

        The bytes are parsed and checked against this model's layout first: llama.cpp itself
        would load any state of the right shapes, from whatever model it came. A quantized
        cache's state (q8_0, q4_0: the bridge cannot parse it) is only llama.cpp's to check:
        give such a runtime back only states it wrote itself.
        """
        if self.layout.cache_type in ("f16", "f32"):
            seq = kvstate.parse_seq_sections(data)
            kv = seq.sections[0]
            layers = sum(s.n_layer for s in seq.sections)
            self._check_fits((layers, kv.n_tokens, kv.channels), kv.dtype, kv.v_trans, tokens)
        self._set_state(data, tokens)

    def restore(self, kv: kvstate.KVState, tokens: Sequence[int]) -> None:
        """Load a KV cache (e.g. decoded from the codec) for `tokens` into the context."""
        lay = self.layout
        buf = kvstate.StateBuffer(*kv.keys.shape, self.cache_dtype, v_trans=lay.v_trans,
                                  positions=kv.positions, seq_id=kv.seq_id)
        buf.keys[...] = kv.keys
        buf.values[...] = kv.values
        self.restore_buffer(buf, tokens)

    @property
    def cache_dtype(self) -> np.dtype:
        return np.dtype(np.float16 if self.layout.cache_type == "f16" else np.float32)

    def new_state_buffer(self, n_tokens: int) -> kvstate.StateBuffer:
        """A state of n_tokens for this model, to fill in place and `restore_buffer`.

        Its bytes may be those of the previous buffer of the same size (llama.cpp copies a
        state in when it is set), so fill every token before restoring it.
        """
        lay = self.layout
        buf = kvstate.StateBuffer(lay.n_layer, n_tokens, lay.channels, self.cache_dtype,
                                  v_trans=lay.v_trans, reuse=self._spare)
        self._spare = buf.data
        return buf

    def restore_buffer(self, buf: kvstate.StateBuffer, tokens: Sequence[int]) -> None:
        """Load a filled StateBuffer without copying it."""
        self._check_fits(buf.keys.shape, buf.keys.dtype, buf.v_trans, tokens)
        self._set_state(buf.data, tokens)

    def _check_fits(self, shape: tuple, dtype: np.dtype, v_trans: bool,
                    tokens: Sequence[int]) -> None:
        """Refuse KV that this context would load but that was not made for it."""
        lay = self.layout
        expected = (lay.n_layer, len(tokens), lay.channels)
        if tokens and shape != expected:
            raise RuntimeStateError(
                f"KV of shape {shape} does not fit this model: expected {expected}")
        if v_trans != lay.v_trans:
            raise RuntimeStateError("the state's V layout does not match this context")
        if dtype != self.cache_dtype:
            raise RuntimeStateError(f"KV of {dtype} for a {lay.cache_type} cache")

    def _set_state(self, data: bytes | bytearray, tokens: Sequence[int]) -> None:
        tokens = list(tokens)
        if len(tokens) > self.n_ctx:
            raise RuntimeStateError(f"{len(tokens)} tokens do not fit the context of {self.n_ctx}")
        with self._lock:
            self.reset()
            if isinstance(data, bytearray):
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
