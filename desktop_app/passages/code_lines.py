"""Which lines of source code open a definition, for `split`'s code units.

A definition is a keyword (def, class, fn, type ...) followed by a name in the form a
definition gives it ("def name(", "class Name", "type Name =", Go's "func (r *T) Name("), not
a statement or key that merely begins with the word ("namespace = ...", "type=type,", YAML's
"type: object", "fn, lno = ..."), nor prose ("type checkers.  They are ..."); a C-like
function signature at the top level ("SQLITE_API int sqlite3_busy_timeout(sqlite3*, int
ms);") is one too. One-line declarations (a #define, a signature or typedef ending in ";")
in a row are a table, read as one unit (`declaration`). Lines inside a triple-quoted string
(a Python docstring and the examples in it) are text, never code: `Strings`.
"""

from __future__ import annotations

import re

_NAME_FOLLOWS = r"(?=[\s(<\[{:;=!?]|\.\w|$)"  # what may follow a definition's name
_KEYWORD = re.compile(
    r"^[ \t]*(?:(?:export|default|pub(?:\([^)]*\))?|public|private|protected|static|async|"
    r"abstract|final|inline|unsafe|const|extern(?:[ \t]+\"[^\"]*\")?|override|internal|"
    r"sealed)[ \t]+)*"
    r"(?:func[ \t]*\([^)]*\)[ \t]*[A-Za-z_]\w*[ \t]*[\[(]"  # Go's method
    r"|impl[ \t]*<"  # Rust's impl<T> ...
    # (C's "struct ind *me = ...;" is a variable of that type)
    r"|(?:(?:class|struct|enum)[ \t]+(?![\w$]+[ \t*&]+[\w$]+[ \t]*[=;,\[(])"
    r"|(?:def|function\*?|func|fn|impl|trait|interface|module|type|namespace|sub|proc|"
    r"procedure)[ \t]+)"
    # A keyword followed by a word in lower case and more words, in a line with no
    # bracket, brace, "=" or ";", is a comment's prose ("function in a row, each
    # decorated...", "type of the value"), not a definition ("type server struct {" is
    # one, and Elixir's "def hello do").
    r"(?![a-z]+[ \t]+(?!do\s*$)[^\s(\[{=;][^(\[{=;\n]*$)"
    r"[A-Za-z_$][\w$]*(?:::[A-Za-z_]\w*)*" + _NAME_FOLLOWS +
    r"|typedef[ \t]|template[ \t]*<|macro_rules!|#define\b"
    # "#  define" in nested #ifs, not a comment's "# define an ..."
    r"|#[ \t]+define[ \t]+\w+(?:\(|[ \t]*$|[ \t]+[^\sa-z]))")
# A C, C++ or Java function's signature at the top level: one to six words of type and
# qualifiers, the name, its "(", and a line ending as a signature does (not prose quoting
# a call); not a statement a keyword begins.
_SIGNATURE = re.compile(
    r"^(?!(?:return|else|if|elif|while|for|switch|case|match|sizeof|goto|new|delete|throw|"
    r"raise|await|yield|print|assert|del|not|and|or|in|is|lambda|with|async|from|import|"
    r"global|nonlocal|except|try|do|typeof|echo|defer|go|select|using)\b)"
    r"(?:[A-Za-z_][\w:<>]*[ \t*&]+){1,6}[*&]*[A-Za-z_~][\w:~]*[ \t]*\("
    r"(?:.*[(){;,])?[ \t]*(?:/\*.*\*/|//.*)?[ \t]*$")


def definition(line: str) -> bool:
    """Whether a line of code (not inside a string) opens a definition."""
    return bool(_KEYWORD.match(line) or _SIGNATURE.match(line))


def declaration(line: str) -> str | None:
    """The kind of a one-line declaration ("#define", "typedef", a function's "signature"
    with no body), None for other lines (a definition with a body, a macro continued on
    the next line)."""
    stripped = line.strip()
    if re.match(r"#[ \t]*define\b", stripped):
        return None if stripped.endswith("\\") else "#define"
    code = re.sub(r"[ \t]*(?:/\*.*\*/|//.*)$", "", stripped)
    if code.startswith("typedef"):
        return "typedef" if code.endswith(";") else None
    # (a signature's parameters may go on over the next lines)
    return "signature" if code.endswith((";", ",", "(")) and _SIGNATURE.match(line) and \
        not _KEYWORD.match(line) else None


_QUOTES = re.compile(r"\"\"\"|'''|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|#.*")


class Strings:
    """Where triple-quoted strings open and close, line by line."""

    def __init__(self) -> None:
        self.quote: str | None = None  # the delimiter of the string open at the line's end

    def inside(self, line: str) -> bool:
        """Whether `line` begins inside a triple-quoted string (then it is text, not code);
        reads the line's quotes for the next."""
        began = self.quote is not None
        if not began and line.lstrip().startswith(("//", "/*", "*")):
            return False  # a comment's quotes open nothing
        pos = 0
        while pos < len(line):
            if self.quote is not None:
                close = line.find(self.quote, pos)
                if close < 0:
                    break
                self.quote, pos = None, close + 3
                continue
            m = _QUOTES.search(line, pos)
            if not m or m.group().startswith("#"):
                break
            if m.group() in ('"""', "'''"):
                self.quote = m.group()
            pos = m.end()
        return began
