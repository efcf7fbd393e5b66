"""Chinese and Japanese documents: the full-text index reads them character by character
(`store.words`), questions search their runs as pairs, and passages and quoted evidence end at
。！？ (no model: a Store, the retrieval layer and static embeddings)."""

from __future__ import annotations

import json
import random
import sqlite3

import pytest

from desktop_app.passages.embed import WordLlamaEmbedder
from desktop_app.passages.evidence import naming, sentences
from desktop_app.passages.retrieve import Retriever
from desktop_app.passages.split import split
from store import Store
from store.datadir.db import open_connection
from store.documents.passages import query_words
from store.upgrade import migrate

SUBJECTS = "市政府|委员会|社区|公司|协会|研究所|管理局|董事会|工作组|学校|工厂|图书馆".split("|")
WHEN = "明年|经过长时间讨论后|与居民一起|分阶段地|在秋季之前|按照去年的协议".split("|")
VERBS = "审查了|计划|改善了|扩建了|记录了|评估了|调查了|翻修了|批准了".split("|")
OBJECTS = "供水设施|预算方案|路灯|校舍|铁路线路|公园|垃圾收集|自行车道|档案室|市场|桥梁".split("|")
# A two-character word (蜂巢) and a four-character one (鹰山天文), each in one sentence only.
FACTS = [("养蜂人在林边的蜂巢里养了四十三箱蜜蜂。", "蜂巢里养了多少箱蜜蜂？"),
         ("鹰山天文台的望远镜镜面直径为八十四厘米。", "鹰山天文台望远镜的镜面直径是多少？")]


def chars(text: str) -> int:
    """A stand-in tokenizer for text without spaces: one token per two characters."""
    return max(1, len(text) // 2)


def haystack(sentences_: int = 1200) -> str:
    """Municipal filler on one line (no paragraph breaks, as text from a PDF often is), the
    facts planted at a third and two thirds."""
    rnd = random.Random(7)
    filler = [rnd.choice(SUBJECTS) + rnd.choice(WHEN) + rnd.choice(VERBS) + rnd.choice(OBJECTS)
              + "。" for _ in range(sentences_)]
    filler.insert(sentences_ // 3, FACTS[0][0])
    filler.insert(2 * sentences_ // 3, FACTS[1][0])
    return "".join(filler)


def test_a_cjk_question_is_searched_as_overlapping_pairs_and_other_words_as_written():
    assert query_words("鹰山天文台在哪里? Who keeps the Vault 3号") == [
        "鹰山", "山天", "天文", "文台", "台在", "在哪", "哪里", "keeps", "vault", "3", "号"]
    assert query_words("灯台守の名前は鳥羽宗一郎です") [:3] == ["灯台", "台守", "守の"]


def test_one_line_chinese_is_split_at_its_full_stops():
    text = haystack(300)
    passages = split(text, "text", chars, target=60, limit=120)
    assert len(passages) > 10
    assert all(p.text.endswith("。") for p in passages)  # none cut mid-sentence
    assert "".join(p.text for p in passages) == text


@pytest.fixture(scope="module")
def embedder():
    return WordLlamaEmbedder()


def test_bm25_finds_a_planted_two_and_four_character_word(tmp_path, embedder):
    text = haystack()
    with Store(tmp_path / "data") as store:
        doc = store.add_document("h", "zh", text, type="text")
        retriever = Retriever(store, embedder)
        assert retriever.index.add(doc.id, text, "text", chars) > 20
        for fact, question in FACTS:
            for mode in ("bm25", "fused"):
                best = retriever.retrieve(doc.id, question, k=3, mode=mode)[0]
                assert fact in store.passage(best.passage_id).text, (question, mode)
        (hit, _), = store.search_passages(doc.id, "蜂巢", 5)  # the word alone, in one passage
        assert FACTS[0][0] in hit.text
        # Deleting the document takes its rows out of the index, which still checks whole.
        store.delete_document(doc.id)
        db = store._db.get()
        db.execute("INSERT INTO passages_fts(passages_fts, rank) VALUES ('integrity-check', 1)")
        assert db.execute("SELECT count(*) FROM passages_fts_docsize").fetchone() == (0,)


def test_a_store_indexed_before_reads_its_cjk_passages_after_the_upgrade(tmp_path):
    """A store of schema 13 indexed each clause as one token: the upgrade indexes it again."""
    path = tmp_path / "kvdesk.sqlite"
    conn = open_connection(path)
    migrate(conn, target=13)
    conn.execute("INSERT INTO documents (id, content_hash, title, type, text, created)"
                 " VALUES (1, 'h', 'zh', 'text', '', 0)")
    texts = ["学校在秋季之前调查了预算方案。", FACTS[1][0], "The vault code is 4417."]
    for i, text in enumerate(texts):
        conn.execute("INSERT INTO passages (document_id, idx, text, char_start, char_end,"
                     " line_start, line_end, heading, n_tokens, content_hash)"
                     " VALUES (1, ?, ?, 0, 1, 1, 1, '[]', 5, ?)", (i, text, str(i)))
    assert conn.execute("SELECT count(*) FROM passages_fts WHERE passages_fts MATCH"
                        " '\"天 文\"'").fetchone() == (0,)
    conn.close()
    with Store(tmp_path) as store:
        (hit, _), = store.search_passages(1, "鹰山天文台的镜面", 5)
        assert hit.text == FACTS[1][0]
        assert [p.text for p, _ in store.search_passages(1, "vault", 5)] == [
            "The vault code is 4417."]
        db = store._db.get()
        db.execute("INSERT INTO passages_fts(passages_fts, rank) VALUES ('integrity-check', 1)")
    raw = sqlite3.connect(path)  # (another program reading the index needs no function of ours)
    assert raw.execute("SELECT count(*) FROM passages_fts WHERE passages_fts MATCH"
                       " '\"天 文\"'").fetchone() == (1,)
    raw.close()


def test_evidence_quotes_the_cjk_sentence_naming_the_rare_word():
    text = "学校在秋季之前调查了预算方案。养蜂人在林边的蜂巢里养了四十三箱蜜蜂！工厂扩建了路灯。"
    assert sentences(text) == ["学校在秋季之前调查了预算方案。",
                               "养蜂人在林边的蜂巢里养了四十三箱蜜蜂！", "工厂扩建了路灯。"]
    assert sentences("「行こう。」と彼は言った。次だ．") == [
        "「行こう。」", "と彼は言った。", "次だ．"]
    counts = {"蜂巢": 1, "巢里": 1, "里养": 2, "养了": 9, "多少": 0}
    store = type("Counted", (), {"passage_frequencies": lambda self, d, q, n: counts})()
    assert naming(store, 1, "蜂巢里养了多少箱蜜蜂？", [text]) == [
        "养蜂人在林边的蜂巢里养了四十三箱蜜蜂！"]
    # A line's wrap between a pair's characters still names it.
    assert naming(store, 1, "蜂巢里养了多少？", ["林边的蜂\n巢里。别的。"]) == ["林边的蜂\n巢里。"]


def test_headings_in_any_script_are_searched_as_their_text(tmp_path):
    """(The index read a heading as its stored JSON: "Übersicht" as "u00dcbersicht", which no
    question holds.) A heading damaged on disk still lets its passage be deleted."""
    with Store(tmp_path / "data") as store:
        doc = store.add_document("h", "de", "x", type="text")
        db = store._db.get()
        for i, (heading, text) in enumerate([(["Übersicht", "第一节"], "Nichts hier."),
                                             (["Other"], "Also nothing.")]):
            with store._db.write() as w:
                w.execute("INSERT INTO passages (document_id, idx, text, char_start, char_end,"
                          " line_start, line_end, heading, n_tokens, content_hash)"
                          " VALUES (?, ?, ?, 0, 1, 1, 1, ?, 5, ?)",
                          (doc.id, i, text, json.dumps(heading), str(i)))
        for query in ("Übersicht", "übersicht", "第一节"):
            assert [p.text for p, _ in store.search_passages(doc.id, query, 5)] == [
                "Nichts hier."], query
        with store._db.write() as w:  # (as a rotten byte would leave it)
            w.execute("UPDATE passages SET heading = '[\"Oth' WHERE idx = 1")
        store.delete_document(doc.id)
        assert db.execute("SELECT count(*) FROM passages").fetchone() == (0,)
