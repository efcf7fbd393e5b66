"""The chat room: documents and chats as the user sees them, and the turns asked in them.

`library` lists documents, chats and messages over the store; `attaching` and `documents`
turn a file into a document whose KV is stored (`encodings`: its bytes read as written);
`sessions` decides what the chat context holds and runs a turn (the room for "how does a
chat over three documents come back");
`longdoc` makes a chat over a document too long for the context out of the passages each
question retrieves (`readings`: which documents a chat reads whole, which from passages);
`answers` and `repetition` stream an answer and stop a loop; `exactness`
computes a blended chat's exact prefix in the background and `passagefill` every passage's
KV, both on `background`'s low-priority thread; `completions` answers a client's whole
conversation with the persistent prompt cache; `fairlock` serves turns in arrival order and
`turns` waits for one another process holds.

Its question is "what happens when the user asks?". It stands on the KV room; it never imports
the engine facade, the server, the CLI or Qt.
"""
