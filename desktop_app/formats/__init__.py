"""The formats room: packaged documents — Word documents (.docx) and EPUB books — and folders
read as text.

`office` tells from a file's bytes and name whether it is one of them, and refuses, named,
what kvdesk does not read (encrypted or damaged files, .doc, OpenDocument, RTF, spreadsheets,
slides); `wordfiles` reads a Word document (python-docx) and `ebooks` an EPUB book (ebooklib,
each chapter through the web page reader the chat room's `documents` passes it), each giving
back its text with its headings as a `Book` for `documents.extract`; `folders` reads a folder
(a code base, notes) as one document, each readable file under its path, and says what it
left out; `webpages` parses a web page's visible text, its lines and headings.

Its question is "what text does this packaged file hold?". It stands on leaf modules and the
passages room's `records` only: it never imports the chat room, the model, the KV room, the
store, llama.cpp or Qt, and it never tokenizes. python-docx, ebooklib and lxml are imported
only when such a file is read.
"""
