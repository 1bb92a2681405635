"""Assembling the dataset: an evaluation question that is also a training question is refused, or with
`data.train_overlap: drop` its training copy is dropped and counted."""

from __future__ import annotations

import pytest

from centralrl.config import DataConfig, QuestionSource
from centralrl.data.prepare import collect, counts
from centralrl.errors import ConfigError, DataError
from centralrl.io import write_jsonl


def _sources(tmp_path) -> list[QuestionSource]:
    write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"id": "t1", "question": "Who wrote Hamlet?", "answer": "Shakespeare"},
            {"id": "t2", "question": "Capital of France?", "answer": "Paris"},
            {"id": "t3", "question": "Who painted the Mona Lisa?", "answer": "Leonardo"},
        ],
    )
    write_jsonl(
        tmp_path / "test.jsonl",
        [
            {"id": "e1", "question": "who wrote  hamlet", "answer": "Shakespeare"},
            {"id": "e2", "question": "Tallest mountain?", "answer": "Everest"},
        ],
    )
    return [
        QuestionSource(kind="qa_jsonl", path="train.jsonl", benchmark="nq", split="train"),
        QuestionSource(kind="qa_jsonl", path="test.jsonl", benchmark="nq", split="test"),
    ]


def test_a_training_copy_of_an_evaluation_question_is_refused_by_default(tmp_path):
    with pytest.raises(
        DataError,
        match=r"1 evaluation question\(s\) also appear in training: 'nq/e1 = train nq/t1'.*"
        r"data.train_overlap: drop",
    ):
        collect(DataConfig(root=str(tmp_path), questions=_sources(tmp_path)), tmp_path)


def test_an_evaluation_question_repeated_with_its_answers_is_refused_or_dropped_and_one_with_other_answers_kept(
    tmp_path,
):
    """Under another id, the same question and answers would count twice in every score (refused, or with
    `data.repeated_questions: drop` the later copy dropped and counted); the same text with other answers is
    another question (PopQA's two Will Smiths)."""
    rows = [
        {"id": "e1", "question": "What is Will Smith's occupation?", "answer": ["actor", "rapper"]},
        {"id": "e2", "question": "what is will smiths occupation", "answer": ["footballer"]},
    ]
    write_jsonl(tmp_path / "test.jsonl", rows)
    source = QuestionSource(kind="qa_jsonl", path="test.jsonl", benchmark="popqa", split="test")
    assert len(collect(DataConfig(root=str(tmp_path), questions=[source]), tmp_path).questions) == 2
    write_jsonl(tmp_path / "test.jsonl", [*rows, {**rows[0], "id": "e3", "answer": ["Rapper", "actor"]}])
    with pytest.raises(DataError, match=r"1 evaluation question\(s\) repeat .*: 'popqa/e3 = popqa/e1'; each would"):
        collect(DataConfig(root=str(tmp_path), questions=[source]), tmp_path)
    dropped = collect(DataConfig(root=str(tmp_path), questions=[source], repeated_questions="drop"), tmp_path)
    assert [q.id for q in dropped.questions] == ["popqa/e1", "popqa/e2"]
    assert counts(dropped)["evaluation_dropped_as_repeats"] == 1


def test_drop_removes_the_training_copy_and_counts_it(tmp_path):
    dataset = collect(DataConfig(root=str(tmp_path), questions=_sources(tmp_path), train_overlap="drop"), tmp_path)
    assert [q.id for q in dataset.split("train")] == ["nq/t2", "nq/t3"]
    assert [q.id for q in dataset.split("test")] == ["nq/e1", "nq/e2"]
    assert counts(dataset)["train_dropped_as_overlap"] == 1


def test_a_relative_root_starts_from_the_params_folder_as_the_preflight_says(tmp_path, monkeypatch):
    """The preflight read a relative data.root from the params file's folder and prepare_data from the current
    one: a check passed and the stage failed, or read other files."""
    (tmp_path / "d").mkdir()
    sources = _sources(tmp_path / "d")
    monkeypatch.chdir(tmp_path / "d")  # the current folder holds no d/
    dataset = collect(DataConfig(root="d", questions=sources, train_overlap="drop"), tmp_path)
    assert len(dataset.questions) == 4
    with pytest.raises(ConfigError, match=f"data.root: folder {tmp_path / 'gone'} does not exist"):
        collect(DataConfig(root="gone", questions=sources), tmp_path)


def test_a_root_beside_the_repository_is_found_from_an_experiments_temporary_copy(tmp_path, monkeypatch):
    """`dvc exp run --temp` and `--queue` run prepare_data in a copy at <repo>/.dvc/tmp/exps/[standalone/]tmpXXXX
    with `$DVC_ROOT` naming the repository: realqa's `../shared/data/realqa` was read from .dvc/tmp/exps/shared,
    which does not exist. A root inside the repository is still the copy's own (the files the run was given)."""
    repo = tmp_path / "repo"
    _sources(tmp_path / "shared" / "d")
    for copy in (repo / ".dvc/tmp/exps/tmpabc", repo / ".dvc/tmp/exps/standalone/tmpdef"):
        (copy / ".dvc").mkdir(parents=True)
        monkeypatch.chdir(copy)
        monkeypatch.setenv("DVC_ROOT", str(repo))
        beside = DataConfig(root="../shared/d", questions=_sources(tmp_path / "unused"), train_overlap="drop")
        assert beside.root_path(copy) == tmp_path / "shared" / "d"
        assert len(collect(beside, copy).questions) == 4
        inside = DataConfig(root="own", questions=_sources(copy / "own"))
        assert inside.root_path(copy) == copy / "own"
    monkeypatch.delenv("DVC_ROOT")  # a stage run by hand from the copy: the folder it is in, as before
    assert beside.root_path(copy) == repo / ".dvc/tmp/exps/standalone/shared/d"


def test_a_source_file_that_is_also_an_output_is_refused_naming_its_param(tmp_path, monkeypatch):
    """A qa_jsonl training file given as --train was replaced by its own converted rows."""
    from conftest import write_params
    from stages.prepare_data import main

    sources = [source.model_dump(exclude_none=True) for source in _sources(tmp_path)]
    params = write_params(tmp_path, {"data": {"questions": sources, "train_overlap": "drop"}})
    monkeypatch.chdir(tmp_path)
    before = (tmp_path / "train.jsonl").read_text()
    outputs = ["--test", "out/test.jsonl", "--corpus", "out/corpus.jsonl", "--metrics", "out/data.json"]
    with pytest.raises(ConfigError, match=r"--train train.jsonl overlaps the input data.questions.0.path .*train"):
        main(["--params", str(params), "--train", "train.jsonl", *outputs])
    assert (tmp_path / "train.jsonl").read_text() == before and not (tmp_path / "out").exists()


def test_two_sources_that_give_one_id_are_named_with_the_fix(tmp_path):
    """Two sources of one benchmark number their rows alike: the error named the ids but not the sources."""
    write_jsonl(tmp_path / "more.jsonl", [{"question": "Who built the Eiffel Tower?", "answer": "Eiffel"}])
    write_jsonl(tmp_path / "other.jsonl", [{"question": "Longest river?", "answer": "Nile"}])
    more = [
        QuestionSource(kind="qa_jsonl", path=name, benchmark="x", split="train")
        for name in ("more.jsonl", "other.jsonl")
    ]
    with pytest.raises(
        DataError,
        match=r"data.questions.2 and data.questions.3 give the same question ids: 'x/0'; an id is <benchmark>/<the "
        r"row's id, or its row number>, so give each source its own benchmark",
    ):
        collect(DataConfig(root=str(tmp_path), questions=_sources(tmp_path) + more), tmp_path)


def test_fewer_training_questions_than_a_run_needs_are_refused_before_any_output(tmp_path, monkeypatch):
    """The config counts a source's limit as its questions; a shorter file passed, and training failed later."""
    from conftest import write_params
    from stages.prepare_data import main

    sources = [source.model_dump(exclude_none=True) for source in _sources(tmp_path)]
    sources[0]["limit"] = 100  # the file holds 3, the smoke profile needs 3 dev + 2 per step
    params = write_params(tmp_path, {"data": {"questions": sources, "train_overlap": "drop"}})
    monkeypatch.chdir(tmp_path)
    outputs = ["--train", "o/t.jsonl", "--test", "o/e.jsonl", "--corpus", "o/c.jsonl", "--metrics", "o/d.json"]
    with pytest.raises(DataError, match=r"only 2 training questions loaded, but .*\(2\).*\(3\) come to 5"):
        main(["--params", str(params), *outputs])
    assert not (tmp_path / "o").exists()


def test_a_pool_larger_than_what_the_dev_split_leaves_is_refused_before_any_output(tmp_path, monkeypatch):
    """The config counts the dev split's questions, not the training questions sharing a hop with them (the
    smoke world: 36, 3 dev, 2 sharing a hop): a pool of 32 passed it and failed at the train stage."""
    from conftest import write_params
    from stages.prepare_data import main

    params = write_params(tmp_path, {"train": {"grpo": {"pool": 32}}})
    monkeypatch.chdir(tmp_path)
    outputs = ["--train", "o/t.jsonl", "--test", "o/e.jsonl", "--corpus", "o/c.jsonl", "--metrics", "o/d.json"]
    with pytest.raises(
        DataError,
        match=r"36 training questions leave 31 to train on after the dev split \(train\.dev"
        r"\.questions 3\) and the 2 sharing a hop with it, but .* is 32",
    ):
        main(["--params", str(params), *outputs])
    assert not (tmp_path / "o").exists()
    write_params(tmp_path, {"train": {"grpo": {"pool": 31}}})
    main(["--params", str(params), *outputs])
    assert (tmp_path / "o" / "t.jsonl").is_file()
