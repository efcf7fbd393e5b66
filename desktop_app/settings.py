"""User settings: which model, how large a context, where the data lives.

Settings are resolved in one order everywhere (CLI, GUI, tests): explicit arguments, then
environment variables (`KVDESK_MODEL`, `KVDESK_DATA_DIR`, `KVDESK_N_CTX`), then the settings
file, then defaults. The settings file lives in the platform's user config directory (not the
data directory, since it names the data directory); `KVDESK_CONFIG_DIR` moves it, which tests
use to stay away from the real one. Writes are atomic (temp file + rename).

This module never loads a model and never opens the store.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import platformdirs

from .runtime import DEFAULT_N_CTX

APP_NAME = "kvdesk"
SETTINGS_VERSION = 1


class SettingsError(ValueError):
    """The settings file or a setting's value is unusable."""


def config_dir() -> Path:
    return Path(os.environ.get("KVDESK_CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME))


@dataclass(frozen=True)
class Settings:
    model: str | None = None  # None: the default model shipped with kvdesk
    data_dir: str | None = None  # None: the platform's user data directory
    n_ctx: int = DEFAULT_N_CTX
    # Flash attention: ~1.9x faster prefill here, and V rows stored token-major (cheaper to
    # restore). Measured with benchmarks/bench_engine.py.
    flash_attn: bool = True
    storage_budget_gb: float = 10.0
    # How long bringing a chat back may take when the level is "auto" (the quality slider):
    # the restore picks, chunk by chunk, the best stored level that fits.
    restore_budget_ms: float = 250.0
    theme: str = "system"  # system | light | dark

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir or platformdirs.user_data_dir(APP_NAME)).expanduser()

    def validated(self) -> Settings:
        if not 256 <= self.n_ctx <= 1 << 20:
            raise SettingsError(f"context size {self.n_ctx} is outside 256..1048576")
        if self.storage_budget_gb <= 0:
            raise SettingsError("the storage budget must be positive")
        if self.restore_budget_ms <= 0:
            raise SettingsError("the restore time budget must be positive")
        if self.theme not in ("system", "light", "dark"):
            raise SettingsError(f"unknown theme {self.theme!r}")
        return self

    def with_overrides(self, **overrides) -> Settings:
        """These settings with every non-None override applied."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None}).validated()

    def save(self, path: Path | None = None) -> None:
        path = path or config_dir() / "settings.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": SETTINGS_VERSION, **asdict(self)}, indent=2))
        os.replace(tmp, path)


def load(path: Path | None = None) -> Settings:
    """Saved settings with the environment applied on top."""
    path = path or config_dir() / "settings.json"
    saved: dict = {}
    if path.is_file():
        try:
            saved = json.loads(path.read_text())
        except ValueError as e:
            raise SettingsError(f"{path} is not valid JSON ({e}); fix or delete it") from e
        if not isinstance(saved, dict) or saved.get("version", 0) > SETTINGS_VERSION:
            raise SettingsError(f"{path} was written by a newer kvdesk; fix or delete it")
    known = {f.name for f in fields(Settings)}
    base = Settings(**{k: v for k, v in saved.items() if k in known})
    env_n_ctx = os.environ.get("KVDESK_N_CTX")
    try:
        n_ctx = int(env_n_ctx) if env_n_ctx else None
    except ValueError as e:
        raise SettingsError(f"KVDESK_N_CTX={env_n_ctx!r} is not an integer") from e
    return base.with_overrides(
        model=os.environ.get("KVDESK_MODEL") or None,
        data_dir=os.environ.get("KVDESK_DATA_DIR") or None,
        n_ctx=n_ctx,
    )
