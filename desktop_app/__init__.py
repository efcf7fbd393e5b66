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

# llama.cpp (ggml) and numba both run on OpenMP (libgomp), which reads its settings once, when
# it is loaded: so they are set here, before either library is imported. Its default lets an
# idle worker spin ~300,000 times before it sleeps, and on a 2-core machine a spinning pool
# starves the other one (a 2,000-token prefill at 47 tokens/s beside two busy processes,
# against 109); a passive policy (no spin) makes every one of llama.cpp's per-operation
# barriers a sleep and a wake, and generation 2.7x slower on a quiet machine (33 ms a token
# against 12). A short spin keeps both: benchmarks/RESULTS.md, "OpenMP's wait". A user's own
# policy or spin count is left as it is.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")
__version__ = "0.1.0"
