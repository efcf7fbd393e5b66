"""The passages room: a document too long for the context, as passages that can be retrieved.

`split` cuts a document's text into passages of a few hundred tokens on its own boundaries
(paragraphs and headings of prose and Markdown, pages of a PDF, definitions in code), each
with its location (characters, lines, page, heading path), `code_lines` telling it which
lines of code open a definition, `plain_headings` which lines of plain text are headings and
`pdf_headings` where a PDF's outline entries are in its text; `records` reads tables and JSON as
one record a line, each value next to its column or key, so that a passage cut from their
middle still says what its values are; `embed` turns texts into
L2-normalised vectors with a static embedding model that ships inside its wheel (nothing is
downloaded); `index` stores a document's passages, their full-text index and their vectors;
`retrieve` answers a question with the passages most likely to hold its answer (BM25, dense,
or both fused by reciprocal rank), and `across` with those of several documents, merged by
what compares between them; `evidence` finds the sentences of those passages that name
what the question asks about.

Its question is "which parts of this long document does the question need?". It stands on the
store and leaf modules only: tokens are counted through a callable the caller passes (the
model's tokenizer), so it never imports the model, the KV room, the chat room, the engine,
llama.cpp or Qt, and it never computes or reads any KV.

The ranking's choices and defaults are declared here rather than in `retrieve`, so that the
command line names them without importing numpy and the store before a one-shot command has
started loading its model.
"""

MODES = ("bm25", "dense", "fused")
DEFAULT_MODE = "bm25"  # measured: benchmarks/bench_retrieval.py, RESULTS.md
DEFAULT_K = 8
