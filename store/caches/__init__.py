"""The caches room: models' KV caches, their chunks, and the codec calibrations they need.

    kv            entries: written a chunk at a time, invisible until complete; the
                  longest-prefix lookup; the tree of entries extending one another
    writers       an entry's chunks put one at a time (on a thread of their own, or not),
                  made visible whole, or aborted and deleted
    blobs         a chunk's bytes as a BLOB, sealed to its place and checked on every read
    deleting      an entry with those extending it, or a chat's old ones none extends
    splitting     an entry cut in two at a chunk boundary, its chunks moved, never re-encoded
    quota         the disk budget: least recently used entries evicted first; abandoned
                  writes, and the documents of attaches killed before their cache, removed
    integrity     every chunk checked, what fails quarantined, what is missing found, what
                  nothing can repair dropped a level at a time
    calibrations  the codec calibrations entries are decoded with: checked bytes per model

Its question is "which KV is stored, and can it be read back?": the part of the store that is
evicted and recomputed, where documents, chats and passages never are. It stands on the data
directory room and the leaf modules (`errors`, `records`, `tokens`); it never imports the
documents room, the schema, the shared tier or the `Store` facade, and never interprets the
bytes of a chunk or a calibration: they are the codec's.
"""
