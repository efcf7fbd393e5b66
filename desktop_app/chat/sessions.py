"""The chat session: what the chat context holds, and the turns asked in it.

A chat's context is its documents' prefix and its turns, as exact tokens under the loaded model
(`conversation`). `bring_in` makes the context hold them: it keeps what the context already
holds when it matches (the previous turn, a reopen just done, a question typed ahead, the
conversation a client sends whole with its next turn, when no stored prefix goes further),
and otherwise restores the longest stored prefix through the adaptive streaming restore and
recomputes the rest; a chat over several documents whose exact prefix is not stored yet comes
back blended from the documents' own caches (`blending`; never at `lossless`), is never stored
so, and is made exact in the background (`exactness`). `ask` brings the chat in, streams the
answer, stores both messages and the conversation's own KV (extending the document's entry) so
the next question or reopen starts at once; `prepare` computes a question while it is typed;
`reopen` restores a chat and says how. A chat over a document too long for the context is made
of the passages retrieved for its questions instead (`longdoc`), blended from their own caches
the same way. An answer is sampled as `sampling.resolve` says (the caller's options, then the
settings file's, the model file's, kvdesk's defaults) and stopped if it loops (`answers`).

One turn runs at a time in the context (a lock), and in a chat across processes sharing the
data directory (the store's chat turn). It never prints, parses arguments or imports Qt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from store import Document, ReadOnlyError, Store

from ..errors import Cancelled
from ..kv import speeds as speeds_mod
from ..kv import streaming
from ..kv.blending import Blend, Blender, Parts, common_prefix, leading
from ..kv.contexts import CHAT, Contexts
from ..kv.exactprefix import Held
from ..kv.kvcache import KVCache
from ..kv.levels import EXACT, check_levels, stored_by_default
from ..kv.sharing import Sharing
from ..kv.sources import resumes_at, stored_prefix
from ..kv.speeds import Speeds
from ..model import inplace
from ..model.prompts import Prompter, question_turn, title_of, with_evidence
from ..model.prompts import closing as closing_text
from ..model.runtime import Runtime
from ..model.sampling import Sampling, resolve
from ..options import AUTO, GenerationOptions, RestoreOptions
from ..results import AskResult, Progress, RestoreReport, counted
from ..validation import InvalidValue
from .answers import from_first_visible, stream_answer
from .fairlock import FairLock
from .library import Library
from .longdoc import LongDocs
from .turns import check_room, filling, fullness, waited

ProgressFn = Callable[[Progress], None]


class ChatSession:
    def __init__(self, store: Store, contexts: Contexts, library: Library, kv: KVCache,
                 sharing: Sharing, prompter: Prompter, speeds: Speeds, *,
                 levels: Sequence[str], chunk_tokens: int, default_budget_ms: float | None,
                 blend_fraction: float = 1.0,
                 generation_defaults: GenerationOptions = GenerationOptions(),
                 longdocs: LongDocs):
        self.store, self.contexts, self.library, self.kv = store, contexts, library, kv
        self.sharing, self.prompter, self.speeds = sharing, prompter, speeds
        self.levels = tuple(levels)
        self.chunk_tokens = chunk_tokens
        self.default_budget_ms = default_budget_ms  # an "auto" restore's (None: best quality)
        self.generation_defaults = generation_defaults  # the settings file's (unset: None)
        self.lock = FairLock()  # the chat context: one turn at a time, first come first served
        # How the context was restored (None: not by a restore), kept for a question asked
        # the same way; how many of its first tokens came back lossy (never stored again).
        self._loaded: RestoreOptions | None = None
        self.decoded_until = 0
        self.held = Held()  # what it holds as a prefill computes it (kept so at lossless)
        # Chats over several documents: the share of each later document recomputed in place
        # (1: never blend), the blender, where the blended KV begins, who makes it exact.
        self.blend_fraction = blend_fraction
        self.blender = Blender(store, levels, chunk_tokens, kv.calibrations)
        self._blended_at: int | None = None
        self.request_exact: Callable[[int], None] = lambda chat_id: None
        self.exact_later = False  # whether request_exact does (a long-running engine's)
        self.longdocs = longdocs  # chats over documents too long for the context: passages

    @property
    def runtime(self) -> Runtime:
        return self.contexts.get(CHAT)

    def sampling(self, generation: GenerationOptions = GenerationOptions()) -> Sampling:
        """What an answer asked with `generation` is sampled with, and where each value is from."""
        return resolve(generation, settings=self.generation_defaults,
                       model=self.runtime.model_sampling)

    # -- what a chat is --------------------------------------------------------------------

    def conversation(self, rt: Runtime, chat_id: int) -> tuple[list[dict], list[int], list[str]]:
        """The chat's template messages, the exact tokens its context holds under this model,
        and what the user should know about them.

        A message's text is the truth; its tokens are those it was computed with under this
        model. Messages this model has never seen (the chat was written under another one, or
        before tokens were kept per model), or whose tokens were damaged, are tokenized from
        their text as the template renders their turn, and remembered.
        """
        layout = self.longdocs.prefix(rt, chat_id)
        msgs, tokens = list(layout.messages), list(layout.tokens)
        known, fresh = self.store.message_tokens(chat_id, rt.fingerprint), 0
        for m in self.library.history(chat_id):
            msgs.append({"role": m.role, "content": m.text})
            held = known.get(m.id)  # (damaged: none for a text, past the vocabulary, cut short)
            if held is None or not held and m.text or max(held, default=0) >= rt.llm.n_vocab():
                # A question's turn ends with the generation prompt, an answer's is the rest
                # (rendered here alone: rendering the chat for every message was quadratic).
                if m.role == "user":
                    before = rt.render_chat(msgs[:-1], add_generation_prompt=False)
                    turn = rt.render_chat(msgs, add_generation_prompt=True)[len(before):]
                else:
                    asked = rt.render_chat(msgs[:-1], add_generation_prompt=True)
                    turn = rt.render_chat(msgs, add_generation_prompt=False)[len(asked):]
                known[m.id] = rt.tokenize(turn)
                self.store.set_message_tokens(m.id, rt.fingerprint, known[m.id])
                fresh += 1
            tokens += known[m.id]
        notes = [f"{counted(fresh, 'message')} of this chat had no usable tokens under this model "
                 "(written under another model or an older kvdesk, or their stored tokens "
                 "damaged): tokenized again from their text and recomputed"] if fresh else []
        return msgs, tokens, notes + layout.notes + self.library.removed(chat_id)

    # -- bringing a chat into the context --------------------------------------------------

    def bring_in(self, rt: Runtime, chat_id: int | None, tokens: list[int], *,
                 options: RestoreOptions, progress: ProgressFn | None,
                 cancel: threading.Event | None, question: Sequence[int] = (),
                 reuse=True, docs: Sequence[Document] = (), chat=True) -> RestoreReport:
        """Make the context hold exactly `tokens` + `question` (fresh logits after a question).

        What the context already holds is kept when it was loaded the way this call asks for
        and starts with `tokens`, or holds more of them than any stored prefix (and no
        documents' caches are to be blended or fetched); only what it lacks is computed. Tokens
        that begin with the prefix of a chat over several documents `docs`, of which no exact
        copy is stored, come back blended from the documents' own caches (`blending`), made
        exact in the background only for a `chat` (not a local API's prompt)."""
        t0 = time.perf_counter()
        full = [*tokens, *question]
        if reuse and not options.no_cache and options in (RestoreOptions(), self._loaded):
            held = rt.tokens
            keep = common_prefix(held, full)
            # A question needs the logits after its last token: unless the context holds
            # exactly it, freshly evaluated (a draft sent as it was), compute that token.
            if question and not (keep == len(held) == len(full) and rt.has_logits):
                keep = min(keep, len(full) - 1)
            keep = self.held.reuse(rt, tokens, question, keep, options.level == EXACT)
            # (A sliding-window cache may no longer hold what cutting back would need.)
            if keep >= 0 and rt.can_truncate(keep) and (keep >= len(tokens) or (
                    self._held_goes_furthest(rt, tokens, keep, docs if chat else ()))):
                rt.truncate(keep)  # (a client's prompt: as any, not as a chat's)
                self.decoded_until = min(self.decoded_until, keep)
                if self._blended_at is not None and keep <= self._blended_at:
                    self._blended_at = None  # what is kept came back exact
                held, r0 = min(keep, len(tokens)), time.perf_counter()
                rt.prefill(full[keep:], cancel=cancel, progress=None if progress is None else (
                    lambda done, n: progress(Progress("recompute", done, n))))
                return RestoreReport(
                    len(tokens), r0 - t0, 0, [], len(tokens) - held,
                    ["the model already held this conversation: nothing read" if held == len(
                        tokens) else f"the model already held {held:,} of its {len(full):,} "
                     "tokens: nothing read, the rest computed"],
                    recompute_s=time.perf_counter() - r0 if held < len(tokens) else 0.0,
                    blended=self._mode_of(docs, held, len(tokens) - held))
        self._loaded = None  # until the context holds a finished load again
        self.held.computed(None)
        source, notes, fresh = None, [], 0  # fresh: tokens of passages computed for this
        effective = options
        if not options.no_cache:
            if options.level != AUTO:
                check_levels([options.level], restoring=True)
            elif options.budget_ms is None and self.default_budget_ms is not None:
                effective = options.model_copy(update={"budget_ms": self.default_budget_ms})
            parts = (None if options.level == EXACT  # blended KV is never exact
                     else self.blendable(rt, chat_id, tokens, docs, cancel, progress))
            if parts is not None and not (parts.later and self.blender.usable(rt, parts.later)):
                notes, fresh, parts = list(parts.notes), parts.computed_tokens, None
            try:
                if parts is not None:
                    with self.contexts.restoring():
                        report, done = self._blend(rt, parts, tokens, question, docs,
                                                   effective, progress, cancel, chat)
                    self._loaded = options
                    rt.prefill(question[done:], cancel=cancel)
                    return report
            except inplace.Unavailable as e:  # the context is as before, empty
                notes += [f"{e}: the context is computed exactly instead"]
            source, found = self.sharing.source(rt.fingerprint, tokens)
            notes += found
            if source is not None and source.n_tokens and self.contexts.recompute_while_compiling(
                    rt, source.n_tokens, self.speeds, self.levels, notes):
                source = None
        with self.contexts.restoring():
            report = streaming.restore(
                rt, source, tokens, levels=self.levels, options=effective, speeds=self.speeds,
                chunk_tokens=self.chunk_tokens, progress=progress, cancel=cancel,
                calibrations=self.kv.calibrations.resolver(rt.fingerprint))
        notes += [] if options.no_cache else self.library.computed_note(  # (asked: no news)
            chat_id, docs, rt.fingerprint, bool(source), report.recomputed_tokens, len(tokens))
        speeds_mod.save(self.store, self.speeds)
        self._blended_at = None
        self._loaded = None if options.no_cache else options
        self.decoded_until = report.lossy_tokens
        rt.prefill(question, cancel=cancel)
        self.held.computed(tokens if options.no_cache or options.level == EXACT else None, question)
        n = min(len(tokens), report.recomputed_tokens + fresh)  # (a passage computed for it counts)
        return replace(report, recomputed_tokens=n, messages=[*notes, *report.messages],
                       blended=self._mode_of(docs, len(tokens) - n, n))

    def _held_goes_furthest(self, rt: Runtime, tokens: list[int], keep: int,
                            docs: Sequence[Document]) -> bool:
        """Whether the `keep` tokens the context holds of `tokens` are the most of them any
        cache here holds. Not with documents (a chat's: theirs are read or blended), a long
        document's passages offered to a client's request, or a shared cache to look in."""
        if keep <= 0 or docs or self.longdocs.offering or self.sharing.auto_pull:
            return False
        stored = stored_prefix(self.store, rt.fingerprint, tokens, touch=False)
        return stored.n_tokens + stored.tail_match <= keep

    def blendable(self, rt: Runtime, chat_id: int | None, tokens: list[int],
                   docs: Sequence[Document], cancel: threading.Event | None, progress=None):
        """The layout and later parts' entries of a chat over passages (`longdoc`) or several
        documents that `tokens` start with (whether the blender can use them: the caller's)."""
        # (A chunked-window model's runs cannot be computed between its parts: `blending`.)
        if self.blend_fraction >= 1 or rt.layout.swa_chunked:
            return None
        found = self.longdocs.blendable(rt, chat_id, tokens, cancel, progress)
        if found is not None or len(docs) < 2 or self.longdocs.applies(docs):
            return found
        layout = self.prompter.layout(rt, docs)
        n = len(layout.tokens)
        if len(layout.parts) < 2 or tuple(tokens[:n]) != layout.tokens:
            return None
        if resumes_at(self.store, rt.fingerprint, tokens, bool(rt.layout.swa_layers)) >= n:
            return None  # the exact prefix is stored (a chat's own entry, or a prompt's)
        levels = stored_by_default(self.levels, rt, self.kv.calibrations)  # (as attach's)
        return Parts(layout, **self.sharing.later_documents(  # (here, or from the bucket)
            rt, self.prompter, docs[:len(layout.parts)], levels, progress))

    def _blend(self, rt, parts, tokens, question, docs, options, progress, cancel, chat
               ) -> tuple[RestoreReport, int]:
        """(The report, how many of `question`'s tokens the context holds after the blend.)"""
        layout = parts.layout
        source, found = self.sharing.source(rt.fingerprint, layout.tokens[:layout.parts[0][1]])
        notes = [*parts.notes, *found]
        full = [*tokens, *question]  # (its last token is computed after: the answer's logits)
        report, blend = self.blender.restore(
            rt, layout, parts.later, source, options=options, speeds=self.speeds,
            select=leading(self.blend_fraction), after=full[len(layout.tokens):-1],
            progress=progress, cancel=cancel, pulled=parts.pulled)
        rest, done = tokens[blend.assembled:], max(0, blend.assembled - len(tokens))
        r0 = time.perf_counter()
        rt.prefill(rest, cancel=cancel)
        report = replace(report, recompute_s=report.recompute_s + time.perf_counter() - r0)
        speeds_mod.save(self.store, self.speeds)
        self._blended_at, self.decoded_until = blend.exact_until, len(tokens)  # (all lossy)
        cached = (source is not None) + sum(e is not None for e in parts.later)
        notes.append(blend.note(len(layout.parts), parts.what, self.exact_later and chat, cached))
        # (passages computed for it count, and quotes taken from them; the question does not)
        computed = (report.recomputed_tokens + len(rest) + parts.computed_tokens
                    - blend.computed_in(len(tokens), blend.assembled)
                    + (blend.assembled_in(len(layout.tokens), len(tokens))
                       if parts.computed_tokens else 0))
        return replace(report, tokens=len(tokens), recomputed_tokens=min(computed, len(tokens)),
                       messages=[*notes, *report.messages], blended=blend.as_dict()), done

    def _mode_of(self, docs: Sequence[Document], reused: int, recomputed: int) -> dict | None:
        """The `blended` field of a report on a chat over several documents or passages."""
        mode = "exact" if self._blended_at is None else "blended"
        many = len(docs) > 1 or self.longdocs.applies(docs)
        return Blend(reused, recomputed, mode).as_dict() if many else None

    @property
    def blended(self) -> bool:
        """Whether the context holds blended (approximate) KV: never to be stored."""
        return self._blended_at is not None

    def exact_stored(self, chat_id: int) -> None:
        """The background pass stored chat `chat_id`'s exact context: a blended context loaded
        now is not kept for the next question."""
        if self._blended_at is not None:
            self._loaded = None

    def reopen(self, chat_id: int, *, restore: RestoreOptions = RestoreOptions(),
               progress: ProgressFn | None = None, cancel=None) -> RestoreReport:
        """Restore a chat's whole context, ready for the next question."""
        self.library.chat(chat_id)
        with self.lock:
            self.contexts.warm_up()  # its kernels load while the model does
            rt, docs = self.runtime, self.library.chat_documents(chat_id)  # (before its tokens)
            _, tokens, notes = self.conversation(rt, chat_id)
            # An explicit reopen always restores: it is how a restore is asked for and timed.
            report = self.bring_in(rt, chat_id, tokens, options=restore, progress=progress,
                                   cancel=cancel, reuse=False, docs=docs)
            kept, kept_notes = self.sharing.keep(exact=self.decoded_until == 0)
            kept_notes += self._keep(rt, chat_id, tokens, kept and report.recomputed_tokens > 0,
                                     docs) + fullness(rt.n_ctx, len(tokens), docs)
            return replace(report, messages=[*notes, *report.messages, *kept_notes])

    def prepare(self, draft: str, *, chat_id: int | None = None, doc_ids: Sequence[int] = (),
                restore: RestoreOptions = RestoreOptions(),
                cancel: threading.Event | None = None) -> RestoreReport | None:
        """Get ready for a question still being typed (`draft`, in `chat_id`, or in a chat
        about `doc_ids` not created yet): bring its context into the model and compute the
        draft as the question's turn, so that when the question is sent only what changed
        since is left to compute (nothing, if the user paused before sending).

        Nothing is stored, and `ask` keeps only what matches the question finally sent.
        Returns the restore's report when this call restored the context, else None (also
        when cancelled: a newer draft supersedes it).
        """
        with self.lock:
            if cancel is not None and cancel.is_set():
                return None
            self.contexts.warm_up()  # its kernels load while the model does
            rt = self.runtime
            docs = self.library.documents_of(chat_id, doc_ids)
            if self.longdocs.draft_waits(rt, chat_id, docs):
                return None  # (its passages are retrieved for the question it asks)
            msgs, context, _ = self._context(rt, chat_id, docs)
            # The draft is computed as if sent now, template tokens included: sent unchanged,
            # its first token comes at once; edited, the context is cut back to what matches.
            turn = question_turn(rt, msgs, draft.strip())
            if len(context) + len(turn.tokens) + 1 >= rt.n_ctx:
                return None
            try:
                report = self.bring_in(rt, chat_id, context, options=restore, progress=None,
                                       cancel=cancel, question=turn.tokens, docs=docs)
            except Cancelled:
                return None
            return report if report.chunk_levels else None

    # -- asking ----------------------------------------------------------------------------

    def ask(self, question: str, *, chat_id: int | None = None, doc_ids: Sequence[int] = (),
            restore: RestoreOptions = RestoreOptions(),
            generation: GenerationOptions = GenerationOptions(),
            on_token: Callable[[str], None] | None = None,
            on_restore: Callable[[RestoreReport], None] | None = None,
            progress: ProgressFn | None = None, cancel: threading.Event | None = None) -> AskResult:
        """One turn: restore the chat (a new one about `doc_ids` if chat_id is None, stored
        with its first answer: a refused or killed question leaves no empty chat), ask,
        stream the answer, store it (stopped before its first visible character: Cancelled,
        nothing stored)."""
        t0 = time.perf_counter()  # the time to first token counts from here
        question = question.strip()
        if not question:
            raise InvalidValue("question", "it is empty")
        if restore.level != AUTO and not restore.no_cache:
            check_levels([restore.level], restoring=True)  # before any work
        if chat_id is None:  # a new chat: stored with its first answer, or not at all
            doc_ids = [self.library.document(d).id for d in dict.fromkeys(doc_ids)]
        else:
            self.library.name_untitled(chat_id, title_of(question))
        with self.lock, waited(self.store.chat_turn, chat_id, cancel=cancel,
                                  progress=progress):
            self.contexts.warm_up()  # its kernels load while the model does
            rt = self.runtime
            # A long document's passages for this question (a new chat's: its pending ones)
            docs = self.library.documents_of(chat_id, doc_ids)
            picked = self.longdocs.choose(rt, chat_id, question, docs)
            msgs, context, notes = self._context(rt, chat_id, docs)
            quoted, absent = self.longdocs.quoted(rt, chat_id, docs, question)
            turn = question_turn(rt, msgs, with_evidence(question, quoted, absent))
            sampling = self.sampling(generation).options
            check_room(rt.n_ctx, len(context), len(turn.tokens), chat_id, docs, sampling.max_tokens)
            report = self.bring_in(rt, chat_id, context, options=restore, progress=progress,
                                   cancel=cancel, question=turn.tokens, docs=docs)
            notes += streaming.adaptation_note(report, sampling)
            report = replace(report, messages=[*picked, *notes, *report.messages])
            if on_restore:
                on_restore(report)
            out = stream_answer(rt, sampling, t0, from_first_visible(on_token), cancel)
            if cancel is not None and cancel.is_set() and not out.text.strip():
                raise Cancelled("stopped before the answer began: nothing is stored")
            generated, answer, ttft = out.tokens, out.text, out.ttft
            # Close the turn as the template would, so the next turn appends to it exactly.
            suffix = closing_text(rt, turn, answer)
            suffix_tokens = rt.tokenize(suffix) if suffix else []
            if suffix_tokens and rt.n_tokens + len(suffix_tokens) <= rt.n_ctx:
                rt.prefill(suffix_tokens)
            else:
                suffix_tokens = []
            # After the answer, not before its first token: what streamed from the shared
            # cache becomes the local entry this chat's own entry will extend. Not kept, only
            # a context held exactly (none read back lossy) is stored, as computed here.
            kept, kept_notes = self.sharing.keep(exact=self.decoded_until == 0)
            messages = [*report.messages, *kept_notes, *out.notes,
                        *([] if kept else ["this turn's cache is not stored"]),
                        *filling(rt.n_ctx, len(context), rt.n_tokens, docs)]
            result = AskResult(
                chat_id=chat_id or 0, answer=answer.strip(), model=rt.model_path.name,
                ttft_s=round(ttft if ttft is not None else time.perf_counter() - t0, 4),
                restore_s=round(report.restore_s, 4), recompute_s=round(report.recompute_s, 4),
                bytes_read=report.bytes_read, chunk_levels=report.chunk_levels,
                recomputed_tokens=report.recomputed_tokens, tokens_generated=len(generated),
                messages=messages, source=report.source, documents=[d.id for d in docs],
                blended=report.blended, finish_reason="length" if out.cut else "cancelled" if (
                    cancel is not None and cancel.is_set()) else "stop",
                evidence=quoted, **self.longdocs.cited(rt, chat_id, docs))
            stats = {k: v for k, v in result.as_dict().items()
                     if k not in ("answer", "chat_id", "stored")}
            # Both messages are stored after the answer, in one transaction: a durable write
            # (fsync) before the first token would only delay it; a turn stopped earlier: neither.
            answer_tokens = generated + suffix_tokens
            new = chat_id is None
            try:
                chat_id = self.library.add_turn(
                    chat_id, question, result.answer, docs=docs, stats=stats,
                    model=rt.fingerprint, question_tokens=turn.tokens, answer_tokens=answer_tokens)
            except ReadOnlyError as e:  # (full, gone, damaged) the answer was shown: it stands
                return replace(result, messages=[*result.messages, str(e)], stored=False)
            if new:
                self.longdocs.adopt(chat_id)
            not_kept = self._keep(rt, chat_id, context + turn.tokens + answer_tokens, kept, docs)
            return replace(result, chat_id=chat_id, messages=[*result.messages, *not_kept])

    def regenerate(self, chat_id: int, **options) -> AskResult:
        """Ask the last question again: its new turn replaces the last one once stored."""
        self.library.chat(chat_id)
        with self.lock, waited(self.store.chat_turn, chat_id, cancel=options.get("cancel"),
                                  progress=options.get("progress")):
            turn = self.library.last_turn(chat_id)
            with self.library.superseding(chat_id, [m.id for m in turn]):
                return self.ask(turn[0].text, chat_id=chat_id, **options)

    def _context(self, rt: Runtime, chat_id: int | None, docs: Sequence[Document]
                 ) -> tuple[list[dict], list[int], list[str]]:
        """A chat's messages, tokens and notes (`conversation`); of none yet, its `docs`'."""
        if chat_id is None:
            layout = self.longdocs.prefix(rt, None, docs)
            return list(layout.messages), list(layout.tokens), layout.notes
        return self.conversation(rt, chat_id)

    def _keep(self, rt: Runtime, chat_id: int, tokens: list[int], store: bool, docs) -> list[str]:
        """Store the chat's KV over `docs` (read before its tokens), if asked and held exactly
        (a blended one: made exact in the background). What stopped or evicted for it, said."""
        if self._blended_at is not None:
            self.request_exact(chat_id)
        elif store:
            return self.kv.keep_chat(rt, chat_id, tokens, self.longdocs.first_document(
                rt, chat_id), self.decoded_until, [d.id for d in docs])
        return []
