"""The shipped cache of compiled codec kernels: found, verified, used, never written; anything
wrong with it falls back to compiling (codec/jit/jitcache.py, codec/jit/cachelocator.py).

The end-to-end tests build a real shipped cache of one small kernel in a child process (a
compile of a second or two) rather than the whole codec; `make package-test` checks the
bundle's full cache.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codec.jit import jitcache

ROOT = Path(__file__).resolve().parent.parent

# Run in a child: a kernel with the signature the cache is built with, then one it lacks.
CHILD = """
import json, subprocess, sys, numpy as np
from codec.jit import jitcache
from codec.kernels import quant
before = jitcache.compiles()[0]
quant.any_nonfinite(np.zeros((1, 2, 3), np.uint16))
shipped_sig = jitcache.compiles()[0] - before
found = quant.any_nonfinite(np.full((1, 4, 3), 0x7C00, np.uint16)[:, ::2])
grandchild = subprocess.run([sys.executable, "-c", "import codec, json; from codec.jit import "
                             "jitcache; print(json.dumps(jitcache.status()))"],
                            capture_output=True, text=True, check=True).stdout
print(json.dumps({"compiled_shipped_signature": shipped_sig, "found_inf": bool(found),
                  "compiled": jitcache.compiles()[0] - before, **jitcache.status(),
                  "grandchild": json.loads(grandchild)}))
"""


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NUMBA_") and k != jitcache.SHIPPED_ENV}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _run(code: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """A shipped cache for the generic target holding one kernel, one signature."""
    out = tmp_path_factory.mktemp("shipped")
    code = "import numpy as np; from codec.kernels import quant; " \
           "quant.any_nonfinite(np.zeros((1, 2, 3), np.uint16)); print('{}')"
    _run(code, {**jitcache.build_env(out, "generic"), "PYTHONPATH": str(ROOT)})
    jitcache.write_manifest(out, "generic")
    return out


def _read_only(folder: Path) -> None:
    for p in [*folder.rglob("*"), folder]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def test_shipped_cache_is_used_and_never_written(shipped, tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    cache = bundle / "codec_cache"
    (cache).mkdir()
    for rel, data in _files(shipped).items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    _read_only(bundle)
    before = _files(bundle)
    user = tmp_path / "user-cache"
    report = _run(CHILD, _child_env(KVDESK_CODEC_CACHE=str(cache), NUMBA_CACHE_DIR=str(user)))
    assert report["target"] == "generic" and report["shipped_cache"] == str(cache)
    # a kvdesk process it starts inherits its numba settings, and still uses the cache
    assert report["grandchild"]["shipped_cache"] == str(cache)
    assert report["compiled_shipped_signature"] == 0  # loaded from the shipped cache
    # a signature the shipped cache lacks compiles (into the private folder) and works
    assert report["compiled"] >= 1 and report["found_inf"] is True
    assert _files(bundle) == before
    assert not [p for p in user.rglob("*") if p.is_file()]


_CACHED = """
import json
from codec.jit import jitcache
print(json.dumps([jitcache.kernels_cached(["high"]), jitcache.kernels_cached(["high", "compact"])]))
"""


def test_a_shipped_cache_built_at_every_level_needs_no_warm_up(shipped, tmp_path):
    """A bundle's one-shot command skips the codec's warm-up on its first start: the shipped
    cache it verified holds every kernel of the levels its build ran, with no stamp in the
    user's cache yet. A manifest that records no levels (an older build) says nothing."""
    cache = tmp_path / "codec_cache"
    for rel, data in _files(shipped).items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    env = _child_env(KVDESK_CODEC_CACHE=str(cache), NUMBA_CACHE_DIR=str(tmp_path / "user"))
    assert _run(_CACHED, env) == [False, False]
    manifest = json.loads((cache / jitcache.MANIFEST).read_text())
    manifest["precompile"] = {"levels": ["high", "lossless"]}
    (cache / jitcache.MANIFEST).write_text(json.dumps(manifest))
    assert _run(_CACHED, env) == [True, False]  # compact's kernels were not built
    assert not (tmp_path / "user").exists()


def _damaged(shipped: Path, folder: Path, damage: str) -> Path:
    """A copy of the shipped cache with one kind of damage."""
    for rel, data in _files(shipped).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    manifest = json.loads((folder / jitcache.MANIFEST).read_text())
    nbc = next(folder.rglob("*.nbc"))
    if damage == "corrupt":
        nbc.write_bytes(b"\0" * 64 + nbc.read_bytes()[64:])
    elif damage == "missing-file":
        nbc.unlink()
    else:
        key = "sources" if damage == "stale" else "runtime"
        manifest[key][next(iter(manifest[key]))] = "0" * 64
        (folder / jitcache.MANIFEST).write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("damage", ["corrupt", "stale"])
def test_a_damaged_shipped_cache_falls_back_to_compiling(shipped, tmp_path, damage):
    cache = _damaged(shipped, tmp_path / "codec_cache", damage)
    user = tmp_path / "user-cache"
    report = _run(CHILD, _child_env(KVDESK_CODEC_CACHE=str(cache), NUMBA_CACHE_DIR=str(user)))
    assert report["shipped_cache"] is None and report["target"] == "host"
    assert damage in report["reason"]
    assert report["found_inf"] is True
    assert [p for p in user.rglob("*.nbi")]  # compiled into numba's own cache instead


def test_verify_says_why_a_cache_does_not_fit(shipped, tmp_path):
    assert jitcache.verify(shipped)["target"] == "generic"
    for damage, why in [("missing-file", "corrupt"), ("other-numba", "another numba"),
                        ("stale", "stale"), ("corrupt", "corrupt")]:
        assert why in jitcache.verify(_damaged(shipped, tmp_path / damage, damage))
    assert "no readable manifest" in jitcache.verify(tmp_path)
    (tmp_path / jitcache.MANIFEST).write_text("{not json")
    assert "no readable manifest" in jitcache.verify(tmp_path)
    manifest = json.loads((shipped / jitcache.MANIFEST).read_text())
    (tmp_path / jitcache.MANIFEST).write_text(json.dumps({**manifest, "target": "pentium-9"}))
    assert "cannot run code built for pentium-9" in jitcache.verify(tmp_path)
    # a shipped file replaced by a link to elsewhere is not trusted either
    (tmp_path / jitcache.MANIFEST).write_text(json.dumps(manifest))
    for rel in manifest["files"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).symlink_to(shipped / rel)
    assert "corrupt" in jitcache.verify(tmp_path)


def test_every_codec_source_in_every_room_is_checked_and_its_kernels_found_by_their_path(
        shipped):
    """A shipped cache is stale when any codec module changed, those of the rooms too; its
    kernels are kept under their module's path inside the package (codec/kernels/...)."""
    assert set(jitcache._sources()) == {p.relative_to(ROOT).as_posix()
                                        for p in (ROOT / "codec").rglob("*.py")}
    assert "codec/kernels/quant.py" in jitcache._sources()
    files = json.loads((shipped / jitcache.MANIFEST).read_text())["files"]
    assert files and all(rel.startswith("codec/kernels/quant.") for rel in files)


def test_targets_and_the_cpu():
    assert jitcache.host_supports("generic") and not jitcache.host_supports("pentium-9")
    assert jitcache.target_env("host") == {}
    assert jitcache.target_env("x86-64-v3") == {"NUMBA_CPU_NAME": "x86-64-v3",
                                                "NUMBA_CPU_FEATURES": ""}
    assert jitcache.portable_targets()[-1] == "generic"
    if "x86-64-v3" in jitcache.portable_targets():
        flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        if flags:
            assert jitcache.host_supports("x86-64-v3") == (" avx2" in flags and " bmi2" in flags)


def test_compiles_counts_compiles_not_cache_loads():
    count, seconds = jitcache.compiles()
    from numba import njit

    @njit  # no cache: compiled here, in this process
    def twice(x):
        return 2 * x

    assert twice(np.float64(21)) == 42
    after, after_s = jitcache.compiles()
    assert after == count + 1 and after_s > seconds


def test_the_users_own_numba_target_wins(shipped):
    code = ("import json, codec; from codec.jit import jitcache; "
            "print(json.dumps(jitcache.status()))")
    report = _run(code, _child_env(KVDESK_CODEC_CACHE=str(shipped), NUMBA_CPU_NAME="generic"))
    assert report["shipped_cache"] is None and "set by the user" in report["reason"]


def test_the_stamp_says_every_kernel_is_cached_while_nothing_it_records_changed(
        tmp_path, monkeypatch):
    """After a full run of precompile's steps, the stamp records every kernel's cache files;
    any difference in them, the CPU, numba or the codec's sources, or a level it did not
    cover, says "not known to be cached"."""
    from codec import precompile

    path = tmp_path / jitcache.STAMP
    monkeypatch.setattr(jitcache, "stamp_path", lambda: path)
    assert not jitcache.kernels_cached(["high"])  # no stamp yet
    precompile.run(level_names=["high"])  # its last step writes the stamp
    stamp = json.loads(path.read_text())
    decoders = [p for p in stamp["files"] if "rans.decode-" in p]
    assert any(p.endswith(".nbi") for p in decoders) and any(p.endswith(".nbc") for p in decoders)
    assert all(Path(p).is_file() for p in stamp["files"])
    assert jitcache.kernels_cached(["high"])
    assert not jitcache.kernels_cached(["high", "compact"])  # compact's steps never ran

    def changed(edit) -> bool:
        s = json.loads(json.dumps(stamp))
        edit(s)
        path.write_text(json.dumps(s))
        return not jitcache.kernels_cached(["high"])

    index = next(p for p in decoders if p.endswith(".nbi"))
    assert changed(lambda s: s["files"].__setitem__(index, [1, s["files"][index][1]]))
    assert changed(lambda s: s["files"].__setitem__(str(tmp_path / "gone.nbc"), [1, 1]))
    assert changed(lambda s: s["sources"].__setitem__("codec/kernels/rans.py", [1, 1]))
    assert changed(lambda s: s["cpu"].__setitem__("name", "another-cpu"))
    assert changed(lambda s: s["runtime"].__setitem__("numba", "0.0"))
    assert not changed(lambda s: None)
    path.write_text("not json")
    assert not jitcache.kernels_cached(["high"])


def test_no_stamp_while_a_kernels_cache_file_is_missing(tmp_path, monkeypatch):
    """numba could not write a kernel's cache (a read-only folder): nothing is vouched for."""
    path = tmp_path / jitcache.STAMP
    monkeypatch.setattr(jitcache, "stamp_path", lambda: path)
    monkeypatch.setattr(jitcache, "_cached_files", lambda: {str(tmp_path / "a.nbi"): None})
    jitcache.mark_cached(["high"])
    assert not path.exists()
