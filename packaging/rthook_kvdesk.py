"""PyInstaller runtime hook: environment a frozen kvdesk needs before any of its imports.

Runs inside the bundle only, before the entry point. It only sets defaults (`setdefault`):
a user's own environment always wins. It must never import numba, llama_cpp or the codec,
since the settings below only take effect if they are in place before those load.
"""

import os
import sys

import platformdirs

# numba's `cache=True` writes compiled kernels next to the source files, which live inside
# the (possibly read-only, possibly shared) bundle: keep them in the user's cache instead, so
# the second start skips the ~seconds of compilation too.
os.environ.setdefault(
    "NUMBA_CACHE_DIR", os.path.join(platformdirs.user_cache_dir("kvdesk"), "numba"))

# The codec's kernels compiled at build time for a portable CPU target (`make package`): used
# when they fit this CPU (codec/jit/jitcache.py), so the first start compiles nothing; never
# written, whatever happens.
os.environ.setdefault("KVDESK_CODEC_CACHE", os.path.join(sys._MEIPASS, "codec_cache"))

# The bundle ships no CUDA toolkit (numba's CUDA backend compiles through the system's NVVM),
# so a machine with an NVIDIA driver but no toolkit would pick the CUDA codec and then fail
# to compile it. The CPU kernels are the bundle's backend; KVDESK_CODEC_BACKEND=cuda opts in.
os.environ.setdefault("KVDESK_CODEC_BACKEND", "cpu")
