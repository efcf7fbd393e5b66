"""The application object: settings plus the lazily loaded model, shared by CLI and GUI.

`App` is the one place that turns settings into live resources. Loading the model takes a
second or more, so nothing is loaded until a command needs it; `info()` and the other
service methods are the Python API that the CLI and the GUI wrap.

It never parses command lines and never imports Qt.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from . import models
from .runtime import Runtime
from .settings import Settings


class App:
    def __init__(self, settings: Settings):
        self.settings = settings.validated()

    @property
    def data_dir(self) -> Path:
        return self.settings.data_path

    @cached_property
    def model_path(self) -> Path:
        return models.resolve_model_path(self.settings.model)

    @cached_property
    def runtime(self) -> Runtime:
        path = self.model_path
        digest = models.content_hash(path, memo_file=self.data_dir / "model-hashes.json")
        return Runtime(
            path,
            model_hash=digest,
            n_ctx=self.settings.n_ctx,
            flash_attn=self.settings.flash_attn,
        )

    def info(self) -> dict:
        rt = self.runtime
        lay = rt.layout
        return {
            "model": str(self.model_path),
            "fingerprint": rt.fingerprint,
            "n_layer": lay.n_layer,
            "n_head_kv": lay.n_head_kv,
            "head_dim": lay.head_dim,
            "n_ctx": rt.n_ctx,
            "kv_bytes_per_token": lay.kv_bytes_per_token,
        }

    def close(self) -> None:
        if "runtime" in self.__dict__:
            self.runtime.close()
