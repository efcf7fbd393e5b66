"""kvdesk's application core: model runtime, exact KV bridge, engine, settings and CLI.

Layers, bottom up: `kvstate` (llama.cpp state bytes <-> numpy KV), `models` (locating and
identifying GGUF files), `runtime` (one model and context: prefill, generate, capture and
restore KV), `settings`, `app` (settings turned into live resources; the Python API the CLI and
the GUI share), `cli`. No Qt here: the GUI lives in `ui/`, reached only through `launcher`.
"""

import os

# llama.cpp (ggml) and numba both run on OpenMP. Its default lets idle workers spin, and on a
# 2-core machine a spinning pool starves the other one: measured here, prefill of 2,000 tokens
# ran at 117 tokens/s with PASSIVE against 59 with ACTIVE, and numba's encode 4x slower.
# libgomp reads this once, when it is loaded, so it is set before either library is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
