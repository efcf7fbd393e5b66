"""The KV room: a model's cache captured, encoded, stored, and streamed back chunk by chunk.

`kvcache` captures and stores a context's KV at the codec's `levels`; `streaming`, `reading`,
`sources` and `speeds` bring it back, choosing a level per chunk for the time budget (the room
for "why was this chunk read at compact"); `blending` restores a chat over several documents
(or passages) from their separate caches; `passagekv` keeps each passage's own KV; `sharing` is
the shared S3 tier's side; `repair` fixes what `verify` found; `contexts` holds the model
contexts these run in.

Its question is "how does a cache come back?". It stands on calibration and the model room;
it never imports chats, sessions, the engine, the server or a front end: it knows prefixes and
entries, not what a user said.
"""
