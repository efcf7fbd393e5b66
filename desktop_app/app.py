"""The application object: settings turned into live resources, shared by CLI and GUI.

`App` is the one place that turns settings into the store, the model contexts and the
engine. Loading a model takes a second or more, so nothing is loaded until a command needs it
— not even the modules: a command a running server answers never imports llama.cpp, the codec
or the store.
`App.engine` is the Python API the CLI and the GUI wrap.

It never parses command lines and never imports Qt.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import EngineError
from .model import models
from .settings import Settings, config_dir

log = logging.getLogger(__name__)

STORE_FILE = "kvdesk.sqlite"  # (store.DB_NAME, named here without importing the store)
# Where the data directories made on drives are remembered (store.datadir.drive), beside the
# settings: the data directory itself is what goes away with its drive.
DRIVES_MEMO = "stores-on-drives"

if TYPE_CHECKING:
    from store import RemoteTier, Store

    from .engine import Engine
    from .model.contextsize import ContextChoice
    from .model.gguf_header import HeaderFacts
    from .model.runtime import Runtime
    from .results import ModelFile


class App:
    def __init__(self, settings: Settings, *, background: bool = True,
                 model_flag: bool = False):
        self.settings = settings
        self.model_flag = model_flag  # the model was named by --model (an error says so)
        self.background = background  # a long-running process (the window, kvdesk serve)
        # Set by commands that only read (`info`, `models`): a data directory that does not
        # exist yet, or a folder with no store in it, is then not written to; memos and the
        # store go to a temporary folder.
        self.reads_only = False
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._preload: _Preload | None = None
        self._model_error: models.ModelNotFoundError | None = None
        self.warned: list[str] = []  # what this run has warned of, so an error never repeats it
        self._notes: list[str] = []  # what opening the store had to say (`take_notes`)

    @property
    def data_dir(self) -> Path:
        return self.settings.data_path

    @property
    def holds_store(self) -> bool:
        """Whether the data directory holds a store: not where there is no folder, nor in a
        folder with no store in it (a mistyped --data-dir naming the user's documents). One
        that cannot be looked into, or a file in its place, is left to the store to name."""
        try:
            os.stat(self.data_dir / STORE_FILE)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return True

    @property
    def state_dir(self) -> Path:
        """Where this run keeps what it writes: the data directory, except for a command
        that only reads where it holds no store (then a folder removed at close)."""
        if not self.reads_only or self.holds_store:
            return self.data_dir
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="kvdesk-scratch-")
        return Path(self._scratch.name)

    @cached_property
    def model_path(self) -> Path:
        if self._model_error is not None:  # (looked for once: a listing of models is slow)
            raise self._model_error
        try:
            return models.resolve_model_path(
                self.settings.model, listed=lambda: [(m.name, m.path) for m in self.list_models()])
        except models.ModelNotFoundError as e:
            # The shipped default's own error says how to install it; one the user set says
            # where it was set, and how to go back.
            message = f"{e}; {self.model_origin()}" if self.settings.model else str(e)
            self._model_error = models.UnusableModelError(message, e.path) if isinstance(
                e, models.UnusableModelError) else models.ModelNotFoundError(message)
            raise self._model_error from None

    def model_origin(self) -> str:
        """Where the model set came from (the flag over the variable over the settings file),
        and how to go back to the shipped default."""
        if self.model_flag:
            return "it was given by --model: leave that out for the default model"
        if os.environ.get("KVDESK_MODEL"):
            return ("it is set by the environment variable KVDESK_MODEL: unset it for the "
                    "default model")
        return (f"it is set as \"model\" in {config_dir() / 'settings.json'}: remove that "
                "key (or set it to null) for the default model")

    @property
    def model_missing(self) -> models.ModelNotFoundError | None:
        """Why the model set cannot be found or used (`check_model`), None where it can:
        `docs`, `chats` and `info` list what they can without it."""
        try:
            self.check_model()
        except models.ModelNotFoundError as e:
            return e
        return None

    def check_model(self) -> None:
        """Refuse the model set where it is not found, or where its header shows it cannot
        load (UnusableModelError, saying what was found), before llama.cpp is asked: its own
        refusal says only "Failed to load model from file"."""
        if (problem := self._header[1]) is not None:
            raise models.UnusableModelError(f"{problem.rstrip('.')}; {self.model_origin()}"
                                            if self.settings.model else problem,
                                            self.model_path)

    @cached_property
    def model_hash(self) -> str:
        return models.content_hash(self.model_path, memo_file=self.state_dir / "model-hashes.json")

    def list_models(self) -> list[ModelFile]:
        """The GGUF models on this machine (headers only: nothing is loaded)."""
        try:
            own = [("default", models.default_model_path())]
        except models.ModelNotFoundError:
            own = []
        for notice in self.settings.notices():  # (a folder not there now: said once, kept)
            if notice.key == "model_folders" and str(notice) not in self.warned:
                self.warned.append(str(notice))
                log.warning("Warning: %s", notice)
        return models.discover(self.settings.model_folders, own=own, memo_dir=self.state_dir)

    @cached_property
    def _header(self) -> tuple[HeaderFacts | None, str | None]:
        """The model's header, and what in it keeps the model from loading (gguf_header.verdict);
        read once, for the check and the facts alike."""
        from .model.gguf_header import verdict

        return verdict(self.model_path)

    @property
    def model_facts(self) -> HeaderFacts | None:
        """The model's header (None if it cannot be read as one: `check_model` says why)."""
        return self._header[0]

    @cached_property
    def flash_attn(self) -> tuple[bool, str]:
        """Whether contexts use flash attention, and why."""
        if self.settings.flash_attn is not None:
            return self.settings.flash_attn, "set in the settings"
        if self.model_facts is not None and self.model_facts.sliding_window:
            return False, ("off: a sliding-window model, whose restored cache answers exactly "
                           "as a recomputed one only without it")
        return True, ("on: faster prefill, and a restored cache answers as a recomputed one "
                      "on plain-cache models (tested on SmolLM2)")

    @cached_property
    def context(self) -> ContextChoice:
        """The context size, and why (`kvdesk info` says it)."""
        from .model.contextsize import ContextChoice, available_memory, choose, unallocatable

        if self.settings.n_ctx is not None:
            n, trained = self.settings.n_ctx, self.model_facts and self.model_facts.context_length
            if too_large := unallocatable(
                    self.model_facts, n, model_bytes=self.model_path.stat().st_size,
                    flash_attn=self.flash_attn[0], available=available_memory()):
                raise EngineError(too_large)
            why = "set in the settings, --n-ctx or KVDESK_N_CTX"
            if trained and n > trained:
                why += (f", over the {trained:,} tokens the model was trained on: past them "
                        "its answers may fall apart")
                log.warning("Warning: a context of %s tokens is %s", f"{n:,}", why)
            return ContextChoice(n, why)
        return choose(self.model_facts, model_bytes=self.model_path.stat().st_size,
                      flash_attn=self.flash_attn[0], available=available_memory())

    def preload(self) -> None:
        """Start loading the model now, on a thread of its own, for a command that will need
        it: llama.cpp loads without holding the GIL, so the rest of kvdesk imports and opens
        meanwhile. The engine's first context is that one; a failure to load is raised there,
        as without this. (The load silences nothing meanwhile: `model.llamalog`.)"""
        if self._preload is None:
            self._preload = _Preload(self._load_runtime)

    def new_runtime(self) -> Runtime:
        """A fresh context on the configured model (the engine holds one per role)."""
        if self._preload is not None and not self._preload.taken:
            return self._preload.take()
        return self._load_runtime()

    def _load_runtime(self) -> Runtime:
        from .model.runtime import Runtime

        self.check_model()
        return Runtime(
            self.model_path,
            model_hash=self.model_hash,
            n_ctx=self.context.n_ctx,
            flash_attn=self.flash_attn[0],
        )

    def check_drive(self) -> None:
        """Refuse (DataDirError) a data directory holding no store where one was made on a
        drive that is not mounted now (store.datadir.drive): never a new, empty store in its
        place."""
        from store.datadir import drive

        if not self.holds_store:
            drive.check_connected(config_dir() / DRIVES_MEMO, self.data_dir)

    @cached_property
    def store(self) -> Store:
        from store import Store
        from store.datadir import drive

        self.check_drive()
        store = Store(self.state_dir)
        if self.state_dir == self.data_dir and not store.read_only:
            drive.remember(config_dir() / DRIVES_MEMO, self.data_dir)
        if store.damage:
            self._warn_damage(store.damage_error())
        store.on_damage(self._warn_damage)  # (found by a read later: a value rotten inside)
        for note in store.upgrade_notes:  # (only the open that upgraded the store has any)
            log.warning("Note: %s", note)
        self._notes.extend(store.upgrade_notes)
        budget = int(self.settings.storage_budget_gb * 1e9)
        # Kept in the store for every process's gc; a read-only one changes nothing anyway.
        if not store.read_only and store.budget_setting != budget:  # (a capped one: as set)
            store.budget_bytes = budget
        return store

    def take_notes(self) -> list[str]:
        """What opening the store had to say (an upgrade's notes), logged as it opened: for a
        window to show, once."""
        notes, self._notes = self._notes, []
        return notes

    def _warn_damage(self, error: Exception) -> None:
        """Warn, once, that the store is damaged (an error then says only "as warned")."""
        self.warned.append(str(error))
        log.warning("Warning: %s", self.warned[-1])

    @cached_property
    def remote(self) -> RemoteTier | None:
        """The shared cache tier, if a bucket is set (boto3 loads on its first request)."""
        s = self.settings
        if not s.remote_bucket:
            return None
        from store import RemoteConfig, RemoteTier

        return RemoteTier(RemoteConfig(bucket=s.remote_bucket, prefix=s.remote_prefix,
                                       endpoint_url=s.remote_endpoint_url, region=s.remote_region))

    @cached_property
    def engine(self) -> Engine:
        from .engine import Engine
        from .kv.levels import DEFAULT_LEVELS, EXACT

        s = self.settings
        levels = (*DEFAULT_LEVELS, EXACT) if s.keep_lossless else DEFAULT_LEVELS
        # (a command that only reads lists what it can without a model not found or unusable:
        # whatever needs the model raises its error when it loads; any other command is
        # refused before its work starts)
        if self.reads_only and self.model_missing:
            path = ""
        else:
            self.check_model()
            path = str(self.model_path)
        return Engine(self.store, self.new_runtime, model_path=path,
                      levels=levels,
                      default_budget_ms=s.restore_budget_ms, remote=self.remote,
                      auto_push=s.remote_auto_push, auto_pull=s.remote_auto_pull,
                      min_cache_tokens=s.prompt_cache_min_tokens,
                      blend_fraction=s.blend_recompute, generation_defaults=s.generation,
                      passage_level=s.passage_level,
                      fill_passages=s.passages_in_background, background=self.background)

    def info(self) -> dict:
        rt = self.engine.runtime
        lay = rt.layout
        return {
            "model": str(self.model_path),
            # Where kvdesk keeps what it stores, and the settings file it reads (may not exist)
            "data_dir": str(self.data_dir.resolve()),
            "settings_file": str(config_dir() / "settings.json"),
            "fingerprint": rt.fingerprint,
            "n_layer": lay.n_layer,
            "n_head_kv": lay.n_head_kv,
            "head_dim": lay.head_dim,
            "n_ctx": rt.n_ctx,
            "n_ctx_reason": self.context.why,
            "kv_bytes_per_token": lay.kv_bytes_per_token,
            # The codec calibration new caches are encoded with (None: model-independent).
            "codec_calibration": (cal := self.engine.calibration()) and cal.id,
            "sliding_window_layers": lay.swa_layers,
            "sliding_window": lay.n_swa,
            "flash_attn": self.flash_attn[0],
            "flash_attn_reason": self.flash_attn[1],
            # What an answer is sampled with unless asked otherwise, and where each value is
            # from; then what in the model file's recommendation was unusable.
            "sampling": self.engine.sampling().as_dict(),
            "sampling_notes": rt.model_sampling_notes,
        }

    def close(self) -> None:
        if self._preload is not None:
            self._preload.discard()  # never taken (the command failed before it needed it)
        if "engine" in self.__dict__:
            self.engine.close()
        if "store" in self.__dict__:
            self.store.close()
        if self._scratch is not None:
            self._scratch.cleanup()


class _Preload:
    """A runtime loading on its own thread until it is taken (once)."""

    def __init__(self, load):
        self.taken = False
        self._result: Runtime | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(load,), name="model-preload",
                                        daemon=True)
        self._thread.start()

    def _run(self, load) -> None:
        try:
            self._result = load()
        except BaseException as e:  # noqa: BLE001 - raised where the runtime is taken
            self._error = e

    def take(self) -> Runtime:
        self.taken = True
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    def discard(self) -> None:
        if not self.taken:
            self.taken = True
            self._thread.join()
            if self._result is not None:
                self._result.close()
