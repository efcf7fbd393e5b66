"""Long documents as passages: splitting keeps locations, the store keeps text, index and
vectors across reopen and drops them with the document, retrieval finds planted facts and,
focused, keeps only the passages that hold the most of a question's rare words."""

from __future__ import annotations

import re
import sysconfig
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from pdf_helpers import make_pdf

from desktop_app.chat.documents import _normalize, extract
from desktop_app.errors import EngineError
from desktop_app.passages.embed import WordLlamaEmbedder
from desktop_app.passages.pdf_headings import MAX_HEADINGS, outline_headings
from desktop_app.passages.retrieve import (
    RARE_PASSAGES,
    Retriever,
    focused,
    fuse,
    most_named,
    rare_words,
    written_names,
)
from desktop_app.passages.split import split
from store import Store


def words(text: str) -> int:
    """A stand-in tokenizer: one token per word (the real one is the model's)."""
    return len(text.split())


# -- splitting ----------------------------------------------------------------------------------


def check_locations(text: str, passages) -> None:
    assert [p.index for p in passages] == list(range(len(passages)))
    for p in passages:
        assert text[p.start:p.end] == p.text and p.text.strip()
        assert p.lines == (text.count("\n", 0, p.start) + 1, text.count("\n", 0, p.end - 1) + 1)
    assert all(a.end <= b.start for a, b in zip(passages, passages[1:], strict=False))


def test_markdown_passages_follow_headings_and_stay_under_the_limit():
    body = " ".join(f"word{i}" for i in range(900))
    text = (f"# Guide\n\nIntro.\n\n## Install\n\n{body}\n\nAfter.\n\n## Use\n\n"
            + "Run it. " * 15 + "\n\n```\ncode\n\nstill code\n```\n\nSetext title\n------------\n\n"
            + "Under it. " * 30)
    passages = split(text, "markdown", words, target=100, limit=200)
    check_locations(text, passages)
    assert all(p.tokens <= 200 for p in passages)
    assert any(p.heading == ("Guide", "Install") and "word500" in p.text for p in passages)
    use = next(p for p in passages if "## Use" in p.text)
    assert use.heading == ("Guide", "Use") and "still code" in use.text  # a fence stays whole
    assert passages[-1].heading == ("Guide", "Setext title")
    # No passage but the last is tiny: small sections join the next.
    assert sum(p.tokens for p in passages) == words(text)


def test_a_passage_that_begins_with_a_heading_is_cited_under_it():
    # A small section joins the next one's text: the passage is still the small one's.
    text = ("## Lexical analysis\n\n" + "Tokens are read one by one. " * 40 + "\n\n"
            "## Vexmoor service\n\nThe Vexmoor service listens on port 7311.\n\n"
            "## Identifiers\n\n" + "Identifiers are names of things. " * 20)
    passages = split(text, "markdown", words, target=200, limit=400)
    vexmoor = next(p for p in passages if "Vexmoor" in p.text)
    assert vexmoor.text.startswith("## Vexmoor service") and "Identifiers are" in vexmoor.text
    assert vexmoor.heading == ("Vexmoor service",)
    # A document's untitled first lines, joined to the sections after them, are cited
    # under the one most of it sits under.
    inside = split("Words before any heading. " * 3 + "\n\n" + text[text.index("## Vex"):],
                   "markdown", words, target=200, limit=400)[0]
    assert inside.heading == ("Identifiers",)


@pytest.mark.parametrize("kind, head", [
    ("markdown", "# Harbor manual\n\n\n## Chapter 1: Valves\n\n### Section 1.1 Bridge\n\n"),
    ("text", "Harbor manual\n=============\n\nChapter 1: Valves\n-----------------\n\n"
             "Section 1.1 Bridge\n~~~~~~~~~~~~~~~~~~\n\n")])
def test_a_passage_is_cited_under_the_headings_its_text_begins_under(kind, head):
    """A title and chapter heading above a section's first text are not where it sits: its
    passage is cited under the whole path (one heading right under another too)."""
    text = head + "The bridge valve opens every 7 days. " * 20 + "\n\nMore of it. " * 5
    first = split(text, kind, words)[0]
    assert first.text.startswith("Harbor manual") or first.text.startswith("# Harbor")
    assert first.heading == ("Harbor manual", "Chapter 1: Valves", "Section 1.1 Bridge")


def test_a_sections_last_lines_are_not_cited_under_the_next_section():
    # A manual's 40.2 ends with a short paragraph that does not fit its passage; it used to
    # start one that ran on into "### 40.3" and was cited as "40.3 Procedures part 3".
    sections = [f"### 40.{n} Procedures part {n}\n\nShort intro {n}, a few words.\n\n"
                + " ".join(f"w{n}x{i}" for i in range(140))
                + f"\n\nThe fact of section {n} is the code Z{n}." for n in range(1, 5)]
    text = "## 40 Procedures\n\n" + "\n\n".join(sections)
    passages = split(text, "markdown", words)
    check_locations(text, passages)
    for n in range(1, 5):  # (40.1's starts at "## 40", whose text begins under 40.1)
        fact = next(p for p in passages if f"the code Z{n}." in p.text)
        assert fact.heading == ("40 Procedures", f"40.{n} Procedures part {n}")
        assert "###" not in fact.text[fact.text.index(f"the code Z{n}."):]
    for p in passages:  # no passage runs across a heading unless it starts at one
        if "\n###" in p.text:
            assert p.text.startswith("#")
    # However small a section's last lines, they end at the next heading.
    tails = text.replace("is the code", "is, as the procedure says, the code")
    for p in split(tails, "markdown", words, target=150, limit=150):
        assert "\n###" not in p.text or p.text.startswith("#")


def test_a_heading_left_open_ends_where_the_next_block_starts(tmp_path):
    # An unclosed <h2> took every later heading and all the text after it as its title.
    path = tmp_path / "open.html"
    path.write_text("<html><body><h1>Guide</h1><h2>Intro<p>Text one.</p>"
                    "<h2>Second <h3>Third</h3><p>Text two.</p></body></html>")
    doc = extract(path)
    titles = [title for *_, title in doc.headings]
    assert titles == ["Guide", "Intro", "Second", "Third"], doc.headings


def test_a_web_pages_passages_cite_its_lines_under_its_own_headings(tmp_path):
    # Its passages were numbered by the extracted text's lines (a fact at the file's line 143
    # cited as 162-174), its h2s were no headings, and a paragraph starting "# " was the
    # heading of the rest of the page.
    parts = ["<!DOCTYPE html>\n<html>\n<head>\n<title>Ops guide</title>\n<style>\n"
             "p { margin: 0 }\n</style>\n</head>\n<body>\n<h1>Ops guide</h1>"]
    for n in range(1, 7):
        parts.append(f"<h2>Section\n  {n}</h2>")
        parts.append("<p># not a heading, a paragraph</p>" if n == 3 else f"<p>About {n}.</p>")
        parts += ['<div class="x">\n  <p>\n    ' + " ".join(f"w{n}x{k}y{i}" for i in range(12))
                  + "\n    more words on a wrapped line\n  </p>\n</div>" for k in range(6)]
        parts.append(f"<ul>\n  <li>The <b>relay {n}</b> port is\n      {7000 + n}.</li>\n</ul>")
    path = tmp_path / "page.html"
    path.write_text("\n".join(parts) + "\n</body>\n</html>\n")
    file_lines = path.read_text().split("\n")
    doc = extract(path)
    passages = split(doc.text, doc.kind, words, line_numbers=doc.lines,
                     headings=doc.headings, target=60, limit=120)
    assert len(passages) > 10
    for p in passages:
        first, last = p.lines
        cited = "\n".join(file_lines[first - 1:last])
        # Its first and last lines of text are on the file's lines it cites.
        for line in (p.text.split("\n")[0], p.text.split("\n")[-1]):
            assert line.split()[0] in file_lines[first - 1] + file_lines[last - 1], p
        assert all(word in cited for word in p.text.split() if word.startswith("w"))
    for n in range(1, 7):
        relay = next(p for p in passages if f"relay {n} port" in p.text)
        assert relay.heading == ("Ops guide", f"Section {n}")
        assert f"<li>The <b>relay {n}</b>" in file_lines[relay.lines[1] - 2]
        assert f"{7000 + n}.</li>" in file_lines[relay.lines[1] - 1]
    assert not any("not a heading" in "".join(p.heading) for p in passages)


def test_plain_text_takes_no_hash_line_for_a_heading_but_underlined_ones():
    text = ("Install\n=======\n\nRun the script.\n\n# copy the defaults first\n"
            "cp a b\n\n" + "More words here. " * 30)
    passages = split(text, "text", words, target=20, limit=40)
    assert {p.heading for p in passages} == {("Install",)}
    as_markdown = split(text, "markdown", words, target=20, limit=40)
    assert ("copy the defaults first",) in {p.heading for p in as_markdown}


def test_underline_levels_follow_the_order_first_seen_but_in_markdown():
    # Python's reference: * for a topic, = for its sections ("Naming and binding" was cited
    # under the = section before it, as if * were the deeper level).
    text = ("Simple statements\n*****************\n\nWords.\n\nFuture statements\n"
            "=================\n\nWords.\n\nNaming and binding\n******************\n\n"
            "Binding words.\n\nResolution of names\n===================\n\nResolving.\n")
    headings = {p.heading for p in split(text, "text", words, target=2, limit=8)}
    assert headings == {("Simple statements",), ("Simple statements", "Future statements"),
                        ("Naming and binding",), ("Naming and binding", "Resolution of names")}
    markdown = ("Part\n----\n\nWords.\n\nBook\n====\n\nMore.\n")
    assert {p.heading for p in split(markdown, "markdown", words, target=1, limit=8)} == {
        ("Part",), ("Book",)}  # setext: = is level 1, - level 2, whatever comes first


def test_a_tilde_underline_is_a_heading_and_a_tilde_fence_a_fence():
    # reStructuredText underlines a section with ~ as readily as with = or - (it used to open
    # a fence that never closed: every later heading was lost, 516 passages under one).
    text = ("Guide\n=====\n\nIntro words.\n\nInstall\n-------\n\nPip it.\n\n"
            "Sub topic\n~~~~~~~~~\n\nMore words.\n\nUsage\n-----\n\nRun it.\n")
    headings = [p.heading for p in split(text, "text", words, target=4, limit=8)]
    assert ("Guide", "Install", "Sub topic") in headings and ("Guide", "Usage") in headings
    fenced = ("Intro\n\n~~~python\nx = 1\n\n# not a heading\n~~~\n\nAfter it.\n")
    inside = [p for p in split(fenced, "markdown", words, target=4, limit=40)
              if "# not a heading" in p.text]
    assert inside and all(p.heading == () for p in inside)


MAN_PAGE = """BASH(1)                     General Commands Manual                    BASH(1)

NAME
       bash - GNU Bourne-Again SHell

DESCRIPTION
       Bash  is  an  sh-compatible  command language interpreter that executes
       commands read from the standard input or from a file.

OPTIONS
       -c        If the -c option is present, then commands are read from  the
                 first non-option argument command_string.

SHELL GRAMMAR
   Simple Commands
       A simple command is a sequence of optional variable assignments  fol-
       lowed by blank-separated words and redirections.

       HISTFILE
              The name of the file in which command history is saved.

   Pipelines
       A pipeline is a sequence of one or more commands separated  by  one  of
       the control operators | or |&.

EXPANSION
       Expansion is performed on the command line after it has been split into
       words.

   Tilde Expansion
       If a word begins with an unquoted tilde character, all of the characters
       up to the first unquoted slash are considered a tilde-prefix.

BUGS
       It's too big and too slow.

GNU Bash 5.2                   2022 September 19                       BASH(1)
"""


def heading_of(passages, fragment: str) -> tuple[str, ...]:
    """The heading of the passage holding `fragment`."""
    return next(p for p in passages if fragment in p.text).heading


def test_a_man_pages_sections_and_subsections_are_headings():
    # A man page rendered as text had no heading in any of its 557 passages: its sections
    # are lines in capitals at the margin, its subsections title lines indented 3.
    passages = split(MAN_PAGE, "text", words, target=4, limit=60)
    check_locations(MAN_PAGE, passages)
    under = partial(heading_of, passages)
    assert under("sh-compatible") == ("DESCRIPTION",)
    assert under("first non-option") == ("OPTIONS",)
    assert under("optional variable") == ("SHELL GRAMMAR", "Simple Commands")
    # A list's term, as deep as the body, is no subsection.
    assert under("history is saved") == ("SHELL GRAMMAR", "Simple Commands")
    assert under("control operators") == ("SHELL GRAMMAR", "Pipelines")
    assert under("unquoted tilde") == ("EXPANSION", "Tilde Expansion")
    assert under("too slow") == ("BUGS",)
    assert not any("BASH(1)" in "".join(p.heading) for p in passages)


CONTRACT = """MASTER SERVICES AGREEMENT

This Agreement is entered into by Northwind Logistics GmbH ("Customer") and Harbor Data
Systems Ltd. ("Provider").

ARTICLE 1. DEFINITIONS

1.1 Defined Terms
"Affiliate" means any entity that directly or indirectly controls a party.

1.2 Customer shall keep records of each Affiliate
that it appoints, and send them on request.

1.3 Lists
1.4 Terms

3. FEES AND PAYMENT
Customer shall pay each undisputed invoice within forty-five (45) days of receipt.

ARTICLE 5. LIMITATION OF LIABILITY

IN NO EVENT SHALL EITHER PARTY BE LIABLE FOR ANY INDIRECT, INCIDENTAL, SPECIAL OR
CONSEQUENTIAL DAMAGES, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGES.

EACH PARTY'S TOTAL LIABILITY
SHALL NOT EXCEED THE FEES PAID IN THE TWELVE (12) MONTHS BEFORE THE CLAIM AROSE.

NOTE

Schedules A and B form part of this Agreement.

NAME        PORT      DEFAULT
relay       8080      yes

    SELECT ID FROM USERS
    where id = 1

ARTICLE 7. GOVERNING LAW

This Agreement is governed by the laws of Ireland.

IN WITNESS WHEREOF
"""


def test_a_contracts_articles_in_capitals_are_headings_and_shouting_prose_is_not():
    passages = split(CONTRACT, "text", words, target=4, limit=60)
    check_locations(CONTRACT, passages)
    under = partial(heading_of, passages)
    assert under("Northwind") == ("MASTER SERVICES AGREEMENT",)
    assert under("Affiliate") == ("ARTICLE 1. DEFINITIONS", "1.1 Defined Terms")
    # A numbered clause's first line, or a list of numbered lines, is no title.
    assert under("keep records") == under("1.4 Terms") == ("ARTICLE 1. DEFINITIONS",
                                                           "1.1 Defined Terms")
    assert under("undisputed invoice") == ("3. FEES AND PAYMENT",)  # text right under it
    # A paragraph in capitals, its first line short or not, an admonition alone, a table's
    # header row and a line of code stay in the section they are in.
    for fragment in ("IN NO EVENT", "TOTAL LIABILITY", "Schedules A", "relay", "SELECT"):
        assert under(fragment) == ("ARTICLE 5. LIMITATION OF LIABILITY",), fragment
    assert under("laws of Ireland") == ("ARTICLE 7. GOVERNING LAW",)
    # A line in capitals with nothing after it heads nothing (the article's title line is
    # a passage of its own only at this tiny target).
    assert {p.heading for p in passages} == {
        ("MASTER SERVICES AGREEMENT",), ("ARTICLE 1. DEFINITIONS",),
        ("ARTICLE 1. DEFINITIONS", "1.1 Defined Terms"),
        ("3. FEES AND PAYMENT",),
        ("ARTICLE 5. LIMITATION OF LIABILITY",), ("ARTICLE 7. GOVERNING LAW",)}


def test_lines_in_capitals_are_headings_only_in_plain_text_without_underlines():
    # Markdown has its own headings; a reStructuredText document keeps its underlined ones
    # (a "NOTE"-like line in capitals would take the place of the section it sits in).
    text = "Guide\n=====\n\nINSTALLATION STEPS\nRun the script first.\n\nMore words.\n"
    assert {p.heading for p in split(text, "text", words, target=2, limit=20)} == {
        ("Guide",)}
    plain = "Intro words.\n\nINSTALLATION STEPS\nRun the script first.\n"
    assert ("INSTALLATION STEPS",) in {p.heading for p in split(plain, "text", words,
                                                                target=1, limit=20)}
    for kind in ("markdown", "code"):
        assert {p.heading for p in split(plain, kind, words, target=1, limit=20)} == {()}


def test_passages_are_about_160_tokens_by_default():
    # The size measured to read best (RESULTS.md, "Passage size and distraction"): a
    # paragraph-by-paragraph text packs into passages under the target, most near it.
    text = "\n\n".join(" ".join(f"w{i}x{j}" for j in range(40)) for i in range(60))
    sizes = [p.tokens for p in split(text, "text", words)]
    assert max(sizes) <= 160 and sum(sizes) / len(sizes) >= 120


def test_code_passages_start_at_definitions_and_name_them():
    source = Path(sysconfig.get_paths()["stdlib"], "textwrap.py").read_text()
    passages = split(source, "code", words, target=150, limit=300)
    check_locations(source, passages)
    wrap = next(p for p in passages if p.text.lstrip().startswith("def _split(self, text)"))
    assert wrap.heading == ("class TextWrapper:", "def _split(self, text):")
    dedent = next(p for p in passages if "\ndef dedent(text):" in p.text)
    assert dedent.heading == ("def dedent(text):",)  # a small top-level statement joins it
    # Comments and decorators just above a method go with it; code back at the top level
    # leaves the class.
    source = ("class A:\n    x = 1\n    # a helper\n    @property\n    def g(self):\n"
              "        return 1\nTOP = 2\n")
    parts = split(source, "code", words, target=1, limit=50)
    assert [(p.heading, p.text.split("\n")[0]) for p in parts] == [
        (("class A:",), "class A:"), (("class A:", "def g(self):"), "    # a helper"),
        ((), "TOP = 2")]
    # A docstring's line beginning with a keyword is prose, not a definition to cite under.
    source = ('def overload(func):\n    """Decorator for overloaded functions.\n\n    In a '
              'stub file, place two or more stub definitions for the same\n    function in a '
              'row, each decorated with @overload.\n    type of the value is kept.\n    '
              'function in @no_type_check.\n    """\n    return func\n\n\n'
              'type server struct {\n}\nfn main() {}\ntype alias = int\ndef hello do\n  :world\n')
    parts = split(source, "code", words, target=1, limit=50)
    assert {p.heading for p in parts} == {("def overload(func):",), ("type server struct {",),
                                          ("fn main() {}",), ("type alias = int",),
                                          ("def hello do",)}


def test_a_line_beginning_with_a_keyword_is_no_definition_unless_a_name_follows():
    # argparse, inspect, traceback: assignments, keyword arguments and tuples whose first word
    # is a keyword each began a passage under a bogus heading, as did a docstring's prose and
    # the example in it, and a YAML schema's keys (nearly every passage of one).
    source = (
        "class ArgumentParser(_AttributeHolder, _ActionsContainer):\n\n"
        "    def parse_known_args(self, args=None, namespace=None):\n"
        "        if namespace is None:\n"
        "            namespace = Namespace()\n\n"
        "        namespace, args = self._parse_known_args(args, namespace)\n"
        "        self.add_argument('-x',\n"
        "                          type=type,\n"
        "                          help='the type')\n\n"
        "        module = getmodule(object, file)\n"
        "        fn, lno, func = '(unknown file)', 0, '(unknown function)'\n"
        "        type(self).__name__\n"
        "        return namespace, args\n\n\n"
        "def final(f):\n"
        '    """Decorator to indicate final methods and final classes.\n\n'
        "    Use this decorator to indicate to type checkers that the decorated\n"
        "    method cannot be overridden. For example:\n\n"
        "      class Base:\n"
        "          @final\n"
        "          def done(self) -> None:\n"
        "              ...\n\n"
        "    There is no runtime checking of these properties. The decorator\n"
        "    sets the ``__final__`` attribute; it is used by\n"
        "    type checkers.  They are used to report the error.\n"
        '    """\n'
        "    return f\n")
    parts = split(source, "code", words, target=1, limit=50)
    check_locations(source, parts)
    assert {p.heading for p in parts} == {
        ("class ArgumentParser(_AttributeHolder, _ActionsContainer):",),
        ("class ArgumentParser(_AttributeHolder, _ActionsContainer):",
         "def parse_known_args(self, args=None, namespace=None):"),
        ("def final(f):",)}
    schema = ("$schema: http://json-schema.org/draft-07/schema#\n"
              "type: object\nproperties:\n  namespace:\n    type: string\n\n"
              "  module:\n    type: object\n    # define an override of the request\n"
              "    description: The module the class is in.\n\n  enum:\n    - fn\n")
    assert {p.heading for p in split(schema, "code", words, target=1, limit=50)} == {()}
    # Definitions in other languages keep theirs.
    other = ("impl<T: Display> Wrapper<T> {\n    pub(crate) fn show(&self) {}\n}\n\n"
             "func (s *Server) Serve(l net.Listener) error {\n}\n\n"
             "export default class Widget extends Base {\n}\n\n"
             "type Point = { x: number };\n\n"
             "struct ind {\n    int fd;\n};\n\n"
             "int main(int argc, char **argv)\n{\n    struct ind *me = (struct ind *)in;\n}\n")
    assert [p.heading[-1] for p in split(other, "code", words, target=1, limit=50)
            if p.heading] == [
        "impl<T: Display> Wrapper<T> {", "pub(crate) fn show(&self) {}",
        "func (s *Server) Serve(l net.Listener) error {",
        "export default class Widget extends Base {", "type Point = { x: number };",
        "struct ind {", "int main(int argc, char **argv)"]  # (its variable is none)


def test_a_small_definition_sharing_a_passage_does_not_name_the_next_one():
    # logging: "def getLevelName" and half its docstring sat in a passage cited under the
    # two-line "def getLevelNamesMapping():" before it.
    source = (
        "def getLevelNamesMapping():\n    return _nameToLevel.copy()\n\n"
        "def getLevelName(level):\n"
        '    """\n'
        "    Return the textual or numeric representation of logging level 'level'.\n\n"
        "    If the level is one of the predefined levels (CRITICAL, ERROR, WARNING,\n"
        "    INFO, DEBUG) then you get the corresponding string. If you have\n"
        "    associated levels with names using addLevelName then the name you have\n"
        "    associated with 'level' is returned.\n\n"
        "    If a numeric value corresponding to one of the defined levels is passed\n"
        "    in, the corresponding string representation is returned.\n"
        '    """\n'
        "    result = _levelToName.get(level)\n"
        "    if result is not None:\n"
        "        return result\n"
        "    return \"Level %s\" % level\n")
    parts = split(source, "code", words, target=60, limit=120)
    check_locations(source, parts)
    named = next(p for p in parts if "def getLevelName(level)" in p.text)
    assert named.heading == ("def getLevelName(level):",)
    assert all(p.heading == ("def getLevelName(level):",) for p in parts)


def test_a_c_headers_tables_stay_whole_and_its_functions_are_definitions():
    # sqlite3.h: each #define began a passage of its own (54 passages under 40 tokens), and
    # its functions, declared a line each, were never definitions to cite.
    header = (
        "/*\n** CAPI3REF: Flags For File Open Operations\n**\n"
        "** These bit values are intended for use in the\n** 3rd parameter to the "
        "[sqlite3_open_v2()] interface.\n*/\n"
        + "".join(f"#define SQLITE_OPEN_{name:<16} 0x{1 << i:08X}  /* Ok for "
                  "sqlite3_open_v2() */\n"
                  for i, name in enumerate(["READONLY", "READWRITE", "CREATE", "URI",
                                            "MEMORY", "NOMUTEX"]))
        + "\n/* Reserved:                         0x00F00000 */\n/* Legacy compatibility: */\n"
        "#define SQLITE_OPEN_MASTER_JOURNAL   0x00004000  /* VFS only */\n\n"
        "/*\n** CAPI3REF: Set A Busy Timeout\n** METHOD: sqlite3\n**\n"
        "** ^This routine sets a [sqlite3_busy_handler | busy handler] that sleeps\n"
        "** when a table is locked.\n*/\n"
        "SQLITE_API int sqlite3_busy_timeout(sqlite3*, int ms);\n\n"
        "/*\n** CAPI3REF: Initialize The SQLite Library\n**\n"
        "** ^The sqlite3_initialize() routine initializes the SQLite library.\n*/\n"
        "SQLITE_API int sqlite3_initialize(void);\nSQLITE_API int sqlite3_shutdown(void);\n"
        "SQLITE_API void *sqlite3_wal_hook(\n  sqlite3*,\n"
        "  int(*)(void *,sqlite3*,const char*,int),\n  void*\n);\n")
    parts = split(header, "code", words, target=100, limit=200)
    check_locations(header, parts)
    table = [p for p in parts if "#define SQLITE_OPEN" in p.text]
    assert len(table) == 1 and "CAPI3REF: Flags" in table[0].text
    assert "SQLITE_OPEN_MASTER_JOURNAL" in table[0].text
    assert table[0].heading == ("#define SQLITE_OPEN_READONLY         0x00000001  /* Ok for "
                                "sqlite3_open_v2() */",)
    busy = next(p for p in parts if "sqlite3_busy_timeout(" in p.text)
    assert busy.heading == ("SQLITE_API int sqlite3_busy_timeout(sqlite3*, int ms);",)
    assert busy.text.startswith("/*\n** CAPI3REF: Set A Busy Timeout")
    init = next(p for p in parts if "sqlite3_initialize(void)" in p.text)
    assert init.heading == ("SQLITE_API int sqlite3_initialize(void);",)
    assert "sqlite3_wal_hook" in init.text  # one declaration after another: one table


def test_a_restructuredtext_title_with_an_overline_is_a_heading():
    # Sphinx's usual document title; "Changelog" was no heading, its sections under nothing.
    text = ("=========\nChangelog\n=========\n\n.. attention::\n\n    Major and minor "
            "releases of pip also include changes.\n\n"
            "23.0 (2023-01-30)\n=================\n\nFeatures\n--------\n\n"
            "- Change the hashing algorithm.\n\n"
            "Bug Fixes\n---------\n\n- Fix the wheel cache.\n")
    headings = [p.heading for p in split(text, "text", words, target=4, limit=40)]
    assert headings[0] == ("Changelog",)
    assert ("Changelog", "23.0 (2023-01-30)", "Features") in headings
    assert ("Changelog", "23.0 (2023-01-30)", "Bug Fixes") in headings


def test_an_overline_after_a_heading_and_a_tables_ruled_header_are_read_right():
    """(probe 119's books: a module's overlined title right after "API / ---" was read as an
    underline of the "---", the module filed under the one before; a table's header over a
    rule, "Language  Sources  Development", titled the next 10,000 lines.)"""
    module = "{0}\nMODULE numpy/typing/{1}.py\n{0}\n\n".format("=" * 20, "{}")
    text = (module.format("__init__") + "typing\n------\n\nIntro.\n\nAPI\n---\n\n\n"
            + module.format("mypy_plugin") + "mypy_plugin\n-----------\n\nThe plugin.\n\n"
            "Packages:\n\nLanguage  Sources      Development\n" + "-" * 36
            + "\nC++                    libstdc++6-dev\n\nThe end.\n")
    headings = {p.heading for p in split(text, "text", words, target=2, limit=12)}
    assert headings == {("MODULE numpy/typing/__init__.py",),
                        ("MODULE numpy/typing/__init__.py", "typing"),
                        ("MODULE numpy/typing/__init__.py", "API"),
                        ("MODULE numpy/typing/mypy_plugin.py",),
                        ("MODULE numpy/typing/mypy_plugin.py", "mypy_plugin")}
    # A title written with double spaces stays one: prose (or a blank line) under its rule,
    # in plain text and Markdown alike (review 73).
    spaced = "Part 1.  Setup  and  Use\n" + "-" * 24 + "\n{}Words of the part.\n"
    for kind, between in (("text", ""), ("text", "\n"), ("markdown", "")):
        assert {p.heading for p in split(spaced.format(between), kind, words, target=2,
                                         limit=12)} == {("Part 1.  Setup  and  Use",)}


@pytest.mark.parametrize("name, kind", [("notes.txt", "text"), ("tool.py", "code")])
def test_a_passages_lines_are_the_files_though_its_blank_runs_are_collapsed(tmp_path, name,
                                                                             kind):
    # Two blank lines between definitions (PEP 8), leading blank lines, trailing spaces and
    # CRLF: the text collapses them, the lines a source cites must still be the file's.
    blocks = [f"def f{i}(x):  \r\n" + "".join(f"    y{j} = x + {j}\r\n" for j in range(i % 4))
              + "    return x\r\n" for i in range(60)]
    path = tmp_path / name
    path.write_bytes(("\r\n\r\n\r\n" + "\r\n\r\n".join(blocks)).encode())
    ex = extract(path)
    assert ex.kind == kind and "\n\n\n" not in ex.text
    file_lines = path.read_bytes().decode().split("\r\n")
    passages = split(ex.text, ex.kind, words, line_numbers=ex.lines, target=20, limit=40)
    assert len(passages) > 10
    for p in passages:
        first, last = p.lines
        cited = [line.rstrip() for line in file_lines[first - 1:last] if line.strip()]
        assert cited == [line for line in p.text.split("\n") if line.strip()], p.lines
    with pytest.raises(ValueError, match="line numbers"):
        split(ex.text, ex.kind, words, line_numbers=ex.lines[:-1])


def test_pdf_passages_carry_their_pages(tmp_path):
    pages = [["Chapter one opens here.", "It rains in Lisbon."],
             [],  # a page with no text: numbering goes on past it
             ["The harbour master keeps the keys."],
             ["Last page."]]
    doc = extract(make_pdf(tmp_path / "book.pdf", pages))
    raw = ["\n".join(lines) for lines in pages]
    assert doc.text == _normalize("\n\n".join(raw))  # the same text as before pages were kept
    assert [n for n, _ in doc.pages] == [1, 3, 4]
    passages = split(doc.text, doc.kind, words, pages=doc.pages, target=6, limit=12)
    check_locations(doc.text, passages)
    harbour = next(p for p in passages if "harbour master" in p.text)
    assert harbour.page == 3 and "Lisbon" not in harbour.text and "Last" not in harbour.text
    assert {p.page for p in passages} == {1, 3, 4}


REPORT = [["Annual report", "1. Introduction", "The harbour opened in spring."],
          ["The pilots trained all summer.", "1.1 Background", "Tides ran high in May.",
           "1.1.1 Early tides", "The first tide came at dawn."],
          ["2. Methods", "We counted boats each morning.", "2.1 Counting boats",
           "Each boat was counted twice."],
          ["3. Results", "The fleet grew by a third."]]
OUTLINE = [(1, "Introduction", 0), (2, "Background", 1), (3, "Early tides", 1),
           (1, "Methods", 2), (2, "Counting   BOATS", 2), (1, "Results", 3)]


def test_a_pdfs_outline_gives_its_passages_headings_with_their_pages(tmp_path):
    # A PDF's passages had only page numbers: its bookmarks said nothing in its sources.
    doc = extract(make_pdf(tmp_path / "report.pdf", REPORT, OUTLINE))
    lines = {doc.text[s:e]: (level, title) for s, e, level, title in doc.headings}
    assert lines == {"1. Introduction": (1, "Introduction"), "1.1 Background": (2, "Background"),
                     "1.1.1 Early tides": (3, "Early tides"), "2. Methods": (1, "Methods"),
                     "2.1 Counting boats": (2, "Counting BOATS"), "3. Results": (1, "Results")}
    passages = split(doc.text, doc.kind, words, pages=doc.pages, headings=doc.headings,
                     target=6, limit=12)
    check_locations(doc.text, passages)
    cited = {(p.page, p.heading) for p in passages}
    assert {(1, ("Introduction",)), (2, ("Introduction",)),
            (2, ("Introduction", "Background")),
            (2, ("Introduction", "Background", "Early tides")), (3, ("Methods",)),
            (3, ("Methods", "Counting BOATS")), (4, ("Results",))} <= cited, cited
    tide = next(p for p in passages if "first tide" in p.text)
    assert tide.page == 2 and tide.heading == ("Introduction", "Background", "Early tides")
    # Without an outline: the pages alone, as before.
    plain = extract(make_pdf(tmp_path / "plain.pdf", REPORT))
    assert plain.text == doc.text and not plain.headings
    assert {p.heading for p in split(plain.text, plain.kind, words, pages=plain.pages,
                                     headings=plain.headings, target=6, limit=12)} == {()}


def test_a_broken_outline_entry_is_skipped_and_a_title_not_on_its_page_opens_it(tmp_path):
    outline = [(1, "Introduction", 0), (1, "A web page", "uri"), (1, "Nowhere", None),
               (2, "Gone", "missing"), (1, "Appendix", 17), (1, "Methods", 2),
               (2, "Tables", 2), (2, "Figures", 3), (1, "Loop", "loop")]
    doc = extract(make_pdf(tmp_path / "broken.pdf", REPORT, outline))
    assert [(doc.text[s:e].split("\n")[0], level, title)
            for s, e, level, title in doc.headings] == [
        ("1. Introduction", 1, "Introduction"), ("2. Methods", 1, "Methods"),
        ("", 2, "Tables"), ("", 2, "Figures")]  # not on their pages: put at their starts
    assert doc.warnings == []  # (pypdf's about the bookmarks: a cycle's holds a dictionary)
    results = dict(doc.pages)[4]
    assert doc.headings[-1][:2] == (results, results)
    passages = split(doc.text, doc.kind, words, pages=doc.pages, headings=doc.headings,
                     target=6, limit=12)
    assert next(p for p in passages if "fleet" in p.text).heading == ("Methods", "Figures")
    # a heading found and one put at the same line's start: both in the path, in order
    assert next(p for p in passages if "counted boats" in p.text).heading == (
        "Methods", "Tables")


def test_outline_levels_are_clamped_and_their_count_capped():
    text = "Alpha\nbody\n\nBeta\nmore"
    pages = [(1, 0), (2, 12)]
    entries = [(1, "alpha", 1), (9, "B E T A", 2), (2, "gone", None), (1, "late", 7)]
    assert outline_headings(entries, text, pages) == ((0, 5, 1, "alpha"), (12, 16, 6, "B E T A"))
    many = [(1, "Beta", 2)] * (MAX_HEADINGS + 50)
    assert len(outline_headings(many, text, pages)) == MAX_HEADINGS


def test_a_paragraph_longer_than_the_limit_is_cut_at_sentences_then_words():
    text = "Alpha beta gamma. " * 200 + "\n" + "x" * 5 + " y" * 700
    passages = split(text.strip(), "text", words, target=50, limit=80)
    check_locations(text.strip(), passages)
    assert all(p.tokens <= 80 for p in passages)
    with pytest.raises(ValueError, match="target"):
        split(text, "text", words, target=100, limit=50)


# -- the store ----------------------------------------------------------------------------------


HAYSTACK = Path(sysconfig.get_paths()["stdlib"], "pydoc_data", "topics.py")
FACTS = [
    ("The access code of the Zelmar vault is 4417.",
     "What is the access code of the Zelmar vault?"),
    ("Captain Orsolya Brandt named her sloop the Wandering Heron.",
     "What did Captain Orsolya Brandt call her sloop?"),
    ("The Quillfeather conference of 2031 met in the town of Tarrow.",
     "Where did the Quillfeather conference of 2031 take place?"),
]


@pytest.fixture(scope="module")
def embedder():
    return WordLlamaEmbedder()


@pytest.fixture
def indexed(tmp_path, embedder):
    """A 60 kB slice of Python's own documentation with three facts planted at 10, 50 and 90 %."""
    text = HAYSTACK.read_text()[20_000:80_000]
    paragraphs = text.split("\n\n")
    for (fact, _), depth in zip(FACTS, (0.1, 0.5, 0.9), strict=True):
        paragraphs.insert(int(depth * len(paragraphs)), fact)
    text = "\n\n".join(paragraphs)
    store = Store(tmp_path / "data")
    doc = store.add_document("h", "topics", text, type="text")
    retriever = Retriever(store, embedder)
    n = retriever.index.add(doc.id, text, "text", words)
    yield store, doc, retriever, n
    store.close()


def test_passages_index_and_vectors_survive_reopen_and_go_with_the_document(indexed, tmp_path,
                                                                            embedder):
    store, doc, retriever, n = indexed
    before = store.passages(doc.id)
    assert len(before) == n >= 20 and store.passage_counts() == {doc.id: n}
    store.close()
    with Store(tmp_path / "data") as again:
        assert again.passages(doc.id) == before
        assert again.passage(before[3].id) == before[3]
        (best, score), *_ = again.search_passages(doc.id, "Zelmar vault access code", 3)
        assert "Zelmar" in best.text and score > 0
        ids, vectors = again.passage_vectors(doc.id, embedder.name)
        assert ids == [p.id for p in before] and vectors.shape == (n, embedder.dimension)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
        again.delete_document(doc.id)
        assert again.passages(doc.id) == [] and again.passage_counts() == {}
        assert again.search_passages(doc.id, "Zelmar", 3) == []
        db = again._db.get()
        assert db.execute("SELECT count(*) FROM passage_vectors").fetchone() == (0,)
        # The full-text index itself holds nothing of the deleted passages.
        db.execute("INSERT INTO passages_fts(passages_fts, rank) VALUES ('integrity-check', 1)")
        assert db.execute("SELECT count(*) FROM passages_fts_docsize").fetchone() == (0,)


def test_a_question_sharing_no_word_with_the_document_still_gets_passages(indexed):
    store, doc, retriever, _ = indexed
    question = "Qwxyz zzyq frobtastic?"  # no word of it anywhere in the document
    assert store.search_passages(doc.id, question, 5) == []
    for mode in ("bm25", "fused", "dense"):
        hits = retriever.retrieve(doc.id, question, k=4, mode=mode)
        assert len(hits) == 4, mode  # the nearest in meaning: never nothing to read


def test_any_query_text_is_searched_as_words(indexed):
    store, doc, _, _ = indexed
    for query in ['"AND (NOT', "NEAR(x y) OR *", "", "the of and", "Zelmar's vault?"]:
        store.search_passages(doc.id, query, 5)  # never an FTS5 syntax error
    assert "Zelmar" in store.search_passages(doc.id, "Zelmar's vault?", 1)[0][0].text


def test_add_passages_refuses_what_does_not_match(indexed):
    store, doc, _, _ = indexed
    passages = split("One.\n\nTwo.", "text", words, target=1, limit=1)
    assert len(passages) == 2
    with pytest.raises(ValueError, match="vectors"):
        store.add_passages(doc.id, passages, vectors=np.zeros((1, 4)), embedder="e")
    with pytest.raises(ValueError, match="name"):
        store.add_passages(doc.id, passages, vectors=np.zeros((2, 4)))


# -- retrieval ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bm25", "fused"])
def test_retrieval_finds_planted_facts(indexed, mode):
    _, doc, retriever, _ = indexed
    for fact, question in FACTS:
        hits = retriever.retrieve(doc.id, question, k=3, mode=mode)
        assert any(fact in h.text for h in hits), (mode, question, [h.text[:60] for h in hits])
        assert hits == sorted(hits, key=lambda h: -h.score)


def test_dense_retrieval_ranks_by_meaning(indexed):
    _, doc, retriever, _ = indexed
    hits = retriever.retrieve(doc.id, "The access code of the Zelmar vault is 4417.", k=1,
                              mode="dense")
    assert "Zelmar" in hits[0].text and hits[0].score > 0.5


def test_recent_turns_join_the_query(indexed):
    _, doc, retriever, _ = indexed
    alone = retriever.retrieve(doc.id, "And what was it called?", k=3, mode="bm25")
    assert not any("Wandering Heron" in h.text for h in alone)
    hits = retriever.retrieve(doc.id, "And what was it called?", k=3, mode="bm25",
                              recent=["Tell me about Captain Orsolya Brandt's sloop.",
                                      "She sailed it for years."])
    assert any("Wandering Heron" in h.text for h in hits)
    assert re.fullmatch(r"lines? \d+(-\d+)?", hits[0].location)


def test_a_follow_up_is_led_by_its_own_words_and_its_it_by_the_turns(tmp_path, embedder):
    """The recent turns join a follow-up's query, but the question leads: one naming a new
    subject gets that subject's passage, not the last answer's; one saying "it" gets what
    the turns were about first, not every passage worded alike."""
    paragraphs = HAYSTACK.read_text()[20_000:80_000].split("\n")  # (source: lines)
    clerks = [("the Zelmar vault", "Ostune"), ("Captain Orsolya Brandt", "Vokten"),
              ("the Quillfeather conference", "Marlis")]
    for (fact, _), depth in zip(FACTS, (0.1, 0.5, 0.9), strict=True):
        paragraphs.insert(int(depth * len(paragraphs)), f"\n{fact}\n")
    for (subject, clerk), depth in zip(clerks, (0.3, 0.7, 0.2), strict=True):
        paragraphs.insert(int(depth * len(paragraphs)),
                          f"\nRecords about {subject} are kept by a clerk named {clerk}.\n")
    paragraphs.insert(len(paragraphs) // 2, "\nThe lighthouse harbormaster is Tobiah Quen.\n")
    text = "\n".join(paragraphs)
    with Store(tmp_path / "data") as store:
        doc = store.add_document("h", "topics", text, type="text")
        retriever = Retriever(store, embedder)
        retriever.index.add(doc.id, text, "text", words)
        vault = [FACTS[0][1], FACTS[0][0]]  # asked, and answered with the fact

        def read(question):
            return [h.text for h in retriever.retrieve(doc.id, question, recent=vault,
                                                       focus=True)]

        switched = read("And where did the Quillfeather conference of 2031 take place?")
        assert any(FACTS[2][0] in t for t in switched), switched
        assert not any(FACTS[0][0] in t for t in switched), [t[:80] for t in switched]
        # naming what it asks about, and pointing back at nothing: read as if asked alone
        assert switched == [h.text for h in retriever.retrieve(
            doc.id, "And where did the Quillfeather conference of 2031 take place?",
            focus=True)]
        # A word rare in the document says what it asks about as a name does: read as if
        # asked alone ("Who is the harbormaster?" read the last answer's passages beside).
        lone = "Who is the lighthouse harbormaster?"
        assert read(lone) == [h.text for h in retriever.retrieve(doc.id, lone, focus=True)]
        assert "Tobiah Quen" in read(lone)[0], read(lone)
        assert not retriever.specific(doc.id, "And who keeps the records about it?")
        assert retriever.specific(doc.id, "Who keeps the records about the Zelmar vault?")
        that = read("And who keeps the records about it?")
        assert "clerk named Ostune" in that[0], that
        # beside it the passage the question alone matches best, no more of the alike ones
        assert sum("Records about" in t for t in that) <= 2, that


def test_reciprocal_rank_fusion_rewards_agreement():
    fused = fuse([[(1, 9.0), (2, 5.0), (3, 1.0)], [(2, 0.9), (4, 0.8), (1, 0.1)]])
    assert [pid for pid, _ in fused] == [2, 1, 4, 3]  # in both lists beats first in one
    bm25_led = fuse([[(1, 9.0), (2, 5.0), (3, 1.0)], [(3, 0.9), (2, 0.8), (1, 0.1)]], [1, 0.1])
    assert [pid for pid, _ in bm25_led] == [1, 2, 3]  # a small weight only breaks near-ties


def test_a_focused_ranking_keeps_what_every_ranking_found():
    # Rare-word fusion: 1 and 2 found by both rankings, 3 and 4 by one of them only.
    fused = fuse([[(1, 9.0), (2, 5.0), (3, 4.0)], [(2, 0.9), (1, 0.8), (4, 0.1)]])
    assert [pid for pid, _ in focused(fused)] == [1, 2]
    assert [pid for pid, _ in focused(fused, share=0.25)] == [1, 2, 3, 4]
    # One ranking's scores, fused with nothing: the first only is more than half ahead.
    assert focused([(7, 0.02), (8, 0.0099)]) == [(7, 0.02)]
    assert focused([]) == []


def test_of_the_focused_passages_those_holding_the_most_rare_words_are_kept():
    order = [(1, 0.032), (2, 0.031), (3, 0.030), (4, 0.029)]
    # 1 holds the name and "vault"; 2 and 4 share only "opens" with the question.
    holders = {"zelmar": {1}, "vault": {1, 3}, "opens": {2, 4}}
    assert most_named(order, holders) == [(1, 0.032)]
    assert most_named(order, {"zelmar": {1}, "heron": {3}}) == [(1, 0.032), (3, 0.030)]
    assert most_named(order, {"elsewhere": {9}}) == order  # none holds one: as it is
    assert most_named([], {}) == []
    # A question about two named things: the passage on each, though one holds more words.
    q = "What is the port of the Vexmoor sync service, and how do I reset the Quillfeather relay?"
    holders = {"port": {1}, "vexmoor": {1}, "sync": {1}, "quillfeather": {3}, "relay": {3, 4}}
    assert most_named(order, holders) == [(1, 0.032)]
    assert written_names(q, holders) == {"vexmoor", "quillfeather"}
    assert most_named(order, holders, written_names(q, holders)) == [(1, 0.032), (3, 0.030)]
    assert written_names("What does __missing__ return in py3?", {"__missing__", "py3",
                                                                   "return"}) == {
        "__missing__", "py3"}
    # written as code: called, or between backticks
    assert written_names("what does frobnicate() return for `sorted`?",
                         {"frobnicate", "return", "sorted"}) == {"frobnicate", "sorted"}
    # not every word of a span of code, nor a plural's "(s)" ("True": capitalised)
    assert written_names("which option(s) does `load(path, strict=True)` take?",
                         {"option", "load", "path", "strict", "true", "take"}) == {"load",
                                                                                   "true"}
    assert written_names("is `os.path` there?", {"os", "path", "there"}) == {"os", "path"}


def test_focused_retrieval_reads_the_passages_naming_the_questions_rare_words(indexed):
    store, doc, retriever, _ = indexed
    for fact, question in FACTS:
        wide = retriever.retrieve(doc.id, question, k=8)
        hits = retriever.retrieve(doc.id, question, k=8, focus=True)
        assert fact in hits[0].text and all(h in wide for h in hits)
    # Of the eight, the passage holding the most of the question's rare words (in at most
    # three passages): the fact's, alone. The third question's "place" is a rare word of this
    # text too: the head of the fusion keeps the passages holding it beside the fact's (each
    # holds one of its rare words, the fact's three).
    assert 0 < store.passage_frequencies(doc.id, FACTS[2][1], 4)["place"] <= 3
    wide = retriever.retrieve(doc.id, FACTS[2][1], k=8)
    assert len(focused([(h.passage_id, h.score) for h in wide])) > 1
    for fact, question in FACTS:
        assert [fact in h.text for h in retriever.retrieve(doc.id, question, k=8,
                                                            focus=True)] == [True]
    assert all(len(retriever.retrieve(doc.id, q, k=8)) == 8 for _, q in FACTS[:2])
    # Scores with no fusion's scale (dense cosines, or the dense ranking fused at a tenth)
    # are not cut.
    for mode in ("dense", "fused"):
        assert len(retriever.retrieve(doc.id, FACTS[0][1], k=8, mode=mode, focus=True)) == 8


def test_bad_retrieval_requests_are_refused(indexed):
    _, doc, retriever, _ = indexed
    with pytest.raises(EngineError, match="mode"):
        retriever.retrieve(doc.id, "q", mode="magic")
    with pytest.raises(EngineError, match="at least 1"):
        retriever.retrieve(doc.id, "q", k=0)
    assert retriever.retrieve(doc.id + 99, "Zelmar") == []  # a document with no passages


def test_the_embedder_loads_from_its_wheel_with_no_network(monkeypatch, embedder):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("the embedder tried to reach the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    fresh = WordLlamaEmbedder()
    vectors = fresh.embed(["A cat sat on the mat.", "A feline rested on a rug.", "", "Tax law."])
    assert vectors.dtype == np.float32 and vectors.shape == (4, fresh.dimension)
    assert np.allclose(np.linalg.norm(vectors[[0, 1, 3]], axis=1), 1, atol=1e-5)
    assert not vectors[2].any()  # no token, no direction (not NaN)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[3]
    assert fresh.embed([]).shape == (0, fresh.dimension)


def test_a_name_the_question_shares_with_its_passage_outweighs_repeated_common_words(
        tmp_path, embedder):
    filler = [f"Note {i}: the gardeners planted roses along the northern wall." * 3
              for i in range(30)]
    for i in range(0, 30, 6):  # a few long passages that repeat the question's common words
        filler[i] = "Each day has its time, and each time its day: " * 6
    filler.insert(12, "A ferry log.\n\nThe Tenlisqui ferry leaves the harbour every morning "
                      "at 07:15, with the mail and the baker's bread for the island.")
    text = "\n\n".join(filler)
    with Store(tmp_path / "data") as store:
        doc = store.add_document("n", "notes", text, type="text")
        retriever = Retriever(store, embedder, "bm25")
        store.add_passages(doc.id, split(text, "text", words, target=40, limit=80))
        question = "At what time does the Tenlisqui boat depart each day?"
        plain = Retriever(store, embedder, "bm25", rare_words=False)
        assert "Tenlisqui" not in plain.retrieve(doc.id, question, k=1)[0].text
        assert "Tenlisqui" in retriever.retrieve(doc.id, question, k=1)[0].text
        counts = store.passage_frequencies(doc.id, "Tenlisqui harbour time of day", 4)
        assert counts == {"tenlisqui": 1, "harbour": 1, "time": 4, "day": 4}  # "of": a stopword


def test_an_identifier_with_underscores_is_found_as_written(tmp_path, embedder):
    # The index reads `__missing__` as "missing", which most of these passages say.
    filler = [f"Section {i}: a missing value is reported when the key is missing." * 2
              for i in range(30)]
    filler.insert(17, "Mapping hooks.\n\nA dict subclass may define __missing__; a lookup "
                      "of an absent key calls it with the key.")
    text = "\n\n".join(filler)
    with Store(tmp_path / "data") as store:
        doc = store.add_document("n", "notes", text, type="text")
        store.add_passages(doc.id, split(text, "text", words, target=40, limit=80))
        holder = next(p.id for p in store.passages(doc.id) if "__missing__" in p.text)
        question = "When is __missing__ called for a missing key?"
        assert store.passages_holding(doc.id, "__missing__", 4) == [holder]
        assert store.passage_frequencies(doc.id, question, 4)["__missing__"] == 1
        assert len(store.passages_holding(doc.id, "missing", 4)) == 4  # the word itself
        hits = Retriever(store, embedder, "bm25").retrieve(doc.id, question, k=3, focus=True)
        assert [h.passage_id for h in hits] == [holder]


def test_a_name_the_question_writes_is_read_beside_a_common_word_rare_in_the_document(
        tmp_path, embedder):
    """`nonlocal` is in many passages, "kept" in one: a question about both reads the
    passages on `nonlocal`, not only the one that says "kept" (the probe's answer about
    __future__ imports)."""
    filler = [f"Section {i}: gardeners planted roses along the northern wall." * 2
              for i in range(24)]
    for i in range(2, 24, 4):
        filler[i] = (f"The nonlocal statement, case {i}: nonlocal makes the listed names "
                     "refer to bindings of the nearest enclosing function scope.")
    filler[13] = "Future features are redundant now, only kept for backwards compatibility."
    text = "\n\n".join(filler)
    with Store(tmp_path / "data") as store:
        doc = store.add_document("n", "manual", text, type="text")
        store.add_passages(doc.id, split(text, "text", words, target=30, limit=60))
        assert len(store.passages_holding(doc.id, "nonlocal", 10)) > RARE_PASSAGES
        hits = Retriever(store, embedder, "bm25").retrieve(
            doc.id, "Where is the phone kept, and what does `nonlocal` do?", focus=True)
        assert sum("nonlocal" in h.text for h in hits) >= 3
        # With no name written, a word rare in the document still focuses the reading.
        hits = Retriever(store, embedder, "bm25").retrieve(
            doc.id, "Which features are kept?", focus=True)
        assert [h.text.count("kept") for h in hits] == [1]


def test_missing_embedding_files_are_one_clear_error(monkeypatch, tmp_path):
    import wordllama

    monkeypatch.setattr(wordllama, "__file__", str(tmp_path / "wordllama" / "__init__.py"))
    with pytest.raises(EngineError, match="embedding model's files cannot be read"):
        WordLlamaEmbedder().embed(["text"])


def test_a_defined_term_of_a_contract_leaves_the_questions_rare_words_focused(
        tmp_path, embedder):
    """A contract capitalises its defined terms (the Lessee, the Lessor, the Premises, this
    Agreement) and writes them in nearly every clause. A question writing one ("the Lessee")
    still asks about its rare words held with it: it reads the clause holding them, alone,
    as the same question written in lower case does (the probe's lease read 8 passages, the
    clause 6th in the window's document order)."""
    duties = ["pay the rent on the first day of each month", "keep the Premises clean",
              "insure the Premises against fire", "allow the Lessor to inspect the Premises",
              "repair any damage caused by the Lessee's guests", "not sublet the Premises",
              "give notice of any defect in the Premises", "pay the utilities when due"]
    filler = [f"Clause {i}. Under this Agreement the Lessee shall {duties[i % len(duties)]}, "
              f"and the Lessor shall answer any notice of the Lessee under this Agreement "
              f"within {i + 5} days." for i in range(30)]
    fact = ("The security deposit of the Lessee is held by Quenwick Trust in account "
            "88-204-XQ until this Agreement ends.")
    filler.insert(19, f"Clause 19a. {fact}")
    text = "\n\n".join(filler)
    with Store(tmp_path / "data") as store:
        doc = store.add_document("n", "lease", text, type="text")
        store.add_passages(doc.id, split(text, "text", words, target=30, limit=60))
        assert len(store.passages_holding(doc.id, "lessee", 10)) > RARE_PASSAGES
        retriever = Retriever(store, embedder, "bm25")
        for question in ("Which trust holds the security deposit of the Lessee, and in what "
                         "account?", "Which trust holds the security deposit of the lessee, "
                         "and in what account?"):
            hits = retriever.retrieve(doc.id, question, focus=True)
            assert [fact in h.text for h in hits] == [True], question
    # A rare word no passage holds with the name held often is left out ("kept" beside
    # `nonlocal`, above); a rare name is kept whatever it is held with.
    counts = {"lessee": 9, "trust": 1, "kept": 1, "quenwick": 1}
    question = "Is the Quenwick trust of the Lessee kept?"
    assert rare_words(counts, question, lambda word, often: word == "trust") == (
        ["trust", "quenwick"], {"lessee", "quenwick"})
    assert rare_words(counts, question)[0] == ["quenwick"]
