"""What the model reads: the system prompt, documents and questions through the chat template.

Pure functions over a `Template` (the model's tokenizer and chat template; `Runtime` is one):
a document's prefix, cut to fit the context (`document_prefix`), the prefix of a chat over
several documents (`chat_prefix`), a question's turn (`question_turn`), the text a client's
conversation is answered after (`answer_text`) and what the template appends after an answer
(`closing`). Every chat about a document starts with exactly the
document's prefix, which is what makes its stored KV cache reusable.

They never evaluate anything and never touch the store: the sessions decide what to compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from store import Document

from ..errors import EngineError
from ..validation import InvalidValue

SYSTEM_PROMPT = (
    "You are kvdesk, a careful assistant. Answer questions about the document below "
    "accurately and concisely, quoting it where it helps."
)
# A chat over a long document's passages: what each passage's own KV is computed after.
PASSAGE_SYSTEM_PROMPT = (
    "You are kvdesk, a careful assistant. Answer questions from the passages of a document "
    "below, accurately and concisely, quoting them where it helps; if they do not hold the "
    "answer, say so."
)
SYSTEM_PROMPT_NO_DOCUMENT = "You are kvdesk, a careful and concise assistant."
UNTITLED = "New chat"  # a chat's title until its first question names it


class Template(Protocol):
    @property
    def n_ctx(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def adds_bos(self) -> bool: ...

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool) -> str: ...

    def tokenize(self, text: str, *, add_bos: bool = False,
                 special: bool = True) -> list[int]: ...

    @property
    def fim_tokens(self) -> tuple[int, int, int] | None: ...


@dataclass(frozen=True)
class Prefix:
    """What every chat about a document starts with."""

    messages: tuple[dict, ...]  # the system message, for the chat template
    text: str  # the rendered template
    tokens: tuple[int, ...]
    doc_tokens: int  # the document's own token count (all of it)
    kept_tokens: int  # how many of them are in the prefix


@dataclass(frozen=True)
class Turn:
    """A conversation with a question appended as the user's turn."""

    messages: tuple[dict, ...]  # the conversation's messages and the question
    text: str  # the whole template text, ending with the generation prompt
    tokens: list[int]  # the tokens of the part added by the question's turn
    # The start of the answer, where the conversation ends with the assistant's own message
    # (the answer continues it; `messages` ends with it and `text` with its words).
    prefill: str = ""


class Prompter:
    """One engine's prompts: the room it keeps for questions and answers, and a memo of
    document prefixes (tokenizing a 4,000-token document costs ~15 ms, on every question)."""

    def __init__(self, reserve_tokens: int | None = None):
        self._reserve = reserve_tokens
        self._prefixes: dict[tuple, Prefix] = {}
        self._layouts: dict[tuple, Layout] = {}

    def reserve(self, tpl: Template) -> int:
        """Context kept free for questions and answers when documents are too long."""
        return self._reserve if self._reserve is not None else min(1024, tpl.n_ctx // 4)

    def room(self, tpl: Template) -> int:
        return tpl.n_ctx - self.reserve(tpl)

    def prefix(self, tpl: Template, doc: Document | None) -> Prefix:
        """A document's prefix (the system prompt alone for None)."""
        if doc is None:
            return document_prefix(tpl, None, self.room(tpl))
        key = (doc.id, doc.content_hash, tpl.fingerprint, tpl.n_ctx, self.reserve(tpl))
        if key not in self._prefixes:
            self._prefixes[key] = document_prefix(tpl, (doc.title, doc.text), self.room(tpl))
        return self._prefixes[key]

    def chat(self, tpl: Template, docs: Sequence[Document]) -> tuple[list[dict], list[int]]:
        """A chat's messages and tokens before its first question."""
        layout = self.layout(tpl, docs)
        return list(layout.messages), list(layout.tokens)

    def layout(self, tpl: Template, docs: Sequence[Document]) -> Layout:
        """A chat's prefix, with each document's part of it (kept: a later document cut to
        fit is tokenized a dozen times to find where)."""
        first = self.prefix(tpl, docs[0] if docs else None)
        # (A document attached under a larger context than today's is cut too.)
        cut = ((docs[0].title, first.kept_tokens, first.doc_tokens),) \
            if docs and first.kept_tokens < first.doc_tokens else ()
        if len(docs) < 2:
            return Layout(first.messages, first.tokens, ((0, len(first.tokens)),), cut)
        key = (*((d.id, d.content_hash) for d in docs), tpl.fingerprint, tpl.n_ctx,
               self.reserve(tpl))
        if key not in self._layouts:
            later = chat_prefix(tpl, first, [(d.title, d.text) for d in docs[1:]],
                                self.room(tpl))
            self._layouts[key] = replace(later, shortened=cut + later.shortened)
        return self._layouts[key]


def document_prefix(tpl: Template, document: tuple[str, str] | None, room: int) -> Prefix:
    """The system prompt and a (title, text) document, cut to fit `room` tokens."""
    if document is None:
        msgs = ({"role": "system", "content": SYSTEM_PROMPT_NO_DOCUMENT},)
        text = tpl.render_chat(msgs, add_generation_prompt=False)
        return Prefix(msgs, text, tuple(tpl.tokenize(text, add_bos=tpl.adds_bos)), 0, 0)
    title, body = document

    def build(cut: str) -> tuple[tuple[dict, ...], str, list[int]]:
        msgs = ({"role": "system", "content": f"{SYSTEM_PROMPT}\n\nDocument: {title}\n\n{cut}"},)
        text = tpl.render_chat(msgs, add_generation_prompt=False)
        return msgs, text, tpl.tokenize(text, add_bos=tpl.adds_bos)

    (msgs, text, tokens), total, kept = fit(tpl, body, build, room)
    return Prefix(msgs, text, tuple(tokens), total, kept)


@dataclass(frozen=True)
class Layout:
    """A chat's prefix: its messages and tokens, and which tokens are which document's."""

    messages: tuple[dict, ...]
    tokens: tuple[int, ...]
    parts: tuple[tuple[int, int], ...]  # per document kept: its [start, end) in `tokens`
    # (title, tokens kept, tokens in all) of each document the context could not hold whole:
    # cut, or left out (none kept)
    shortened: tuple[tuple[str, int, int], ...] = ()
    later: tuple[str, ...] = ()  # what else is said of how the documents are read

    @property
    def notes(self) -> list[str]:
        """What the user is told of the documents cut or left out (said with each answer and
        reopen of the chat, and with each request of the local API), then `later`."""
        return [*(f"{title}: not read in this chat, no room is left for it in the context "
                "beside the documents before it (ask about it in a chat of its own)"
                if not kept else
                f"{title}: only its first {kept:,} of {total:,} tokens are read in this "
                "chat, the rest does not fit the context (a larger context in the settings "
                "reads more of it)"
                for title, kept, total in self.shortened), *self.later]


def chat_prefix(tpl: Template, first: Prefix, more: Sequence[tuple[str, str]],
                room: int) -> Layout:
    """A chat's prefix before its first question: `first` (the first document's prefix, the
    one attach cached), then each further (title, text) document as a system message of its
    own, cut to fit `room` tokens in all; one that cannot fit is left out."""
    msgs, tokens = list(first.messages), list(first.tokens)
    parts, shortened = [(0, len(tokens))], []
    for title, body in more:
        before = tpl.render_chat(msgs, add_generation_prompt=False)

        def build(cut: str, title=title, before=before, msgs=msgs) -> tuple[list, list[int]]:
            added = [*msgs, {"role": "system", "content": f"Document: {title}\n\n{cut}"}]
            rendered = tpl.render_chat(added, add_generation_prompt=False)
            return added, tpl.tokenize(rendered[len(before):])

        (added, delta), total, kept = fit(tpl, body, build, room - len(tokens))
        if kept:
            parts.append((len(tokens), len(tokens) + len(delta)))
            msgs, tokens = added, tokens + delta
        if kept < total:
            shortened.append((title, kept, total))
    return Layout(tuple(msgs), tuple(tokens), tuple(parts), tuple(shortened))


def passage_prefix(tpl: Template, text: str) -> Prefix:
    """A passage's own prefix, the one its KV is computed and keyed by: the passages' system
    prompt and the passage's text, nothing of where it is from, so the same text under the
    same model is one stored entry whichever document holds it."""
    msgs = ({"role": "system", "content": PASSAGE_SYSTEM_PROMPT}, _passage(text))
    rendered = tpl.render_chat(msgs, add_generation_prompt=False)
    n = len(tpl.tokenize(text))
    return Prefix(msgs, rendered, tuple(tpl.tokenize(rendered, add_bos=tpl.adds_bos)), n, n)


# Passages unlike at their start (a letter, a digit, a space, a line break, a mark, code,
# another script): what every passage's prefix holds before them is what all of these share.
_UNLIKE = ("a", "The", "1.", " x", "\nx", "# x", "def f():", "\u65e5\u672c", "\u00c9t\u00e9", "(x)")


def passage_head(tpl: Template) -> tuple[int, ...]:
    """The tokens every passage's own prefix (`passage_prefix`) begins with, whatever its text:
    the passages' system prompt as the template renders it, which their KV can share. A
    passage whose tokens do not begin so (its first characters merged with the template's
    last ones) shares none of it."""
    heads = [passage_prefix(tpl, text).tokens for text in _UNLIKE]
    n = min(len(h) for h in heads)
    n = next((i for i in range(n) if len({h[i] for h in heads}) > 1), n)
    return heads[0][:n]


def passage_layout(tpl: Template, texts: Sequence[str]) -> Layout:
    """A chat's prefix over passages: the first passage's own prefix, then each further one
    as a system message of its own, which its own prefix holds after its copy of the system
    prompt (what `blending` needs to move its cached KV into place)."""
    if not texts:
        msgs = ({"role": "system", "content": PASSAGE_SYSTEM_PROMPT},)
        rendered = tpl.render_chat(msgs, add_generation_prompt=False)
        tokens = tuple(tpl.tokenize(rendered, add_bos=tpl.adds_bos))
        return Layout(msgs, tokens, ((0, len(tokens)),))
    first = passage_prefix(tpl, texts[0])
    msgs, tokens = list(first.messages), list(first.tokens)
    parts = [(0, len(tokens))]
    for text in texts[1:]:
        before = tpl.render_chat(msgs, add_generation_prompt=False)
        msgs.append(_passage(text))
        delta = tpl.tokenize(tpl.render_chat(msgs, add_generation_prompt=False)[len(before):])
        parts.append((len(tokens), len(tokens) + len(delta)))
        tokens += delta
    return Layout(tuple(msgs), tuple(tokens), tuple(parts))


def _passage(text: str) -> dict:
    return {"role": "system", "content": f"Passage:\n\n{text}"}


def question_turn(tpl: Template, messages: Sequence[dict], question: str) -> Turn:
    """`messages` with `question` appended as the user's turn, and that turn's tokens."""
    before = tpl.render_chat(messages, add_generation_prompt=False)
    msgs = (*messages, {"role": "user", "content": question})
    text = tpl.render_chat(msgs, add_generation_prompt=True)
    if not text.startswith(before):
        raise EngineError("this model's chat template rewrites earlier turns; "
                          "kvdesk needs an append-only template")
    return Turn(msgs, text, tpl.tokenize(text[len(before):]))


def with_evidence(question: str, evidence: Sequence[str], absent: Sequence[str] = ()) -> str:
    """What the user's turn says when the passages read hold sentences that name what the
    question asks about (`passages.evidence`): the question, then those sentences as where
    the answer is to come from; and when the question writes names that the documents never
    hold (`absent`), that they are not there and the reply that says so. Worded for the
    models measured (RESULTS.md, "Evidence in the question's turn" and "A name the documents
    never hold"): before the question, some answered nothing at all, and told only the fact,
    they answered from the nearest passage all the same."""
    turn = question
    if evidence:
        turn += "\nAnswer from these lines of the document: " + " ".join(
            f'"{s}"' for s in evidence)
    if absent:
        names = " and ".join(absent)
        turn += (f"\nThe document never mentions {names}. "
                 f'Reply: "The document does not mention {names}."')
    return turn


def raw_prompt(tpl: Template, prompt: str, suffix: str | None = None) -> list[int]:
    """A prompt read as it is, with no chat template (a legacy completion); with a suffix, the
    fill-in-the-middle prompt of the model's own tokens (prefix, suffix, middle: the order
    llama.cpp's infill uses), the texts' look-alikes of special tokens read as text."""
    if suffix is None:
        return tpl.tokenize(prompt, add_bos=tpl.adds_bos)
    fim = tpl.fim_tokens
    if fim is None:
        raise InvalidValue("suffix", "this model has no fill-in-the-middle tokens, so it cannot "
                           "complete between a prompt and a suffix; leave the suffix out")
    pre, suf, mid = fim
    bos = tpl.tokenize("", add_bos=True) if tpl.adds_bos else []
    return [*bos, pre, *tpl.tokenize(prompt, special=False), suf,
            *tpl.tokenize(suffix, special=False), mid]


_ANSWER = "\x00kvdesk-answer\x00"  # where a template writes an assistant message's text


def answer_text(tpl: Template, messages: Sequence[dict]) -> tuple[str, str]:
    """The template text a conversation is answered after, and the answer's given start.

    Ending with a user (or system) message: the template with its generation prompt, and "".
    Ending with the assistant's message: the template up to the end of that message's words,
    which the answer continues (a prefill, as llama.cpp's server and Ollama take it), and
    those words as the template wrote them (an empty one is the generation prompt).
    """
    if messages[-1]["role"] != "assistant":
        return tpl.render_chat(messages, add_generation_prompt=True), ""
    given = messages[-1]["content"]
    if not given.strip():
        return tpl.render_chat(messages[:-1], add_generation_prompt=True), ""
    # Where its words begin, found by a marker in their place (the words themselves might
    # also be written by the template around them: "think" in "<think>").
    marked = tpl.render_chat([*messages[:-1], {"role": "assistant", "content": _ANSWER}],
                             add_generation_prompt=False)
    whole = tpl.render_chat(messages, add_generation_prompt=False)
    if _ANSWER in marked:
        opening = marked[:marked.index(_ANSWER)]
        for words in (given, given.strip()):  # (some templates trim a message)
            if whole.startswith(opening + words):
                return opening + words, words
    raise EngineError("this model's chat template rewrites the assistant's last message, so "
                      "the answer cannot continue it; end the conversation with a user message")


def closing(tpl: Template, turn: Turn, answer: str) -> str:
    """The text the template puts after `answer` to close the turn (e.g. an end-of-turn tag),
    so the next turn appends to the conversation exactly as the template renders it."""
    whole = turn.prefill + answer
    before = turn.messages[:-1] if turn.prefill else turn.messages
    closed = tpl.render_chat([*before, {"role": "assistant", "content": whole}],
                             add_generation_prompt=False)
    tail = closed[len(turn.text) - len(turn.prefill):]
    return tail[len(whole):] if tail.startswith(whole) else ""


def fit(tpl: Template, text: str, build: Callable[[str], tuple], room: int):
    """build(text cut to fit) whose last item, a token list, holds at most `room` tokens.

    Returns (what build returned, the text's token count, how many of them were kept).
    """
    text_tokens = tpl.tokenize(text)
    built, kept = build(text), len(text_tokens)
    while len(built[-1]) > room and kept > 0:
        # Cut the text's tokens by the overflow; the cut text's own tokens can differ by a
        # token or two at the cut, so loop until it fits.
        kept = max(0, kept - (len(built[-1]) - room))
        built = build(_start(tpl, text, kept))
    return built, len(text_tokens), kept


def _start(tpl: Template, text: str, tokens: int) -> str:
    """The longest start of `text` that tokenizes to at most `tokens` tokens: the text as
    written, which detokenizing its first tokens need not give back (the binding's reader gave
    nothing for a token over 32 bytes, a line break and a deep indentation)."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tpl.tokenize(text[:mid])) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def title_of(question: str) -> str:
    """A chat's title from its first question: up to its first 60 characters, on one line,
    cut between words (an export's heading and a saved file's name come from it)."""
    line = " ".join(question.split())
    if len(line) <= 60:
        return line
    cut = line[:58]
    words = cut[:cut.rfind(" ")] if " " in cut[20:] else cut[:57]  # (a long word: cut)
    return words.rstrip(" ,;:.-") + "…"
