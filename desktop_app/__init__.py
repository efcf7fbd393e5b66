"""kvdesk's application core: model runtime, exact KV bridge, engine, settings and CLI.

Layers, bottom up: `kvstate` (llama.cpp state bytes <-> numpy KV), `models` (locating and
identifying GGUF files), `runtime` (one model and context: prefill, generate, capture and
restore KV), `settings`, `app` (settings turned into live resources; the Python API the CLI and
the GUI share), `cli`. No Qt here: the GUI lives in `ui/`, reached only through `launcher`.
"""

__version__ = "0.1.0"
