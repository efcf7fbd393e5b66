"""The user's choices: the settings dialog and the quality-vs-speed slider.

`settings_dialog` edits a `desktop_app.settings.Settings` (model, folders, theme, the shared
cache, the local API, ...) with its `context_size` box, its `appearance` fields (theme, text
size) and its `generation_settings` group (how answers are generated); `quality` is the
slider under the conversation, from the fastest load to the best quality.

Its question is "what did the user choose?". These widgets edit what they are given; they
never save the settings file or call the engine (the main window does), and never import the
main window, the chat or library rooms, nor the model runtime, codec or store.
"""
