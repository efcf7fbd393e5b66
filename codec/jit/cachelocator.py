"""numba's cache locator for the codec's kernels while a shipped cache is used or built.

`jitcache.configure()` lists this class first in NUMBA_CACHE_LOCATOR_CLASSES, and numba asks
it, for every `cache=True` kernel, where that kernel's cache lives. It answers only for
kernels of the codec package and only when `jitcache` has a folder for them (the private
folder of links to the verified shipped cache, or the folder a build writes); otherwise it
declines and numba's own locators decide, as without it. Cache entries are found by the
kernel's path inside the package and stamped with its source's SHA-256, so a cache built in a
checkout is found in a bundle wherever that is unpacked.

Imported by numba, after numba; it must never be imported before `jitcache.configure()`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

from numba.core.caching import _CacheLocator

from . import jitcache


@functools.cache
def _stamp(py_file: str) -> str:
    with open(py_file, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class CodecCacheLocator(_CacheLocator):
    def __init__(self, py_func, py_file: str, folder: Path):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._folder = folder

    def get_cache_path(self) -> str:
        return str(self._folder)

    def get_source_stamp(self) -> str:
        return _stamp(self._py_file)

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file: str):
        root = jitcache.cache_folder()
        # The module's file, not the code's: a bundle's code objects carry a relative path
        # (PyInstaller strips the build machine's), its modules where the .py file lies.
        module = sys.modules.get(py_func.__module__)
        py_file = getattr(module, "__file__", None) or py_file
        if root is None or not os.path.isfile(py_file):
            return None
        try:
            rel = Path(os.path.realpath(py_file)).relative_to(jitcache.PACKAGE_DIR.parent)
        except ValueError:
            return None  # not a codec kernel: numba's own locators decide
        self = cls(py_func, py_file, root / rel.parent)
        try:
            self.ensure_cache_path()
        except OSError:
            return None
        return self
