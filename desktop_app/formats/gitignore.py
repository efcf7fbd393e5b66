""".gitignore rules as git reads them, for a folder attached as one document (`folders`).

What is followed: blank lines and # comments skipped; a trailing unescaped space dropped; "\\"
escaping the next character ("\\#", "\\!", "\\ "); "!" taking a path back, the last matching
rule winning; "/" at the end matching folders only; a pattern with a "/" before its end
matched against the path from the .gitignore's folder ("/" at its start only anchoring it),
one without against a name at any depth; "*" and "?" never crossing "/", "[...]" (with "!"
or "^" negating it), "**/" at the start, "/**/" inside and "/**" at the end as git has them.
Which files hold the rules (`Rules.for_folder`): the enclosing repository's (the nearest
folder above holding `.git`) root .gitignore and those between it and the attached folder,
then each .gitignore the walk meets, applying from its own folder down. Not read:
.git/info/exclude and the user's global excludes file.

This module only matches paths: it never reads a file other than a .gitignore.
"""

from __future__ import annotations

import re
from pathlib import Path


def _translated(glob: str) -> str:
    """`glob` (no trailing "/") as a regular expression over a path with "/"."""
    out, i, n = [], 0, len(glob)
    while i < n:
        c = glob[i]
        if glob.startswith("**/", i) and (i == 0 or glob[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i) and i + 2 == n and (i == 0 or glob[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(glob[i + 1]))
            i += 2
        elif c == "[" and (end := glob.find("]", i + 2)) != -1:
            inner = glob[i + 1:end]
            if inner[0] in "!^":
                inner = "^" + inner[1:]
            out.append("(?!/)[" + inner.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


class Ignore:
    """One .gitignore's rules (the module's docstring says which)."""

    def __init__(self, text: str):
        self.rules: list[tuple[bool, bool, re.Pattern]] = []  # (negated, folders only, regex)
        for line in text.splitlines():
            stripped = line.rstrip(" ")
            # (a trailing space is dropped unless escaped: "\\ " keeps one)
            line = stripped + " " if stripped.endswith("\\") and stripped != line else stripped
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            line = line[1:] if negated else line
            dirs = line.endswith("/")
            line = line.rstrip("/")
            if not line:
                continue
            anchored = "/" in line
            pattern = _translated(line.lstrip("/"))
            self.rules.append((negated, dirs, re.compile(
                pattern if anchored else "(?:.*/)?" + pattern, re.DOTALL)))

    def match(self, relpath: str, is_dir: bool) -> bool | None:
        """True: ignored, False: taken back by a "!", None: no rule says."""
        said = None
        for negated, dirs, regex in self.rules:
            if (is_dir or not dirs) and regex.fullmatch(relpath):
                said = not negated
        return said

    def ignores(self, relpath: str, is_dir: bool) -> bool:
        return bool(self.match(relpath, is_dir))


class Rules:
    """The .gitignore files that apply in a folder: (the folder's path from the top with "/",
    its rules), outermost first; paths are asked from the attached folder."""

    def __init__(self, prefix: str, files: list[tuple[str, Ignore]]):
        self.prefix = prefix  # the attached folder from the repository's root ("" or "a/b/")
        self.files = files

    @classmethod
    def for_folder(cls, root: Path) -> Rules:
        top = root
        for above in [root, *root.parents]:
            if (above / ".git").exists():
                top = above
                break
        prefix = root.relative_to(top).as_posix()
        prefix = "" if prefix == "." else prefix + "/"
        rules = cls(prefix, [])
        folder, base = top, ""
        for part in Path(prefix).parts:  # (the folder's own .gitignore: the walk's first)
            rules.add(folder, base)
            folder, base = folder / part, base + part + "/"
        return rules

    def add(self, folder: Path, base: str) -> None:
        """`folder`'s own .gitignore, if it has a readable one; `base`: its path from the top."""
        try:
            text = (folder / ".gitignore").read_text("utf-8", "replace")
        except OSError:
            return
        self.files.append((base, Ignore(text)))

    def within(self, folder: Path, rel: str) -> Rules:
        """These rules and the .gitignore of `folder` (at `rel` from the attached folder)."""
        inner = Rules(self.prefix, list(self.files))
        inner.add(folder, self.prefix + rel)
        return inner

    def ignores(self, rel: str, is_dir: bool) -> bool:
        path, ignored = self.prefix + rel, False
        for base, rules in self.files:
            if path.startswith(base) and (said := rules.match(path[len(base):], is_dir)) \
                    is not None:
                ignored = said
        return ignored
