"""The application object: settings turned into live resources, shared by CLI and GUI.

`App` is the one place that turns settings into the store, the model contexts and the
engine. Loading a model takes a second or more, so nothing is loaded until a command needs it
— not even the modules: a command a running server answers never imports llama.cpp, the codec
or the store.
`App.engine` is the Python API the CLI and the GUI wrap.

It never parses command lines and never imports Qt.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from . import models
from .settings import Settings

if TYPE_CHECKING:
    from store import RemoteTier, Store

    from .engine import Engine
    from .runtime import Runtime


class App:
    def __init__(self, settings: Settings):
        self.settings = settings

    @property
    def data_dir(self) -> Path:
        return self.settings.data_path

    @cached_property
    def model_path(self) -> Path:
        return models.resolve_model_path(self.settings.model)

    @cached_property
    def model_hash(self) -> str:
        return models.content_hash(self.model_path, memo_file=self.data_dir / "model-hashes.json")

    def new_runtime(self) -> Runtime:
        """A fresh context on the configured model (the engine holds one per role)."""
        from .runtime import Runtime

        return Runtime(
            self.model_path,
            model_hash=self.model_hash,
            n_ctx=self.settings.n_ctx,
            flash_attn=self.settings.flash_attn,
        )

    @cached_property
    def store(self) -> Store:
        from store import Store

        store = Store(self.data_dir)
        store.budget_bytes = int(self.settings.storage_budget_gb * 1e9)
        return store

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

        s = self.settings
        return Engine(self.store, self.new_runtime, model_path=str(self.model_path),
                      default_budget_ms=s.restore_budget_ms, remote=self.remote,
                      auto_push=s.remote_auto_push, auto_pull=s.remote_auto_pull,
                      min_cache_tokens=s.prompt_cache_min_tokens,
                      blend_fraction=s.blend_recompute, generation_defaults=s.generation)

    @cached_property
    def local_api(self):
        """The local API server, for a window to start and stop (desktop_app.server)."""
        from .server import LocalAPI

        return LocalAPI(self)

    def info(self) -> dict:
        rt = self.engine.runtime
        lay = rt.layout
        return {
            "model": str(self.model_path),
            "fingerprint": rt.fingerprint,
            "n_layer": lay.n_layer,
            "n_head_kv": lay.n_head_kv,
            "head_dim": lay.head_dim,
            "n_ctx": rt.n_ctx,
            "kv_bytes_per_token": lay.kv_bytes_per_token,
            # What an answer is sampled with unless asked otherwise, and where each value is
            # from; then what in the model file's recommendation was unusable.
            "sampling": self.engine.sampling().as_dict(),
            "sampling_notes": rt.model_sampling_notes,
        }

    def close(self) -> None:
        if "local_api" in self.__dict__:
            self.local_api.stop()
        if "engine" in self.__dict__:
            self.engine.close()
        if "store" in self.__dict__:
            self.store.close()
