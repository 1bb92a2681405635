"""Bounded inputs: prepare_data refuses an over-long question or passage, a passage without text and a golden
answer that is blank or normalizes to nothing, naming the row and its file; the harness cuts every
prompt to the model's context, so a huge question still runs on a tiny Qwen2 with few positions."""

from __future__ import annotations

import json
import shutil

import pytest

from centralrl.config import CorpusSource, DataConfig, QuestionSource
from centralrl.data.prepare import collect, counts
from centralrl.errors import DataError
from centralrl.harness.engine import RolePolicy
from centralrl.harness.episodes import run_central, run_single_agent
from centralrl.io import write_jsonl
from centralrl.models.backbone import load_backbone
from centralrl.schema import Question
from test_harness import FROZEN, TOKENS, settings


def _collect(tmp_path, questions: list[dict], passages: list[dict] | None = None, **limits):
    write_jsonl(tmp_path / "qa.jsonl", questions)
    corpus = []
    if passages is not None:
        write_jsonl(tmp_path / "corpus.jsonl", passages)
        corpus = [CorpusSource(kind="flashrag_passages", path="corpus.jsonl")]
    source = QuestionSource(kind="qa_jsonl", path="qa.jsonl", benchmark="nq", split="test")
    return collect(DataConfig(root=str(tmp_path), questions=[source], corpus=corpus, **limits), tmp_path)


def test_an_over_long_question_is_refused_naming_its_id_benchmark_and_file(tmp_path):
    rows = [
        {"id": "ok", "question": "Who wrote Hamlet?", "answer": "Shakespeare"},
        {"id": "huge", "question": "w" * 120, "answer": "because"},
    ]
    with pytest.raises(
        DataError,
        match=r"qa\.jsonl: 1 row\(s\) refused: question nq/huge \(nq\) has 120 characters, "
        r"above data\.max_question_chars 100",
    ):
        _collect(tmp_path, rows, max_question_chars=100)


def test_an_over_long_passage_is_refused_naming_its_line_and_file(tmp_path):
    rows = [{"id": "q", "question": "Who wrote Hamlet?", "answer": "Shakespeare"}]
    passages = [{"id": "7", "contents": '"Hamlet"\n' + "p" * 160}]
    with pytest.raises(
        DataError,
        match=r"corpus\.jsonl: 1 row\(s\) refused: line 1 \('Hamlet'\) has 160 "
        r"characters, above data\.max_passage_chars 50",
    ):
        _collect(tmp_path, rows, passages, max_passage_chars=50)


def test_a_golden_answer_that_normalizes_to_nothing_is_refused(tmp_path):
    rows = [{"id": "blood", "question": "Most common blood type in Sweden?", "answer": ["A+", "AB+"]}]
    with pytest.raises(
        DataError,
        match=r"question nq/blood \(nq\): golden answer 'A\+' normalizes to the empty "
        r"string, so every prediction would match it",
    ):
        _collect(tmp_path, rows)


def test_a_blank_golden_answer_beside_good_ones_is_refused_not_dropped_silently(tmp_path):
    rows = [{"id": "poet", "question": "Who wrote Hamlet?", "answer": ["Shakespeare", "  "]}]
    with pytest.raises(DataError, match=r"qa\.jsonl:1 \(id poet\): field 'answer' holds a blank answer beside usable"):
        _collect(tmp_path, rows)


def test_a_passage_without_text_is_refused_naming_its_line_title_and_file(tmp_path):
    rows = [{"id": "q", "question": "Who wrote Hamlet?", "answer": "Shakespeare"}]
    passages = [{"id": "1", "contents": '"Hamlet"\nA play.'}, {"id": "2", "contents": '"Blank"\n  '}]
    with pytest.raises(DataError, match=r"corpus\.jsonl: 1 row\(s\) refused: line 2 \('Blank'\) has no text"):
        _collect(tmp_path, rows, passages)


def test_with_empty_answers_drop_such_answers_go_and_are_counted(tmp_path):
    rows = [
        {"id": "blood", "question": "Most common blood type in Sweden?", "answer": ["A+", "AB+"]},
        {"id": "dash", "question": "What is the symbol?", "answer": ["---"]},
        {"id": "ok", "question": "Who wrote Hamlet?", "answer": "Shakespeare"},
    ]
    dataset = _collect(tmp_path, rows, empty_answers="drop")
    assert {q.id: q.golden_answers for q in dataset.questions} == {"nq/blood": ("AB+",), "nq/ok": ("Shakespeare",)}
    assert counts(dataset)["golden_answers_dropped_as_empty"] == 2


def test_the_default_limits_admit_the_realqa_samples(realqa_dir):
    from centralrl.config import load_config
    from conftest import REPO

    cfg = load_config(REPO / "params.yaml", {"profile": "realqa", "data": {"root": str(realqa_dir)}})
    assert collect(cfg.data, REPO).split("test")


@pytest.fixture(scope="module")
def short_context(tiny_backbone, tmp_path_factory):
    """The tiny Qwen2 saved with only 256 positions."""
    folder = tmp_path_factory.mktemp("short") / "backbone"
    shutil.copytree(tiny_backbone, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 256}))
    return load_backbone(folder)


@pytest.mark.parametrize("run", [run_central, run_single_agent])
def test_a_huge_question_runs_with_every_prompt_cut_to_the_context(short_context, smoke_world, run):
    model, tokenizer = short_context
    assert model.config.max_position_embeddings == 256
    huge = Question("huge", "Which city? " + "Very long preamble. " * 2000, ("Oslo",), "synth", "test")
    policy = RolePolicy(model, tokenizer, FROZEN, batch_size=4)
    episodes = run([huge], policy, smoke_world[2], settings(max_turns=2))
    first, *_ = calls = episodes[0].calls
    assert len(first.prompt_ids) == 256 - getattr(TOKENS, first.role)  # cut to what leaves room for the reply
    assert all(len(call.prompt_ids) + len(call.completion_ids) <= 256 for call in calls)
    assert tokenizer.decode(first.prompt_ids).endswith("<think>")  # the end of the chat and the prefill survive
