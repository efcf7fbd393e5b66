"""What `Runtime` asks of llama.cpp below `llama_cpp.Llama`: a sampler chain, and batches
that ask for only the logits a caller reads.

`chain`: the stages of a set of resolved generation options (`sampling.resolve`) in llama.cpp's
own order: a grammar where the answer has a format (`AnswerFormat`), penalties, top-k, top-p,
min-p, temperature, then the draw (the most likely token at temperature 0); a grammar is
applied as llama.cpp's common sampler applies it by default (`Held`: the drawn token checked
alone, the grammar first over every token only when it refuses that one). It only builds the
chain: `Runtime.generate` runs it, `sampling` decides the values.

`AnswerFormat`, `json_object`, `json_schema`: structured output, an answer held to JSON or to
a JSON schema (what OpenAI's `response_format` and Ollama's `format` ask for): the GBNF grammar
`chain` puts first, and the request field that asked for it, so that a grammar llama.cpp cannot
parse is refused by that field's name. A schema becomes a grammar through llama-cpp-python's
converter (llama.cpp's json_schema_to_grammar), whose refusal is given in words, and a bound
that the converter writes out one repetition at a time (`maxLength`...: `MAX_REPEATS`) is
refused before it is converted: llama.cpp's parser recurses once a repetition, and a bound of
~18,000 overflows the stack of the thread parsing it (a segfault: the whole server gone);
`schema_rules` gives several schemas' rules for a grammar whose own root puts them in place (a
tool call's arguments: `desktop_app.tools`). It is never a
generation option (`GenerationOptions` is also the settings file's and the CLI's: a grammar
there would become a setting); only the local API asks for one.

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

import contextlib
import ctypes
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import _internals, llama_grammar

from ..options import GenerationOptions
from ..validation import InvalidValue


def chain(o: GenerationOptions, llm: llama_cpp.Llama, n_ctx: int, grammar: str | None = None,
          *, drawn_first: bool = True) -> _internals.LlamaSampler | Held:
    """A new sampler chain for `o` (every field resolved) and `llm`'s vocabulary, held to
    `grammar` (GBNF text: `AnswerFormat`) if given, whose end alone then allows
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


@dataclass(frozen=True)
class AnswerFormat:
    """The grammar an answer is held to, and the request field that asked for it."""

    grammar: str
    field: str


def json_object(field: str) -> AnswerFormat:
    """Any JSON object (OpenAI's JSON mode, Ollama's "json"): an object at the top level, as
    both promise, not any JSON value."""
    # llama.cpp's own json.gbnf: its root is an object, and its whitespace bounded (a line
    # break and 20 spaces at most between tokens), so a model cannot fill its answer with
    # blank lines (tests/test_server_structured.py pins both).
    return AnswerFormat(llama_grammar.JSON_GBNF, field)


def json_schema(schema: Any, field: str) -> AnswerFormat:
    """A JSON value that `schema` describes; refused (400, by `field`) where it is not a
    schema or uses what the converter does not support (a remote `$ref`, an unanchored
    `pattern`...), in the converter's words."""
    if not isinstance(schema, dict):
        raise InvalidValue(field, f"a JSON schema is an object (got {_kind(schema)})")
    with _converting(field):
        _bounded(schema, field)
        converter = _Converter.plain()
        converter.visit(converter.resolve_refs(json.loads(json.dumps(schema)), "stdin"), "")
    return AnswerFormat(converter.format_grammar(), field)


def schema_rules(schemas: Sequence[tuple[str, Any, str]]) -> str:
    """GBNF rules for several JSON schemas in one grammar, each (rule name, schema, field)'s
    values under its rule name and no root: for a grammar whose own root puts them in place
    (a tool call's arguments: `desktop_app.tools`). Refused by field as `json_schema`."""
    converter = _Converter.plain()
    for name, schema, field in schemas:
        if not isinstance(schema, dict):
            raise InvalidValue(field, f"a JSON schema is an object (got {_kind(schema)})")
        with _converting(field):
            _bounded(schema, field)
            converter.prefix = name
            # (a copy: the converter writes its own names into the `$ref`s it resolves)
            converter.visit(converter.resolve_refs(json.loads(json.dumps(schema)), field), name)
    return converter.format_grammar()


# A JSON string's character as JSON has it: no control character unescaped. The converter's
# own (`[^"\\]`) lets a raw line break into a string, and the answer is no JSON a client's
# parser takes (llama.cpp's own json.gbnf, `json_object`'s, has this one).
_CHAR = llama_grammar.BuiltinRule(
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] '
    r'[0-9a-fA-F])', [])


# A pattern's `.` inside a JSON string: what `.` matches but a line break (the converter's
# `dotall=False`), written as JSON writes it. The converter's own (`[^\x0A\x0D]`) lets a raw
# control character, a raw `"` that ends the string early, and a lone `\\` through; so does a
# pattern's negated class (`[^@]`), which the converter copies as written: each is given
# JSON's exclusions (`_NOT_IN_STRING`), and matches its characters unescaped only.
_DOT = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bft])'
_NOT_IN_STRING = r'"\\\x7F\x00-\x1F'


class _Converter(llama_grammar.SchemaConverter):
    """The converter with JSON's own string characters (`_CHAR`), and each schema's `$ref`
    rules named after its own rule (`prefix`): its own names one by the ref's last part
    alone, so two schemas' `$defs` of one name (pydantic models' `Place`, in two tools) would
    both get the first's rule."""

    prefix = ""

    @classmethod
    def plain(cls) -> _Converter:
        """One as llama-cpp-python's json_schema_to_gbnf makes it: nothing fetched, `.` not
        taking line breaks, patterns as written."""
        return cls(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def _add_primitive(self, name: str, rule: llama_grammar.BuiltinRule) -> str:
        return super()._add_primitive(name, _CHAR if name == "char" else rule)

    def _add_rule(self, name: str, rule: str) -> str:
        return super()._add_rule(name, _DOT if name == "dot" and rule == llama_grammar.DOT
                                 else rule)

    def _visit_pattern(self, pattern: str, name: str) -> str:
        return super()._visit_pattern(_json_classes(pattern), name)

    def _resolve_ref(self, ref: str) -> str:  # (as the converter's own, but for the name)
        if not self.prefix:  # (one schema: its names as the converter gives them)
            return super()._resolve_ref(ref)
        name = f"{self.prefix}-{ref.split('/')[-1]}"
        if name not in self._rules and ref not in self._refs_being_resolved:
            self._refs_being_resolved.add(ref)
            name = self.visit(self._refs[ref], name)
            self._refs_being_resolved.remove(ref)
        return name


def _json_classes(pattern: str) -> str:
    """`pattern` with `_NOT_IN_STRING` added to each negated class (`[^...]`), read as the
    converter reads a pattern: a backslash escapes the next character, a class runs to its
    first unescaped `]`. A `]` or `}` that closes nothing is refused: the converter would loop
    on it for good (a server's every route waiting behind it)."""
    out, i, inside, bound = [], 0, False, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if not inside and (c == "]" or c == "}" and not bound):
            raise ValueError(f"the pattern's {c!r} at {i} closes nothing (\\{c} is the "
                             "character itself)")
        if not inside and pattern.startswith("[^", i):
            out.append("[^" + _NOT_IN_STRING)
            inside, i = True, i + 2
            continue
        bound = (bound or c == "{") and c != "}" if not inside else bound
        inside = (inside or c == "[") and c != "]"
        out.append(c)
        i += 1
    return "".join(out)


# The most repetitions a schema's bound may ask for. The converter writes `maxLength: n` (and
# `maxItems`, a pattern's `{m,n}`) as n optional groups nested in one another, which
# llama.cpp's grammar parser reads by recursing once a group: measured with an 8 MiB stack
# (Linux's main thread and its default for others), 17,500 parse and 20,000 overflow it; from
# ~1,100 on llama.cpp refuses the grammar anyway ("exceeds sane defaults"). A `minLength` or
# `minItems` is written out flat (it parses at 20,000) but as long, so it is held to the same.
# (The converter ignores `minimum`, `maximum` and the `*Properties` bounds: nothing expands.)
MAX_REPEATS = 1000
_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems")
_QUANTIFIER = re.compile(r"\{(\d*)(?:,(\d*))?\}")
_VALUES = ("enum", "const", "default", "examples")  # (data, not schemas: never walked)


def _bounded(schema: Any, field: str) -> None:
    """Refuse, by the path of the schema that asks for it, a repetition bound above
    `MAX_REPEATS` anywhere in `schema`."""
    if isinstance(schema, list):
        for i, part in enumerate(schema):
            _bounded(part, f"{field}.{i}")
        return
    if not isinstance(schema, dict):
        return
    for key in _BOUNDS:
        n = schema.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > MAX_REPEATS:
            raise InvalidValue(field, f"{key} {n} is more than kvdesk's grammar can hold (at "
                               f"most {MAX_REPEATS})")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        for m in _QUANTIFIER.finditer(pattern):
            if any(n and int(n) > MAX_REPEATS for n in m.groups()):
                raise InvalidValue(field, f"the pattern's repetition {m.group()} is more than "
                                   f"kvdesk's grammar can hold (at most {MAX_REPEATS})")
    for key, part in schema.items():
        if key not in _VALUES:
            _bounded(part, f"{field}.{key}")


@contextlib.contextmanager
def _converting(field: str) -> Iterator[None]:
    """The schema converter's refusals in words, by `field`."""
    try:
        yield
    except InvalidValue:
        raise  # (already said, by its own field: `_bounded`)
    except (AssertionError, ValueError, KeyError, NotImplementedError) as e:
        raise InvalidValue(field, f"this schema cannot be turned into a grammar: {e}") from None
    except (AttributeError, TypeError):  # (the converter reads every part with .get)
        raise InvalidValue(field, "this schema cannot be turned into a grammar: a part of it "
                           "that should be a schema (an object) is not one") from None
    except RecursionError:
        raise InvalidValue(field, "this schema cannot be turned into a grammar: it is nested "
                           "too deeply") from None


def _kind(value: Any) -> str:
    return {str: "a string", list: "an array", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


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
