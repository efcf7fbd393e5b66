"""User settings: which model, how large a context, where the data lives, the shared cache,
how answers are generated, whether the window calibrates the codec for a new model, how
large the window's text is.

Settings are resolved in one order everywhere (CLI, GUI, tests): explicit arguments, then
environment variables (`KVDESK_MODEL`, `KVDESK_DATA_DIR`, `KVDESK_N_CTX`, and for the shared
cache tier `KVDESK_REMOTE_BUCKET`, `KVDESK_REMOTE_ENDPOINT_URL`, `KVDESK_REMOTE_PREFIX`), then
the settings file, then defaults. The shared cache's credentials are never settings: boto3
reads them from the standard AWS environment variables and files, and an endpoint URL that
carries any is refused. The settings file lives in the platform's user config directory (not the
data directory, since it names the data directory); `KVDESK_CONFIG_DIR` moves it, which tests
use to stay away from the real one. Writes are atomic (temp file + rename). A key in the file,
or a `KVDESK_` variable, that this version does not know is ignored with a warning naming it;
a setting's variable set but empty is read as unset, with a warning (once) naming it.

`generation` holds only the generation values the user set (`options.GenerationOptions`, the
same fields and ranges as `kvdesk ask`'s flags); a value left unset (null) comes from the model
file's recommendation or kvdesk's defaults (`sampling.resolve`), so a settings file written
today does not pin tomorrow's defaults.

What no front end can use is refused here, for every one of them: a data folder that is not an
absolute path or that a file stands in the way of, a model folder that is not an absolute
path (a settings file written before has its relative ones read from where kvdesk starts,
as they were, and said). Ollama's port on the local API's is one server: the API serves
/api anyway. Told of and kept (`Settings.notices`): a data folder this user cannot write
(read, never written: a read-only copy lists and verifies), a model folder that does not
exist (a removable drive, a share not mounted).

This module never loads a model and never opens the store.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import platformdirs
import pydantic
from pydantic import Field

from .options import GenerationOptions
from .validation import InvalidValue, UserValues, changed, parse, secret_error

APP_NAME = "kvdesk"
# Chats over several documents: the share of each later document's tokens computed again in
# place when their caches are blended (its first ones); 1 computes them all (no blending).
# Chosen by benchmarks/bench_blend.py (RESULTS.md, "Chats over several documents"): 5 % takes
# most of what recomputing buys (KLD 0.13 -> 0.10; 15 % 0.085) for a third of 15 %'s time.
DEFAULT_BLEND_FRACTION = 0.05
SETTINGS_VERSION = 1
TEXT_SCALES = (0.7, 2.0)  # the window's text size, smallest and largest: 70 % to 200 %
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# An origin's parts (a "*" allowed where `_origins` says); `server.edges` matches by them.
ORIGIN = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://"
                     r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^/:?#@\s\[\]]+)(?::(?P<port>\d{1,5}|\*))?")
_PREFIX_PART = re.compile(r"^[A-Za-z0-9._-]+$")
# Environment variables, each for the setting it overrides.
ENVIRONMENT = {"KVDESK_MODEL": "model", "KVDESK_DATA_DIR": "data_dir", "KVDESK_N_CTX": "n_ctx",
               "KVDESK_REMOTE_BUCKET": "remote_bucket",
               "KVDESK_REMOTE_ENDPOINT_URL": "remote_endpoint_url",
               "KVDESK_REMOTE_PREFIX": "remote_prefix"}
# kvdesk's other variables, which are not settings: where the settings file is, the local
# API's key; the codec's and the bundle's own (by prefix).
OTHER_ENVIRONMENT = ("KVDESK_CONFIG_DIR", "KVDESK_API_KEY")
OTHER_ENVIRONMENT_PREFIXES = ("KVDESK_CODEC_", "KVDESK_BUNDLE_")
log = logging.getLogger("kvdesk.settings")
# An empty KVDESK_ variable is read as unset, and said (an empty endpoint URL left by a script
# would otherwise send a team's caches to AWS S3 without a word): what it then means.
EMPTY_MEANS = {"remote_endpoint_url": "AWS S3 itself", "data_dir": "the default folder"}
_SAID_EMPTY: set[str] = set()


class SettingsError(InvalidValue):
    """The settings file, a setting or a setting's value is unusable; the message says which."""

    def __init__(self, message: str, key: str = "settings"):
        ValueError.__init__(self, message)
        self.key = key
        self.reason = message


RELATIVE = "should be an absolute path (a relative one means another folder for each folder " \
    "kvdesk is started from)"


def _nearest(path: Path) -> Path:
    """`path` (absolute), or the nearest folder above it that exists: where it would be made
    (one this user may not look into counts as there: its contents are not this check's)."""
    while not _there(path) and path != path.parent:
        path = path.parent
    return path


def _there(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # (not allowed to look: someone else's, or a share that went away)
        return True


def _folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _file(path: Path) -> bool:
    try:
        return path.exists() and not path.is_dir()
    except OSError:
        return False


def config_dir() -> Path:
    return Path(os.environ.get("KVDESK_CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME))


class Settings(UserValues):
    # A GGUF path, or the name of a model `kvdesk models` lists; None: the shipped default.
    model: str | None = None
    # Folders of GGUF files to list besides the other apps' (LM Studio, Ollama...).
    model_folders: tuple[str, ...] = ()
    data_dir: str | None = None  # None: the platform's user data directory
    # None: the model's trained context, capped by the memory it needs (contextsize).
    n_ctx: int | None = Field(None, ge=256, le=1 << 20)
    # Flash attention: ~1.9x faster prefill here, and V rows stored token-major (cheaper to
    # restore); but on sliding-window models (Gemma) llama.cpp's CPU kernel makes a restored
    # cache answer differently from a recomputed one (RESULTS.md). None: on, except for those.
    flash_attn: bool | None = None
    storage_budget_gb: float = Field(10.0, gt=0, le=1e6)
    # How long bringing a chat back may take when the level is "auto" (the quality slider):
    # the restore picks, chunk by chunk, the best stored level that fits.
    restore_budget_ms: float = Field(250.0, gt=0, le=3_600_000)
    # Store every document at `lossless` too: exact reopens without recomputing, for about
    # twice the disk (levels.DEFAULT_LEVELS).
    keep_lossless: bool = False
    theme: Literal["system", "light", "dark", "high-contrast"] = "system"
    # The window's text, as a multiple of the platform's font (View ▸ Larger text, Ctrl++).
    text_scale: float = Field(1.0, ge=TEXT_SCALES[0], le=TEXT_SCALES[1])
    # The local API (kvdesk serve): its port, the folders whose files a client may attach by
    # path (none: uploads only), and from how many tokens a prompt with no cached prefix
    # is kept in the prompt cache.
    server_enabled: bool = False  # the window serves the local API while it is open
    server_port: int = Field(8765, ge=0, le=65535)  # 0: any free port
    server_attach_folders: tuple[str, ...] = ()
    prompt_cache_min_tokens: int = Field(1024, ge=0, le=1 << 20)
    # Ollama's API is served under /api on the server's port and, where Ollama's own clients
    # look by default, on this port too when it is free (no Ollama running); None: not.
    ollama_port: int | None = Field(11434, ge=0, le=65535)
    # Web pages allowed to call the local API from a browser (origins, such as
    # "http://localhost:3000"); none by default. "*" (any page) is refused with an API key.
    cors_origins: tuple[str, ...] = ()
    blend_recompute: float = Field(DEFAULT_BLEND_FRACTION, ge=0, le=1)
    # The one level a long document's passages keep their KV at (not every level: a book has
    # thousands of passages; a question's passages come back at it, or are computed again).
    passage_level: Literal["lossless", "high", "balanced", "compact"] = "balanced"
    # The window and `kvdesk serve` give every passage its KV in the background (else only
    # the passages questions retrieve get theirs, when first retrieved).
    passages_in_background: bool = True
    # The window calibrates the codec for a model that has no calibration yet (minutes, in the
    # background, once per model per session; `kvdesk calibrate` does it by hand), so that
    # the model's new caches are encoded with its own levels.
    calibrate_automatically: bool = True
    # The shared cache tier on S3-compatible storage: off until a bucket is set.
    remote_bucket: str | None = None
    remote_endpoint_url: str | None = None  # None: AWS S3; else MinIO, Ceph, SeaweedFS...
    remote_prefix: str = "kvdesk"  # a team's namespace in the bucket
    remote_region: str | None = None  # None: the AWS configuration's, or us-east-1
    remote_auto_push: bool = False  # share each attached document (its text travels too)
    remote_auto_pull: bool = True  # on a local miss, look there before recomputing
    # How answers are generated: temperature, top-k, top-p, min-p, penalties, max_tokens.
    generation: GenerationOptions = GenerationOptions()

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir or platformdirs.user_data_dir(APP_NAME)).expanduser()

    @pydantic.field_validator("data_dir")
    @classmethod
    def _data_dir(cls, value: str | None) -> str | None:
        if value:  # ("" as unset: the default folder)
            path = Path(value).expanduser()
            if not path.is_absolute():
                raise ValueError(RELATIVE)
            if _file(there := _nearest(path)):
                raise ValueError(f"{there} is a file, not a folder (the data folder holds "
                                 "kvdesk's store)")
        return value

    @pydantic.field_validator("model_folders")
    @classmethod
    def _model_folders(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # (one that does not exist is allowed, and told of: `notices`)
        if any(not Path(f).expanduser().is_absolute() for f in value):
            raise ValueError(RELATIVE)
        return value

    def notices(self) -> list[InvalidValue]:
        """What these settings allow but a user should be told of (never raised): a data
        folder this user cannot write is read only; a model folder that is not there now (a
        removable drive, a network share not mounted) is kept, and its models are listed
        again once it is back."""
        there = _nearest(self.data_path.absolute())
        return [InvalidValue("data_dir", f"{self.data_path} cannot be written by this user: "
                             "kvdesk only reads it (nothing can be attached or asked there)")
                for _ in [there] if _folder(there) and not os.access(there, os.W_OK | os.X_OK)
                ] + [InvalidValue("model_folders", f"{f} is not a folder on this computer now: "
                                  "its models are listed once it is back")
                     for f in self.model_folders if not _folder(Path(f).expanduser())]

    @pydantic.field_validator("remote_bucket")
    @classmethod
    def _bucket(cls, value: str | None) -> str | None:
        if value is not None and not _BUCKET.match(value):
            raise ValueError("not a bucket name (3-63 lower-case letters, digits, dots and "
                             "hyphens)")
        return value

    @pydantic.field_validator("remote_endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value:
            try:
                url = urlsplit(value)
            except ValueError:  # (malformed: it may still hold a secret, so not echoed)
                raise secret_error("the shared cache's endpoint URL is not a URL") from None
            if url.username or url.password or url.query:
                raise secret_error("the shared cache's endpoint URL must not carry credentials; "
                                   "boto3 reads them from the AWS environment variables or "
                                   "~/.aws")
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError("not an http(s) URL")
            try:
                port = url.port
            except ValueError:  # (out of range, or not a number)
                port = 0
            if port == 0:
                raise ValueError("its port should be a number from 1 to 65535 (or none: the "
                                 "scheme's own)")
        return value

    @pydantic.field_validator("remote_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        parts = value.strip("/").split("/")
        if not all(_PREFIX_PART.match(p) and p not in (".", "..") for p in parts):
            raise ValueError("not a usable prefix (letters, digits, '.', '_', '-', separated "
                             "by '/')")
        return value

    @pydantic.field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """As browsers send them: scheme and host in lower case, no default port (an
        extension's or an app's scheme, chrome-extension:// or app://, is an origin too). A
        "*" may stand for the port (http://localhost:*) or for the first labels of a domain
        (https://*.example.com), never for a whole host: that is any page, "*"."""
        out = []
        for origin in value:
            if origin == "*":
                out.append(origin)
                continue
            m = ORIGIN.fullmatch(origin)
            host = m["host"] if m else ""
            wild = host.startswith("*.") and "*" not in host[2:] and "." in host[2:]
            if not m or ("*" in host and not wild) or (
                    m["port"] not in (None, "*") and not 0 < int(m["port"]) < 65536):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], such "
                                 "as http://localhost:3000, with no path; a \"*\" for the port "
                                 "or the first labels of a domain: https://*.example.com), "
                                 "nor \"*\"")
            scheme, port = m["scheme"].lower(), m["port"]
            if port not in (None, "*"):
                port = None if int(port) == {"http": 80, "https": 443}.get(scheme) else int(port)
            out.append(f"{scheme}://{host.lower()}" + (f":{port}" if port else ""))
        return tuple(out)

    def with_overrides(self, **overrides: Any) -> Settings:
        """These settings with every non-None override applied (checked)."""
        return changed(self, **{k: v for k, v in overrides.items() if v is not None})

    def with_values(self, **values: Any) -> Settings:
        """These settings with `values` set, None included (an emptied field), checked."""
        return changed(self, **values)

    def save(self, path: Path | None = None, *, unknown: dict | None = None) -> None:
        """Write what was set, and `unknown`: a newer kvdesk's keys, kept for it."""
        path = path or config_dir() / "settings.json"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # (keys: this user's)
        tmp = path.with_suffix(".tmp")
        # What was set, not every default: a file saved today does not pin today's defaults.
        # A null that is the default ("auto") is left out too: it means what no key means,
        # and kvdesk before 2026-11-30 cannot read a null n_ctx or flash_attn.
        values = _set(type(self), self.model_dump(exclude_unset=True))
        if isinstance(values.get("generation"), dict):
            values["generation"] = _set(GenerationOptions, values["generation"])
        tmp.write_text(json.dumps({"version": SETTINGS_VERSION, **values, **(unknown or {})},
                                  indent=2))
        os.replace(tmp, path)


def _set(model: type[pydantic.BaseModel], values: dict) -> dict:
    """`values` but for a null where null is the default: auto, as a key left out."""
    return {k: v for k, v in values.items()
            if v is not None or model.model_fields[k].default is not None}


def load(path: Path | None = None) -> Settings:
    """Saved settings with the environment applied on top."""
    base = saved_settings(path)
    for var in sorted(v for v in os.environ if v.startswith("KVDESK_")):
        if var not in ENVIRONMENT and var not in OTHER_ENVIRONMENT \
                and not var.startswith(OTHER_ENVIRONMENT_PREFIXES):
            _warn(f"unknown environment variable {var} ignored", var,
                  [*ENVIRONMENT, *OTHER_ENVIRONMENT], only_a_setting(var))
    env = {key: os.environ[var] for var, key in ENVIRONMENT.items() if os.environ.get(var)}
    for var, key in ENVIRONMENT.items():
        if os.environ.get(var) == "" and var not in _SAID_EMPTY:  # (once a process)
            _SAID_EMPTY.add(var)
            log.warning("Warning: %s is set but empty: read as unset (the settings file's %s, "
                        "else %s)", var, key, EMPTY_MEANS.get(key, "its default"))
    if "data_dir" in env:  # (a folder set in the shell is where the shell is, as --data-dir)
        env["data_dir"] = str(Path(env["data_dir"]).expanduser().absolute())
    try:
        return base.with_overrides(**env)
    except InvalidValue as e:
        var = next(v for v, k in ENVIRONMENT.items() if k == e.key)
        raise SettingsError(f"{var}: {e.reason}", e.key) from None


def save_edits(before: Settings, after: Settings, path: Path | None = None) -> None:
    """Save what the user changed from `before` (as loaded) to `after` over the saved file's
    values: a value that came from the environment (KVDESK_...) is written only if edited.
    Keys this kvdesk does not know (a newer one's) stay in the file as they are."""
    path = path or config_dir() / "settings.json"
    edits = {name: getattr(after, name) for name in Settings.model_fields
             if getattr(after, name) != getattr(before, name)}
    merged = saved_settings(path).with_values(**edits)  # (the file read and checked first)
    raw = json.loads(path.read_text(encoding="utf-8-sig")) if path.is_file() else {}
    merged.save(path, unknown={k: v for k, v in raw.items()
                               if k not in Settings.model_fields and k != "version"})


def saved_settings(path: Path | None = None) -> Settings:
    """The settings file's settings, without the environment's (checked)."""
    path = path or config_dir() / "settings.json"
    saved: dict = {}
    if path.exists() and not path.is_file():
        raise SettingsError(f"{path} is not a file (a folder?): move it away, and kvdesk "
                            "writes its settings there again")
    twice: list[str] = []  # keys an object of the file gives more than once: the last counts

    def pairs(items: list[tuple[str, object]]) -> dict:
        keys = [key for key, _ in items]
        twice.extend(key for key in dict.fromkeys(keys) if keys.count(key) > 1)
        return dict(items)

    if path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8-sig"), object_pairs_hook=pairs)
        except (ValueError, OSError) as e:
            raise SettingsError(f"{path} is not valid JSON ({e}); fix or delete it") from e
        if not isinstance(saved, dict):
            what = {list: "list", str: "string", int: "number", float: "number", bool:
                    "true or false", type(None): "null"}.get(type(saved), "value")
            raise SettingsError(f"{path} holds a JSON {what}, not the object "
                                "of settings kvdesk writes; fix or delete it")
        version = saved.pop("version", 0)
        if not isinstance(version, int) or isinstance(version, bool):
            raise SettingsError(f"{path}: version {version!r} is not a settings version; "
                                "fix or delete it")
        if version > SETTINGS_VERSION:
            raise SettingsError(f"{path} was written by a newer kvdesk; fix or delete it")
    for key in dict.fromkeys(twice):
        log.warning("Warning: %s: setting %r is given more than once: the last one is used",
                    path, key)
    # Settings this version does not know (a typo, or a newer minor release's) are left
    # alone, and said: a misspelt key silently ignored would look like a setting kept.
    for key in saved.keys() - Settings.model_fields.keys():
        _warn(f"{path}: unknown setting {key!r} ignored", key, Settings.model_fields)
    known = {k: v for k, v in saved.items() if k in Settings.model_fields}
    _absolute(known, path)
    generation = known.get("generation")
    if isinstance(generation, dict):  # its keys are settings too: the same rule
        for key in generation.keys() - GenerationOptions.model_fields.keys():
            _warn(f"{path}: unknown setting 'generation.{key}' ignored", key,
                  GenerationOptions.model_fields)
        known["generation"] = {k: v for k, v in generation.items()
                               if k in GenerationOptions.model_fields}
    try:
        return parse(Settings, known, from_json=True)  # ("5" is a string, not a number)
    except InvalidValue as e:
        raise SettingsError(f"{path}: {e}", e.key) from None


def _absolute(known: dict, path: Path) -> None:
    """Folders a settings file written before they had to be absolute holds as relative
    paths: read from the folder kvdesk starts in, as they always were, and said (the same
    file then means another folder wherever kvdesk starts)."""
    folders = known.get("model_folders")
    for key, values in (("data_dir", [known.get("data_dir")]),
                        ("model_folders", folders if isinstance(folders, list) else [])):
        relative = [v for v in values if isinstance(v, str) and v.strip()
                    and not Path(v).expanduser().is_absolute()]
        if not relative:
            continue
        made = {v: str(Path(v).expanduser().absolute()) for v in relative}
        log.warning("Warning: %s: %s %s relative: read from the folder kvdesk starts in (%s); "
                    "an absolute path means one folder wherever kvdesk starts", path, key,
                    ", ".join(repr(v) for v in relative), ", ".join(made.values()))
        known[key] = made.get(known[key], known[key]) if key == "data_dir" else [
            made.get(v, v) if isinstance(v, str) else v for v in folders]


def only_a_setting(var: str) -> str | None:
    """What a KVDESK_ variable naming a setting the environment does not set is (KVDESK_THEME:
    'theme'), so that the warning says where that setting is set."""
    key = var.removeprefix("KVDESK_").lower()
    if key in Settings.model_fields:
        return f"{key!r} is a setting of the settings file, not an environment variable"
    if key in GenerationOptions.model_fields:
        return (f"{key!r} is a setting of the settings file (generation.{key}) and an "
                "option of `kvdesk ask`, not an environment variable")
    return None


def _warn(message: str, name: str, known, hint: str | None = None) -> None:
    """Say an unknown key or variable ignored, with what it is where `hint` knows, else a known
    name it looks like a typo of: only a close one, compared without the KVDESK_ every
    variable shares (with it, KVDESK_TEMPERATURE looked like KVDESK_DATA_DIR)."""
    if hint is None:
        close = difflib.get_close_matches(name.removeprefix("KVDESK_"),
                                          [k.removeprefix("KVDESK_") for k in known], n=1,
                                          cutoff=0.75)
        prefix = "KVDESK_" if name.startswith("KVDESK_") else ""
        hint = f"did you mean {prefix + close[0]!r}?" if close else None
    log.warning("Warning: %s%s", message, f" ({hint})" if hint else "")
