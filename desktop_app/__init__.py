"""kvdesk's application core, in rooms: each subpackage imports only those below it.

Top down: `cli` (the command line), `launcher` and `server` (the GUI hand-over, the local
API), `selfcheck`, `app` (settings turned into live resources), `engine` (the Python API the
CLI, the GUI and the server share), `chat` (documents, chats and turns), `kv` (caches stored
and streamed back), `calibration` (the codec readied and calibrated per model), `passages`
(a document longer than the context as passages: split, indexed, embedded, retrieved),
`model` (one llama.cpp model: runtime, KV state, prompts, model files), then the leaf
modules `settings`,
`options`, `errors`, `results` and `validation`. pyproject.toml's layers contract states it.
No Qt here: the GUI lives in `ui/`, reached only through `launcher`.
"""

import os

# llama.cpp (ggml) and numba both run on OpenMP. Its default lets idle workers spin, and on a
# 2-core machine a spinning pool starves the other one: measured here, prefill of 2,000 tokens
# ran at 117 tokens/s with PASSIVE against 59 with ACTIVE, and numba's encode 4x slower.
# libgomp reads this once, when it is loaded, so it is set before either library is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
