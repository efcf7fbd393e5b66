"""A title (a document's, a chat's) as plain-text output shows it: on one line, with no
character a terminal would act on, so that `kvdesk docs | grep` reads a row per document
and a file named with a BEL or an escape sequence cannot ring or recolour the terminal.

A line break is shown as `\\n`, any other control character (C0, DEL, C1, the Unicode line
and paragraph separators) escaped as Python writes it (`\\x07`, `\\x1b`), as a folder's file
names are (`formats.folders.shown`). It never changes what `--json` prints: a script reading
JSON gets the real title.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(title: str) -> str:
    """`title` escaped for a line of plain output (`new\\nline.txt`)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], title)
