"""The conversation: the transcript and the input box, and the questions asked in them.

`chat_view` shows the messages (rendered Markdown that grows while an answer streams) and the
input box under them; `asking` (a mixin of the main window) sends a question, streams the answer
back, stops and regenerates it.

Its question is "what happens on screen when the user asks?". It stands on `ui.text` and
`ui.workers`; it never imports the main window, the library or settings rooms, nor the model
runtime, codec or store.
"""
