"""Where the codec's compiled kernels come from, and which CPU they are compiled for.

numba compiles every `@njit(cache=True)` kernel on first use (~20 s for the codec on 2 cores)
and keeps the machine code in a cache: the checkout's `__pycache__`, or the folder
NUMBA_CACHE_DIR names (the bundle's runtime hook points it at the user's cache folder). A
bundle also ships a cache of its own, compiled when it is built (`python -m codec.precompile
build DIR`) for a portable CPU target instead of the build machine's, so that the first
question after installing finds its kernels compiled. `configure()` runs as this module is
imported (`codec/__init__.py` imports it before any module defines a kernel) and uses that
shipped cache when it fits — KVDESK_CODEC_CACHE names it, its manifest matches this numba,
Python and machine, every file's SHA-256 and every codec source's matches, and this CPU has
the target's instruction sets — by compiling for the same target in this process and
handing numba the locator of `cachelocator.py`. Anything else, or a kernel signature the
shipped cache lacks, compiles as without it; nothing here may fail the codec.

The shipped folder is never written: numba writes a cache entry next to the index it read,
so the locator gives numba a private temporary folder holding links to the shipped files,
and a compile for a missing signature lands there and is dropped at exit.

numba fixes its CPU target when it first compiles or loads a kernel, so `configure` must run
before that: this module never makes numba do either, and imports it only inside functions.
It must never change what a kernel computes: only where its machine code comes from.

It also says, from a stamp `precompile`'s last step writes, whether numba's cache holds every
kernel (`kernels_cached`): a one-shot command then skips the app's warm-up.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SHIPPED_ENV = "KVDESK_CODEC_CACHE"  # the shipped cache folder (set by the bundle's runtime hook)
BUILD_ENV = "KVDESK_CODEC_CACHE_BUILD"  # while building one: the folder it is written to
SET_ENV = "KVDESK_CODEC_NUMBA_ENV"  # the numba settings configure() made, seen by children
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # codec/, whose sources and kernels are all here
LOCATOR = "codec.jit.cachelocator.CodecCacheLocator"  # numba imports it when it needs it
# numba's own locators, after ours: other packages' kernels (and ours, when we decline).
NUMBA_LOCATORS = ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator",
                  "IPythonCacheLocator", "ZipCacheLocator")

# Named CPU targets a shipped cache may be built for, with the LLVM features a CPU must have
# to run their code. x86-64-v3 (AVX2, FMA, BMI2: Haswell, 2013, and later) is what the
# bundle's llama.cpp already requires on x86-64; "generic" is the architecture's baseline.
TARGET_FEATURES = {
    "x86-64-v3": ("cx16", "sahf", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3", "avx", "avx2",
                  "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"),
    "generic": (),
}
PORTABLE = {"x86_64": ("x86-64-v3", "generic"), "AMD64": ("x86-64-v3", "generic")}


def portable_targets() -> tuple[str, ...]:
    """The portable targets for this machine's architecture, preferred first."""
    return PORTABLE.get(platform.machine(), ("generic",))


def target_env(target: str) -> dict[str, str]:
    """The numba environment that compiles for `target` ("host": this CPU, numba's default).
    A named CPU gets empty extra features: exactly the instruction sets the name implies."""
    return {} if target == "host" else {"NUMBA_CPU_NAME": target, "NUMBA_CPU_FEATURES": ""}


def host_cpu_name() -> str:
    import llvmlite.binding as ll

    return ll.get_host_cpu_name()


def host_supports(target: str) -> bool:
    """Whether this CPU runs code compiled for `target` (unknown targets: no)."""
    if target not in TARGET_FEATURES:
        return False
    if not TARGET_FEATURES[target]:
        return True
    import llvmlite.binding as ll

    have = ll.get_host_cpu_features()
    return all(have.get(f, False) for f in TARGET_FEATURES[target])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sources() -> dict[str, str]:
    """SHA-256 of every codec source file, by path relative to the package's parent."""
    return {p.relative_to(PACKAGE_DIR.parent).as_posix(): _sha256(p)
            for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _runtime() -> dict[str, str]:
    """What a cache's machine code and pickles depend on besides the CPU target (numba's
    version from its metadata: importing numba costs a fresh process 0.2 s)."""
    try:
        version = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:  # a bundle without numba's metadata
        import numba

        version = numba.__version__
    return {"numba": version, "python": sys.implementation.cache_tag,
            "machine": platform.machine(), "system": platform.system()}


@dataclass(frozen=True)
class Shipped:
    """A verified shipped cache: its folder, CPU target and the private folder numba uses."""

    root: Path
    target: str
    overlay: Path
    levels: frozenset[str]  # every kernel `precompile` reaches at these levels is in it


@dataclass
class _State:
    shipped: Shipped | None = None  # set by configure() when the shipped cache is used
    build: Path | None = None  # set while building a shipped cache
    reason: str = "not configured"  # why the shipped cache is or is not used


_state = _State()


def status() -> dict:
    """Which cache serves the kernels in this process, and why (for diagnostics)."""
    s = _state.shipped
    return {"shipped_cache": str(s.root) if s else None, "target": s.target if s else "host",
            "reason": _state.reason}


def verify(root: Path) -> str | dict:
    """The manifest of the shipped cache at `root` if it fits this installation, else why not."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
        files, target = manifest["files"], manifest["target"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no readable manifest ({type(e).__name__})"
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("runtime") != _runtime():
        return "built for another numba, Python or machine"
    recorded = manifest.get("sources") or {}
    # A bundle leaves out codec modules the app never imports (the benchmark): only the
    # sources present here must be the ones the cache was built from.
    if any(recorded.get(rel) != digest for rel, digest in _sources().items()):
        return "stale: the codec's sources differ from the ones it was built from"
    if not host_supports(target):
        return f"this CPU cannot run code built for {target}"
    for rel, digest in files.items():
        path = root / rel
        if (Path(rel).is_absolute() or ".." in Path(rel).parts or not path.is_file()
                or path.is_symlink() or _sha256(path) != digest):
            return f"corrupt: {rel} does not match its checksum"
    return manifest


def configure() -> None:
    """Choose where kernels come from; once, before any kernel is defined (at this module's
    import, below).

    It only sets defaults: a NUMBA_CPU_NAME or NUMBA_CACHE_LOCATOR_CLASSES of the user's wins
    (and then the shipped cache, built for one target, is not used)."""
    if _state.reason != "not configured":
        return
    build, root = os.environ.get(BUILD_ENV), os.environ.get(SHIPPED_ENV)
    if build:
        _state.build, _state.reason = Path(build), "building a shipped cache"
        _use_locator({})
        return
    if not root:
        _state.reason = f"no shipped cache ({SHIPPED_ENV} is not set)"
        return
    ours = os.environ.get(SET_ENV) == _numba_env()  # inherited from a parent kvdesk, not the user's
    if not ours and (os.environ.get("NUMBA_CPU_NAME")
                     or os.environ.get("NUMBA_CACHE_LOCATOR_CLASSES")):
        _state.reason = "NUMBA_CPU_NAME or NUMBA_CACHE_LOCATOR_CLASSES is set by the user"
        return
    found = verify(Path(root))
    if isinstance(found, str):
        _state.reason = f"shipped cache at {root} not used: {found}"
        return
    try:
        overlay = _link_overlay(Path(root), found["files"])
    except OSError as e:
        _state.reason = f"shipped cache at {root} not used: no temporary folder ({e})"
        return
    built = found.get("precompile")
    levels = built.get("levels") if isinstance(built, dict) else None
    levels = [n for n in levels if isinstance(n, str)] if isinstance(levels, list) else []
    _state.shipped = Shipped(Path(root), found["target"], overlay, frozenset(levels))
    _state.reason = f"shipped cache, built for {found['target']}"
    _use_locator(target_env(found["target"]))


def _use_locator(env: dict[str, str]) -> None:
    # numba raises on every cached kernel if a listed locator cannot be imported
    if importlib.util.find_spec(LOCATOR.rsplit(".", 1)[0]) is None:
        _state.shipped, _state.build = None, None
        _state.reason = f"{LOCATOR} cannot be imported: numba's own cache is used"
        return
    os.environ.update(env, NUMBA_CACHE_LOCATOR_CLASSES=",".join((LOCATOR, *NUMBA_LOCATORS)))
    os.environ[SET_ENV] = _numba_env()
    if "numba" in sys.modules:  # numba rereads its environment when it changes
        from numba.core import config

        config.reload_config()


def _numba_env() -> str:
    """The numba settings configure() makes, as one string (to recognise them in a child)."""
    return ",".join(os.environ.get(k, "") for k in
                    ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_CACHE_LOCATOR_CLASSES"))


def _link_overlay(root: Path, files: dict[str, str]) -> Path:
    """A private folder of links to the shipped files (copies where links are not allowed),
    removed at exit: numba may write there, never into the shipped folder."""
    overlay = Path(tempfile.mkdtemp(prefix="kvdesk-codec-cache-"))
    atexit.register(shutil.rmtree, overlay, ignore_errors=True)
    for rel in files:
        (overlay / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.symlink(root / rel, overlay / rel)
        except OSError:
            shutil.copyfile(root / rel, overlay / rel)
    return overlay


def cache_folder() -> Path | None:
    """Where the locator keeps the codec's kernels: the build's output folder, the private
    folder of links to the shipped cache, or None (numba's own cache)."""
    if _state.build is not None:
        return _state.build
    return _state.shipped.overlay if _state.shipped else None


def build(out: Path, target: str) -> dict:
    """Compile every kernel the app reaches (`precompile`) for `target` into `out` (replaced),
    in a child process (the target must be set before numba loads), and write the manifest
    that `verify` checks. Returns the manifest."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "codec.precompile", "--json"],
                          env=build_env(out, target), cwd=PACKAGE_DIR.parent,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"compiling the codec's kernels failed:\n{proc.stderr}")
    return write_manifest(out, target, precompile=json.loads(proc.stdout))


def build_env(out: Path, target: str) -> dict[str, str]:
    """The environment of a process that compiles the codec's kernels into `out` for `target`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.pop(SHIPPED_ENV, None)
    return {**env, **target_env(target), BUILD_ENV: str(out)}


def write_manifest(out: Path, target: str, **extra) -> dict:
    """Record what the cache in `out` was built for and every file's SHA-256."""
    files = {p.relative_to(out).as_posix(): _sha256(p)
             for p in sorted(out.rglob("*")) if p.is_file() and p.name != MANIFEST}
    if not files:
        raise RuntimeError(f"no compiled kernel was written to {out}")
    manifest = {"format": MANIFEST_FORMAT, "target": target, "runtime": _runtime(),
                "sources": _sources(), "files": files, **extra}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


# -- whether every kernel is already in numba's cache -------------------------------------
#
# A process that runs every step of `precompile.steps()` to the end has compiled or loaded
# every kernel the app reaches; it then records a stamp of what numba's cache held: the index
# file numba keeps per kernel and the data files beside it (one per signature), with their
# sizes and modification times, keyed by numba, Python, this CPU as numba targets it and the
# codec's sources' sizes and modification times (numba's own test: it drops a kernel's index
# when its source's stat changes). While all of that still matches, a load from the cache
# finds every kernel those steps reached, without compiling: `kernels_cached` checks it in a
# few milliseconds, and nothing here loads or compiles a kernel.
STAMP = "kvdesk-kernels-cached.json"
STAMP_FORMAT = 1


def stamp_path() -> Path | None:
    """Where the stamp lives: beside numba's cache (NUMBA_CACHE_DIR, which the bundle sets),
    else the checkout's `codec/__pycache__`; None while building a shipped cache."""
    if _state.build is not None:
        return None
    # numba.core.config's reading of it (`configure` sets it there): importing numba costs 0.2 s
    return Path(os.environ.get("NUMBA_CACHE_DIR") or PACKAGE_DIR / "__pycache__") / STAMP


def _cpu() -> dict:
    """The CPU numba compiles for here, as its code generator names it (its cache key), from
    its settings as numba reads them from the environment, without importing numba."""
    import llvmlite.binding as ll

    name = os.environ.get("NUMBA_CPU_NAME")  # read as numba.core.config reads them
    features = os.environ.get("NUMBA_CPU_FEATURES",
                              "" if str(name).lower() == "generic" else None)
    return {"triple": ll.get_process_triple(), "name": name or ll.get_host_cpu_name(),
            "features": ll.get_host_cpu_features().flatten() if features is None else features}


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()  # (through the shipped cache's links: its files)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _source_stats() -> dict[str, list[int] | None]:
    return {p.relative_to(PACKAGE_DIR.parent).as_posix(): _stat(p)
            for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _cached_files() -> dict[str, list[int] | None]:
    """The cache files of every codec kernel this process compiled or loaded: each one's
    index and its data files."""
    from numba.core.dispatcher import Dispatcher

    files: dict[str, list[int] | None] = {}
    for name, module in list(sys.modules.items()):
        if name != "codec" and not name.startswith("codec."):
            continue
        for obj in list(vars(module).values()):
            cache_file = getattr(getattr(obj, "_cache", None), "_cache_file", None)
            if not isinstance(obj, Dispatcher) or not obj.signatures or cache_file is None:
                continue
            index = Path(os.path.realpath(cache_file._index_path))
            for path in (index, *index.parent.glob(f"{index.stem}.*.nbc")):
                files[str(path)] = _stat(path)
    return files


def _stamp(level_names: list[str]) -> dict:
    return {"format": STAMP_FORMAT, "runtime": _runtime(), "cpu": _cpu(),
            "levels": sorted(level_names), "sources": _source_stats()}


def mark_cached(level_names: list[str]) -> None:
    """After every step of `precompile.steps(level_names=...)` has run in this process:
    record what numba's cache now holds. Nothing is recorded when a kernel's cache file is
    missing (numba could not write it) or the stamp cannot be written."""
    path, files = stamp_path(), _cached_files()
    if path is None or not files or None in files.values():
        return
    try:
        # (under PYTHONDONTWRITEBYTECODE there is no __pycache__ yet)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**_stamp(level_names), "files": files}))
        os.replace(tmp, path)
    except OSError:
        pass  # the next one-shot command warms up as it would without a stamp


def kernels_cached(level_names: list[str]) -> bool:
    """Whether every kernel `precompile.steps` reaches at these levels loads from numba's
    cache without compiling: the shipped cache in use was built by running them (`configure`
    verified it at import), or the stamp `mark_cached` wrote says so."""
    shipped = _state.shipped
    if shipped is not None and set(level_names) <= shipped.levels:
        return True
    path = stamp_path()
    try:
        stamp = json.loads(path.read_text()) if path is not None else None
        files = stamp.pop("files")
        if not isinstance(files, dict) or not set(level_names) <= set(stamp["levels"]):
            return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return (stamp == _stamp(stamp["levels"])
            and all(_stat(Path(p)) == st for p, st in files.items()))


@dataclass
class _Compiles:
    count: int = 0  # kernels numba compiled in this process (not loaded from a cache)
    seconds: float = 0.0
    active: int = 0  # compiles in progress now
    watching: bool = False


_compiles = _Compiles()
_compiles_lock = threading.Lock()


def compiles() -> tuple[int, float]:
    """(kernels compiled, seconds spent compiling them) in this process so far, counting from
    the first call: numba reports every compile (never a cache load) as an event."""
    with _compiles_lock:
        if not _compiles.watching:
            from numba.core import event

            event.register("numba:compile", _listener())
            _compiles.watching = True
        return _compiles.count, round(_compiles.seconds, 3)


def compiling() -> bool:
    """Whether numba is compiling a kernel right now (watched from the first `compiles()`)."""
    with _compiles_lock:
        return _compiles.active > 0


def _listener():
    from numba.core import event

    class Listener(event.Listener):
        """Sums the outermost compiles: compiling a kernel compiles the kernels it calls."""

        local = threading.local()

        def on_start(self, ev):
            depth = getattr(self.local, "depth", 0)
            if depth == 0:
                self.local.t0 = time.perf_counter()
                with _compiles_lock:
                    _compiles.active += 1
            self.local.depth = depth + 1

        def on_end(self, ev):
            self.local.depth -= 1
            if self.local.depth == 0:
                with _compiles_lock:
                    _compiles.active -= 1
                    _compiles.count += 1
                    _compiles.seconds += time.perf_counter() - self.local.t0

    return Listener()


configure()  # at import: `codec/__init__.py` imports this module before any kernel module
