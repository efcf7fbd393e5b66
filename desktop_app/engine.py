"""The engine: kvdesk's flows — attach documents, ask, reopen chats — on model, codec and store.

`Engine` implements `protocol.EngineAPI`, the Python API the CLI and the GUI wrap. It only
assembles the parts and hands each call to the one that owns it:

    library     documents, chats and messages as the user sees them (over the store)
    prompts     the system prompt, documents and questions through the chat template
    contexts    the model contexts, one per role (chat, attach), loaded on first use
    calibrations the codec calibration each model's caches are encoded with (calibrate runs one)
    attaching   extract, prefill once, encode and store a document's KV
    sessions    the chat context: bring a chat in, ask, prepare, reopen, regenerate
    blending    a chat over several documents from their own caches, moved into place
    exactness   the exact context of a blended chat, computed in the background
    completions a client's whole conversation answered with the persistent prompt cache
    kvcache     a context's KV captured, encoded at every level and stored
    streaming   stored chunks back into the model, a level chosen per chunk
    estimates   what a restore would cost at each level (the slider's tooltip)
    sharing     the shared cache tier (S3), when one is configured
    passages    a document longer than the context as passages: split, indexed, retrieved

Every method blocks; progress, tokens and cancellation go through callbacks and a
threading.Event. It never prints, never parses arguments and never imports Qt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from store import DEFAULT_CHUNK_SIZE, Document, ReadOnlyError, RemoteTier, Store

from .calibration import runs
from .calibration.calibrations import Calibrations, calibration_info
from .chat.attaching import Attacher
from .chat.completions import Completions, RawPrompt
from .chat.exactness import Exactness, ExactNotes
from .chat.library import Library
from .chat.longdoc import LongDocs
from .chat.passagefill import PassageFill
from .chat.sessions import ChatSession
from .chat.turns import fullness
from .errors import EngineError
from .kv import estimates, relevel, repair, speeds
from .kv.contexts import CHAT, Contexts
from .kv.kvcache import KVCache
from .kv.levels import DEFAULT_LEVELS, check_levels, quality_order
from .kv.passagekv import DEFAULT_PASSAGE_LEVEL, PassageKV
from .kv.sharing import Sharing
from .model.prompts import Prompter
from .model.runtime import Runtime
from .model.sampling import Sampling
from .options import GenerationOptions, RestoreOptions
from .passagepass import PassagePass
from .passages import evidence
from .passages.embed import Embedder, WordLlamaEmbedder
from .passages.retrieve import DEFAULT_K, Hit, Retriever
from .protocol import ProgressFn, RestoreFn, TokenFn
from .results import (
    AskResult,
    AttachResult,
    CalibrationInfo,
    ChatInfo,
    Completion,
    DocumentInfo,
    MessageInfo,
    PrepState,
    RestoreEstimate,
    RestoreReport,
    Source,
)
from .settings import DEFAULT_BLEND_FRACTION


class Engine(ExactNotes):
    def __init__(self, store: Store, runtime_factory: Callable[[], Runtime], *,
                 model_path: str = "", levels: Sequence[str] = DEFAULT_LEVELS,
                 chunk_tokens: int = DEFAULT_CHUNK_SIZE, reserve_tokens: int | None = None,
                 default_budget_ms: float | None = None, remote: RemoteTier | None = None,
                 auto_push: bool = False, auto_pull: bool = True, min_cache_tokens: int = 1024,
                 blend_fraction: float = DEFAULT_BLEND_FRACTION,
                 generation_defaults: GenerationOptions = GenerationOptions(),
                 passage_level: str = DEFAULT_PASSAGE_LEVEL, fill_passages: bool = True,
                 background: bool = True):
        check_levels(levels)
        self.store = store
        self._levels = tuple(quality_order(levels))
        self.chunk_tokens = chunk_tokens
        # The shared cache tier (off without `remote`): read on a local miss or before a prefill
        self.sharing = Sharing(store, remote, auto_push=auto_push, auto_pull=auto_pull)
        self.library = Library(store)
        self.prompter = Prompter(reserve_tokens)
        self.calibrations = Calibrations(store)
        self.contexts = Contexts(store, runtime_factory, model_path=model_path,
                                 levels=self._levels, chunk_tokens=chunk_tokens,
                                 calibrations=self.calibrations, background=background)
        self.speeds = speeds.load(store)
        self._calibrating = threading.Lock()
        kv = KVCache(store, self._levels, chunk_tokens, self.calibrations)
        # Long documents' passages: the embedding model loads on first use (~0.5 s).
        self.embedder: Embedder = WordLlamaEmbedder()
        self.retriever = Retriever(store, self.embedder)
        self.attacher = Attacher(store, self.contexts, kv, self.sharing, self.prompter,
                                 self.speeds, self.retriever.index)
        passage_kv = PassageKV(store, kv, self.sharing, passage_level)
        longdocs = LongDocs(store, self.library, self.prompter, passage_kv, self.retriever,
                            self.contexts.loaded, self._split_stored)
        self.session = ChatSession(store, self.contexts, self.library, kv, self.sharing,
                                   self.prompter, self.speeds, levels=self._levels,
                                   chunk_tokens=chunk_tokens, default_budget_ms=default_budget_ms,
                                   blend_fraction=blend_fraction,
                                   generation_defaults=generation_defaults, longdocs=longdocs)
        # Long documents' passages given their KV in the background (long-running ones: warm_up)
        self.fill_passages, self._long_running = fill_passages, False
        self.passage_fill = PassageFill(store, self.contexts, passage_kv,
                                        chat_lock=self.session.lock,
                                        attach_lock=self.attacher.lock)
        self.completions = Completions(self.session, min_cache_tokens=min_cache_tokens)
        self.exactness = Exactness(
            self.contexts, kv, chat_lock=self.session.lock, attach_lock=self.attacher.lock,
            conversation=self.session.conversation, documents=self.library.chat_documents,
            first_document=self.session.longdocs.first_document,
            prefix=self.session.longdocs.prefix,
            on_exact=self.session.exact_stored)
        # Work after a call returns, in long-running processes only (`background`).
        self.background = background
        if background:
            self.session.request_exact = self.exactness.request
            self.session.exact_later = True

    @property
    def levels(self) -> tuple[str, ...]:
        return self._levels

    @property
    def storage_problem(self) -> str | None:
        try:  # (as new work checks first: a damaged or read-only store refuses it at once)
            self.store.check_writable()
        except ReadOnlyError as e:  # (damaged, gone, full or read-only: what a write says)
            return str(e)
        return None

    @property
    def generation_defaults(self) -> GenerationOptions:
        return self.session.generation_defaults

    @generation_defaults.setter
    def generation_defaults(self, values: GenerationOptions) -> None:
        self.session.generation_defaults = values  # the next answer uses them

    @property
    def runtime(self) -> Runtime:
        """The chat context (loaded on first use)."""
        return self.contexts.get(CHAT)

    @property
    def fingerprint(self) -> str:
        return self.contexts.fingerprint

    @property
    def model_name(self) -> str:
        return self.runtime.model_path.name

    def warm_up(self) -> None:
        """Load the model and ready the codec before the first call (the window, `kvdesk serve`):
        such a long-running engine also gives long documents' passages their KV meanwhile."""
        self.contexts.warm_up()
        self.contexts.get(CHAT)
        if self.fill_passages and self.background:
            self._long_running = True
            self.passage_fill.resume()

    def codec_state(self) -> PrepState:
        """How far readying the codec's kernels is (the GUI's "preparing the codec")."""
        return self.contexts.codec_state()

    # -- the codec calibration ---------------------------------------------------------------

    def calibration(self) -> CalibrationInfo | None:
        """The model's codec calibration; None: model-independent levels until `calibrate`."""
        cal = self.calibrations.current(self.fingerprint)
        return None if cal is None else calibration_info(cal)

    def calibrate(self, *, progress: ProgressFn | None = None,
                  cancel: threading.Event | None = None) -> CalibrationInfo:
        """Calibrate the codec for the loaded model (minutes: measured against llama.cpp's
        q8_0 KV on the built-in text), store it for its new caches, then `relevel`. One at a
        time, each step after the questions being answered; another process's calibration of
        the model is waited for and taken; raises Cancelled."""
        rt = self.runtime
        with self._calibrating:
            cal = runs.calibrate_once(self.store, self.calibrations, rt.model_path,
                                      rt.fingerprint, progress=progress, cancel=cancel,
                                      pause=lambda: self.session.lock.wait_free(cancel))
            self.relevel(progress=progress, cancel=cancel)
        return calibration_info(cal)

    def relevel(self, *, progress: ProgressFn | None = None,
                cancel: threading.Event | None = None) -> dict:
        """The model's caches stored before its calibration at its levels (`kv.relevel`)."""
        return relevel.relevel(self.session.kv, self.runtime, contexts=self.contexts,
                               lock=self.attacher.lock, progress=progress, cancel=cancel,
                               pause=lambda: self.session.lock.wait_free(cancel))

    def close(self) -> None:
        # Both stopped before either is waited for: the passage pass may be waiting for the
        # background context the exact pass holds, which would otherwise run to its end.
        self.passage_fill.stop()
        self.exactness.stop()
        self.passage_fill.close()
        self.exactness.close()
        self.sharing.abandon()
        self.contexts.close()

    # -- the library -------------------------------------------------------------------------

    def set_storage_budget(self, gb: float) -> dict:
        """The caches' storage budget changed while running (the window's settings): kept for
        every process, and the least recently used evicted down to it now; gc's report."""
        self.store.check_writable()
        grew, self.store.budget_bytes = int(gb * 1e9) > self.store.budget_bytes, int(gb * 1e9)
        if self._long_running and grew:  # a passage pass the budget stopped goes on
            self.passage_fill.resume()
        return self.store.gc()

    def documents(self) -> list[DocumentInfo]:
        return self.library.documents(self.fingerprint, bool(self.runtime.layout.swa_layers))

    def document_titles(self) -> dict[int, str]:
        return self.library.titles()

    def passage_pass(self) -> PassagePass:
        return self.passage_fill.state()

    def pause_passages(self, paused: bool) -> None:
        self.passage_fill.pause(paused)

    def passages_as_text(self) -> bool:
        return not self.passage_fill.kv.kept(self.runtime)

    def chats(self) -> list[ChatInfo]:
        return self.library.chats()

    def search_chats(self, text: str) -> dict[int, str]:
        return self.store.chats_holding(text)

    def messages(self, chat_id: int) -> list[MessageInfo]:
        return self.library.messages(chat_id)

    def new_chat(self, doc_ids: Sequence[int], title: str | None = None) -> ChatInfo:
        return self.library.new_chat(doc_ids, title)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self.library.rename_chat(chat_id, title)

    def delete_chat(self, chat_id: int) -> None:
        self.library.delete_chat(chat_id)

    def delete_document(self, doc_id: int) -> list[int]:
        return self.library.delete_document(doc_id)

    def export_chat(self, chat_id: int, fmt: str = "markdown") -> str:
        return self.library.export_chat(chat_id, fmt)

    # -- the flows ---------------------------------------------------------------------------

    def attach(self, path: str | Path, *, levels: Sequence[str] | None = None,
               progress: ProgressFn | None = None, cancel: threading.Event | None = None,
               source: str | None = None) -> AttachResult:
        self.store.check_writable()
        result = self.attacher.attach(path, levels=levels, progress=progress, cancel=cancel,
                                      source=source)
        if result.passages and self._long_running:  # (a one-shot command would not finish)
            self.passage_fill.request(result.doc_id)
        notes = self.passage_fill.attach_notes(result, levels, self.fill_passages)
        return replace(result, warnings=[*result.warnings, *notes,
                                         *self.library.earlier_versions(result.doc_id)])

    def _split_stored(self, rt: Runtime, doc: Document) -> int:
        """A document read whole kept as passages too (`readings`), their KV in the background."""
        count = self.attacher.split_stored(rt, doc)
        if self._long_running:
            self.passage_fill.request(doc.id)
        return count

    def prefill(self, doc_id: int, *, levels: Sequence[str] | None = None,
                progress: ProgressFn | None = None,
                cancel: threading.Event | None = None) -> AttachResult:
        """A stored document's cache computed under the loaded model from its text (after a
        model switch, or an eviction), as attaching its file again would."""
        self.store.check_writable()
        self.library.document(doc_id)
        return self.attacher.prefill(doc_id, levels=levels, progress=progress, cancel=cancel)

    def ask(self, question: str, *, chat_id: int | None = None, doc_ids: Sequence[int] = (),
            restore: RestoreOptions = RestoreOptions(),
            generation: GenerationOptions = GenerationOptions(),
            on_token: TokenFn | None = None, on_restore: RestoreFn | None = None,
            progress: ProgressFn | None = None,
            cancel: threading.Event | None = None) -> AskResult:
        self.store.check_writable()
        t0, stale = time.perf_counter(), [0]  # (a stale document cached: this answer's wait)
        notes = self.exactness.said(chat_id).get(chat_id, []) if chat_id is not None else \
            [] if restore.no_cache else self._cache_stale(doc_ids, progress, cancel, stale)
        spent = time.perf_counter() - t0 if chat_id is None and notes else 0.0
        unattached = self.library.unattached_notes(doc_ids, self.fingerprint)  # (taken first)
        result = self.session.ask(question, chat_id=chat_id, doc_ids=doc_ids, restore=restore,
                                  generation=generation, on_token=on_token,
                                  on_restore=on_restore, progress=progress, cancel=cancel)
        notes += self.library.changed_files(result.documents) + (
            unattached if result.recomputed_tokens else [])
        return replace(result.after(spent, stale[0]), messages=[*notes, *result.messages])

    def _cache_stale(self, doc_ids: Sequence[int], progress: ProgressFn | None,
                     cancel: threading.Event | None, computed: list[int]) -> list[str]:
        """A new chat's documents cached only under another model (a switch) are cached under
        this one first, once, as the window offers (their tokens added to `computed`)."""
        notes = []
        for doc_id in self.library.stale_documents(doc_ids, self.fingerprint) if doc_ids else ():
            done = self.prefill(doc_id, progress=progress, cancel=cancel)
            computed[0] += 0 if done.pulled or done.passages else done.kept_tokens
            notes += [f"document {doc_id} was cached under another model: " + (
                "longer than this one's context, it is kept as passages now" if
                done.passages else "its cache for this one is taken from the shared cache "
                "and stored now, once" if done.pulled else "its cache for this one is "
                "computed and stored now, once"), *done.warnings]  # (what storing it evicted)
        return notes

    def regenerate(self, chat_id: int, *, restore: RestoreOptions = RestoreOptions(),
                   generation: GenerationOptions = GenerationOptions(),
                   on_token: TokenFn | None = None, on_restore: RestoreFn | None = None,
                   progress: ProgressFn | None = None,
                   cancel: threading.Event | None = None) -> AskResult:
        self.store.check_writable()
        return self.session.regenerate(chat_id, restore=restore, generation=generation,
                                       on_token=on_token, on_restore=on_restore,
                                       progress=progress, cancel=cancel)

    def prepare(self, draft: str, *, chat_id: int | None = None, doc_ids: Sequence[int] = (),
                restore: RestoreOptions = RestoreOptions(),
                cancel: threading.Event | None = None) -> RestoreReport | None:
        return self.session.prepare(draft, chat_id=chat_id, doc_ids=doc_ids, restore=restore,
                                    cancel=cancel)

    def reopen(self, chat_id: int, *, restore: RestoreOptions = RestoreOptions(),
               progress: ProgressFn | None = None,
               cancel: threading.Event | None = None) -> RestoreReport:
        return self.session.reopen(chat_id, restore=restore, progress=progress, cancel=cancel)

    def estimate(self, *, chat_id: int | None = None,
                 doc_ids: Sequence[int] = ()) -> RestoreEstimate:
        """Bytes and seconds a restore would take at each level (the slider's tooltip); for a
        new chat, which of its documents the context cannot hold whole, as its answer will
        say (a chat says so with each reopen); for a chat, how full it is, as a reopen says."""
        rt, notes, parts = self.runtime, [], None
        if chat_id is not None:
            self.library.chat(chat_id)
            tokens = self.session.conversation(rt, chat_id)[1]
            docs = self.library.chat_documents(chat_id)  # (a passage chat's are computed: not)
            notes = fullness(rt.n_ctx, len(tokens), docs)  # (how full it is, from 80 %)
            if not self.session.longdocs.applies(docs):  # blended until its exact copy is stored
                parts = self.session.blendable(rt, chat_id, tokens, docs, None)
                parts = parts if parts and self.session.blender.usable(rt, parts.later) else None
        else:
            docs = [self.library.document(d) for d in doc_ids]
            layout = self.prompter.layout(rt, docs)
            tokens = list(layout.tokens)
            longdocs = self.session.longdocs
            notes = longdocs.readings.pending(rt, docs) or (
                longdocs.unread(docs, rt=rt) if longdocs.applies(docs) else layout.notes)
        return replace(estimates.estimate(self.store, rt, tokens, self.levels, self.speeds,
                                          parts, self.session.blend_fraction), notes=notes)

    def sampling(self, generation: GenerationOptions = GenerationOptions()) -> Sampling:
        """What an answer asked with `generation` is sampled with, each value with the layer
        it comes from (`kvdesk info` shows it)."""
        return self.session.sampling(generation)

    def complete(self, messages: Sequence[dict] | RawPrompt, **options) -> Completion:
        """Answer a client's whole conversation (or continue a prompt given as it is) with the
        persistent prompt cache (the local API's): `completions.Completions.complete`."""
        return self.completions.complete(messages, **options)

    def passages(self, doc_id: int, *, query: str | None = None, k: int = DEFAULT_K,
                 mode: str | None = None, wide: bool = False,
                 chat_id: int | None = None) -> list[Hit]:
        """A long document's passages in order (score 0), or with `query` those retrieval
        returns for it, best first, by `mode` (bm25, dense or fused; default: the measured
        best): of its `k` best, the ones a chat reads (focused: for a question naming
        something rare, those holding it; a repeated text once), or with `wide` all `k`;
        asked as a follow-up in chat `chat_id` (about the document), after its turns.
        `kvdesk passages`. A document that fits the context has none."""
        self.library.document(doc_id)
        if query is None and chat_id is not None:
            raise EngineError("a chat says how to retrieve: give a query too")
        if query is not None:
            if not query.strip():
                raise EngineError("the query is empty")
            recent = []
            if chat_id is not None:
                self.library.chat(chat_id)  # "no chat 9"
                if doc_id not in {d.id for d in self.library.chat_documents(chat_id)}:
                    raise EngineError(f"chat {chat_id} is not about document {doc_id}")
                recent = [m.text for m in self.library.history(chat_id)]
            hits = self.retriever.retrieve(doc_id, query, recent=recent, k=k, mode=mode,
                                           focus=not wide and self.session.longdocs.focus)
            if wide:
                return hits
            # A text the document repeats is read once (`longdoc`): listed once.
            return [h for i, h in enumerate(hits) if h.text not in {g.text for g in hits[:i]}]
        return [Hit.of(p, self.retriever.kind(doc_id)) for p in self.store.passages(doc_id)]

    def passages_around(self, doc_id: int, index: int, around: int = 30) -> list[Source]:
        """A long document's passages around its `index`-th, `around` either side, in order:
        a source shown in its document (the window's)."""
        kind = self.library.document(doc_id).type
        return [Source.of(Hit.of(p, kind), doc_id)
                for p in self.store.passages(doc_id, index - around, index + around)]

    def evidence(self, doc_id: int, query: str, hits: Sequence[Hit]) -> list[str]:
        """The sentences of `hits` (document `doc_id`'s) a chat's turn quotes with `query`
        (`passages.evidence`: those naming its rarest words)."""
        return evidence.naming(self.store, doc_id, query,
                               [h.text for h in sorted(hits, key=lambda h: h.index)],
                               kind=self.library.document(doc_id).type)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Texts as L2-normalised float32 vectors [n, d] of retrieval's embedding model (the
        local API's /v1/embeddings; its name and size: `embedder.name`, `.dimension`)."""
        return self.embedder.embed(list(texts))

    def repair(self, *, progress: ProgressFn | None = None,
               cancel: threading.Event | None = None) -> dict:
        """Recompute (or drop, for another model's) every chunk quarantined after a failed
        check or missing, and encode again the entries whose calibration is unusable:
        `kvdesk verify --repair` (kv.repair)."""
        with self.attacher.lock:
            return repair.repair(self.store, self.contexts, self.calibrations,
                                 sharing=self.sharing, progress=progress, cancel=cancel)

    # -- for benchmarks and tests: what a chat about these documents starts with --------------

    def prefix_tokens(self, doc_ids: Sequence[int]) -> list[int]:
        rt = self.runtime
        return self.prompter.chat(rt, [self.library.document(d) for d in doc_ids])[1]

