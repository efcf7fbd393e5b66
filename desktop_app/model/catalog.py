"""The GGUF models already on this machine: the folders other apps keep them in, and the user's.

`discover()` lists the model files of LM Studio (~/.lmstudio/models, ~/.cache/lm-studio/models),
GPT4All and Jan (their data folders, per platform), Ollama's store (each `name:tag` manifest
names its GGUF blob), the Hugging Face hub cache (HF_HUB_CACHE, HF_HOME) and the folders the
user adds (the `model_folders` setting), with what each header says (`gguf_header`): the
architecture, parameters, quantization, trained context, KV bytes per token, and whether
kvdesk supports it. A file that is not a readable GGUF is listed as "unreadable", with why.

Nothing is loaded: headers only, at most a few MB each, remembered by (path, size, mtime) in
the data directory so a second listing reads none. Folders are walked a few levels deep,
without following folder links; the second and later parts of a split model are left out
(its first part names it). This module must never load a model, follow into a file beyond its
header, or write anywhere but its memo.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ..results import ModelFile
from . import gguf_header

UNREADABLE = "unreadable"
MEMO_FILE = "model-headers.json"
# What the memo's facts hold; a memo of another format is read again (2: a file's
# `general.type`, whose adapters and projectors are refused).
MEMO_FORMAT = 2
MAX_DEPTH = 6
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY, OLLAMA_LIBRARY = "registry.ollama.ai", "library"


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
