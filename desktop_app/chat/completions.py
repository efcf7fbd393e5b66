"""Completions for any client: a conversation given whole, answered with a persistent prompt
cache (what the local OpenAI-compatible API serves).

A client sends every message each time. They are rendered with the model's chat template
(after the kvdesk documents the request names, as a kvdesk chat would start), the longest
prefix of the tokens that the store holds — a document's entry, an earlier turn of the same
conversation, a long shared system prompt — comes back through the adaptive streaming
restore, only the rest is computed, and the conversation's KV (the answer included) is stored
as an entry extending that prefix. So the next request of the conversation, after a restart
too, starts at once. A prompt with no stored prefix at all is kept only from
`min_cache_tokens` tokens on: short one-off prompts cost little to compute and would only
churn the cache. The store's quota and eviction apply as to every entry.

A prompt may also come as it is (`RawPrompt`: a legacy text completion, with no chat template;
with a suffix, fill-in-the-middle where the model has the tokens for it): the same cache holds
it, extended by its answer.

It runs in the chat context, one turn at a time in arrival order, beside the window's chats; a
request whose text has more bytes than the context could hold tokens of (`llamacalls.
longest_piece`) is refused before its turn, not after seconds of tokenizing it in the queue
(of a conversation its caller trims to fit, the last message: the rest is measured to cut).
It never touches chats or messages: a client's conversation lives in the client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from store import Document

from ..errors import ContextFullError, EngineError, MissingError
from ..kv.blending import common_prefix
from ..kv.sources import LocalSource
from ..kv.streaming import adaptation_note, resume_points
from ..model import llamacalls
from ..model.answerformat import AnswerFormat
from ..model.prompts import Turn, answer_text, closing, raw_prompt, with_evidence
from ..options import GenerationOptions, RestoreOptions
from ..results import Completion, RestoreReport, Source
from ..tools import RESULT
from ..validation import InvalidValue
from .answers import StopStrings, from_first_visible, stream_answer
from .sessions import ChatSession

ROLES = ("system", "user", "assistant")
# Bytes a token of the context below which a request is not looked at before its turn (real
# vocabularies' longest tokens stand for 30-80 bytes; text averages about 4), and the least
# context a setting allows.
SURELY_FITS = 16
MIN_CONTEXT = 256
# A request that must leave room for its answer (`complete`'s leave_room) leaves the longest
# answer asked for, at most 1/ROOM_SHARE of the context: the rest is the conversation's.
ROOM_SHARE = 4


@dataclass(frozen=True)
class RawPrompt:
    """A prompt to continue as it is, no chat template; with `suffix`, the text between."""

    prompt: str
    suffix: str | None = None


class _Either:
    """Set when either event is (a client's cancel, or a stop string seen)."""

    def __init__(self, *events: threading.Event | None):
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


class Completions:
    def __init__(self, session: ChatSession, *, min_cache_tokens: int = 1024):
        self.session = session
        self.min_cache_tokens = min_cache_tokens
        self._longest: dict[str, int] = {}  # model fingerprint -> `llamacalls.longest_piece`

    def surely_too_long(self, messages: Sequence[dict] | RawPrompt) -> None:
        """Refuse, before it is tokenized, a request whose text has more tokens than the
        context holds whatever they are: more bytes than its longest tokens could take. (A
        text under SURELY_FITS bytes a token of the context is let through unlooked-at: the
        vocabulary's longest token is read only for the rare text that could need it.)"""
        texts = ([messages.prompt, messages.suffix or ""] if isinstance(messages, RawPrompt)
                 else [m.get("content") for m in messages if isinstance(m, dict)])
        size = sum(len(t.encode("utf-8", "replace")) for t in texts if isinstance(t, str))
        if size < SURELY_FITS * MIN_CONTEXT:
            return
        rt = self.session.runtime
        if size < SURELY_FITS * rt.n_ctx:
            return
        if rt.fingerprint not in self._longest:
            self._longest[rt.fingerprint] = llamacalls.longest_piece(rt.llm)
        fewest = -(-size // self._longest[rt.fingerprint])
        if fewest + 1 >= rt.n_ctx:
            raise ContextFullError(
                f"the prompt has at least {fewest:,} tokens ({size:,} bytes); the context "
                f"holds {rt.n_ctx:,} with room to answer",
                "prompt" if isinstance(messages, RawPrompt) else "messages")

    def documents(self, ids: Sequence[int]) -> list[Document]:
        """A request's documents (one named twice is read once), refused by their field."""
        try:
            return [self.session.library.document(d) for d in dict.fromkeys(ids)]
        except MissingError as e:
            raise MissingError(str(e), field="kvdesk.documents") from None

    def prompt(self, messages: Sequence[dict], docs: Sequence[Document] = (), room: int = 0
               ) -> tuple[Turn, list[Source], list[str], list[str], list[dict]]:
        """The request's messages after its documents' prefix, rendered and tokenized; the
        passages that prefix is made of when a document is too long for the context (for
        the messages, the last ones the query: `longdoc`); what the last user message's turn
        quotes of them (`longdoc.evidence`); notes; the documents read whole beside them
        (`longdoc.named`). Both are offered to the restore that follows (`longdoc.offer`)."""
        given = len(messages)
        for m in messages:
            if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise EngineError("each message needs a role (system, user or assistant) and "
                                  "text content")
        if messages and messages[-1]["role"] == "assistant" and \
                not messages[-1]["content"].strip():
            messages = messages[:-1]  # an empty start of the answer: none given
        if not any(m["role"] != "assistant" for m in messages):
            raise InvalidValue("messages", "the conversation needs a user (or system) message")
        s = self.session
        rt = s.runtime
        head, head_tokens, sources, wholes, quoted, notes = [], [], [], [], [], []
        split = s.longdocs.readings.split_where_needed(rt, docs)
        if docs and s.longdocs.applies(docs):
            texts = [m["content"] for m in messages]
            asking = [i for i, m in enumerate(messages) if m["role"] != "assistant"]
            # the question a given answer start follows; not a tool's result (an agent's
            # history: its passages are the question's, not the call's or the result's words)
            ask = max((i for i in asking if not messages[i].get(RESULT)),
                      default=asking[-1] if asking else len(texts) - 1)
            earlier = messages[:ask]
            sources, notes = s.longdocs.pick(
                rt, docs, texts[ask], texts[:ask] + texts[ask + 1:],
                # (their template's tokens; and the answer's room beyond what the passages
                # always leave: else a history trimmed for it is refilled with passages)
                len(rt.tokenize("\n".join(texts))) + 8 * len(texts)
                + max(0, room - s.prompter.reserve(rt)),
                # as a chat keeps its turns'
                kept=(lambda: s.longdocs.asked_before(docs, earlier)) if any(
                    m["role"] == "user" for m in earlier) else None)
            wholes = s.longdocs.wholes(rt, docs)
            layout = s.longdocs.laid_out(rt, wholes, sources)
            head, head_tokens = list(layout.messages), list(layout.tokens)
            if messages[ask]["role"] == "user":  # its evidence, as a chat's question has
                asked = [m["content"] for m in earlier if m["role"] == "user"]
                quoted, absent = s.longdocs.evidence(docs, wholes, sources,
                                                     messages[ask]["content"],
                                                     asked[-1] if asked else "")
                messages = [*messages[:ask], {**messages[ask], "content": with_evidence(
                    messages[ask]["content"], quoted, absent)}, *messages[ask + 1:]]
        elif docs:
            layout = s.prompter.layout(rt, docs)
            head, head_tokens = list(layout.messages), list(layout.tokens)
            notes = layout.notes
        before = rt.render_chat(head, add_generation_prompt=False) if head else ""
        msgs = (*head, *({"role": m["role"], "content": m["content"]} for m in messages))
        text, prefill = answer_text(rt, msgs)
        if not text.startswith(before):
            raise EngineError("this model's chat template rewrites earlier messages; kvdesk "
                              "needs an append-only template")
        rest = text[len(before):]
        tokens = head_tokens + rt.tokenize(rest, add_bos=rt.adds_bos and not head)
        s.longdocs.offer(sources, wholes)
        if len(tokens) + 1 + room >= rt.n_ctx:
            own = [len(rt.tokenize(m["content"])) for m in messages]
            each = max(0, len(tokens) - len(head_tokens) - sum(own)) / len(own)  # the template
            raise _too_long(rt, len(tokens), "messages", over=len(tokens) + 2 + room - rt.n_ctx,
                            sizes=(*(n + each for n in own), *[0.0] * (given - len(own))),
                            own=(*own, *[0] * (given - len(own))),
                            space=rt.n_ctx - len(head_tokens))
        return (Turn(msgs, text, tokens, prefill), sources, quoted, [*split, *notes],
                s.longdocs.named(wholes))

    def complete(
        self,
        messages: Sequence[dict] | RawPrompt,
        *,
        documents: Sequence[int] = (),
        restore: RestoreOptions = RestoreOptions(),
        generation: GenerationOptions = GenerationOptions(),
        stop: Sequence[str] = (),
        on_token: Callable[[str], None] | None = None,
        on_restore: Callable[[RestoreReport], None] | None = None,
        on_answered: Callable[[Completion], None] | None = None,
        on_start: Callable[[], None] | None = None,
        cancel: threading.Event | None = None,
        leave_room: bool = False,
        answer_format: AnswerFormat | None = None,
    ) -> Completion:
        """Answer the conversation; `on_start` hears that the request is taken (its documents
        found, its prompt within the context), before the restore; `on_answered` hears the
        completion as soon as it is known, before its KV is stored (the call returns after).
        `leave_room`: a conversation must leave its answer room (the longest answer asked
        for, at most 1/ROOM_SHARE of the context), else it is refused as too long
        (`ContextFullError`, measured): for a caller that leaves old messages out to fit
        (`server.ollama.fitted`), so that it leaves out enough for an answer too, the context
        not shifting as the answer grows; it is measured whatever its length, its last
        message alone refused by its bytes before its turn. `answer_format`: the answer is
        held to its grammar (JSON: `answerformat.AnswerFormat`), one llama.cpp cannot parse
        refused by its field before the turn starts; the prompt, and so what is cached, is
        the same with it or without."""
        t0 = time.perf_counter()
        s = self.session
        # Before its turn in the queue. A conversation that leaves room is one its caller
        # trims (`fitted`): its last message only, never left out; the rest is measured, so
        # that it is cut where it would be at any length (a tokenizing: 0.12 s for 121k).
        self.surely_too_long(messages[-1:] if leave_room and not isinstance(
            messages, RawPrompt) else messages)
        with s.lock:
            s.contexts.warm_up()  # its kernels load while the model does
            rt = s.runtime
            if isinstance(messages, RawPrompt):
                if documents:
                    raise InvalidValue("documents", "a prompt given as it is has no chat to "
                                       "put them in; use chat completions for them")
                turn = Turn((), messages.prompt,
                            raw_prompt(rt, messages.prompt, messages.suffix))
                sources, quoted, picked, whole, docs = [], [], [], [], []
                s.longdocs.offer((), ())
            else:
                docs = self.documents(documents)
                room = min(s.sampling(generation).options.max_tokens,
                           rt.n_ctx // ROOM_SHARE) if leave_room else 0
                turn, sources, quoted, picked, whole = self.prompt(messages, docs, room)
            if not turn.tokens:
                raise InvalidValue("prompt", "it is empty")
            prompt = turn.tokens
            if len(prompt) + 1 >= rt.n_ctx:  # (a conversation's is refused by `prompt`)
                raise _too_long(rt, len(prompt), "prompt")
            if answer_format:
                _check_format(rt, answer_format, turn)
            if on_start:
                on_start()
            first = None if docs else self._system_first(rt, turn, restore, cancel)
            # (several documents come back blended from their own caches, as a chat's do; a
            # document cached under another model only is said, as a chat says it)
            report = s.bring_in(rt, None, prompt[:-1], options=restore, progress=None, chat=False,
                                cancel=cancel, question=prompt[-1:], docs=docs)
            if first is not None:
                report = _joined(*first, report)
            if on_restore:
                on_restore(report)
            # A chat's answer reaches the client from its first visible character, streamed
            # or whole, as kvdesk's own chats show it: a base model asked "...Answer:" writes a
            # space first. A prompt continued as it is, or a prefill, keeps it: there it is text.
            trim = not isinstance(messages, RawPrompt) and not turn.prefill
            stops = StopStrings(stop, from_first_visible(on_token) if trim else on_token)
            stopped = threading.Event()

            def token(text: str) -> None:
                if stops.feed(text):
                    stopped.set()  # the generation ends after this token

            sampling = s.sampling(generation).options
            out = stream_answer(rt, sampling, t0, token, _Either(cancel, stopped),
                                chat=not isinstance(messages, RawPrompt),
                                grammar=answer_format and answer_format.grammar)
            generated, ttft = out.tokens, out.ttft
            text = stops.finish()
            if stopped.is_set():
                finish = "stop"
            elif cancel is not None and cancel.is_set():
                finish = "cancelled"
            else:  # ended, ran to its limit, or stopped going round in circles (said)
                finish = "length" if out.cut else "stop"
            cached = report.tokens - report.recomputed_tokens
            kept, notes = s.sharing.keep(exact=s.decoded_until == 0)
            result = Completion(text.lstrip() if trim else text, finish, len(prompt),
                                len(generated),
                                round(ttft if ttft is not None else time.perf_counter() - t0, 4),
                                report, cached, False,
                                [*picked, *report.messages, *notes, *out.notes,
                                 *adaptation_note(report, sampling)],
                                [x.as_dict() for x in sources], quoted, whole)
            if on_answered:
                on_answered(result)
            # A blended prompt (a long document's passages) is approximate: never stored.
            stored, said = (self._store(rt, turn, text, documents) if kept and not s.blended
                            else (False, []))
            # (a damaged shared entry's note says the context is stored instead: only if it is)
            return replace(result, stored=stored, messages=[
                *(result.messages if stored else s.sharing.unstored(result.messages)), *said])

    def _system_first(self, rt, turn: Turn, restore: RestoreOptions,
                      cancel: threading.Event | None) -> tuple[RestoreReport, list[str]] | None:
        """A sliding-window model resumes only where a stored entry ends (its window is kept
        there): requests that share a long system prompt and part after it could never resume
        where they part. So a request whose restore cannot reach its system prompt's end
        brings that prompt in first and stores it as an entry of its own, which the next
        request with it resumes from: (that part's report, what storing it said), or None."""
        s, lay = self.session, rt.layout
        system = [m for m in turn.messages[:len(turn.messages) - 1] if m["role"] == "system"]
        # (not where the rest would not start from the prompt held: computed from text, or a
        # shared cache to look in first)
        if not lay.swa_layers or lay.swa_chunked or not system or restore.no_cache or \
                s.sharing.auto_pull or turn.messages[:len(system)] != tuple(system):
            return None
        tokens = rt.tokenize(rt.render_chat(system, add_generation_prompt=False),
                             add_bos=rt.adds_bos)
        end = len(tokens)
        if end < self.min_cache_tokens or turn.tokens[:end] != tokens or \
                common_prefix(rt.tokens, tokens) == end:  # (held: nothing to compute)
            return None
        stored = resume_points(LocalSource(s.store, rt.fingerprint, turn.tokens, touch=False),
                               lay)
        if stored and stored[0] >= end:
            return None
        first = s.bring_in(rt, None, tokens, options=restore, progress=None, chat=False,
                           cancel=cancel)
        kept, said = s.kv.keep_prefix(rt, tokens, s.decoded_until)
        return first, said + ([f"its system prompt ({end:,} tokens) is now stored on its "
                               "own, so the next request that starts with it skips computing "
                               "it (this model picks up a stored cache only where one was "
                               "saved)"] if kept else [])

    def _store(self, rt, turn: Turn, text: str, documents: Sequence[int]
               ) -> tuple[bool, list[str]]:
        """Keep the conversation's KV (answer and the template's closing of it included) over
        `documents`, when it extends a stored prefix or is long enough to be worth it on its
        own; whether it is kept, and what it evicted, a full disk or a document deleted
        meanwhile, said."""
        s = self.session
        prefix = s.store.longest_prefix(rt.fingerprint, turn.tokens, touch=False)
        if prefix.n_tokens == 0 and len(turn.tokens) < self.min_cache_tokens:
            return False, []
        suffix = closing(rt, turn, text) if turn.messages else ""  # a raw prompt: as it is
        suffix_tokens = rt.tokenize(suffix) if suffix else []
        if suffix_tokens and rt.n_tokens + len(suffix_tokens) <= rt.n_ctx:
            rt.prefill(suffix_tokens)
        return s.kv.keep_prefix(rt, rt.tokens, s.decoded_until, holds=documents)


def _check_format(rt, answer_format: AnswerFormat, turn: Turn) -> None:
    """Refuse, by its field, a format whose grammar llama.cpp cannot parse, or one asked of a
    prefill: the grammar holds a whole answer, and would start it again after those words."""
    if turn.prefill:
        raise InvalidValue(answer_format.field, "the conversation ends with the assistant's "
                           "own words, which the answer would continue; a format holds a "
                           "whole answer: leave out one or the other")
    if not llamacalls.grammar_parses(rt.llm._model.vocab, answer_format.grammar):
        raise InvalidValue(answer_format.field, "llama.cpp could not parse the grammar made "
                           "of it")


def _joined(first: RestoreReport, said: list[str], then: RestoreReport) -> RestoreReport:
    """The report of a prompt brought in two steps, the second keeping what the first did."""
    return replace(then, restore_s=first.restore_s + then.restore_s,
                   bytes_read=first.bytes_read + then.bytes_read,
                   chunk_levels=first.chunk_levels + then.chunk_levels,
                   recomputed_tokens=min(then.tokens,
                                         first.recomputed_tokens + then.recomputed_tokens),
                   recompute_s=first.recompute_s + then.recompute_s, source=first.source,
                   adapted_chunks=first.adapted_chunks + then.adapted_chunks,
                   messages=[*first.messages, *said, *(m for m in then.messages
                                                        if not m.startswith("the model already"))])


def _too_long(rt, tokens: int, field: str, **measured) -> ContextFullError:
    return ContextFullError(f"the prompt has {tokens:,} tokens; the context holds "
                            f"{rt.n_ctx:,} with room to answer", field, **measured)
