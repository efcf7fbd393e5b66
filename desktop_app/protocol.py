"""The engine as its front ends see it: `EngineAPI`, a typing.Protocol.

The GUI is typed against it, and both the real engine (`desktop_app.engine.Engine`) and the
GUI tests' scripted `ui.testing.FakeEngine` implement it; a test checks that every method of
both has exactly the signature declared here, so the fake cannot drift from the real one.

A leaf: records and options only, so the GUI can import it without loading a model runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from .options import GenerationOptions, RestoreOptions
from .passagepass import PassagePass
from .results import (
    AskResult,
    AttachResult,
    CalibrationInfo,
    ChatInfo,
    DocumentInfo,
    MessageInfo,
    ModelFile,
    PrepState,
    Progress,
    RestoreEstimate,
    RestoreReport,
    Source,
)
from .settings import Settings

ProgressFn = Callable[[Progress], None]
TokenFn = Callable[[str], None]
RestoreFn = Callable[[RestoreReport], None]


class EngineAPI(Protocol):
    """Every method blocks: front ends call them off their UI thread. Progress, tokens and
    cancellation go through callbacks and a threading.Event; errors a user can act on are
    those `desktop_app.errors.is_user_error` recognizes."""

    # The settings file's generation values: what an ask's `generation` leaves unset comes
    # from them, then from the model file and kvdesk's defaults. Set it when they change.
    generation_defaults: GenerationOptions

    @property
    def levels(self) -> tuple[str, ...]:
        """The codec levels documents are stored at, best quality first."""
        ...

    @property
    def model_name(self) -> str:
        """The loaded model's file name (the window's title names it)."""
        ...

    @property
    def storage_problem(self) -> str | None:
        """Why the data directory takes no new work (its database damaged, the folder gone or
        read-only, its disk full when opened), or None."""
        ...

    def warm_up(self) -> None:
        """Ready the codec in the background (a GUI calls it at start-up)."""
        ...

    def codec_state(self) -> PrepState:
        """How far readying the codec's kernels is ("preparing the codec (once)")."""
        ...

    def calibration(self) -> CalibrationInfo | None:
        """The loaded model's codec calibration (None: model-independent levels)."""
        ...

    def calibrate(self, *, progress: ProgressFn | None = None,
                  cancel: threading.Event | None = None) -> CalibrationInfo:
        """Calibrate the codec for the loaded model (minutes; raises Cancelled)."""
        ...

    def relevel(self, *, progress: ProgressFn | None = None,
                cancel: threading.Event | None = None) -> dict:
        """Move the model's caches stored before its calibration to its levels (`kv.relevel`:
        a document's computed again from its text; returns the report)."""
        ...

    def close(self) -> None: ...

    # -- the library ---------------------------------------------------------------------

    def set_storage_budget(self, gb: float) -> dict: ...

    def documents(self) -> list[DocumentInfo]: ...

    def document_titles(self) -> dict[int, str]:
        """Titles by id, of deleted documents that chats were about too ("(deleted)")."""
        ...

    def passage_pass(self) -> PassagePass:
        """What the background pass giving long documents' passages their KV is doing (in a
        long-running engine: the window's, a server's): the document it works, how far, its
        measured rate, whether it is paused; and in `notes`, why it left a document's
        passages without their KV, by id: "the storage budget (30.0 MB) is full" (the rest
        get theirs as questions read them; a changed budget starts it again). Read from
        memory: cheap enough to poll."""
        ...

    def pause_passages(self, paused: bool) -> None:
        """Pause the background pass before its next passage, or let it go on: for this
        engine's life (the setting passages_in_background turns it off for good)."""
        ...

    def passages_as_text(self) -> bool:
        """Whether the loaded model keeps no passage KV (a sliding-window model's, until its
        codec is calibrated: `PassageKV.kept`): its long documents' passages are read as text
        by each question, and none gets its KV."""
        ...

    def passages_around(self, doc_id: int, index: int, around: int = 30) -> list[Source]: ...

    def chats(self) -> list[ChatInfo]: ...

    def search_chats(self, text: str) -> dict[int, str]:
        """The chats whose title or messages hold `text`, in any case: {chat id: a line of
        the latest message holding it, around it, or "" where only the title does}."""
        ...

    def exact_notes(self) -> dict[int, list[str]]:
        """What storing blended chats' exact contexts in the background evicted, by chat id:
        "storing chat 3's exact context evicted ... document 2 (a.md) (4.1 MB); ...". Each
        note is handed over once (here, or with the chat's next answer)."""
        ...

    def messages(self, chat_id: int) -> list[MessageInfo]: ...

    def new_chat(self, doc_ids: Sequence[int], title: str | None = None) -> ChatInfo: ...

    def rename_chat(self, chat_id: int, title: str) -> None: ...

    def delete_chat(self, chat_id: int) -> None: ...

    def delete_document(self, doc_id: int) -> list[int]: ...  # the chats that were about it

    def export_chat(self, chat_id: int, fmt: str = "markdown") -> str: ...

    # -- the flows -----------------------------------------------------------------------

    def attach(self, path: str | Path, *, levels: Sequence[str] | None = None,
               progress: ProgressFn | None = None, cancel: threading.Event | None = None,
               source: str | None = None) -> AttachResult:
        """Attach the file at `path`; `source` is where the user's file lives when `path` is
        a copy of it (an upload: "" when not known), watched for changes."""

    def prefill(self, doc_id: int, *, levels: Sequence[str] | None = None,
                progress: ProgressFn | None = None,
                cancel: threading.Event | None = None) -> AttachResult:
        """Compute a stored document's cache under the loaded model (after a model switch)."""
        ...

    def ask(self, question: str, *, chat_id: int | None = None, doc_ids: Sequence[int] = (),
            restore: RestoreOptions = RestoreOptions(),
            generation: GenerationOptions = GenerationOptions(),
            on_token: TokenFn | None = None, on_restore: RestoreFn | None = None,
            progress: ProgressFn | None = None,
            cancel: threading.Event | None = None) -> AskResult:
        """One turn in chat `chat_id`, or in a new chat about `doc_ids`."""
        ...

    def regenerate(self, chat_id: int, *, restore: RestoreOptions = RestoreOptions(),
                   generation: GenerationOptions = GenerationOptions(),
                   on_token: TokenFn | None = None, on_restore: RestoreFn | None = None,
                   progress: ProgressFn | None = None,
                   cancel: threading.Event | None = None) -> AskResult:
        """The last question asked again; its new turn replaces the last one once stored
        (stopped or failed before that, the last turn stays)."""
        ...

    def prepare(self, draft: str, *, chat_id: int | None = None, doc_ids: Sequence[int] = (),
                restore: RestoreOptions = RestoreOptions(),
                cancel: threading.Event | None = None) -> RestoreReport | None:
        """Compute a question while it is typed; the report when a restore happened."""
        ...

    def reopen(self, chat_id: int, *, restore: RestoreOptions = RestoreOptions(),
               progress: ProgressFn | None = None,
               cancel: threading.Event | None = None) -> RestoreReport: ...

    def estimate(self, *, chat_id: int | None = None,
                 doc_ids: Sequence[int] = ()) -> RestoreEstimate: ...


class LocalAPIControl(Protocol):
    """The local API server as a window toggles it (`desktop_app.server.LocalAPI`)."""

    @property
    def url(self) -> str | None:
        """Its base URL while it serves (http://127.0.0.1:PORT/v1), else None."""
        ...

    def start(self, settings: Settings) -> str:
        """Serve on loopback as the settings say: `server_port`, `ollama_port` and
        `cors_origins` (blocks until it serves; raises if it cannot)."""
        ...

    def stop(self) -> None: ...


class AppAPI(Protocol):
    """The application object (`desktop_app.app.App`) as the GUI uses it."""

    settings: Settings

    @property
    def engine(self) -> EngineAPI:
        """Loads the model on first use: call it off the UI thread."""
        ...

    def list_models(self) -> list[ModelFile]:
        """The GGUF models on this machine, from their headers (call it off the UI thread)."""
        ...

    def take_notes(self) -> list[str]:
        """What opening the store had to say once (an upgrade's notes), and no more after."""
        ...

    def close(self) -> None: ...
