"""The data directory room: one SQLite file shared by threads and processes, kept usable.

    db        connections: one per thread, WAL, IMMEDIATE write transactions; a damaged file
              or a full disk raised as the store's errors, never as raw sqlite3 ones; the
              directory prepared, and SQLite's own check of the file
    values    a stored JSON value read back: one that no longer decodes is damage of the file
    reserve   room kept on the directory's disk, so that freeing space works on a full disk,
              and a turn's text is kept there
    paying    the writes the reserves pay for: freeing space, a turn's text; freed pages
              handed back to the file system
    place     the database file as opened: one removed, moved or replaced under a running
              kvdesk stops every write (they would go to a file no longer there)
    full      what a full disk means: SQLite's "full" recognized, the error the user reads
    locks     file locks between processes: one turn at a time per chat, one attach at a time
              per document

Its question is "how do threads and processes share one data directory safely?". It stands on
the leaf `errors` alone and never imports the schema, the caches, the documents, the shared
tier or the `Store` facade: what the file holds is theirs to say.
"""
