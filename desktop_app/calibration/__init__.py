"""The calibration room: the codec readied for a model, and its levels measured on it.

`codec_prep` readies the codec's kernels in the background at start; `calibrate` searches the
codec configurations that keep each level's promise on one model, `steps` keeps a run's
measurements as it goes (a run stopped goes on from them), `runs` runs one model's
calibration at a time in a data directory (a second process waits and takes its result),
and `calibrations` keeps the
results per model; `quality` measures how a compressed cache answers against the exact one
(`kvdesk eval`).

Its question is "what may this model's cache be encoded with?". It stands on the model room
and the codec; it never imports the KV room's stored caches, chats, the engine or a front end.
"""
