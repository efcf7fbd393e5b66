"""What `Runtime` asks of llama.cpp below `llama_cpp.Llama`: a sampler chain, and batches
that ask for only the logits a caller reads.

`chain`: the stages of a set of resolved generation options (`sampling.resolve`) in llama.cpp's
own order: a grammar where the answer has a format (`answerformat`), penalties, top-k, top-p,
min-p, temperature, then the draw (the most likely token at temperature 0); a grammar is
applied as llama.cpp's common sampler applies it by default (`Held`: the drawn token checked
alone, the grammar first over every token only when it refuses that one). It only builds the
chain: `Runtime.generate` runs it, `sampling` decides the values. `grammar_stage`,
`grammar_parses`: llama.cpp's grammar sampler for a grammar (`answerformat` writes them), and
whether it parses one, so that a request's is refused before its turn.

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
import numpy as np
from llama_cpp import _internals

from ..options import GenerationOptions


def chain(o: GenerationOptions, llm: llama_cpp.Llama, n_ctx: int, grammar: str | None = None,
          *, drawn_first: bool = True) -> _internals.LlamaSampler | Held:
    """A new sampler chain for `o` (every field resolved) and `llm`'s vocabulary, held to
    `grammar` (GBNF text: `answerformat.AnswerFormat`) if given, whose end alone then allows
    end-of-generation (`Held`; `drawn_first` False: the grammar a stage of the chain, run
    over every token each time); the caller closes it."""
    sampler = _internals.LlamaSampler()
    n_vocab = llm.n_vocab()
    stage = None
    if grammar:
        # First, as llama.cpp's common sampler applies it: the penalties and the truncations
        # then choose among the tokens the grammar allows (after them, top-k could leave it
        # none). `sample` accepts the drawn token into the grammar, which allows
        # end-of-generation only once the JSON is complete.
        stage = grammar_stage(llm._model.vocab, grammar)
        if stage is None:
            sampler.close()
            raise ValueError("llama.cpp could not parse the grammar")
        if not drawn_first:
            llama_cpp.llama_sampler_chain_add(sampler.sampler, stage)
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
    return Held(sampler, stage, n_vocab) if stage is not None and drawn_first else sampler


class Held:
    """A chain held to a grammar as llama.cpp's common sampler holds it by default: the token
    the chain draws is checked alone against the grammar, and only where the grammar refuses
    it is the draw made again with the grammar first, over every token. A grammar run over the
    whole vocabulary costs 3 ms a token with SmolLM2's 49,152 and 20-28 ms with Gemma 3's
    262,144 (as much as a decode); a model asked for JSON mostly draws what the grammar
    allows. The same tokens at temperature 0 (the grammar-first draw's argmax is the plain
    one's wherever the grammar allows that), and sampling the same distribution (a refused
    draw is made again from the allowed tokens, renormalized)."""

    def __init__(self, rest: _internals.LlamaSampler, grammar, n_vocab: int):
        self.rest, self.grammar, self.n_vocab = rest, grammar, n_vocab
        self._all = _internals.LlamaTokenDataArray(n_vocab=n_vocab)
        self._one = _internals.LlamaTokenDataArray(n_vocab=1)

    def sample(self, ctx: _internals.LlamaContext, idx: int = -1) -> int:
        """The next token after the logits at `idx`, accepted into the grammar and the chain
        (as `llama_sampler_sample` accepts it)."""
        ptr = llama_cpp.llama_get_logits_ith(ctx.ctx, idx)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        token = self._draw(logits, held=False)
        if not self._allowed(token):
            token = self._draw(logits, held=True)
        llama_cpp.llama_sampler_accept(self.grammar, token)
        llama_cpp.llama_sampler_accept(self.rest.sampler, token)
        return token

    def _draw(self, logits: np.ndarray, *, held: bool) -> int:
        cur = self._all
        cur.copy_logits(logits)
        if held:
            llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(cur.candidates))
        llama_cpp.llama_sampler_apply(self.rest.sampler, ctypes.byref(cur.candidates))
        return int(cur.candidates.data[cur.candidates.selected].id)

    def _allowed(self, token: int) -> bool:
        one = self._one
        one.candidates_data.id[0], one.candidates_data.logit[0] = token, 1.0
        one.candidates.size, one.candidates.sorted = 1, False
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(one.candidates))
        return bool(np.isfinite(one.candidates_data.logit[0]))

    def close(self) -> None:
        if self.grammar is not None:
            llama_cpp.llama_sampler_free(self.grammar)
            self.grammar = None
        self.rest.close()


def grammar_stage(vocab: llama_cpp.llama_vocab_p, gbnf: str) -> llama_cpp.llama_sampler_p | None:
    """llama.cpp's grammar sampler for `gbnf` (root rule `root`), or None where it cannot
    parse it (the binding's `add_grammar` would add the null pointer to a chain)."""
    stage = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
    return stage or None


def grammar_parses(vocab: llama_cpp.llama_vocab_p, gbnf: str) -> bool:
    """Whether llama.cpp parses `gbnf`: a request's format is refused before its turn."""
    stage = grammar_stage(vocab, gbnf)
    if stage is not None:
        llama_cpp.llama_sampler_free(stage)
    return stage is not None


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
