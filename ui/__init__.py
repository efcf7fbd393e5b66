"""The PySide6 desktop GUI of kvdesk: presentation on top of desktop_app's engine.

Its rooms, top to bottom (an import-linter layers contract): `main` (the entry point) and
`screenshots`; `main_window`, which wires the rooms together; `chat/` (the conversation),
`library/` (chats and documents), `settings/` (the user's choices), side by side and
independent; the shared plumbing `workers` (engine calls off the GUI thread), `theme`,
`icons` and `testing` (the scripted fake engine); and `text/`, the words, free of Qt.

It never imports llama.cpp, SQLite or the codec (an import-linter contract): every model, store
and codec operation goes through the engine, on worker threads.
"""
