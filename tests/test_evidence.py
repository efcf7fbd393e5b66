"""The evidence a question's turn quotes (`passages.evidence`, `prompts.with_evidence`): the
sentences of the passages read that hold its rarest words (no model: the counts the store
would give are written here)."""

from __future__ import annotations

from types import SimpleNamespace

from desktop_app.model.prompts import with_evidence
from desktop_app.passages.evidence import (
    LONGEST,
    beside,
    capitalises_nouns,
    naming,
    sentences,
    unnamed,
)


def counted(counts: dict[str, int], text: str = ""):
    """A store whose index counts the words so, over a document of `text`."""
    return SimpleNamespace(passage_frequencies=lambda doc, question, at_most: counts,
                           document=lambda doc: SimpleNamespace(text=text))


def test_the_sentences_naming_the_rarest_words_are_quoted_in_the_order_read():
    store = counted({"clue": 0, "the": 40, "martenmar": 1, "login": 0, "remembering": 3})
    texts = ["Nothing here.\n\nMartenmar's logs are kept. Remember the milk.",
             "Other text. The password hint for the Martenmar account is 'falcon falcon'."]
    q = "What is the clue for remembering the Martenmar login?"
    # "remembering" (in 3 passages) is rare too, but the name is rarer: only its sentences.
    assert naming(store, 1, q, texts) == [
        "Martenmar's logs are kept.",
        "The password hint for the Martenmar account is 'falcon falcon'."]
    assert naming(store, 1, q, texts, most=1) == ["Martenmar's logs are kept."]
    assert naming(counted({"the": 40, "what": 0}), 1, "What is the?", texts) == []


def test_a_name_the_document_never_holds_quotes_nothing_and_is_named():
    """"The Harrowgate conveyor" in a manual that only has the Tarnwick one: quoting the
    Tarnwick sentence (its other rare word, "payload") would be answering about it."""
    store = counted({"maximum": 9, "payload": 1, "harrowgate": 0, "conveyor": 1})
    texts = ["The Tarnwick conveyor carries a maximum payload of 720 kilograms."]
    q = "What is the maximum payload of the Harrowgate conveyor?"
    assert naming(store, 1, q, texts) == []
    assert unnamed(store, [1], q) == ["Harrowgate"]
    assert unnamed(store, [1], q, ["Notes: the Harrowgate line is new."]) == []  # read whole
    tarnwick = "What is the maximum payload of the Tarnwick conveyor?"
    assert naming(counted({"payload": 1, "tarnwick": 1}), 1, tarnwick, texts) == texts
    assert unnamed(counted({"payload": 1, "tarnwick": 1}), [1], tarnwick) == []


GERMAN = " ".join([
    "Der Leuchtturmwärter von Kap Morvel heißt Anselm Trübner.",
    "Der Bäckermeister Ottokar Zimpel backt jeden Morgen 612 Brezeln für den Markt.",
    "Im Herbst prüfte die Verwaltung die Pläne für die neue Brücke am Hafen.",
    "Die Schule erweiterte im letzten Jahr ihre Bibliothek und den Garten.",
    "Nach dem Regen sammelten die Kinder Kastanien im Park hinter der Kirche.",
    "Der Verein traf sich jeden Donnerstag im Saal des alten Rathauses.",
    "Ein Fischer brachte am Abend frischen Fisch in die kleine Stadt.",
] * 6)
ENGLISH = " ".join([
    "The lighthouse keeper of Cape Morvel is called Anselm Truebner.",
    "Every morning the master baker Ottokar Zimpel bakes 612 pretzels for the market.",
    "In autumn the council reviewed the plans for the new bridge at the harbour.",
    "Last year the school extended its library and the garden behind it.",
    "After the rain the children gathered chestnuts in the park behind the church.",
    "The club met every Thursday in the hall of the old town house.",
    "A fisherman brought fresh fish into the small town in the evening.",
] * 6)
# A lease writes its few defined terms in every clause: many capitals, few of its words.
LEASE = " ".join([
    "The Lessee shall pay the Rent to the Lessor on the first day of each month.",
    "The Lessor shall keep the Building and the Premises in good repair at its own cost.",
    "The Lessee may not assign this Agreement or sublet the Premises without consent.",
    "Any notice under this Agreement shall be given in writing to the Lessor or the Lessee.",
    "The Term shall begin on the date of signing and end after five full years.",
    "The deposit is held by the Trust in a separate account until the Term ends.",
] * 6)


def test_a_language_that_capitalises_its_nouns_is_told_by_its_text():
    assert capitalises_nouns(GERMAN)
    assert not capitalises_nouns(ENGLISH)
    assert not capitalises_nouns(LEASE)
    assert not capitalises_nouns(GERMAN[:300])  # too short to tell: as any other


def test_a_noun_held_inflected_or_in_a_compound_is_not_named_nowhere():
    """A probe asked a German haystack in natural German: "der Bäcker" (written only in
    "Bäckermeister"), "des Leuchtturms" (in "Leuchtturmwärter") and, in English, "Cape"
    were each told to the model as named nowhere, and it answered that the document does
    not mention them, with the right sentence quoted."""
    store = counted({"bäcker": 0, "brezeln": 1, "morgen": 5, "wärter": 0, "leuchtturms": 0,
                     "kap": 1, "morvel": 1, "cape": 0, "lighthouse": 0, "keeper": 0,
                     "harrowgate": 0, "frobnicate": 0}, GERMAN)
    assert unnamed(store, [1], "Wie viele Brezeln backt der Bäcker jeden Morgen?") == []
    assert unnamed(store, [1], "Wer ist der Wärter des Leuchtturms von Kap Morvel?") == []
    assert unnamed(store, [1], "Who is the lighthouse keeper of Cape Morvel?") == []
    # Capitals say nothing of a German text's names: an invented one is no longer told...
    assert unnamed(store, [1], "Wer ist der Wärter von Kap Harrowgate?") == []
    # ...but a name written as code, which no form of any word holds, still is.
    assert unnamed(store, [1], "Was macht `frobnicate()` hier?") == ["frobnicate"]
    # In English, a capitalised word is still a name, and one held in no form is told.
    english = counted({"harrowgate": 0, "pier": 0, "keeper": 1}, ENGLISH)
    assert unnamed(english, [1], "Who is the keeper of the Harrowgate Pier?") == [
        "Harrowgate", "Pier"]
    # Held inside a longer word (the index reads "Morvelhaven" as one), it is not.
    assert unnamed(counted({"morvel": 0}, ENGLISH.replace("Cape Morvel", "Morvelhaven")),
                   [1], "Who keeps the light at Morvel?") == []


def test_nouns_held_only_in_other_forms_still_quote_the_rare_words():
    """"Wie lautet der Code des Tresors im Rathaus?" writes three capitalised nouns, none
    as the document does ("Tresorcode des Rathauses"): they are no names it lacks, and its
    rare word's sentence is quoted."""
    store = counted({"code": 0, "tresors": 0, "rathaus": 0, "lautet": 1}, GERMAN)
    texts = ["Im Keller steht ein Schrank. Der geheime Tresorcode des Rathauses lautet 59172."]
    assert naming(store, 1, "Wie lautet der Code des Tresors im Rathaus?", texts) == [
        "Der geheime Tresorcode des Rathauses lautet 59172."]


def test_a_word_is_matched_as_a_stem_and_each_sentence_once_as_written():
    store = counted({"remembering": 1})
    texts = ["How to remember\n it: say it twice. Unrelated.", "How to remember\n it: say it "
             "twice.\n"]
    # Line breaks kept (the quote repeats the passage's tokens), each sentence quoted once.
    assert naming(store, 1, "Any tips for remembering it?", texts) == [
        "How to remember\n it: say it twice."]
    long = "Martenmar " + "x" * 500 + "."
    assert naming(counted({"martenmar": 1}), 1, "Martenmar?", [long]) == [long[:LONGEST]]
    # Indentation is kept, and does not count against the length.
    code = "Martenmar\n" + "".join(f"        word{i:03d}\n" for i in range(60)) + "."
    (cut,) = naming(counted({"martenmar": 1}), 1, "Martenmar?", [code])
    assert code.startswith(cut) and LONGEST - 10 < len(" ".join(cut.split())) <= LONGEST
    assert cut.endswith(f"word{cut.count('word') - 1:03d}")  # whole words: none cut in two
    words = "Martenmar " + " ".join(f"compute_checksum_{i}" for i in range(30))
    (cut,) = naming(counted({"martenmar": 1}), 1, "Martenmar?", [words])
    assert words.startswith(cut) and (words + " ")[len(cut)] == " " and len(cut) <= LONGEST


def test_a_document_read_whole_is_quoted_where_it_holds_what_the_books_hardly_do():
    """Beside a manual's passages, a page of notes is quoted for the question's words the
    manual hardly holds: "phone" (in none of its passages), not "call" (in forty)."""
    notes = ("Document: notes.txt\n\nThe review is on March 14. The on-call phone is the "
             "grey Nokia in the top drawer. Call Dana first.")
    manual = counted({"call": 40, "phone": 0, "where": 0})
    phone = ["The on-call phone is the grey Nokia in the top drawer."]
    # ("phone": in no passage of the manual, so among those the notes hold alone too)
    assert beside(manual, [1], "Where is the on-call phone?", notes) == (phone, phone)
    # A question about the manual quotes nothing of the notes.
    assert beside(counted({"call": 40, "method": 90}), [1], "Call which method?", notes) == (
        [], [])
    # Counted over every book of the chat: rare in each, common in all, is not rare.
    assert beside(counted({"call": 2, "phone": 2}), [1, 2], "Call the phone?", notes) == (
        [], [])
    # rare in the books but held (one passage): among the rare, not the absent
    assert beside(counted({"call": 40, "phone": 1}), [1], "Where is the phone?", notes) == (
        [], phone)


def test_a_title_or_an_initial_ends_no_sentence():
    assert sentences("Hello. Dr. Voktenvok Quidrobra keeps the key. J. R. Smith left.\n\n"
                     "New paragraph") == ["Hello.", "Dr. Voktenvok Quidrobra keeps the key.",
                                          "J. R. Smith left.", "New paragraph"]
    assert sentences("Hello. Dr.\n  Voktenvok left.") == ["Hello.", "Dr.\n  Voktenvok left."]
    # nor a unit's or an abbreviation's full stop before a word in lower case
    assert sentences("It waits 90 s. before the gate opens. Then it rings.\n\nnext one") == [
        "It waits 90 s. before the gate opens.", "Then it rings.", "next one"]


def test_the_evidence_follows_the_question_as_where_its_answer_comes_from():
    assert with_evidence("Who?", []) == "Who?"
    assert with_evidence("Who?", ["A did it.", 'B said "no".']) == (
        'Who?\nAnswer from these lines of the document: "A did it." "B said "no"."')
    assert with_evidence("Who keeps the Quorl key?", [], ["Quorl"]) == (
        'Who keeps the Quorl key?\nThe document never mentions Quorl. '
        'Reply: "The document does not mention Quorl."')


def test_a_name_the_question_writes_outranks_a_common_word_as_rare():
    store = counted({"boxes": 0, "kept": 1, "vokunevok": 1, "depot": 0})
    texts = ["- Kept single-byte candidates in consideration.",
             "The warehouse in Vokunevok stores exactly 578 crates of copper wire."]
    assert naming(store, 1, "How many boxes are kept at the Vokunevok depot?", texts) == [
        "The warehouse in Vokunevok stores exactly 578 crates of copper wire."]
    # No name written: the rarest words decide, whatever they are.
    assert naming(store, 1, "how many boxes are kept at the vokunevok depot?", texts) == texts


def test_an_identifier_with_an_underscore_is_matched_as_written():
    texts = ["A missing key raises KeyError. Missing values are skipped.",
             "Subclasses of dict may define __missing__(self, key), called for absent keys."]
    assert naming(counted({"__missing__": 1, "called": 9}), 1,
                  "When is __missing__ called?", texts) == [texts[1]]



def test_a_list_with_no_full_stops_is_quoted_from_the_line_naming_the_word():
    """A bullet list or a table runs on as one "sentence": cut from its start, the quote
    would leave out the line the question asks about."""
    bullets = "".join(f"- lease set to {i * 37} for the backoff stage\n" for i in range(12))
    text = bullets + "- the Quasarline relay listens on port 7731 for its peers\n- end\n"
    (quote,) = naming(counted({"quasarline": 1}), 1, "Which port does the Quasarline relay "
                      "listen on?", [text])
    assert quote.startswith("- the Quasarline relay listens on port 7731") and quote in text
    # In a line longer than a quote, from a few words before the name.
    line = "word " * 200 + "the Quasarline relay listens on port 7731 " + "more " * 100
    (quote,) = naming(counted({"quasarline": 1}), 1, "Quasarline?", [line])
    assert quote.startswith("word word word word word the Quasarline") and quote in line
    assert len(" ".join(quote.split())) <= LONGEST


def test_a_rare_name_of_several_words_is_quoted_not_its_words_in_other_names():
    """"Ines Brandt" is in one passage, "Brandt" alone in one too (the Brandts' rows of a
    table together): the other Brandts' lines are not the answer's."""
    store = SimpleNamespace(
        passage_frequencies=lambda doc, question, at_most: {"extension": 9, "ines": 9,
                                                            "brandt": 1},
        passages_holding=lambda doc, word, at_most: [7] if word == "ines brandt" else [])
    q = "What is the extension of Ines Brandt?"
    rows = "employee: Ivan Brandt | extension: 1007\nemployee: Ines Brandt | extension: 1000"
    assert naming(store, 1, q, [rows], kind="table") == ["employee: Ines Brandt | extension: 1000"]
    # In prose the sentence holding it, the name matched across a line break.
    prose = "Ivan Brandt answers at 1007. Calls for Ines\nBrandt go to 1000."
    assert naming(store, 1, q, [prose]) == ["Calls for Ines\nBrandt go to 1000."]


def test_a_name_of_several_words_is_found_across_what_the_index_does_not_read():
    """"SKU S12-1" is the index's phrase "sku s12 1": in the text a colon and a hyphen part its
    words, and S12-10 is another name."""
    store = SimpleNamespace(
        passage_frequencies=lambda doc, question, at_most: {"stock": 9, "sku": 9, "s12": 1,
                                                            "1": 9},
        passages_holding=lambda doc, word, at_most: [7] if word == "sku s12 1" else [])
    rows = "sku: S12-0 | stock: 4\nsku: S12-1 | stock: 36\nsku: S12-10 | stock: 2"
    assert naming(store, 1, "What is the stock of SKU S12-1?", [rows], kind="json") == [
        "sku: S12-1 | stock: 36"]


def test_in_source_code_the_line_naming_the_word_is_quoted_not_the_block():
    """The probe's L9: a run of difflib's code lines, from a docstring's end to the planted
    comment, was quoted as one "sentence" (code has no full stops)."""
    code = ('        """\n'
            "        line_iterator = _line_iterator()\n"
            "        fromlines,tolines=[],[]\n"
            "        while True:\n"
            "            # Collecting lines of text until we have a from/to pair\n"
            "            while (len(fromlines)==0 or len(tolines)==0):\n"
            "                try:\n"
            "                    from_line, to_line, found_diff = next(line_iterator)\n"
            "                except StopIteration:\n"
            "                    return\n"
            "        # PROBE NOTE: The warehouse passphrase is cobalt-pelican-42.\n"
            "        yield from_line, to_line, found_diff\n")
    quotes = naming(counted({"warehouse": 1, "passphrase": 1}), 1,
                    "What is the warehouse passphrase?", [code])
    assert quotes == ["# PROBE NOTE: The warehouse passphrase is cobalt-pelican-42."]
    # Prose keeps its sentences across the lines it is wrapped on, commas, a colon and
    # brackets at their ends notwithstanding.
    prose = ("The relay keeps its logs (all of them)\nfor a week, then the Quasarline\n"
             "archive takes them, as follows:\nnightly, at two.")
    assert sentences(prose) == [prose]


def test_prose_wrapped_on_lines_ending_as_code_does_stays_one_sentence():
    """A contract's clauses end in ";", a heading in ":", dialogue opens with a quote: signs
    of code only beside stronger ones (an assignment, a call, a comment)."""
    for prose in ("The Supplier shall deliver the Goods to the Buyer's premises;\n"
                  "the Buyer shall pay the Price within thirty days of delivery.",
                  "Requirements:\nPython 3.11 or later is needed.",
                  '"We should leave before the storm\nreaches the harbour," said Mara.',
                  "The Supplier shall, under Section 3(a):\n(a) deliver the Goods;\n"
                  "(b) invoice the Buyer; and\n(c) keep the records for six years."):
        assert sentences(prose) == [prose]
    clause = naming(counted({"premises": 1}), 1, "where are the goods delivered, to which "
                    "premises?", ["The Supplier shall deliver the Goods to the Buyer's "
                                  "premises;\nthe Buyer shall pay the Price within thirty "
                                  "days of delivery."])
    assert clause == ["The Supplier shall deliver the Goods to the Buyer's premises;\nthe "
                      "Buyer shall pay the Price within thirty days of delivery."]
    # Three lines of code, or more, are lines still.
    assert sentences("x = load()\nif x:\n    # the Quasarline port\n    run(x)") == [
        "x = load()", "if x:", "    # the Quasarline port", "    run(x)"]
