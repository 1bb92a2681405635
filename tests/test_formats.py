"""Loaders of the official benchmark and corpus formats: real samples from ../shared/data/realqa, tiny files."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from centralrl.config import CorpusSource, DataConfig, QuestionSource
from centralrl.data.formats import load_corpus, load_questions
from centralrl.errors import DataError
from centralrl.schema import passage_id

REALQA = Path(__file__).parents[1].parent / "shared/data/realqa"


@pytest.fixture(scope="module")
def realqa() -> Path:
    if not REALQA.is_dir():
        pytest.skip(f"../shared/data/realqa not found: the real benchmark samples live beside the repo at {REALQA}")
    return REALQA


def source(kind: str, path: str | Path | None = None, **fields) -> QuestionSource:
    fields = {"benchmark": "bench", "split": "test", **fields}
    return QuestionSource(kind=kind, path=None if path is None else str(path), **fields)


def corpus(kind: str, path: str | Path, root: Path, **fields) -> list:
    return load_corpus(CorpusSource(kind=kind, path=str(path), **fields), root, DataConfig().max_passage_chars)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


# --- real files ---------------------------------------------------------------------------------------------

REAL_QUESTIONS = [  # kind, file, source_filter, questions, passages carried by the file
    ("hotpotqa", "hotpotqa/hotpotqa_dev_distractor_100_reflexion.json", None, 100, 1000),
    ("hotpotqa", "hotpotqa/hotpotqa_train_100_hipporag.json", None, 100, 994),
    ("2wikimultihopqa", "2wikimultihopqa/2wikimultihopqa_dev_first40_with_context.jsonl", None, 40, 354),
    ("musique", "musique/musique_ans_dev_100_kag.json", None, 100, 1839),
    ("musique", "musique/musique_ans_train_100_hipporag.json", None, 100, 1890),
    ("popqa", "popqa/popqa_1000_with_paragraphs_hipporag2.json", None, 1000, 1475),
    ("qa_jsonl", "bamboogle/bamboogle_125_r1searcher.jsonl", None, 125, 0),
    ("nq_open", "nq/NQ-open.dev.jsonl", None, 3610, 0),
    ("qa_jsonl", "mixed_qa_only/deepresearcher_test.jsonl", "tq", 512, 0),
    ("qa_jsonl", "mixed_qa_only/deepresearcher_test.jsonl", "bamboogle", 125, 0),  # the file writes "Bamboogle"
    ("qa_jsonl", "mixed_qa_only/deepresearcher_dev.jsonl", "2wiki", 125, 0),
    ("qa_jsonl", "mixed_qa_only/r1searcher_hotpotqa_500.jsonl", None, 500, 0),
    ("qa_jsonl", "mixed_qa_only/r1searcher_2wiki_500.jsonl", None, 500, 0),
    ("qa_jsonl", "mixed_qa_only/r1searcher_musique_500.jsonl", None, 500, 0),
    ("qa_jsonl", "training_qa_only/r1searcher_train_stage_2.jsonl", None, 8148, 0),
]


@pytest.mark.parametrize(("kind", "path", "source_filter", "n_questions", "n_passages"), REAL_QUESTIONS)
def test_real_question_files_load_whole(realqa, kind, path, source_filter, n_questions, n_passages):
    questions, passages = load_questions(source(kind, path, source_filter=source_filter), realqa)
    assert (len(questions), len(passages)) == (n_questions, n_passages)
    assert len({q.id for q in questions}) == n_questions
    assert all(q.id.startswith("bench/") and q.golden_answers for q in questions)
    known = {p.id for p in passages}
    assert all(pid in known for q in questions for pid in q.supporting_passage_ids)
    if n_passages:  # benchmarks that carry their evidence give every question its supporting paragraphs
        assert all(q.supporting_passage_ids for q in questions)


@pytest.mark.parametrize(
    ("path", "n_supporting"),
    [
        ("hotpotqa/hotpotqa_dev_distractor_100_reflexion.json", 200),
        ("hotpotqa/hotpotqa_train_100_hipporag.json", 200),
    ],
)
def test_real_hotpotqa_supporting_paragraphs_are_the_titled_context(realqa, path, n_supporting):
    questions, passages = load_questions(source("hotpotqa", path), realqa)
    raw = json.loads((realqa / path).read_text(encoding="utf-8"))
    by_id = {p.id: p for p in passages}
    assert sum(len(q.supporting_passage_ids) for q in questions) == n_supporting
    for question, row in zip(questions, raw):
        assert question.id == f"bench/{row['_id']}"
        titles = {by_id[pid].title for pid in question.supporting_passage_ids}
        assert titles == {title for title, _ in row["supporting_facts"]}


def test_real_hotpotqa_train_supporting_passages_are_in_hipporag_corpus(realqa):
    train = source("hotpotqa", "hotpotqa/hotpotqa_train_100_hipporag.json", split="train")
    questions, carried = load_questions(train, realqa)
    corpus_ids = {p.id for p in corpus("title_sentences", "hotpotqa/hotpotqa_train_100_corpus_hipporag.json", realqa)}
    supporting = [pid for q in questions for pid in q.supporting_passage_ids]
    assert len(supporting) == 200
    assert all(pid in corpus_ids for pid in supporting)
    assert {p.id for p in carried} == corpus_ids  # same 994 paragraphs, same text, same ids


def test_real_hotpotqa_paragraph_text_is_the_concatenated_sentences(realqa):
    questions, passages = load_questions(
        source("hotpotqa", "hotpotqa/hotpotqa_dev_distractor_100_reflexion.json"), realqa
    )
    raw = json.loads((realqa / "hotpotqa/hotpotqa_dev_distractor_100_reflexion.json").read_text(encoding="utf-8"))
    title, sentences = raw[0]["context"][1]
    assert title == "VIVA Poland"
    expected = "".join(sentences).strip()
    assert expected.startswith('VIVA Polska (earlier "VIVApolska!") is a Polish')
    assert any(p.title == title and p.text == expected and p.id == passage_id(title, expected) for p in passages)
    assert questions[0].golden_answers == ("Gesellschaft mit beschränkter Haftung",)


def test_real_musique_supporting_and_decomposition_resolve(realqa):
    for path in ("musique/musique_ans_dev_100_kag.json", "musique/musique_ans_train_100_hipporag.json"):
        questions, passages = load_questions(source("musique", path), realqa)
        known = {p.id for p in passages}
        assert all(q.decomposition and len(q.decomposition) >= 2 for q in questions)
        for q in questions:
            step_ids = [pid for step in q.decomposition for pid in step.passage_ids]
            assert len(step_ids) == len(q.decomposition)
            assert set(step_ids) <= set(q.supporting_passage_ids) <= known


def test_real_musique_first_row(realqa):
    questions, passages = load_questions(source("musique", "musique/musique_ans_dev_100_kag.json"), realqa)
    first = questions[0]
    assert first.id == "bench/2hop__82713_84616"
    assert first.golden_answers == (
        "for Best Performance by a Leading Actress in a Play in Ondine",
        "leading role",
        "star",
        "leading actress",
        "lead",
    )
    by_id = {p.id: p for p in passages}
    assert [by_id[s.passage_ids[0]].title for s in first.decomposition] == [
        "My Fair Lady (film)",
        "List of awards and honours received by Audrey Hepburn",
    ]
    assert first.decomposition[0].answer == "Audrey Hepburn"


def test_real_musique_train_supporting_passages_are_in_hipporag_corpus(realqa):
    train = source("musique", "musique/musique_ans_train_100_hipporag.json", split="train")
    questions, carried = load_questions(train, realqa)
    corpus_ids = {
        p.id for p in corpus("title_text_list", "musique/musique_ans_train_100_corpus_hipporag.json", realqa)
    }
    supporting = [pid for q in questions for pid in q.supporting_passage_ids]
    assert (len(supporting), len(set(supporting))) == (237, 234)  # a few paragraphs support two questions
    assert set(supporting) <= corpus_ids
    assert {p.id for p in carried} == corpus_ids


def test_real_2wiki_supporting_passages_are_in_hipporag_corpus(realqa):
    dev = source("2wikimultihopqa", "2wikimultihopqa/2wikimultihopqa_dev_first40_with_context.jsonl")
    questions, carried = load_questions(dev, realqa)
    hipporag = corpus("title_text_list", "2wikimultihopqa/2wikimultihopqa_dev1000_corpus_hipporag.json", realqa)
    corpus_ids = {p.id for p in hipporag}
    assert questions[0].golden_answers == ("20 March 851",)
    assert all(len(q.supporting_passage_ids) >= 2 for q in questions)
    assert {pid for q in questions for pid in q.supporting_passage_ids} <= {p.id for p in carried} <= corpus_ids


def test_real_popqa_decodes_possible_answers(realqa):
    questions, passages = load_questions(source("popqa", "popqa/popqa_1000_with_paragraphs_hipporag2.json"), realqa)
    first = questions[0]
    assert first.id == "bench/4222362"
    assert first.question == "What is George Rankin's occupation?"
    assert first.golden_answers == ("politician", "political leader", "political figure", "polit.", "pol")
    assert {p.title for p in passages if p.id in first.supporting_passage_ids} == {"George Rankin", "Politician"}


def test_real_nq_open_ids_are_row_numbers(realqa):
    questions, _ = load_questions(source("nq_open", "nq/NQ-open.dev.jsonl"), realqa)
    assert questions[0].id == "bench/0" and questions[-1].id == "bench/3609"
    assert questions[0].golden_answers == ("14 December 1972 UTC", "December 1972")


def test_real_deepresearcher_tq_rows_are_triviaqa(realqa):
    questions, _ = load_questions(
        source("qa_jsonl", "mixed_qa_only/deepresearcher_test.jsonl", source_filter="tq"), realqa
    )
    assert all(q.id.startswith("bench/tq_") for q in questions)
    first = questions[0]
    assert first.id == "bench/tq_bt_3133"
    assert first.question == "What is a nattatorium better known as"
    assert "swimming pool" in first.golden_answers


def test_real_bamboogle_uses_idx_and_answer(realqa):
    questions, _ = load_questions(source("qa_jsonl", "bamboogle/bamboogle_125_r1searcher.jsonl"), realqa)
    assert questions[0].id == "bench/1" and questions[0].golden_answers == ("james madison",)


REAL_CORPORA = [
    ("flashrag_passages", "corpus/flashrag_wiki_sample_1000_passages.jsonl", 1000),
    ("kilt_pages", "corpus/r1searcher_kilt_wikipedia_pages_sample.jsonl", 2439),
    ("title_sentences", "hotpotqa/hotpotqa_train_100_corpus_hipporag.json", 994),
    ("title_text_list", "2wikimultihopqa/2wikimultihopqa_dev1000_corpus_hipporag.json", 6119),
    ("title_text_list", "musique/musique_ans_train_100_corpus_hipporag.json", 1890),
]


@pytest.mark.parametrize(("kind", "path", "n_passages"), REAL_CORPORA)
def test_real_corpus_files(realqa, kind, path, n_passages):
    passages = corpus(kind, path, realqa)
    assert len(passages) == n_passages
    assert all(p.id == passage_id(p.title, p.text) and p.title and p.text for p in passages)


def test_real_flashrag_passage_title_and_text(realqa):
    first = corpus("flashrag_passages", "corpus/flashrag_wiki_sample_1000_passages.jsonl", realqa)[0]
    assert first.title == "Evan Morris"
    assert first.text.startswith("Evan Morris Evan L. Morris (January 26, 1977")


def test_real_kilt_pages_become_clean_passages_of_about_100_words(realqa):
    passages = corpus("kilt_pages", "corpus/r1searcher_kilt_wikipedia_pages_sample.jsonl", realqa)
    assert not any("Section::::" in p.text or "BULLET::::" in p.text for p in passages)
    assert not any(p.text == p.title for p in passages)  # the title line that opens each page is gone
    assert 60 <= statistics.median(len(p.text.split()) for p in passages) <= 100
    assert passages[0].title == "A" and passages[0].text.startswith('A (named , plural "As"')


# --- tiny files: one happy path per kind ----------------------------------------------------------------------


def test_flashrag_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "nq.jsonl",
        [
            {"id": "test_0", "question": " Who? ", "golden_answers": ["A", "A", 1990], "metadata": {}},
            {"id": "test_1", "question": "What?", "golden_answers": ["B"], "metadata": {"x": 1}},
        ],
    )
    questions, passages = load_questions(source("flashrag_jsonl", path, benchmark="nq", split="train"), tmp_path)
    assert [q.id for q in questions] == ["nq/test_0", "nq/test_1"]
    assert questions[0].question == "Who?"
    assert questions[0].golden_answers == ("A", "1990")
    assert (questions[1].benchmark, questions[1].split, passages) == ("nq", "train", [])


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_id_is_refused_naming_the_line(tmp_path, blank):
    """It became the question id `nq/`, one id for every such row."""
    path = write_jsonl(tmp_path / "nq.jsonl", [{"id": blank, "question": "Who?", "golden_answers": ["A"]}])
    with pytest.raises(DataError, match=rf"nq\.jsonl:1: empty id '{blank}'"):
        load_questions(source("flashrag_jsonl", path, benchmark="nq", split="train"), tmp_path)


def test_nq_open(tmp_path):
    write_jsonl(tmp_path / "nq.jsonl", [{"question": "q0", "answer": ["x", "y"]}, {"question": "q1", "answer": ["z"]}])
    questions, _ = load_questions(source("nq_open", "nq.jsonl"), tmp_path)
    assert [(q.id, q.golden_answers) for q in questions] == [("bench/0", ("x", "y")), ("bench/1", ("z",))]


def test_qa_jsonl_answer_fields_and_ids(tmp_path):
    path = write_jsonl(
        tmp_path / "qa.jsonl",
        [
            {"idx": 7, "question": "q0", "answer": "one"},
            {"_id": "h1", "question": "q1", "answers": ["two", "2"]},
            {"question": "q2", "golden_answers": [3]},
        ],
    )
    questions, _ = load_questions(source("qa_jsonl", path), tmp_path)
    assert [(q.id, q.golden_answers) for q in questions] == [
        ("bench/7", ("one",)),
        ("bench/h1", ("two", "2")),
        ("bench/2", ("3",)),
    ]


def test_qa_jsonl_source_filter(tmp_path):
    sources = ["nq", "tq", "tq", "popqa"]
    rows = [{"source": s, "id": f"{s}_{i}", "question": f"q{i}", "answers": ["a"]} for i, s in enumerate(sources)]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    questions, _ = load_questions(source("qa_jsonl", path, source_filter="tq"), tmp_path)
    assert [q.id for q in questions] == ["bench/tq_1", "bench/tq_2"]
    with pytest.raises(DataError, match=r"no row has source 'musique'; present: nq \(1\), popqa \(1\), tq \(2\)"):
        load_questions(source("qa_jsonl", path, source_filter="musique"), tmp_path)


@pytest.mark.parametrize("limit", [None, 2])
def test_qa_jsonl_of_several_sources_needs_a_filter(tmp_path, limit):
    """Read whole, DeepResearcher's mixed files filed NQ, TriviaQA, ... under one benchmark (with a limit, its
    first rows only), and the macro average counted them as one."""
    rows = [{"source": s, "question": f"q{i}", "answers": ["a"]} for i, s in enumerate(["nq", "TQ", "tq"])]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.raises(
        DataError,
        match=r"mixed\.jsonl: rows of several sources \(TQ \(1\), nq \(1\), tq \(1\)\): read each as its own "
        r"data\.questions entry, with source_filter and its benchmark",
    ):
        load_questions(source("qa_jsonl", path, limit=limit), tmp_path)
    one = write_jsonl(tmp_path / "one.jsonl", [{"source": s, "question": "q", "answers": ["a"]} for s in ["tq", "TQ"]])
    assert len(load_questions(source("qa_jsonl", one), tmp_path)[0]) == 2  # one source, as the filter compares


def test_real_deepresearcher_mixed_file_needs_a_filter(realqa):
    with pytest.raises(DataError, match=r"several sources \(2wiki \(512\), Bamboogle \(125\), hotpotqa"):
        load_questions(source("qa_jsonl", "mixed_qa_only/deepresearcher_test.jsonl"), realqa)


def hotpot_row(qid: str = "h0") -> dict:
    return {
        "_id": qid,
        "question": "Which?",
        "answer": "Yes",
        "type": "comparison",
        "level": "hard",
        "supporting_facts": [["Alpha", 0], ["Beta", 1], ["Beta", 0]],
        "context": [
            ["Alpha", ["Alpha is a thing.", " It is old."]],
            ["Gamma", ["Gamma."]],
            ["Beta", ["Beta one.", " Beta two."]],
        ],
    }


def test_hotpotqa(tmp_path):
    path = write_json(tmp_path / "hotpot.json", [hotpot_row("h0"), hotpot_row("h1")])
    questions, passages = load_questions(source("hotpotqa", path), tmp_path)
    assert [q.id for q in questions] == ["bench/h0", "bench/h1"]
    assert [(p.title, p.text) for p in passages] == [
        ("Alpha", "Alpha is a thing. It is old."),
        ("Gamma", "Gamma."),
        ("Beta", "Beta one. Beta two."),
    ]
    assert questions[0].supporting_passage_ids == (passages[0].id, passages[2].id)


def test_a_hotpotqa_file_that_is_a_json_object_is_told_to_be_a_list(tmp_path):
    """{"data": [...]} was read as JSON lines: "hotpot.json:1 missing field '_id'", or indented, line 1's
    malformed JSON. JSON lines of several rows in a .json file are still read."""
    wrapped = {"data": [hotpot_row("h0")]}
    (tmp_path / "one_line.json").write_text(json.dumps(wrapped))
    (tmp_path / "indented.json").write_text(json.dumps(wrapped, indent=2))
    for name in ("one_line.json", "indented.json"):
        message = rf"{name}: a JSON object, but this file must be a JSON list of questions \(\[\{{...\}}, ...\]\)"
        with pytest.raises(DataError, match=message):
            load_questions(source("hotpotqa", tmp_path / name), tmp_path)
    (tmp_path / "lines.json").write_text("".join(json.dumps(hotpot_row(i)) + "\n" for i in ("h0", "h1")))
    assert len(load_questions(source("hotpotqa", tmp_path / "lines.json"), tmp_path)[0]) == 2


def test_hotpotqa_supporting_title_outside_context(tmp_path):
    row = hotpot_row()
    row["supporting_facts"].append(["Delta", 0])
    path = write_json(tmp_path / "hotpot.json", [row])
    message = r"hotpot\.json row 0 \(id h0\): supporting_facts name titles not in the context: \['Delta'\]"
    with pytest.raises(DataError, match=message):
        load_questions(source("hotpotqa", path), tmp_path)


def test_2wikimultihopqa_both_layouts(tmp_path):
    official = {
        "_id": "w0",
        "question": "Who?",
        "answer": "X",
        "supporting_facts": [["T1", 0]],
        "context": [["T1", ["First sentence.", "Second sentence."]], ["T2", ["Other."]]],
    }
    variant = {
        "_id": "w1",
        "question": "Who?",
        "answer": "X",
        "supporting_facts": [["T1", 0]],
        "context": [{"title": "T1", "text": "First sentence. Second sentence."}, {"title": "T3", "text": "More."}],
    }
    write_json(tmp_path / "dev.json", [official])
    write_jsonl(tmp_path / "dev.jsonl", [variant])
    q_official, p_official = load_questions(source("2wikimultihopqa", "dev.json"), tmp_path)
    q_variant, p_variant = load_questions(source("2wikimultihopqa", "dev.jsonl"), tmp_path)
    assert p_official[0].text == "First sentence. Second sentence."
    assert q_official[0].supporting_passage_ids == q_variant[0].supporting_passage_ids == (p_variant[0].id,)
    assert [p.title for p in p_variant] == ["T1", "T3"]


def musique_row(qid: str = "2hop__1_2", answerable: bool = True) -> dict:
    return {
        "id": qid,
        "question": "Where was the author of B born?",
        "answerable": answerable,
        "answer": "Paris",
        "answer_aliases": ["Paris", "City of Light"],
        "paragraphs": [
            {"idx": 0, "title": "Noise", "paragraph_text": "Unrelated.", "is_supporting": False},
            {"idx": 1, "title": "B", "paragraph_text": "B was written by C.", "is_supporting": True},
            {"idx": 2, "title": "C", "paragraph_text": "C was born in Paris.", "is_supporting": True},
        ],
        "question_decomposition": [
            {"id": 1, "question": "who wrote B", "answer": "C", "paragraph_support_idx": 1},
            {"id": 2, "question": "where was #1 born", "answer": "Paris", "paragraph_support_idx": 2},
        ],
    }


def test_musique(tmp_path):
    path = write_json(tmp_path / "musique.json", [musique_row()])
    questions, passages = load_questions(source("musique", path), tmp_path)
    (question,) = questions
    assert question.golden_answers == ("Paris", "City of Light")
    assert len(passages) == 3
    assert question.supporting_passage_ids == (passages[1].id, passages[2].id)
    assert [(s.question, s.answer, s.passage_ids) for s in question.decomposition] == [
        ("who wrote B", "C", (passages[1].id,)),
        ("where was #1 born", "Paris", (passages[2].id,)),
    ]


def test_musique_unanswerable_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "musique.jsonl", [musique_row(), musique_row("2hop__9_9", answerable=False)])
    with pytest.raises(DataError, match=r"musique\.jsonl:2 \(id 2hop__9_9\): 'answerable' is false"):
        load_questions(source("musique", path), tmp_path)


def test_popqa(tmp_path):
    rows = [
        {
            "id": 11,
            "question": "What is X's occupation?",
            "possible_answers": '["actor", "actress", "actor"]',
            "paragraphs": [
                {"title": "X", "text": "X is an actor.", "is_supporting": True},
                {"title": "Y", "text": "Y.", "is_supporting": False},
            ],
        },
        {"question": "Where is Z?", "possible_answers": '["Z town"]'},
    ]
    path = write_json(tmp_path / "popqa.json", rows)
    questions, passages = load_questions(source("popqa", path), tmp_path)
    assert [(q.id, q.golden_answers) for q in questions] == [
        ("bench/11", ("actor", "actress")),
        ("bench/1", ("Z town",)),
    ]
    assert questions[0].supporting_passage_ids == (passages[0].id,) and len(passages) == 2
    assert questions[1].supporting_passage_ids == ()


def test_popqa_tsv(tmp_path):
    (tmp_path / "popQA.tsv").write_text('id\tquestion\tpossible_answers\n5\tWho is A?\t["a", "b"]\n', encoding="utf-8")
    questions, _ = load_questions(source("popqa", "popQA.tsv"), tmp_path)
    assert [(q.id, q.golden_answers) for q in questions] == [("bench/5", ("a", "b"))]


def test_popqa_malformed_possible_answers(tmp_path):
    path = write_json(
        tmp_path / "popqa.json",
        [
            {"id": 1, "question": "q", "possible_answers": '["a"]'},
            {"id": 42, "question": "q", "possible_answers": '["a", '},
        ],
    )
    with pytest.raises(
        DataError, match=r"popqa\.json row 1 \(id 42\): field 'possible_answers' is not a JSON-encoded list"
    ):
        load_questions(source("popqa", path), tmp_path)


# --- Search-R1 parquet and Hugging Face layout ----------------------------------------------------------------

SEARCHR1_PROMPT = "Answer the given question. ... For example, <answer> Beijing </answer>. Question: {}\n"


def write_searchr1_parquet(path: Path, with_flashrag_columns: bool) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {
        "data_source": ["nq", "nq"],
        "prompt": [[{"role": "user", "content": SEARCHR1_PROMPT.format(q)}] for q in ("who wrote x?", "when was y?")],
        "ability": ["fact-reasoning"] * 2,
        "reward_model": [{"style": "rule", "ground_truth": {"target": t}} for t in (["Ann"], ["1990", "in 1990"])],
        "extra_info": [{"split": "test", "index": i} for i in range(2)],
    }
    if with_flashrag_columns:
        columns = {
            "id": ["test_0", "test_1"],
            "question": ["Who wrote X?", "When was Y?"],
            "golden_answers": [["Ann"], ["1990"]],
            **columns,
        }
    pq.write_table(pa.table(columns), path)
    return path


def test_searchr1_parquet_prefers_flashrag_columns(tmp_path):
    path = write_searchr1_parquet(tmp_path / "test.parquet", with_flashrag_columns=True)
    questions, passages = load_questions(source("searchr1_parquet", path, benchmark="nq"), tmp_path)
    assert [(q.id, q.question, q.golden_answers) for q in questions] == [
        ("nq/test_0", "Who wrote X?", ("Ann",)),
        ("nq/test_1", "When was Y?", ("1990",)),
    ]
    assert passages == []


def test_searchr1_parquet_falls_back_to_prompt_and_target(tmp_path):
    path = write_searchr1_parquet(tmp_path / "test.parquet", with_flashrag_columns=False)
    questions, _ = load_questions(source("searchr1_parquet", path, benchmark="nq", limit=1), tmp_path)
    assert [(q.id, q.question, q.golden_answers) for q in questions] == [("nq/0", "who wrote x?", ("Ann",))]


def write_searchr1_merged_parquet(path: Path) -> Path:
    """Search-R1's qa_search_test_merge.py: FlashRAG datasets concatenated, each row's dataset in `data_source`,
    FlashRAG's id/question/golden_answers columns kept (ids restart per dataset) beside the prompt and target."""
    import pandas as pd

    questions = {"nq": ["who wrote x?", "when was y?"], "triviaqa": ["Which composer wrote Z?", "Who painted W?"]}
    rows = [
        {
            "id": f"test_{i}",
            "question": question,
            "golden_answers": [f"{source} {i}"],
            "data_source": source,
            "prompt": [{"role": "user", "content": SEARCHR1_PROMPT.format(question)}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": [f"{source} {i}"]}},
            "extra_info": {"split": "test", "index": i},
        }
        for source, texts in questions.items()
        for i, question in enumerate(texts)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_searchr1_parquet_source_filter_reads_data_source(tmp_path):
    """The filter was ignored: with a limit the NQ rows were loaded as TriviaQA, in silence."""
    path = write_searchr1_merged_parquet(tmp_path / "test.parquet")
    for wanted in ("triviaqa", "TriviaQA"):  # case-insensitive, as qa_jsonl's filter
        loaded, _ = load_questions(
            source("searchr1_parquet", path, benchmark="triviaqa", source_filter=wanted, limit=2), tmp_path
        )
        assert [(q.id, q.question, q.golden_answers) for q in loaded] == [
            ("triviaqa/test_0", "Which composer wrote Z?", ("triviaqa 0",)),
            ("triviaqa/test_1", "Who painted W?", ("triviaqa 1",)),
        ]
    first, _ = load_questions(source("searchr1_parquet", path, benchmark="nq", source_filter="nq", limit=1), tmp_path)
    assert [q.id for q in first] == ["nq/test_0"]
    with pytest.raises(DataError, match=r"no row has data_source 'popqa'; present: nq \(2\), triviaqa \(2\)"):
        load_questions(source("searchr1_parquet", path, source_filter="popqa"), tmp_path)


@pytest.mark.parametrize("limit", [None, 2])
def test_searchr1_parquet_of_several_data_sources_needs_a_filter(tmp_path, limit):
    """Without a filter the rows of every dataset were filed under one benchmark: with a limit in silence,
    without one refused for an id used twice (test_0 of nq and of triviaqa), naming no way out."""
    path = write_searchr1_merged_parquet(tmp_path / "test.parquet")
    with pytest.raises(
        DataError,
        match=r"test\.parquet: rows of several data_sources \(nq \(2\), triviaqa \(2\)\): read each as its own "
        r"data\.questions entry, with source_filter",
    ):
        load_questions(source("searchr1_parquet", path, benchmark="triviaqa", limit=limit), tmp_path)


def flashrag_hub_folder(folder: Path) -> Path:
    """A local folder laid out like RUC-NLPIR/FlashRAG_datasets: README.md `configs:` header +
    <config>/<split>.jsonl."""
    (folder / "nq").mkdir(parents=True)
    (folder / "hotpotqa").mkdir()
    (folder / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: nq\n  data_files:\n"
        "  - split: train\n    path: nq/train.jsonl\n  - split: test\n    path: nq/test.jsonl\n"
        "- config_name: hotpotqa\n  data_files:\n  - split: dev\n    path: hotpotqa/dev.jsonl\n"
        "---\n# FlashRAG datasets (local copy)\n",
        encoding="utf-8",
    )

    def rows(split, n):
        return [
            {
                "id": f"{split}_{i}",
                "question": f"{split} q{i}?",
                "golden_answers": [f"a{i}", f"b{i}"],
                "metadata": {"n": i},
            }
            for i in range(n)
        ]

    write_jsonl(folder / "nq" / "test.jsonl", rows("test", 3))
    write_jsonl(folder / "nq" / "train.jsonl", rows("train", 5))
    write_jsonl(folder / "hotpotqa" / "dev.jsonl", rows("dev", 2))
    return folder


@pytest.fixture
def hub_folder(tmp_path, monkeypatch) -> Path:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")  # keep the user's cache clean
    return flashrag_hub_folder(tmp_path / "FlashRAG_datasets")


def test_hf_dataset_from_local_hub_layout(hub_folder, tmp_path):
    nq = source("hf_dataset", benchmark="nq", dataset_id=str(hub_folder), dataset_config="nq", dataset_split="test")
    questions, passages = load_questions(nq, tmp_path)
    assert [(q.id, q.question, q.golden_answers) for q in questions] == [
        ("nq/test_0", "test q0?", ("a0", "b0")),
        ("nq/test_1", "test q1?", ("a1", "b1")),
        ("nq/test_2", "test q2?", ("a2", "b2")),
    ]
    assert passages == []
    hotpot = source(
        "hf_dataset",
        benchmark="hotpotqa",
        dataset_id="FlashRAG_datasets",
        dataset_config="hotpotqa",
        dataset_split="dev",
        limit=1,
    )  # relative to root
    assert [q.id for q in load_questions(hotpot, tmp_path)[0]] == ["hotpotqa/dev_0"]


def test_a_hub_dataset_offline_is_read_from_its_hf_cache_snapshot(hub_folder, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 with the dataset in the hub cache, as `hf download --repo-type dataset` leaves it: `datasets`
    alone looks only in its own Arrow cache and fails; the loader reads the snapshot, and without one says how to
    get it."""
    import datasets
    from huggingface_hub import constants

    from conftest import hub_cache_repo

    hub_cache_repo(tmp_path / "hub", "RUC-NLPIR/FlashRAG_datasets", "dataset", hub_folder)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    nq = source(
        "hf_dataset",
        benchmark="nq",
        dataset_id="RUC-NLPIR/FlashRAG_datasets",
        dataset_config="nq",
        dataset_split="test",
    )
    assert [q.id for q in load_questions(nq, tmp_path / "no_copy")[0]] == ["nq/test_0", "nq/test_1", "nq/test_2"]
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(
        DataError, match=re.escape("HF cache holds no copy of it: `hf download --repo-type dataset RUC")
    ):
        load_questions(nq, tmp_path / "no_copy")


def test_a_partial_hf_cache_snapshot_names_the_files_it_lacks(hub_folder, tmp_path, monkeypatch):
    """An online load of nq leaves the README and nq's files in the HF cache, not hotpotqa's: offline, hotpotqa's
    load failed with datasets' "Unable to find .../hotpotqa/dev.jsonl" and no way to fetch it; now the error names
    the missing file and the `hf download --include` that fetches it."""
    import datasets
    from huggingface_hub import constants

    from conftest import hub_cache_repo

    shutil.rmtree(hub_folder / "hotpotqa")
    snapshot = hub_cache_repo(tmp_path / "hub", "RUC-NLPIR/FlashRAG_datasets", "dataset", hub_folder)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    hub = dict(dataset_id="RUC-NLPIR/FlashRAG_datasets")
    nq = source("hf_dataset", benchmark="nq", dataset_config="nq", dataset_split="test", **hub)
    assert len(load_questions(nq, tmp_path / "no_copy")[0]) == 3
    hotpot = source("hf_dataset", benchmark="hotpotqa", dataset_config="hotpotqa", dataset_split="dev", **hub)
    with pytest.raises(DataError) as error:
        load_questions(hotpot, tmp_path / "no_copy")
    assert (
        f"; offline, its snapshot in the HF cache ({snapshot}) lacks hotpotqa/dev.jsonl: `hf download --repo-type "
        "dataset RUC-NLPIR/FlashRAG_datasets --include hotpotqa/dev.jsonl` where the hub is reachable"
    ) in str(error.value)


def test_a_hub_dataset_revision_picks_the_snapshot_offline_and_the_download_online(hub_folder, tmp_path, monkeypatch):
    """dataset_revision pins the hub repository: offline, the HF cache's snapshot of that tag or commit (here with
    one test row more than main's); online, `load_dataset(..., revision=)`. A local copy is read as it is."""
    import datasets
    from huggingface_hub import constants

    from conftest import hub_cache_repo

    hub_cache_repo(tmp_path / "hub", "RUC-NLPIR/FlashRAG_datasets", "dataset", hub_folder)
    with (hub_folder / "nq" / "test.jsonl").open("a", encoding="utf-8") as rows:
        rows.write(json.dumps({"id": "test_3", "question": "q3?", "golden_answers": ["a3"]}) + "\n")
    tagged = "d1" * 20
    hub_cache_repo(tmp_path / "hub", "RUC-NLPIR/FlashRAG_datasets", "dataset", hub_folder, commit=tagged, ref="v1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)

    def ids(revision: str | None, root: Path = tmp_path / "no_copy") -> list[str]:
        fields = dict(dataset_config="nq", dataset_split="test", dataset_revision=revision, benchmark="nq")
        return [
            q.id
            for q in load_questions(source("hf_dataset", dataset_id="RUC-NLPIR/FlashRAG_datasets", **fields), root)[0]
        ]

    assert len(ids(None)) == 3 and len(ids("v1")) == len(ids(tagged)) == 4
    with pytest.raises(
        DataError, match=re.escape("`hf download --repo-type dataset RUC-NLPIR/FlashRAG_datasets --revision v2`")
    ):
        ids("v2")
    calls = []

    def load_dataset(*args, **kwargs) -> list[dict]:  # the hub, faked: it is the outside boundary
        calls.append((args, kwargs))
        return [{"id": "test_0", "question": "q0?", "golden_answers": ["a0"]}]

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    ids("v2")  # online: the hub is asked for the pinned revision
    (copy := tmp_path / "root" / "RUC-NLPIR").mkdir(parents=True)
    shutil.copytree(hub_folder, copy / "FlashRAG_datasets")
    ids("v2", tmp_path / "root")  # a local copy: no revision to ask for
    assert [(args[0], kwargs["revision"]) for args, kwargs in calls] == [
        ("RUC-NLPIR/FlashRAG_datasets", "v2"),
        (str(copy / "FlashRAG_datasets"), None),
    ]


def test_a_hub_dataset_of_other_rows_than_flashrags_is_refused_naming_the_field(tmp_path, monkeypatch):
    """hf_dataset reads FlashRAG rows only (README): a HotpotQA-shaped set is refused, not half read."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")  # keep the user's cache clean
    (tmp_path / "hotpot").mkdir()
    (tmp_path / "hotpot" / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: dev\n    path: dev.jsonl\n---\n"
    )
    write_jsonl(tmp_path / "hotpot" / "dev.jsonl", [{"id": "h1", "question": "q?", "answer": "a"}])
    hub = source("hf_dataset", dataset_id=str(tmp_path / "hotpot"), dataset_split="dev")
    with pytest.raises(
        DataError, match=re.escape("hotpot[default/dev] row 0 (id h1): missing field 'golden_answers'")
    ):
        load_questions(hub, tmp_path)


def test_hf_dataset_rows_convert_like_flashrag_jsonl(hub_folder, tmp_path):
    hub = source("hf_dataset", dataset_id=str(hub_folder), dataset_config="nq", dataset_split="train", split="train")
    from_hub, _ = load_questions(hub, tmp_path)
    from_file, _ = load_questions(source("flashrag_jsonl", hub_folder / "nq" / "train.jsonl", split="train"), tmp_path)
    assert len(from_hub) == 5
    assert from_hub == from_file


# --- errors, limit, dispatch ------------------------------------------------------------------------------


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": ["a"]}\n{"question": "q2", "answer": [\n', encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{path}:2: malformed JSON")):
        load_questions(source("nq_open", path), tmp_path)


def test_a_jsonl_file_is_read_line_by_line_whatever_its_first_line_holds(tmp_path):
    """A .jsonl whose first line was a JSON array was read as one JSON list: its rows, and no error."""
    path = tmp_path / "rows.jsonl"
    path.write_text('[{"question": "q", "answer": ["a"]}]\n', encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{path}:1: expected a JSON object, got list")):
        load_questions(source("nq_open", path), tmp_path)


def test_malformed_json_file_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n{"_id": "x",\n', encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{path}:3: malformed JSON")):
        load_questions(source("hotpotqa", path), tmp_path)


@pytest.mark.parametrize(
    ("kind", "row", "field", "where"),
    [
        ("flashrag_jsonl", {"id": "test_3", "golden_answers": ["a"]}, "question", "(id test_3)"),
        ("flashrag_jsonl", {"id": "test_3", "question": "q"}, "golden_answers", "(id test_3)"),
        ("hotpotqa", {"_id": "h9", "question": "q", "answer": "a", "supporting_facts": []}, "context", "(id h9)"),
        (
            "musique",
            {"id": "m9", "question": "q", "answer": "a", "paragraphs": [{"idx": 0, "title": "T"}]},
            "paragraph_text",
            "(id m9) paragraphs[0]",
        ),
        ("popqa", {"id": 9, "question": "q"}, "possible_answers", "(id 9)"),
        ("nq_open", {"answer": ["a"]}, "question", ":2 (id 1)"),
    ],
)
def test_missing_field_names_field_file_and_row(tmp_path, kind, row, field, where):
    good = {
        "flashrag_jsonl": {"id": "ok", "question": "q", "golden_answers": ["a"]},
        "nq_open": {"question": "q", "answer": ["a"]},
    }  # a good first row, so the bad one is on line 2
    path = write_jsonl(tmp_path / "rows.jsonl", [good[kind], row] if kind in good else [row])
    with pytest.raises(DataError, match=re.escape(f"{path}") + r".*" + re.escape(f"{where}: missing field '{field}'")):
        load_questions(source(kind, path), tmp_path)


def test_row_without_usable_answer_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"id": "q1", "question": "q", "answers": ["", "  "]}])
    with pytest.raises(DataError, match=r"qa\.jsonl:1 \(id q1\): no usable answer in field 'answers'"):
        load_questions(source("qa_jsonl", path), tmp_path)


def test_duplicate_ids_are_an_error(tmp_path):
    rows = [{"id": "a", "question": "q", "answer": "x"}, {"id": "a", "question": "r", "answer": "y"}]
    path = write_jsonl(tmp_path / "qa.jsonl", rows)
    with pytest.raises(DataError, match=r"qa\.jsonl:2: question id 'bench/a' already used by .*qa\.jsonl:1"):
        load_questions(source("qa_jsonl", path), tmp_path)


def test_limit_keeps_the_first_rows_in_file_order(tmp_path):
    write_jsonl(tmp_path / "qa.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(10)])
    write_json(tmp_path / "hotpot.json", [hotpot_row(f"h{i}") for i in range(5)])
    questions, _ = load_questions(source("qa_jsonl", "qa.jsonl", limit=3), tmp_path)
    assert [q.question for q in questions] == ["q0", "q1", "q2"]
    hotpot, _ = load_questions(source("hotpotqa", "hotpot.json", limit=2), tmp_path)
    assert [q.id for q in hotpot] == ["bench/h0", "bench/h1"]


def test_limit_is_applied_before_conversion(tmp_path):
    path = tmp_path / "nq.jsonl"
    path.write_text('{"question": "q0", "answer": ["a"]}\nnot json at all\n', encoding="utf-8")
    questions, _ = load_questions(source("nq_open", path, limit=1), tmp_path)
    assert len(questions) == 1  # the malformed second line is never read
    with pytest.raises(DataError, match=r"nq\.jsonl:2"):  # qa_jsonl reads every row's source first
        load_questions(source("qa_jsonl", path, limit=1), tmp_path)


def test_absolute_path_ignores_root(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}])
    questions, _ = load_questions(source("qa_jsonl", path), Path("/nonexistent"))
    assert len(questions) == 1
    with pytest.raises(DataError, match="no such file"):
        load_questions(source("qa_jsonl", "qa.jsonl"), Path("/nonexistent"))


def test_synthetic_is_not_a_file_kind(tmp_path):
    with pytest.raises(ValueError, match="synthetic"):
        load_questions(QuestionSource(kind="synthetic"), tmp_path)


def test_empty_source_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match="no questions"):
        load_questions(source("qa_jsonl", "empty.jsonl"), tmp_path)


# --- corpus kinds -------------------------------------------------------------------------------------------


def test_flashrag_passages(tmp_path):
    write_jsonl(
        tmp_path / "wiki.jsonl",
        [
            {"id": "0", "contents": '"Evan Morris"\nEvan Morris Evan L. Morris was a lobbyist.'},
            {"id": "1", "contents": '""Weird Al" Yankovic"\nAlfred Yankovic is a singer.\nSecond line.'},
        ],
    )
    passages = corpus("flashrag_passages", "wiki.jsonl", tmp_path)
    assert [(p.title, p.text) for p in passages] == [
        ("Evan Morris", "Evan Morris Evan L. Morris was a lobbyist."),
        ('"Weird Al" Yankovic', "Alfred Yankovic is a singer.\nSecond line."),
    ]


def test_title_sentences_and_title_text_list_agree(tmp_path):
    write_json(tmp_path / "sentences.json", {"Alpha": ["Alpha is a thing.", " It is old."], "Beta": ["Beta."]})
    write_json(
        tmp_path / "list.json",
        [{"title": "Alpha", "text": "Alpha is a thing. It is old."}, {"title": "Gamma", "text": "G."}],
    )
    sentences = corpus("title_sentences", "sentences.json", tmp_path)
    listed = corpus("title_text_list", "list.json", tmp_path)
    assert [p.title for p in sentences] == ["Alpha", "Beta"] and [p.title for p in listed] == ["Alpha", "Gamma"]
    assert sentences[0] == listed[0]


def test_kilt_pages(tmp_path):
    body = " ".join(["word"] * 60)
    write_jsonl(
        tmp_path / "kilt.jsonl",
        [
            {
                "wikipedia_title": "Page",
                "text": [
                    "Page\n",
                    f"{body}.\n",
                    f"{body} again.\n",
                    "Section::::History.\n",
                    "BULLET::::- first item\n",
                    "Short end.\n",
                    "Section::::External links.\n",
                    "BULLET::::- example.org\n",
                ],
            }
        ],
    )
    passages = corpus("kilt_pages", "kilt.jsonl", tmp_path)
    assert [p.text for p in passages] == [f"{body}.", f"{body} again.", "first item Short end."]
    assert all(p.title == "Page" for p in passages)


def test_kilt_pages_keep_a_leading_minus_of_plain_text(tmp_path):
    """The '-' of `BULLET::::- ` was stripped from every paragraph: '-273.15 °C' became '273.15 °C'."""
    write_jsonl(
        tmp_path / "kilt.jsonl",
        [
            {
                "wikipedia_title": "Absolute zero",
                "text": [
                    "Absolute zero\n",
                    "-273.15 °C is the lowest limit of the thermodynamic temperature scale.\n",
                    "Section::::Records.\n",
                    "BULLET::::- -0.5 K was never reached\n",
                    "BULLET::::2. second item\n",
                ],
            }
        ],
    )
    passages = corpus("kilt_pages", "kilt.jsonl", tmp_path)
    assert [p.text for p in passages] == [
        "-273.15 °C is the lowest limit of the thermodynamic temperature scale.",
        "-0.5 K was never reached 2. second item",
    ]


def test_corpus_limit_and_duplicates(tmp_path):
    write_jsonl(tmp_path / "list.jsonl", [{"title": t, "text": f"{t.lower()}."} for t in ["A", "A", "B", "C"]])
    everything = corpus("title_text_list", "list.jsonl", tmp_path)
    limited = corpus("title_text_list", "list.jsonl", tmp_path, limit=2)
    assert [p.title for p in everything] == ["A", "B", "C"]
    assert [p.title for p in limited] == ["A", "B"]


def test_corpus_missing_field_names_file_and_line(tmp_path):
    path = write_jsonl(
        tmp_path / "wiki.jsonl", [{"id": "0", "contents": '"T"\nx'}, {"id": "1", "text": "no contents"}]
    )
    with pytest.raises(DataError, match=re.escape(f"{path}:2: missing field 'contents'")):
        corpus("flashrag_passages", path, tmp_path)


def test_an_unusable_corpus_passage_is_named_by_its_row_in_every_corpus_kind(tmp_path):
    (tmp_path / "list.json").write_text(json.dumps([{"title": "A", "text": "a."}, {"title": "B", "text": " "}]))
    (tmp_path / "sentences.json").write_text(json.dumps({"A": ["a."], "Long": ["w" * 30]}))
    with pytest.raises(DataError, match=r"list\.json: 1 row\(s\) refused: row 1 \('B'\) has no text"):
        corpus("title_text_list", "list.json", tmp_path)
    with pytest.raises(DataError, match=r"refused: entry 'Long' \('Long'\) has 30 characters, above data\.max_pas"):
        load_corpus(CorpusSource(kind="title_sentences", path="sentences.json"), tmp_path, max_chars=20)


# --- malformed rows found by probing (each was a traceback or was taken silently) ----------------------------


def test_a_tsv_row_that_is_not_utf8_or_has_more_cells_than_columns_is_named(tmp_path):
    header = "id\tquestion\tpossible_answers\n"
    latin = tmp_path / "latin.tsv"
    latin.write_bytes((header + '1\tWho?\t["A"]\n').encode() + b'2\tCaf\xe9?\t["B"]\n')
    with pytest.raises(DataError, match=r"latin\.tsv:3: not UTF-8 \(byte 0xe9"):
        load_questions(source("popqa", latin), tmp_path)
    wide = tmp_path / "wide.tsv"
    wide.write_text(header + '1\tWho?\t["A"]\textra\tmore\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"wide\.tsv:2: 2 more cell\(s\) than the header's 3 columns"):
        load_questions(source("popqa", wide), tmp_path)


@pytest.mark.parametrize("bad_id", [True, {"a": 1}, [1, 2], 1.5])
def test_an_id_that_is_not_a_string_or_a_whole_number_is_refused(tmp_path, bad_id):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"id": bad_id, "question": "q", "answer": "a"}])
    with pytest.raises(DataError, match=r"qa\.jsonl:1: an id must be a string or a whole number, got "):
        load_questions(source("qa_jsonl", path), tmp_path)


def test_a_nan_answer_is_refused(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text('{"id": "1", "question": "q", "golden_answers": [NaN]}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"f\.jsonl:1 \(id 1\): field 'golden_answers' holds nan, which is not an"):
        load_questions(source("flashrag_jsonl", path), tmp_path)


def test_a_musique_paragraph_idx_that_is_not_a_number_is_named(tmp_path):
    row = {
        "id": "m1",
        "question": "q",
        "answer": "a",
        "paragraphs": [{"idx": [1], "title": "T", "paragraph_text": "x"}],
    }
    path = write_jsonl(tmp_path / "mu.jsonl", [row])
    with pytest.raises(DataError, match=r"mu\.jsonl:1 \(id m1\) paragraphs\[0\]: field 'idx' should be int, got list"):
        load_questions(source("musique", path), tmp_path)


def test_a_folder_given_as_a_file_is_said_to_be_one(tmp_path):
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}: a folder, not a file")):
        load_questions(source("qa_jsonl", tmp_path), tmp_path)


@pytest.mark.parametrize(
    "config, split, named",
    [("nosuch", "test", "BuilderConfig 'nosuch' not found"), ("nq", "validation", 'Unknown split "validation"')],
)
def test_a_hub_dataset_config_or_split_that_is_not_there_is_named(hub_folder, tmp_path, config, split, named):
    hub = source("hf_dataset", dataset_id=str(hub_folder), dataset_config=config, dataset_split=split)
    with pytest.raises(
        DataError, match=rf"\[{config}/{split}\]: the dataset could not be loaded \({re.escape(named)}"
    ):
        load_questions(hub, tmp_path)
