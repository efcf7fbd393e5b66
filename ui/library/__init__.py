"""The library: chats and documents in the sidebar, and what the user does with them.

`sidebar` lists past chats by date, `document_list` the attached documents with their progress;
`switching` (a mixin of the main window) opens a new or past chat with its ticked documents;
`library_actions` (a mixin) attaches, recomputes, deletes, renames and exports, and shows a
source in its document (`document_view`); `codec_status` (a mixin) shows the codec's kernels
being prepared and its calibration for the model in the status bar; `listing` (a mixin)
reads the chats and the documents into the sidebar, and says when the store cannot list them.

Its question is "which chats and documents are there, and in what state?". It stands on
`ui.text`; it never imports the main window, the chat or settings rooms, nor the model
runtime, codec or store.
"""
