"""What a restore at `lossless` may take as it is: the KV a prefill of the text computes.

llama.cpp's results depend on how tokens are batched. The KV of a token computed in a slice
that begins elsewhere, in a slice of a few tokens, or alone (as an answer is generated) differs
in its last bits from what a prefill of the same text computes, and a greedy answer parts from
there within a few dozen tokens (measured on SmolLM2: a chat's next turn at lossless answered
otherwise than `--no-cache`). `--no-cache` computes a context as `Runtime.prefill` does, in
slices of PREFILL_SLICE from its first token, and the question after it; `lossless` answers as
it does only if every token's KV was computed in those very slices. So a restore at lossless
reads only:

- a document's own entry (attaching prefilled it from its first token, so): never a chat's
  or a prompt's, whose KV was computed as their turns came, an answer a token at a time;
- up to a multiple of PREFILL_SLICE tokens, from where the rest is computed in the slices a
  prefill from the first token would use; or all of the entry when the context asked for
  ends where it does (its last slice was cut there as a prefill of the context cuts it).

`Held` keeps the same rule for what the chat context already holds: a question at lossless
keeps it only as a prefill of text computed it (a context restored so or recomputed, and the
question after it), never what an answer added a token at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from store import Span

from ..model.runtime import PREFILL_SLICE, Runtime
from .sources import ChunkSource


def exact_end(source: ChunkSource, n_asked: int, windowed: bool) -> int:
    """How many of the `n_asked` tokens `source` covers a restore at lossless may read:
    a run of documents' chunks from the first token, as the module says (a sliding-window
    model's: a stored window's end that is such a point, else none)."""
    ends = source.prefilled
    run, ended = 0, False
    for span in source.spans:
        if span.entry_id not in ends or span.token_start != run:
            break
        run = span.token_end
        ended = run == ends[span.entry_id]
        if ended and run % PREFILL_SLICE:
            break  # (an entry extending it computed its tokens in a slice going on past here)
    whole = ended and run == n_asked
    run = min(run, source.n_tokens)
    if windowed:
        return max((end for end in source.windows if end <= run and (
            end % PREFILL_SLICE == 0 or whole and end == run)), default=0)
    return run if whole else run - run % PREFILL_SLICE


@dataclass
class Cut:
    """A source read up to `n_tokens` only (its chunks past them not read)."""

    source: ChunkSource
    spans: Sequence[Span]
    n_tokens: int
    beyond: Sequence[int]
    windows: dict

    def __getattr__(self, name: str):  # kind, parallel, one_level, sizes, read, damaged
        return getattr(self.source, name)


def exact_part(source: ChunkSource, tokens: Sequence[int], windowed: bool
               ) -> tuple[ChunkSource | None, list[str]]:
    """`source` as far as a restore at lossless reads it (None: not at all; a sliding-window
    model's, with only the window ends it may fall back to), and what the user should know
    when that is less than it holds."""
    end = exact_end(source, len(tokens), windowed)
    if end >= source.n_tokens and not windowed:
        return source, []
    # (The reason named is what lies past `end`: a chat's turns, or only a document's last
    # tokens, whose slice a prefill of this longer context would not end there.)
    turns = any(s.entry_id not in source.prefilled for s in source.spans if s.token_end > end)
    why = [] if end >= source.n_tokens else [
        f"{source.n_tokens - end:,} of the {source.n_tokens:,} stored tokens are computed "
        f"again from token {end:,}: lossless reads a cache only where it holds what "
        "--no-cache computes bit for bit (a document's own cache, up to a multiple of "
        f"{PREFILL_SLICE} tokens unless the context ends where it does)"
        + ("; a chat's turns were computed as they came, its answers a token at a time"
           if turns else "") + ", and llama.cpp's results depend on how tokens are batched"]
    if end == 0:
        return None, why
    spans = [s for s in source.spans if s.token_start < end]
    held = [*tokens[:source.n_tokens], *source.beyond]
    return Cut(source, spans, end, held[end:spans[-1].token_end],
               {e: p for e, p in source.windows.items()  # (where it may fall back too)
                if e == end or e < end and e % PREFILL_SLICE == 0}), why


class Held:
    """What the chat context holds as a prefill of text computes it: the context tokens last
    brought in so (restored at lossless, or recomputed), and the question computed after
    them in one prefill (None: not so)."""

    def __init__(self) -> None:
        self.tokens: tuple[int, ...] | None = None
        self.question: tuple[int, ...] | None = None

    def computed(self, tokens: Sequence[int] | None, question: Sequence[int] = ()) -> None:
        """The context was just brought in (None: not as a prefill computes it)."""
        self.tokens = None if tokens is None else tuple(tokens)
        self.question = None if tokens is None else tuple(question)

    def reuse(self, rt: Runtime, tokens: Sequence[int], question: Sequence[int], keep: int,
              exact: bool) -> int:
        """How many tokens of what the context holds a question keeps, computing the rest in
        one prefill (-1: none, it is brought in anew): not at lossless (`exact`), the `keep`
        it asks for; at lossless, all when the context holds `tokens` and `question` as a
        prefill computed them (with the question's logits), only `tokens` when it holds those
        so, else none. Remembered as kept (anything else the caller does, said to
        `computed`)."""
        full = [*tokens, *question]
        if exact:
            if self.tokens != tuple(tokens) or rt.tokens[:len(tokens)] != list(tokens):
                return -1
            keep = len(full) if self.question == tuple(question) and rt.has_logits and \
                rt.tokens == full else len(tokens)
        if self.tokens != tuple(tokens) or keep < len(tokens):
            self.computed(None)
        elif keep == len(tokens):
            self.question = tuple(question)
        elif keep < len(full) or self.question != tuple(question):
            self.question = None  # (part of another question kept: not one prefill)
        return keep
