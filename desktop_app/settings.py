"""User settings: which model, how large a context, where the data lives, the shared cache.

Settings are resolved in one order everywhere (CLI, GUI, tests): explicit arguments, then
environment variables (`KVDESK_MODEL`, `KVDESK_DATA_DIR`, `KVDESK_N_CTX`, and for the shared
cache tier `KVDESK_REMOTE_BUCKET`, `KVDESK_REMOTE_ENDPOINT_URL`, `KVDESK_REMOTE_PREFIX`), then
the settings file, then defaults. The shared cache's credentials are never settings: boto3
reads them from the standard AWS environment variables and files, and an endpoint URL that
carries any is refused. The settings file lives in the platform's user config directory (not the
data directory, since it names the data directory); `KVDESK_CONFIG_DIR` moves it, which tests
use to stay away from the real one. Writes are atomic (temp file + rename).

This module never loads a model and never opens the store.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from urllib.parse import urlsplit

import platformdirs

APP_NAME = "kvdesk"
DEFAULT_N_CTX = 8192
SETTINGS_VERSION = 1
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX_PART = re.compile(r"^[A-Za-z0-9._-]+$")


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
    # The shared cache tier on S3-compatible storage: off until a bucket is set.
    remote_bucket: str | None = None
    remote_endpoint_url: str | None = None  # None: AWS S3; else MinIO, Ceph, SeaweedFS...
    remote_prefix: str = "kvdesk"  # a team's namespace in the bucket
    remote_region: str | None = None  # None: the AWS configuration's, or us-east-1
    remote_auto_push: bool = False  # share each attached document (its text travels too)
    remote_auto_pull: bool = True  # on a local miss, look there before recomputing

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
        self._validate_remote()
        return self

    def _validate_remote(self) -> None:
        if self.remote_bucket is not None and not _BUCKET.match(self.remote_bucket):
            raise SettingsError(f"{self.remote_bucket!r} is not a bucket name (3-63 lower-case "
                                "letters, digits, dots and hyphens)")
        if self.remote_endpoint_url:
            url = urlsplit(self.remote_endpoint_url)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise SettingsError(f"{self.remote_endpoint_url!r} is not an http(s) URL")
            if url.username or url.password or url.query:
                # Not even echoed back: it may hold a secret.
                raise SettingsError("the shared cache's endpoint URL must not carry "
                                    "credentials; boto3 reads them from the AWS environment "
                                    "variables or ~/.aws")
        parts = self.remote_prefix.strip("/").split("/")
        if not all(_PREFIX_PART.match(p) and p not in (".", "..") for p in parts):
            raise SettingsError(f"{self.remote_prefix!r} is not a usable prefix (letters, "
                                "digits, '.', '_', '-', separated by '/')")

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
        remote_bucket=os.environ.get("KVDESK_REMOTE_BUCKET") or None,
        remote_endpoint_url=os.environ.get("KVDESK_REMOTE_ENDPOINT_URL") or None,
        remote_prefix=os.environ.get("KVDESK_REMOTE_PREFIX") or None,
    )
