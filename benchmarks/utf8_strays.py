"""How often legacy text looks like UTF-8 by chance, against UTF-8 with a pasted line.

    .venv/bin/python -m benchmarks.utf8_strays [--locale-dir /usr/share/locale] [--sample 2000]

No network, no model; about two minutes on one core (the CPU does not matter: it counts).
The text is real: every translation catalog (.mo) installed under the locale folder, grouped
by language, each message as translated. Each language's messages are encoded in the legacy
encodings its files were written in (Western: Windows-1252 and Latin-1; Central European:
1250; Cyrillic: 1251; Greek, Turkish, Baltic: 1253, 1254, 1257; Japanese: Shift-JIS, EUC-JP;
Chinese: GBK, Big5; Korean: EUC-KR); a message the encoding cannot hold is left out, as no
such file holds it. Runs of 1, 4, 16, 64 and 256 consecutive messages are the documents.

Each document's bytes are read as UTF-8 (`encodings.utf8_evidence`): its bytes >= 0x80 fall
into stray bytes and valid 2-, 3- and 4-byte sequences. Printed: per encoding, how many valid
sequences of each length legacy text forms per 1,000 stray bytes, the worst language's rates,
the 3/4-byte ones on lines without a stray byte, and how many documents the rule
(`encodings.looks_like_utf8`) and the old one would misread as UTF-8. Then UTF-8 documents
(each language's runs of 1 to 64 messages) with one line pasted in from a legacy catalog (1 or
3 messages of a Western, Central European or Cyrillic language in its 8-bit encoding): how
many the rule keeps as UTF-8, how many the old rule (more non-ASCII characters than twice the
stray bytes) kept, and how many `decode` (the rule, the detector, the Windows-1252 fallback)
gives back with the UTF-8 lines as written. Last, how many legacy documents `decode` reads
back as written.
"""

from __future__ import annotations

import argparse
import gettext
import random
from collections import defaultdict
from pathlib import Path

from desktop_app.chat.encodings import decode, looks_like_utf8, utf8_evidence

ENCODINGS = {
    "cp1252": "fr de es it pt pt_BR nl sv da nb fi ca gl eu is ga",
    "latin-1": "fr de es it pt pt_BR nl sv da nb fi ca gl eu is ga",
    "cp1250": "cs sk pl hu sl hr ro bs",
    "cp1251": "ru uk bg be sr mk",
    "cp1253": "el",
    "cp1254": "tr",
    "cp1257": "lt lv et",
    "shift_jis": "ja",
    "euc_jp": "ja",
    "gbk": "zh_CN",
    "big5": "zh_TW",
    "euc_kr": "ko",
}
RUNS = (1, 4, 16, 64, 256)


def catalog(locale_dir: Path, lang: str) -> list[str]:
    """Every translated message of `lang`'s catalogs, in catalog order, without repeats."""
    seen: dict[str, None] = {}
    for mo in sorted((locale_dir / lang / "LC_MESSAGES").glob("*.mo")):
        try:
            with mo.open("rb") as f:
                cat = gettext.GNUTranslations(f)._catalog
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        for key, msg in cat.items():
            if key and isinstance(msg, str) and msg.strip():
                seen.setdefault(msg.strip(), None)
    return list(seen)


def documents(messages: list[str], encoding: str, run: int) -> list[bytes]:
    held = []
    for m in messages:
        try:
            held.append(m.encode(encoding))
        except UnicodeEncodeError:
            pass
    return [b"\n".join(held[i:i + run]) for i in range(0, len(held) - run + 1, run)]


def legacy_table(texts: dict[str, list[str]]) -> None:
    print("Legacy text read as UTF-8, documents with a stray byte (runs of 1-256 messages):")
    print("valid sequences per 1,000 stray bytes; the worst language's 2- and 3/4-byte rates;")
    print("3/4-byte sequences on lines without a stray byte (\"clean\"), in runs of 256; and")
    print("documents the rule reads as UTF-8, in all and among runs of 4 or more messages,")
    print("and by the old rule alone (valid sequences more than stray bytes)")
    print(f"{'encoding':9} {'docs':>7} {'strays':>9} {'2-byte':>7} {'3-byte':>6} {'4-byte':>6}"
          f"  {'worst':14} {'clean/256':>9} {'as UTF-8 (all / runs >= 4)':>27} {'old':>5}")
    for encoding, langs in ENCODINGS.items():
        strays = two = three = four = docs = misread = misread_long = old = 0
        long_strays = clean_long = 0
        worst = ("", 0.0, 0.0)
        for lang in langs.split():
            lang_strays = lang_two = lang_long = 0
            for run in RUNS:
                for data in documents(texts.get(lang, []), encoding, run):
                    ev = utf8_evidence(data)
                    if not ev.strays:
                        continue  # valid UTF-8 outright (or ASCII): read so before any rule
                    docs += 1
                    strays, two, three, four = (strays + ev.strays, two + ev.two,
                                                three + ev.three, four + ev.four)
                    lang_strays, lang_two = lang_strays + ev.strays, lang_two + ev.two
                    lang_long += ev.three + ev.four
                    if run == RUNS[-1]:
                        long_strays, clean_long = long_strays + ev.strays, \
                            clean_long + ev.clean_long
                    wrong = looks_like_utf8(ev)
                    misread += wrong
                    misread_long += wrong and run > 1
                    old += ev.valid > ev.strays
            if lang_strays and lang_two / lang_strays > worst[1]:
                worst = (lang, lang_two / lang_strays, lang_long / lang_strays)
        if not docs:
            print(f"{encoding:9} (no catalogs)")
            continue
        per = [1000 * v / strays for v in (two, three, four)]
        print(f"{encoding:9} {docs:7d} {strays:9d} {per[0]:7.2f} {per[1]:6.2f} {per[2]:6.2f}"
              f"  {worst[0]:5} {1000 * worst[1]:4.1f} {1000 * worst[2]:4.2f}"
              f" {clean_long:4d}/{long_strays / 1e6:4.2f}M"
              f" {misread:8d} ({100 * misread / docs:.3f} %) / {misread_long:<4d} {old:5d}")


def mixed_table(texts: dict[str, list[str]], seed: int, sample: int) -> None:
    rng = random.Random(seed)
    pastes = []
    for encoding in ("cp1252", "cp1250", "cp1251"):
        for lang in ENCODINGS[encoding].split():
            for run in (1, 3):
                pastes += [(encoding, d) for d in documents(texts.get(lang, []), encoding, run)
                           if utf8_evidence(d).strays]
    print("\nUTF-8 (runs of 1-64 messages, each language) with one legacy line pasted in the")
    print("middle: kept as UTF-8 by the rule, by the old one (non-ASCII characters more than")
    print("twice the stray bytes), and by `decode` (the rule and the Windows-1252 fallback;")
    print(f"on a sample of {sample}: the UTF-8 lines come back as written)")
    print(f"{'UTF-8 part holds':26} {'paste':7} {'docs':>6} {'rule':>7} {'old':>7} {'decode':>7}")
    rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for messages in texts.values():
        for run in (1, 4, 16, 64):
            for data in documents(messages, "utf-8", run)[:150]:
                own = utf8_evidence(data)
                if not own.valid:
                    continue  # ASCII: nothing to keep; the paste alone decides
                encoding, paste = rng.choice(pastes)
                cut = data.find(b"\n", len(data) // 2)
                mixed = data + b"\n" + paste if cut < 0 else \
                    data[:cut + 1] + paste + data[cut:]
                kind = "some 3/4-byte" if own.three + own.four else "2-byte only"
                size = "1-2" if own.valid <= 2 else "3-8" if own.valid <= 8 else "9+"
                row = rows[(f"{kind}, {size} chars", encoding)]
                ev = utf8_evidence(mixed)
                row[0] += 1
                row[1] += looks_like_utf8(ev)
                row[2] += ev.valid + ev.strays > 2 * ev.strays
                if rng.random() < sample / 20000:
                    lines = data.decode().splitlines()
                    got = decode(mixed, "m", []).splitlines()
                    row[3] += 1
                    row[4] += all(line in got for line in lines)
    for (name, encoding), (n, new, old, tried, kept) in sorted(rows.items()):
        print(f"{name:26} {encoding:7} {n:6d} {100 * new / n:6.1f}% {100 * old / n:6.1f}%"
              + (f" {100 * kept / tried:6.1f}% of {tried}" if tried else ""))


def readback_table(texts: dict[str, list[str]], seed: int, sample: int) -> None:
    rng = random.Random(seed)
    print(f"\nLegacy documents (runs of 1, 4, 16 messages with a byte >= 0x80), {sample} of each")
    print("encoding: read back by `decode` as written (the rest: the detector named another)")
    for encoding, langs in ENCODINGS.items():
        docs = [d for lang in langs.split() for run in (1, 4, 16)
                for d in documents(texts.get(lang, []), encoding, run) if max(d) >= 0x80]
        picked = rng.sample(docs, min(sample, len(docs)))
        same = sum(decode(d, "x", []) == d.decode(encoding) for d in picked)
        print(f"{encoding:9} {100 * same / len(picked):5.1f}% of {len(picked)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locale-dir", type=Path, default=Path("/usr/share/locale"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample", type=int, default=2000,
                        help="documents read whole by `decode` (slower: detection)")
    args = parser.parse_args()
    langs = {lang for v in ENCODINGS.values() for lang in v.split()}
    texts = {lang: catalog(args.locale_dir, lang) for lang in sorted(langs)}
    print(f"{sum(map(len, texts.values())):,} messages in {len(texts)} languages:",
          ", ".join(f"{k} {len(v)}" for k, v in texts.items()), "\n")
    legacy_table(texts)
    mixed_table(texts, args.seed, args.sample)
    readback_table(texts, args.seed, args.sample)


if __name__ == "__main__":
    main()
