"""What `Runtime` asks of llama.cpp below `llama_cpp.Llama`: a sampler chain, and batches
that ask for only the logits a caller reads.

`chain`: the stages of a set of resolved generation options (`sampling.resolve`) in llama.cpp's
own order: penalties, top-k, top-p, min-p, temperature, then the draw (the most likely token at
temperature 0). It only builds the chain: `Runtime.generate` runs it, `sampling` decides the
values.

`decode`, `kv_only`: `Llama.eval` asks llama.cpp for the last token's logits of every batch,
which runs the output layer over the whole vocabulary (~8 ms a batch on two cores with Gemma
3's 262,144 words, as much as 2-3 more tokens). A prefill whose KV is all that is wanted (a
passage's, a blend's run, a chat's exact context, an attach) skips it; a score keeps every
row. They keep the Llama object's bookkeeping (`input_ids`, `n_tokens`) as its `eval` does,
and nothing else: `Runtime` owns the lock and what its logits belong to.

`piece`: the bytes one token stands for, however many (the binding's own reading gives
nothing for a token over 32 bytes). `longest_piece`: the most bytes one token of a vocabulary
stands for, so that a text too long for a context is known to be before it is tokenized (no
text has fewer tokens than its bytes over it).

`pieces`, `tokenize`: a long text tokenized a piece at a time. llama.cpp's tokenizer slows
with the length of what it is given (its special-token pass over a conversation of thousands
of turns; Gemma 3's SentencePiece on any long text: minutes for a book), and one call cannot
be cancelled. Only where the model's tokenizer splits where the pieces end anyway
(`splits_exactly`: one that puts a space before each call's text, as some SentencePiece
vocabularies do, does not).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterator, Sequence

import llama_cpp
from llama_cpp import _internals

from ..options import GenerationOptions


def chain(o: GenerationOptions, *, n_vocab: int, n_ctx: int) -> _internals.LlamaSampler:
    """A new sampler chain for `o` (every field resolved); the caller closes it."""
    sampler = _internals.LlamaSampler()
    last_n = n_ctx if o.repeat_last_n == -1 else o.repeat_last_n or 0
    penalized = last_n and (o.repeat_penalty or 1.0, o.presence_penalty or 0.0,
                            o.frequency_penalty or 0.0) != (1.0, 0.0, 0.0)
    if penalized:
        sampler.add_penalties(n_vocab, last_n, o.repeat_penalty or 1.0,
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


def decode(llm: llama_cpp.Llama, tokens: Sequence[int], *,
           logits: bool) -> Iterator[tuple[int, int]]:
    """Evaluate `tokens` after what `llm` holds, n_batch at a time, yielding each piece's
    (start in tokens, length) once it is in; with the logits of every row, or of none."""
    batch = llm._batch
    for start in range(0, len(tokens), llm.n_batch):
        piece = list(tokens[start : start + llm.n_batch])
        batch.set_batch(piece, llm.n_tokens, logits)
        batch.batch.logits[len(piece) - 1] = logits  # (set_batch always asks for the last)
        llm._ctx.decode(batch)
        llm.input_ids[llm.n_tokens : llm.n_tokens + len(piece)] = piece
        llm.n_tokens += len(piece)
        yield start, len(piece)


def kv_only(llm: llama_cpp.Llama, tokens: Sequence[int]) -> None:
    """Evaluate `tokens` after what `llm` holds for their KV alone: no logits are left."""
    llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)  # (cells past n_tokens, as Llama.eval)
    for _ in decode(llm, tokens, logits=False):
        pass


PIECE = 1 << 13  # characters: measured, 8 K tokenize faster than 64 K (and than 1 M)
PIECE_BYTES = 128  # a token's bytes read at once (SmolLM2's longest: 81; longer, asked again)
# Where a piece may end: at a line break between two words (or special tokens), or before a
# space between two words, where every tokenizer splits (runs of spaces or breaks can be one
# token; measured exact on both shipped models: prose, Markdown paragraphs, code, chats).
_CUT = re.compile(r"(?<=\S\n)(?=\S)|(?<=\S)(?= \S)")


def pieces(text: str, size: int = PIECE) -> Iterator[str]:
    """`text` in pieces of about `size` characters whose tokens, joined, are the whole text's
    (`splits_exactly`), each ending at a `_CUT`."""
    start = 0
    while start < len(text):
        found = _CUT.search(text, start + size) if start + size < len(text) else None
        end = found.start() if found else len(text)
        yield text[start:end]
        start = end


def splits_exactly(llm: llama_cpp.Llama) -> bool:
    """Whether this model's tokens of a text cut where `pieces` cuts are the whole text's (a
    tokenizer that adds a space to the start of each call's text splits otherwise)."""
    cut = ("Tokens of a text,", " cut here.\n", "Then  more\n  indented\n\nand <b>so</b>",
           " on.\n")
    whole = llm.tokenize("".join(cut).encode(), add_bos=False, special=True)
    return whole == [t for p in cut for t in llm.tokenize(p.encode(), add_bos=False,
                                                           special=True)]


def parts(text: str, in_pieces: bool) -> list[str]:
    """What to ask the tokenizer for, in order: `pieces`, where the model's tokenizer
    `splits_exactly`, else (and for an empty text, which a BOS-adding model answers) the text."""
    return list(pieces(text)) if in_pieces and text else [text]


def tokenize(llm: llama_cpp.Llama, text: str, add_bos: bool, special: bool,
             in_pieces: bool) -> list[int]:
    """`text`'s tokens, asked for a piece at a time `in_pieces` (`parts`)."""
    return [t for i, piece in enumerate(parts(text, in_pieces))
            for t in llm.tokenize(piece.encode("utf-8"), add_bos=add_bos and not i,
                                  special=special)]


def piece(model: llama_cpp.Llama, token: int, *, special: bool = False) -> bytes:
    """The bytes `token` stands for, however many (the binding's `detokenize` reads a token
    into 32 bytes and gives an empty piece for a longer one: SmolLM2 writes a line break and
    an indentation of 33 spaces as one token of 34 bytes); with `special`, a special token's
    own text too (else none)."""
    buf = ctypes.create_string_buffer(PIECE_BYTES)
    n = llama_cpp.llama_token_to_piece(model._model.vocab, token, buf, len(buf), 0, special)
    if n < 0:  # (longer than the buffer: the size it needs, negated)
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(model._model.vocab, token, buf, len(buf), 0,
                                           special)
    return buf.raw[:n]


def longest_piece(model: llama_cpp.Llama) -> int:
    """The most bytes any one token of `model`'s vocabulary stands for, special ones included
    (about 5 microseconds a token: 0.3 s for SmolLM2's 49,152, 1.3 s for Gemma 3's 262,144;
    for a text too long to tokenize first)."""
    return max(len(piece(model, token, special=True)) for token in range(model.n_vocab()))
