"""The engine: kvdesk's flows — attach documents, ask, reopen chats — on model, codec and store.

Attach extracts a file's text, builds the prefix every chat about it starts with (the system
prompt and the document through the model's chat template), prefills it once, encodes its KV
at every configured codec level and stores it. Ask and reopen bring a chat's whole prefix back
through the streaming restore (`streaming`), append the question, stream the answer, and store
the conversation's own KV as an entry extending the document's, so the next question or the
next reopen starts at once.

The engine holds two model contexts, created on first use: one for chats and one for
attaching, so a GUI can compute documents on one worker while the user chats on another.
Every method blocks; progress, tokens and cancellation go through callbacks and a
threading.Event. It never prints, never parses arguments and never imports Qt.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import codec
from store import Document, NotFoundError, RemoteTier, Store

from . import documents, streaming
from .kvstate import in_position_order
from .results import (
    AskResult,
    AttachResult,
    ChatInfo,
    DocumentInfo,
    MessageInfo,
    Progress,
    RestoreEstimate,
    RestoreReport,
)
from .runtime import Cancelled, Runtime
from .sharing import Sharing

SYSTEM_PROMPT = (
    "You are kvdesk, a careful assistant. Answer questions about the document below "
    "accurately and concisely, quoting it where it helps."
)
SYSTEM_PROMPT_NO_DOCUMENT = "You are kvdesk, a careful and concise assistant."
# The levels a document is stored at, best quality first: every named level, so that the
# streaming restore can choose per chunk. CacheGen's bins are for comparisons (--levels).
DEFAULT_LEVELS = ("lossless", "high", "balanced", "compact")
QUALITY_ORDER = ("lossless", "high", "cachegen-3", "balanced", "cachegen-2", "compact",
                 "cachegen-1")
DEFAULT_CHUNK_TOKENS = 256
UNTITLED = "New chat"  # until the first question names it
SPEEDS_SETTING = "engine.speeds"

ProgressFn = Callable[[Progress], None]


class EngineError(ValueError):
    """A request the engine cannot serve: an unknown document or chat, a bad level..."""


@dataclass(frozen=True)
class Prefix:
    """What every chat about a document starts with."""

    messages: list[dict]  # the system message, for the chat template
    text: str  # the rendered template
    tokens: list[int]
    doc_tokens: int  # the document's own token count (all of it)
    kept_tokens: int  # how many of them are in the prefix


def quality_order(levels: Sequence[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(QUALITY_ORDER)}
    return sorted(dict.fromkeys(levels), key=lambda lvl: (rank.get(lvl, len(rank)), lvl))


class Engine:
    def __init__(
        self,
        store: Store,
        runtime_factory: Callable[[], Runtime],
        *,
        model_path: str = "",
        levels: Sequence[str] = DEFAULT_LEVELS,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        reserve_tokens: int | None = None,
        default_budget_ms: float | None = None,
        remote: RemoteTier | None = None,
        auto_push: bool = False,
        auto_pull: bool = True,
    ):
        self._check_levels(levels)
        self.store = store
        # The shared cache tier (off without `remote`): where restores look on a local miss,
        # and where attach looks before prefilling and shares what it computed.
        self.sharing = Sharing(store, remote, auto_push=auto_push, auto_pull=auto_pull)
        self._factory = runtime_factory
        self._model_path = model_path
        self.levels = tuple(quality_order(levels))
        self.chunk_tokens = chunk_tokens
        self._reserve = reserve_tokens
        # The budget of an "auto" restore when the caller gives none (None: best quality).
        self.default_budget_ms = default_budget_ms
        self._chat_lock = threading.RLock()
        self._attach_lock = threading.RLock()
        self._runtimes: dict[str, Runtime] = {}
        self._prefixes: dict[tuple, Prefix] = {}
        self._runtimes_lock = threading.Lock()
        self._warm_up: threading.Thread | None = None
        # How the chat context's current content was restored (None: not by a restore), so
        # a question asked the same way keeps it instead of restoring it again.
        self._loaded_options: streaming.Options | None = None
        saved = store.setting(SPEEDS_SETTING) or {}
        self.speeds = streaming.Speeds(
            decode_MBps=dict(saved.get("decode_MBps", {})),
            read_MBps=saved.get("read_MBps", streaming.DEFAULT_READ_MBPS),
            prefill_tps=saved.get("prefill_tps", streaming.DEFAULT_PREFILL_TPS),
            remote_MBps=saved.get("remote_MBps", streaming.DEFAULT_REMOTE_MBPS),
        )

    # -- model contexts ------------------------------------------------------------------

    def _runtime(self, role: str) -> Runtime:
        with self._runtimes_lock:
            if role not in self._runtimes:
                rt = self._factory()
                if rt.sliding_window:
                    rt.close()
                    raise EngineError(
                        f"{rt.model_path.name} uses sliding-window attention, whose KV cache "
                        "kvdesk can measure (kvdesk eval) but not yet store and restore: "
                        "choose another model (--model, or Settings)")
                self._runtimes[role] = rt
                self.store.register_model(rt.fingerprint, self._model_path or str(rt.model_path),
                                          {**rt.layout.__dict__, "n_ctx": rt.n_ctx})
            return self._runtimes[role]

    def warm_up(self, rt: Runtime | None = None) -> None:
        """Ready the codec in the background (once): the flows that encode or decode call it
        first thing, a GUI may call it at start-up."""
        lay = (rt or self.runtime).layout
        with self._runtimes_lock:
            if self._warm_up is not None:
                return
            self._warm_up = threading.Thread(
                target=streaming.warm_up, name="codec-warm-up", daemon=True,
                args=(self.levels, (lay.n_layer, self.chunk_tokens, lay.channels)))
            self._warm_up.start()

    @property
    def runtime(self) -> Runtime:
        """The chat context (loaded on first use)."""
        return self._runtime("chat")

    @property
    def fingerprint(self) -> str:
        rt = self._runtimes.get("chat") or self._runtimes.get("attach") or self.runtime
        return rt.fingerprint

    def close(self) -> None:
        self.sharing.abandon()
        if self._warm_up is not None:
            self._warm_up.join()  # never leave numba working while the interpreter exits
        with self._runtimes_lock:
            for rt in self._runtimes.values():
                rt.close()
            self._runtimes.clear()

    def _save_speeds(self) -> None:
        self.store.set_setting(SPEEDS_SETTING, {
            "decode_MBps": self.speeds.decode_MBps,
            "read_MBps": self.speeds.read_MBps,
            "prefill_tps": self.speeds.prefill_tps,
            "remote_MBps": self.speeds.remote_MBps,
        })

    # -- prompts -------------------------------------------------------------------------

    def reserve_tokens(self, rt: Runtime) -> int:
        """Context kept free for questions and answers when a document is too long."""
        return self._reserve if self._reserve is not None else min(1024, rt.n_ctx // 4)

    def prefix(self, rt: Runtime, doc: Document | None) -> Prefix:
        if doc is None:
            return self._prefix(rt, None)
        # Tokenizing a long document twice costs ~15 ms at 4k tokens, on every question.
        key = (doc.id, doc.content_hash, rt.fingerprint, rt.n_ctx, self.reserve_tokens(rt))
        if key not in self._prefixes:
            self._prefixes[key] = self._prefix(rt, (doc.title, doc.text))
        return self._prefixes[key]

    def _prefix(self, rt: Runtime, doc: tuple[str, str] | None) -> Prefix:
        """The system prompt and the document (cut to fit the context) through the template."""
        if doc is None:
            msgs = [{"role": "system", "content": SYSTEM_PROMPT_NO_DOCUMENT}]
            text = rt.render_chat(msgs, add_generation_prompt=False)
            return Prefix(msgs, text, rt.tokenize(text, add_bos=rt.adds_bos), 0, 0)

        def build(body: str) -> tuple[list[dict], str, list[int]]:
            msgs = [{"role": "system",
                     "content": f"{SYSTEM_PROMPT}\n\nDocument: {doc[0]}\n\n{body}"}]
            text = rt.render_chat(msgs, add_generation_prompt=False)
            return msgs, text, rt.tokenize(text, add_bos=rt.adds_bos)

        (msgs, text, toks), total, kept = _fit(rt, doc[1], build,
                                               rt.n_ctx - self.reserve_tokens(rt))
        return Prefix(msgs, text, toks, total, kept)

    def chat_prefix(self, rt: Runtime, docs: Sequence[Document]) -> tuple[list[dict], list[int]]:
        """A chat's template messages and tokens before its first question.

        The first document's prefix is the one attach cached; each further document follows
        as a system message of its own, so the first document's cache stays a true prefix and
        only the others are computed for the chat (positions differ, so their own caches
        cannot be reused). Documents that do not fit are cut; ones that cannot fit are left out.
        """
        prefix = self.prefix(rt, docs[0] if docs else None)
        msgs, tokens = list(prefix.messages), list(prefix.tokens)
        limit = rt.n_ctx - self.reserve_tokens(rt)
        for doc in docs[1:]:
            before = rt.render_chat(msgs, add_generation_prompt=False)

            def build(body: str, doc=doc, before=before, msgs=msgs) -> tuple[list, list[int]]:
                more = [*msgs, {"role": "system", "content": f"Document: {doc.title}\n\n{body}"}]
                return more, rt.tokenize(rt.render_chat(more, add_generation_prompt=False)
                                         [len(before):])

            (more, delta), _, kept = _fit(rt, doc.text, build, limit - len(tokens))
            if kept:
                msgs, tokens = more, tokens + delta
        return msgs, tokens

    # -- attach --------------------------------------------------------------------------

    def attach(
        self,
        path: str | Path,
        *,
        levels: Sequence[str] | None = None,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> AttachResult:
        """Extract, prefill (or take from the shared cache), encode and store one document,
        then share it if automatic pushing is on. Raises DocumentError, Cancelled."""
        result = self._attach(path, levels=levels, progress=progress, cancel=cancel)
        entry = self.store.document_entry(result.doc_id, self._runtime("attach").fingerprint)
        if result.pulled or entry is None:  # None: evicted at once by a tiny storage budget
            return result
        # Outside the attach lock: an upload must not hold up the next document's prefill.
        pushed, notes = self.sharing.push_after_attach(entry.id, progress=None if progress is None
                                                       else self._phase(progress, "push",
                                                                        result.title))
        return replace(result, pushed=pushed, warnings=[*result.warnings, *notes])

    def _attach(self, path, *, levels, progress, cancel) -> AttachResult:
        levels = quality_order(levels or self.levels)
        self._check_levels(levels)
        extracted = documents.extract(path)
        title = extracted.title
        if progress:
            progress(Progress("extract", 1, 1, title))
        with self._attach_lock:
            rt = self._runtime("attach")
            self.warm_up(rt)
            known = {d.content_hash: d for d in self.store.documents()}
            existing = known.get(extracted.content_hash)
            prefix = self._prefix(rt, (existing.title if existing else title, extracted.text))
            doc = existing or self.store.add_document(
                extracted.content_hash, title, extracted.text, type=extracted.kind,
                source_path=extracted.source, n_tokens=prefix.doc_tokens)
            warnings = list(extracted.warnings)
            if prefix.kept_tokens < prefix.doc_tokens:
                warnings.append(
                    f"{title}: the document has {prefix.doc_tokens:,} tokens but only "
                    f"{prefix.kept_tokens:,} fit the context of {rt.n_ctx:,} (with room for "
                    "questions and answers); the rest is left out")
            entry = self.store.document_entry(doc.id, rt.fingerprint)
            if entry is not None and set(levels) <= set(entry.levels):
                return self._attach_result(doc, prefix, entry.id, levels, 0.0, 0.0, True,
                                           warnings)
            try:
                t0 = time.perf_counter()
                pulled, notes = self.sharing.pull_for_attach(
                    rt.fingerprint, prefix.tokens, levels, doc.id,
                    progress=None if progress is None else self._phase(progress, "pull", title))
                warnings += notes
                if pulled is not None:
                    return replace(self._attach_result(
                        doc, prefix, pulled, levels, 0.0, time.perf_counter() - t0, False,
                        warnings), pulled=True)
                rt.reset()
                rt.prefill(prefix.tokens, cancel=cancel, progress=None if progress is None else (
                    lambda done, total: progress(Progress("prefill", done, total, title))))
                prefill_s = time.perf_counter() - t0
                self.speeds.prefill_tps = len(prefix.tokens) / max(prefill_s, 1e-6)
                t1 = time.perf_counter()
                entry_id = self._store_kv(rt, prefix.tokens, levels, document_id=doc.id,
                                          progress=progress, cancel=cancel, title=title)
                encode_s = time.perf_counter() - t1
            except BaseException:
                # Nothing half-stored: a new document leaves no trace, a known one keeps
                # what it had (the entry writer aborts its own chunks).
                if existing is None:
                    self.store.delete_document(doc.id)
                rt.reset()
                raise
            self._save_speeds()
            return self._attach_result(doc, prefix, entry_id, levels, prefill_s, encode_s,
                                       False, warnings)

    @staticmethod
    def _phase(progress: ProgressFn, phase: str, title: str) -> Callable[[int, int], None]:
        return lambda done, total: progress(Progress(phase, done, total, title))

    def _attach_result(self, doc, prefix, entry_id, levels, prefill_s, encode_s, reused,
                       warnings) -> AttachResult:
        sizes = self.store.chunk_sizes([entry_id])
        stored = {lvl: sum(n for (_, _, lv), n in sizes.items() if lv == lvl) for lvl in levels}
        bytes_per_token = self._runtime("attach").layout.kv_bytes_per_token
        return AttachResult(
            doc_id=doc.id, title=doc.title, tokens=prefix.doc_tokens,
            kept_tokens=prefix.kept_tokens, prefill_s=round(prefill_s, 3),
            encode_s=round(encode_s, 3), raw_bytes=len(prefix.tokens) * bytes_per_token,
            stored_bytes=stored, reused=reused, warnings=warnings)

    def _check_levels(self, levels: Sequence[str]) -> None:
        unknown = set(levels) - set(codec.levels())
        if unknown:
            raise EngineError(f"unknown level(s) {sorted(unknown)}; known: "
                              f"{quality_order(codec.levels())}")

    def _store_kv(
        self,
        rt: Runtime,
        tokens: list[int],
        levels: Sequence[str],
        *,
        document_id: int | None = None,
        chat_id: int | None = None,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        title: str = "",
    ) -> int:
        """Encode and store the KV of `tokens` (the context's first tokens) beyond what is
        already stored for them; returns the id of the entry that ends at len(tokens)."""
        match = self.store.longest_prefix(rt.fingerprint, tokens, touch=False)
        if match.n_tokens == len(tokens) and match.entries:
            return match.entries[-1].id
        parent = match.parent
        kv = in_position_order(rt.capture())
        if kv.n_tokens < len(tokens):
            raise Cancelled("the context no longer holds the tokens to store")
        writer = self.store.write_entry(
            rt.fingerprint, tokens, levels=levels, parent_id=parent.id if parent else None,
            chunk_size=self.chunk_tokens, document_id=document_id, chat_id=chat_id)
        # Encoding is CPU work, storing mostly waits on fsync: a writer thread overlaps them.
        pending: queue.Queue = queue.Queue(maxsize=2 * len(levels))
        failure: list[BaseException] = []

        def store_chunks() -> None:
            while (item := pending.get()) is not None:
                if not failure:
                    try:
                        writer.put_chunk(*item)
                    except BaseException as e:  # handed to the encoding thread
                        failure.append(e)

        with writer:
            thread = threading.Thread(target=store_chunks, name="kv-writer")
            thread.start()
            try:
                for n, span in enumerate(writer.spans):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled("stopped while encoding")
                    if failure:
                        raise failure[0]
                    k = kv.keys[:, span.token_start : span.token_end]
                    v = kv.values[:, span.token_start : span.token_end]
                    for level in levels:
                        blob = codec.encode(k, v, level, first_token=span.token_start)
                        pending.put((span.chunk_index, level, blob))
                    if progress:
                        progress(Progress("encode", n + 1, len(writer.spans), title))
            finally:
                pending.put(None)
                thread.join()
            if failure:
                raise failure[0]
        return writer.entry_id

    def _store_chat_kv(self, rt: Runtime, chat_id: int, tokens: list[int]) -> None:
        """Store a chat's KV after a turn or a recompute, as an extension of its first
        document's entry — which is stored first if it was not (evicted, or made under
        another model), so the next chat about the document starts from it too."""
        docs = self.store.chat_documents(chat_id)
        if docs and self.store.document_entry(docs[0].id, rt.fingerprint) is None:
            self._store_kv(rt, self.prefix(rt, docs[0]).tokens, self.levels,
                           document_id=docs[0].id)
        self._store_kv(rt, tokens, self.levels, chat_id=chat_id)

    # -- listings ------------------------------------------------------------------------

    def documents(self) -> list[DocumentInfo]:
        fp = self.fingerprint
        entries = self.store.entries()
        out = []
        for doc in self.store.documents():
            mine = [e for e in entries if e.document_id == doc.id and e.parent_id is None]
            current = [e for e in mine if e.model == fp]
            sizes = self.store.chunk_sizes([current[0].id]) if current else {}
            cache = {}
            for (_, _, level), n in sizes.items():
                cache[level] = cache.get(level, 0) + n
            status = "ready" if current else ("stale" if mine else "none")
            kept = (current[0].token_end if current else 0)
            out.append(DocumentInfo(doc.id, doc.title, doc.type, doc.n_tokens or 0, kept,
                                    cache, status, doc.created))
        return out

    def chats(self) -> list[ChatInfo]:
        return [ChatInfo(c.id, c.title, [d.id for d in self.store.chat_documents(c.id)],
                         len(self.store.messages(c.id)), c.created, c.updated)
                for c in self.store.chats()]

    def messages(self, chat_id: int) -> list[MessageInfo]:
        self._chat(chat_id)
        return [MessageInfo(m.id, m.role, m.text, m.created,
                            {k: v for k, v in (m.stats or {}).items() if k != "tokens"})
                for m in self.store.messages(chat_id)]

    def _chat(self, chat_id: int):
        try:
            return self.store.chat(chat_id)
        except NotFoundError as e:
            raise EngineError(f"no chat {chat_id}") from e

    def _document(self, doc_id: int) -> Document:
        try:
            return self.store.document(doc_id)
        except NotFoundError as e:
            raise EngineError(f"no document {doc_id}") from e

    def new_chat(self, doc_ids: Sequence[int], title: str | None = None) -> ChatInfo:
        docs = [self._document(d) for d in doc_ids]
        chat = self.store.create_chat(title or UNTITLED,
                                      [d.id for d in docs])
        return ChatInfo(chat.id, chat.title, [d.id for d in docs], 0, chat.created, chat.updated)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._chat(chat_id)
        self.store.rename_chat(chat_id, title)

    def delete_chat(self, chat_id: int) -> None:
        self._chat(chat_id)
        self.store.delete_chat(chat_id)

    def delete_document(self, doc_id: int) -> None:
        self._document(doc_id)
        self.store.delete_document(doc_id)

    def export_chat(self, chat_id: int, fmt: str = "markdown") -> str:
        chat = self._chat(chat_id)
        msgs = self.messages(chat_id)
        if fmt == "json":
            return json.dumps({"chat_id": chat.id, "title": chat.title,
                               "messages": [m.as_dict() for m in msgs]}, indent=2)
        if fmt != "markdown":
            raise EngineError(f"unknown export format {fmt!r}: markdown or json")
        parts = [f"# {chat.title}\n"]
        for m in msgs:
            parts.append(f"**{'You' if m.role == 'user' else 'kvdesk'}:**\n\n{m.text}\n")
        return "\n".join(parts)

    # -- chats ---------------------------------------------------------------------------

    def _conversation(self, rt: Runtime, chat_id: int) -> tuple[list[dict], list[int]]:
        """The chat's template messages and the exact tokens its context holds."""
        msgs, tokens = self.chat_prefix(rt, self.store.chat_documents(chat_id))
        history = self.store.messages(chat_id)
        for m in history:
            msgs.append({"role": m.role, "content": m.text})
            tokens += (m.stats or {}).get("tokens", [])
        return msgs, tokens

    def _stale_message(self, chat_id: int, fp: str) -> list[str]:
        docs = {d.id for d in self.store.chat_documents(chat_id)}
        others = {e.model for e in self.store.entries()
                  if (e.document_id in docs or e.chat_id == chat_id) and e.model != fp}
        if not others:
            return []
        return [f"the cache of this chat was made under another model or KV layout "
                f"(fingerprint {', '.join(sorted(o[:12] for o in others))}, now {fp[:12]}); "
                "it is not used: recomputing from text"]

    def _bring_in(self, rt: Runtime, chat_id: int | None, tokens: list[int], *, options, no_cache,
                  progress, cancel, question: Sequence[int] = (),
                  reuse: bool = True) -> RestoreReport:
        """Make the context hold exactly `tokens` + `question`, with fresh logits when a
        question is given.

        What the context already holds is kept when it starts with `tokens` and was loaded
        the way this call asks for (the previous turn of this chat, a reopen just done, or a
        question typed ahead by `prepare`); only the question tokens it lacks are computed.
        """
        t0 = time.perf_counter()
        full = [*tokens, *question]
        if reuse and not no_cache and options in (streaming.Options(), self._loaded_options):
            held = rt.tokens
            keep = _common_prefix(held, full)
            if keep >= len(tokens):
                # A question needs the logits after its last token: unless the context holds
                # exactly it, freshly evaluated (a draft sent as it was), compute that token.
                if question and not (keep == len(held) == len(full) and rt.has_logits):
                    keep = min(keep, len(full) - 1)
                rt.truncate(keep)
                report = RestoreReport(len(tokens), time.perf_counter() - t0, 0, [], 0,
                                       ["the chat was already loaded"])
                rt.prefill(full[keep:], cancel=cancel)
                return report
        self._loaded_options = None  # until the context holds a finished load again
        if no_cache:
            rt.reset()
            rt.prefill(tokens, cancel=cancel, progress=None if progress is None else (
                lambda done, total: progress(Progress("recompute", done, total))))
            n_chunks = -(-len(tokens) // self.chunk_tokens)
            report = RestoreReport(len(tokens), time.perf_counter() - t0, 0,
                                   [streaming.TEXT] * n_chunks, len(tokens), [])
        else:
            asked = options
            if options.level != "auto":
                self._check_levels([options.level])
            elif options.budget_ms is None and self.default_budget_ms is not None:
                options = streaming.Options("auto", self.default_budget_ms,
                                            options.bandwidth_MBps)
            source, notes = self.sharing.source(rt.fingerprint, tokens)
            report = streaming.restore(
                rt, source, tokens, levels=self.levels, options=options,
                speeds=self.speeds, progress=progress, cancel=cancel)
            report.messages[:0] = notes
            if report.recomputed_tokens == len(tokens) and chat_id is not None:
                report.messages.extend(self._stale_message(chat_id, rt.fingerprint))
            self._save_speeds()
            self._loaded_options = asked
        rt.prefill(question, cancel=cancel)
        return report

    def reopen(
        self,
        chat_id: int,
        *,
        level: str = "auto",
        budget_ms: float | None = None,
        bandwidth_MBps: float | None = None,
        no_cache: bool = False,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> RestoreReport:
        """Restore a chat's whole context, ready for the next question."""
        self._chat(chat_id)
        with self._chat_lock:
            rt = self.runtime
            self.warm_up(rt)
            _, tokens = self._conversation(rt, chat_id)
            options = streaming.Options(level, budget_ms, bandwidth_MBps)
            # An explicit reopen always restores: it is how a restore is asked for and timed.
            report = self._bring_in(rt, chat_id, tokens, options=options, no_cache=no_cache,
                                    progress=progress, cancel=cancel, reuse=False)
            kept, notes = self.sharing.keep()
            report.messages.extend(notes)
            if report.recomputed_tokens and kept:
                self._store_chat_kv(rt, chat_id, tokens)
            return report

    def prepare(
        self,
        draft: str,
        *,
        chat_id: int | None = None,
        doc_ids: Sequence[int] = (),
        level: str = "auto",
        cancel: threading.Event | None = None,
    ) -> RestoreReport | None:
        """Get ready for a question still being typed (`draft`, in `chat_id`, or in a chat
        about `doc_ids` not created yet): bring its context into the model and compute the
        draft as the question's turn, so that when the question is sent only what changed
        since is left to compute (nothing, if the user paused before sending).

        Nothing is stored, and `ask` keeps only what matches the question finally sent.
        Returns the restore's report when this call restored the context, else None (also
        when cancelled: a newer draft supersedes it).
        """
        with self._chat_lock:
            if cancel is not None and cancel.is_set():
                return None
            rt = self.runtime
            self.warm_up(rt)
            if chat_id is not None:
                msgs, context = self._conversation(rt, chat_id)
            else:
                msgs, context = self.chat_prefix(rt, [self._document(d) for d in doc_ids])
            # The draft is computed as if it were sent now, template tokens included: sent
            # unchanged, its first token comes at once; edited, the context is cut back to
            # what still matches, which costs nothing.
            _, q_text = _question_turn(rt, msgs, draft.strip())
            q_tokens = rt.tokenize(q_text)
            if len(context) + len(q_tokens) + 1 >= rt.n_ctx:
                return None
            try:
                report = self._bring_in(
                    rt, chat_id, context, options=streaming.Options(level), no_cache=False,
                    progress=None, cancel=cancel, question=q_tokens)
            except Cancelled:
                return None
            return report if report.chunk_levels else None

    def ask(
        self,
        question: str,
        *,
        chat_id: int | None = None,
        doc_id: int | None = None,
        level: str = "auto",
        budget_ms: float | None = None,
        bandwidth_MBps: float | None = None,
        no_cache: bool = False,
        max_tokens: int = 512,
        seed: int | None = None,
        temperature: float = 0.0,
        on_token: Callable[[str], None] | None = None,
        on_restore: Callable[[RestoreReport], None] | None = None,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> AskResult:
        """One turn: restore the chat (new if chat_id is None), ask, stream, store."""
        t0 = time.perf_counter()  # the time to first token counts from here
        question = question.strip()
        if not question:
            raise EngineError("the question is empty")
        if chat_id is None:
            chat_id = self.new_chat([doc_id] if doc_id is not None else [],
                                    title=_title_of(question)).chat_id
        elif self._chat(chat_id).title == UNTITLED and not self.store.messages(chat_id):
            self.store.rename_chat(chat_id, _title_of(question))
        with self._chat_lock:
            rt = self.runtime
            self.warm_up(rt)
            msgs, context = self._conversation(rt, chat_id)
            with_question, q_text = _question_turn(rt, msgs, question)
            q_tokens = rt.tokenize(q_text)
            if len(context) + len(q_tokens) + 1 >= rt.n_ctx:
                raise EngineError(f"the chat is full: {len(context) + len(q_tokens):,} tokens "
                                  f"of a {rt.n_ctx:,}-token context; start a new chat")
            options = streaming.Options(level, budget_ms, bandwidth_MBps)
            report = self._bring_in(rt, chat_id, context, options=options, no_cache=no_cache,
                                    progress=progress, cancel=cancel, question=q_tokens)
            if on_restore:
                on_restore(report)

            generated: list[int] = []
            pieces: list[str] = []
            ttft = None
            max_new = min(max_tokens, rt.n_ctx - rt.n_tokens - 8)
            for tok in rt.generate(max_new, temperature=temperature, seed=seed, cancel=cancel):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                generated.append(tok.id)
                pieces.append(tok.text)
                if on_token and tok.text:
                    on_token(tok.text)
            answer = "".join(pieces)
            # Close the turn as the template would, so the next turn appends to it exactly.
            msgs.append({"role": "assistant", "content": answer})
            closed = rt.render_chat(msgs, add_generation_prompt=False)
            tail = closed[len(with_question):]
            suffix = tail[len(answer):] if tail.startswith(answer) else ""
            suffix_tokens = rt.tokenize(suffix) if suffix else []
            if suffix_tokens and rt.n_tokens + len(suffix_tokens) <= rt.n_ctx:
                rt.prefill(suffix_tokens)
            else:
                suffix_tokens = []
            # After the answer, not before the first token: what streamed from the shared
            # cache becomes a local entry, the one this chat's own entry will extend.
            kept, notes = self.sharing.keep()
            report.messages.extend(notes)
            result = AskResult(
                chat_id=chat_id, answer=answer.strip(),
                ttft_s=round(ttft if ttft is not None else time.perf_counter() - t0, 4),
                restore_s=round(report.restore_s, 4), bytes_read=report.bytes_read,
                chunk_levels=report.chunk_levels, recomputed_tokens=report.recomputed_tokens,
                tokens_generated=len(generated), messages=report.messages,
                source=report.source)
            stats = {k: v for k, v in result.as_dict().items() if k not in ("answer", "chat_id")}
            # Both messages are stored after the answer: a durable write (fsync) before the
            # first token would only delay it. A failure before here stores neither.
            self.store.add_message(chat_id, "user", question, stats={"tokens": q_tokens})
            self.store.add_message(chat_id, "assistant", result.answer,
                                   stats={**stats, "tokens": generated + suffix_tokens})
            if kept:
                self._store_chat_kv(rt, chat_id, context + q_tokens + generated + suffix_tokens)
            else:
                # The context holds the shared entry's chunks, possibly lossy, that could not
                # be kept: stored again here they would pass for a fresh prefill of the document.
                result.messages.append("this turn's cache is not stored")
            return result

    def regenerate(self, chat_id: int, **options) -> AskResult:
        """Drop the last answer (and its question) and ask the question again."""
        self._chat(chat_id)
        with self._chat_lock:
            history = self.store.messages(chat_id)
            users = [m for m in history if m.role == "user"]
            if not users:
                raise EngineError("nothing to regenerate: the chat has no question yet")
            last_q = users[-1]
            for m in history[history.index(last_q):]:
                self.store.delete_message(m.id)
            return self.ask(last_q.text, chat_id=chat_id, **options)

    # -- estimates -----------------------------------------------------------------------

    def estimate(self, *, chat_id: int | None = None,
                 doc_ids: Sequence[int] | None = None) -> RestoreEstimate:
        """Bytes and seconds a restore would take at each level (the slider's tooltip)."""
        rt = self.runtime
        if chat_id is not None:
            self._chat(chat_id)
            _, tokens = self._conversation(rt, chat_id)
        else:
            _, tokens = self.chat_prefix(rt, [self._document(i) for i in doc_ids or []])
        match = self.store.longest_prefix(rt.fingerprint, tokens, touch=False)
        sizes = self.store.chunk_sizes({s.entry_id for s in match.spans})
        raw = match.n_tokens * rt.layout.kv_bytes_per_token
        rest_s = (len(tokens) - match.n_tokens) / self.speeds.prefill_tps
        per_level: dict[str, int] = {}
        for span in match.spans:
            for level in self.levels:
                n = sizes.get((span.entry_id, span.chunk_index, level))
                if n is not None:
                    per_level[level] = per_level.get(level, 0) + n
        seconds = {
            lvl: round(n / 1e6 / self.speeds.read_MBps + raw / 1e6 / self.speeds.decode(lvl)
                       + rest_s, 4)
            for lvl, n in per_level.items()}
        seconds[streaming.TEXT] = round(len(tokens) / self.speeds.prefill_tps, 3)
        return RestoreEstimate(tokens=len(tokens), bytes=per_level, seconds=seconds)


def _fit(rt: Runtime, text: str, build: Callable[[str], tuple], room: int):
    """build(text cut to fit) whose last item, a token list, holds at most `room` tokens.

    Returns (what build returned, the text's token count, how many of them were kept).
    """
    text_tokens = rt.tokenize(text)
    built, kept = build(text), len(text_tokens)
    while len(built[-1]) > room and kept > 0:
        # Cut the text's tokens by the overflow; re-tokenizing the cut text can shift a token
        # or two, so loop until it fits.
        kept = max(0, kept - (len(built[-1]) - room))
        built = build(rt.detokenize(text_tokens[:kept]))
    return built, len(text_tokens), kept


def _question_turn(rt: Runtime, msgs: list[dict], question: str) -> tuple[str, str]:
    """The whole template text with `question` appended as the user's turn (msgs gets the
    turn), and the part of it after the conversation so far."""
    before = rt.render_chat(msgs, add_generation_prompt=False)
    msgs.append({"role": "user", "content": question})
    with_question = rt.render_chat(msgs, add_generation_prompt=True)
    if not with_question.startswith(before):
        raise EngineError("this model's chat template rewrites earlier turns; "
                          "kvdesk needs an append-only template")
    return with_question, with_question[len(before):]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _title_of(question: str) -> str:
    line = " ".join(question.split())
    return line if len(line) <= 60 else line[:57].rstrip() + "..."

