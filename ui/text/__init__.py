"""The GUI's words: what the window says, as plain Python over the engine's records.

`formatting` turns numbers and engine reports into the short phrases the window shows
(sizes, restore and calibration lines, notes under an answer); `markdown` renders a message
as the HTML subset QTextBrowser displays, in colours it is given (`Colors`, `LIGHT`, `DARK`);
`start_failure` what the window says when it starts without an engine (a model that will not
load, a data folder whose store cannot be opened).

Its question is "how is this put into words?". Every other room of the GUI stands on it; it
never imports Qt (an import-linter contract), the engine or any other room of `ui`.
"""
