"""The documents room: what the user keeps, never evicted: models met, documents, chats and
messages, and the passages of long documents.

    library    models, documents, chats and messages, and each message's tokens per model:
               the rows a user sees (`LibraryStore`)
    passages   a long document's passages: text and locations, a full-text index (FTS5, BM25)
               and vectors (`PassageStore`); their tables' migrations (m008, and m014's index
               reading CJK text character by character), which the schema applies
    passagekv  which passage entries hold which passages' KV, found by content
               (`PassageKVStore`)

Its question is "what did the user keep?": rows deleted only with their document or chat. It
stands on the data directory room and the leaf modules; it never imports the caches room (a
document's KV entries go with it by the schema's cascades; a passage entry another document
shares is handed on in SQL), the schema, the shared tier or the `Store` facade, and never reads,
writes or evicts a chunk.
"""
