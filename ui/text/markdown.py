"""A small Markdown-to-HTML renderer for chat messages, in the subset QTextBrowser displays.

It covers what models write: paragraphs, headings, lists, quotes, rules, fenced code (with a
cheap keyword/string/comment highlighter), inline code, emphasis and links. An unfinished code
fence renders as code, so a streamed answer looks right while it grows. Everything from the
text is escaped: a message can never inject markup.

It is pure Python: no Qt, no I/O. The colours come in from the caller (`ui.theme`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Colors:
    text: str = "#1f2328"
    muted: str = "#656d76"  # (4.5:1 or more on every background here, user_bg's included)
    link: str = "#0969da"
    code_bg: str = "#f3f4f6"
    user_bg: str = "#eef2f8"
    keyword: str = "#cf222e"
    string: str = "#0a3069"
    comment: str = "#656d76"
    number: str = "#0550ae"
    error: str = "#cf222e"


LIGHT = Colors()
DARK = Colors(text="#e6edf3", muted="#8d96a0", link="#4493f8", code_bg="#161b22",
              user_bg="#1f2937", keyword="#ff7b72", string="#a5d6ff", comment="#8d96a0",
              number="#79c0ff", error="#f85149")
# White and yellow on black, every colour 7:1 or more on both backgrounds (WCAG AAA)
HIGH_CONTRAST = Colors(text="#ffffff", muted="#d0d0d0", link="#ffff00", code_bg="#000000",
                       user_bg="#1a1a1a", keyword="#ffb000", string="#80ffff",
                       comment="#d0d0d0", number="#c0c0ff", error="#ff8080")

MONO = "'DejaVu Sans Mono', 'Menlo', 'Consolas', monospace"

KEYWORDS = frozenset("""
    and as assert async await break case catch class const continue def default defer del do elif
    else enum except export extends false False final finally fn for from func function go if impl
    import in interface is let loop match mod module mut new nil None not null or package pass pub
    raise return self static struct super switch this throw true True try type typeof use var void
    where while with yield
""".split())
HASH_COMMENT_LANGS = {"python", "py", "sh", "bash", "shell", "zsh", "ruby", "rb", "yaml", "yml",
                      "toml", "r", "perl", "pl", "make", "makefile", "dockerfile", "ini", "conf"}
SLASH_COMMENT_LANGS = {"c", "cpp", "c++", "h", "hpp", "java", "js", "javascript", "ts",
                       "typescript", "rust", "rs", "go", "kotlin", "swift", "cs", "csharp", "scala",
                       "php", "jsx", "tsx", "json", "jsonc"}


def _code_pattern(lang: str) -> re.Pattern[str]:
    comments = []
    if lang not in SLASH_COMMENT_LANGS:
        comments.append(r"\#[^\n]*")
    if lang not in HASH_COMMENT_LANGS:
        comments += [r"//[^\n]*", r"/\*.*?\*/"]
    return re.compile(
        rf"(?P<comment>{'|'.join(comments)})"
        r"|(?P<string>\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|`[^`\n]*`)"
        r"|(?P<number>\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?\b)"
        r"|(?P<word>\b[A-Za-z_]\w*\b)", re.S)


def highlight(code: str, lang: str, colors: Colors) -> str:
    """`code` as escaped HTML with coloured spans for comments, strings, numbers and keywords."""
    def escape(text: str) -> str:  # element text: quotes stay as typed
        return html.escape(text, quote=False)

    out, pos = [], 0
    for m in _code_pattern(lang.lower()).finditer(code):
        kind = m.lastgroup
        if kind == "word" and m.group() not in KEYWORDS:
            continue
        out.append(escape(code[pos:m.start()]))
        color = colors.keyword if kind == "word" else getattr(colors, kind)
        style = f"color:{color}" + (";font-style:italic" if kind == "comment" else "")
        out.append(f'<span style="{style}">{escape(m.group())}</span>')
        pos = m.end()
    out.append(escape(code[pos:]))
    return "".join(out)


_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[([^\]\n]+)\]\(((?:https?|mailto|file):[^)\s]+)\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])|(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")


def inline(text: str, colors: Colors) -> str:
    """One line or paragraph of Markdown inline syntax as HTML."""
    spans: list[str] = []

    def keep(fragment: str) -> str:  # shields finished HTML from the later substitutions
        spans.append(fragment)
        return f"\x00{len(spans) - 1}\x00"

    text = _INLINE_CODE.sub(lambda m: keep(
        f'<code style="font-family:{MONO};background-color:{colors.code_bg}">'
        f"{html.escape(m.group(1))}</code>"), text)
    text = _LINK.sub(lambda m: keep(
        f'<a href="{html.escape(m.group(2), quote=True)}" style="color:{colors.link}">'
        f"{html.escape(m.group(1))}</a>"), text)
    text = html.escape(text, quote=False)
    text = _BOLD.sub(lambda m: f"<b>{m.group(1) or m.group(2)}</b>", text)
    text = _ITALIC.sub(lambda m: f"<i>{m.group(1) or m.group(2)}</i>", text)
    text = _STRIKE.sub(r"<s>\1</s>", text)
    return re.sub(r"\x00(\d+)\x00", lambda m: spans[int(m.group(1))], text)


_FENCE = re.compile(r"^\s{0,3}(```+|~~~+)\s*([\w+#.-]*)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")
_QUOTE = re.compile(r"^\s{0,3}>\s?(.*)$")
_ITEM = re.compile(r"^\s{0,3}(?:([-*+])|(\d{1,9})[.)])\s+(.*)$")
HEADING_SIZES = {1: "x-large", 2: "large", 3: "medium", 4: "medium", 5: "small", 6: "small"}


@dataclass
class Rendered:
    html: str
    code_blocks: list[str]  # raw text of each fenced block, in order, for "copy code"


def render(text: str, colors: Colors = LIGHT,
           code_link: Callable[[int], str] | None = None) -> Rendered:
    """Markdown `text` as HTML; `code_link(i)` gives the href of code block i's copy link."""
    lines = text.replace("\r\n", "\n").split("\n")
    out: list[str] = []
    blocks: list[str] = []
    para: list[str] = []
    list_kind: str | None = None  # "ul" | "ol" while inside a list

    def flush_para() -> None:
        if para:
            out.append(f"<p>{'<br>'.join(inline(p, colors) for p in para)}</p>")
            para.clear()

    def close_list() -> None:
        nonlocal list_kind
        if list_kind:
            out.append(f"</{list_kind}>")
            list_kind = None

    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            flush_para()
            close_list()
            marker, lang = fence.group(1), fence.group(2)
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                body.append(lines[i])
                i += 1
            code = "\n".join(body)
            blocks.append(code)
            link = ""
            if code_link is not None:
                link = (f'<tr><td align="right"><a href="{code_link(len(blocks) - 1)}" '
                        f'style="color:{colors.muted};font-size:small">copy code</a></td></tr>')
            out.append(
                f'<table width="100%" cellpadding="8" cellspacing="0" '
                f'bgcolor="{colors.code_bg}">{link}<tr><td><pre style="font-family:{MONO}">'
                f"{highlight(code, lang, colors)}</pre></td></tr></table>")
            i += 1
            continue
        if not line.strip():
            flush_para()
            close_list()
        elif m := _HEADING.match(line):
            flush_para()
            close_list()
            out.append(f'<p style="font-size:{HEADING_SIZES[len(m.group(1))]}">'
                       f"<b>{inline(m.group(2), colors)}</b></p>")
        elif _RULE.match(line):
            flush_para()
            close_list()
            out.append("<hr>")
        elif m := _QUOTE.match(line):
            flush_para()
            close_list()
            out.append(f'<blockquote style="color:{colors.muted}">'
                       f"{inline(m.group(1), colors)}</blockquote>")
        elif m := _ITEM.match(line):
            flush_para()
            kind = "ul" if m.group(1) else "ol"
            if list_kind != kind:
                close_list()
                start = f' start="{int(m.group(2))}"' if kind == "ol" else ""
                out.append(f"<{kind}{start}>")
                list_kind = kind
            out.append(f"<li>{inline(m.group(3), colors)}</li>")
        elif list_kind and line.startswith((" ", "\t")):  # a list item's continuation line
            out[-1] = out[-1][:-len("</li>")] + f" {inline(line.strip(), colors)}</li>"
        else:
            close_list()
            para.append(line.strip())
        i += 1
    flush_para()
    close_list()
    return Rendered("".join(out), blocks)
