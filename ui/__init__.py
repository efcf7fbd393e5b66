"""The PySide6 desktop GUI of kvdesk: presentation on top of desktop_app's engine.

It never imports llama.cpp, SQLite or the codec (an import-linter contract): every model, store
and codec operation goes through the engine, on worker threads.
"""
