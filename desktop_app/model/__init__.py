"""The model room: one GGUF model, what it reads and the KV cache it makes.

Where model files are and what their headers say (`models`, `gguf_header`, `contextsize`),
whether kvdesk can keep a model's cache (`support`, `layout`), the llama.cpp runtime that
prefills and generates (`runtime`, `llamacalls`, `sampling`, `chat_templates`, `llamalog`)
and the structured answers it can be held to (`answerformat`), the text it is given
(`prompts`), its state bytes as numpy KV (`kvstate`), how its keys are rotated (`rope`) and
tokens computed between others it holds (`inplace`).

Its question is "what does this model compute?". It never imports the codec's levels, the
store's chunks, calibration, chats or any front end: every room above stands on it, and it on
nothing of the app but the leaf modules (`errors`, `options`, `results`, `validation`).
"""
