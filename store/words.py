"""How the store's full-text index reads Chinese, Japanese and Korean: each character a word.

FTS5's unicode61 tokenizer ends a word only at a space or punctuation, and these scripts
write none between words: a whole clause (`モルヴェル岬の灯台守の名前は…`) would be one
token that no question matches. The index is given each CJK character as a token of its own
(`index_text`, registered on every store connection as the SQL function `FTS_TEXT`), and a
question's run of them is searched as its overlapping pairs (`cjk_words`: "天文台" as "天文"
and "文台"), each a phrase of two tokens, which matches wherever the pair is written: a
two-character word as well as one of four. Other scripts pass through unchanged. A passage's
headings are indexed as their text (`index_headings`, the SQL function `FTS_HEADINGS`), not
as the JSON list they are stored as.

Plain text in, plain text out: it never touches a database.
"""

from __future__ import annotations

import json
import re

# Han (with its extensions and compatibility forms, and 々〆〇), kana (with ー and the
# half-width forms) and Hangul.
CJK = ("\u1100-\u11ff\u3005-\u3007\u3040-\u309f\u30a0-\u30ff\u3130-\u318f\u31f0-\u31ff"
       "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f"
       "\U00020000-\U0003134f")
CJK_CHAR = re.compile(f"([{CJK}])")  # one of them
_RUNS = re.compile(f"[{CJK}]+|[^{CJK}]+")
FTS_TEXT = "kvdesk_fts_text"  # the SQL functions' names
FTS_HEADINGS = "kvdesk_fts_headings"


def index_text(text: str | None) -> str | None:
    """`text` as the full-text index reads it: a space on each side of every CJK character."""
    return CJK_CHAR.sub(r" \1 ", text) if text else text


def index_headings(stored: str | None) -> str | None:
    """A passage's headings (stored as a JSON list) as the index reads them: their text
    (`index_text`), never the list's escapes ("\\u00dcbersicht" for "Übersicht"), which no
    question holds; a list damaged on disk as it is (its passage must still be deletable)."""
    try:
        headings = json.loads(stored) if stored else []
    except ValueError:
        return index_text(stored)
    if not isinstance(headings, list):
        return index_text(stored)
    return index_text(" ".join(map(str, headings)))


def cjk_words(word: str) -> list[str]:
    """`word` (a run of letters and digits) in the parts a question searches for: each run
    of CJK characters as its overlapping pairs (a lone character as itself), the rest as
    written."""
    out: list[str] = []
    for run in _RUNS.findall(word):
        if CJK_CHAR.match(run):
            out += [run[i:i + 2] for i in range(max(1, len(run) - 1))]
        else:
            out.append(run)
    return out
