"""Data-parallel training on CPU processes (gloo), started by `accelerate launch` as on a GPU machine: two
processes make the same update as one, and the train stage relaunches itself and trains with both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from centralrl.distributed import World, launch_command
from centralrl.errors import ConfigError

from conftest import REPO, TOY, project_pythonpath, session_prefect_env, write_params


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_shards_cover_every_item_once_in_order(size):
    items = list(range(7))
    shards = [World(rank, size).shard(items) for rank in range(size)]
    assert sum(shards, []) == items
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_params_must_say_how_many_processes_the_run_was_launched_with(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="train.processes is 1 but this run was launched with 4"):
        World.join("cpu", 1)


def test_more_processes_than_questions_per_step_is_refused(tmp_path):
    from centralrl.config import load_config

    params = write_params(tmp_path, {"train": {"processes": 3, "grpo": {"questions_per_step": 2}}})
    with pytest.raises(ConfigError, match=r"processes \(3\) may not exceed grpo.questions_per_step \(2\)"):
        load_config(params)


def test_several_processes_with_the_vllm_engine_is_refused_not_left_to_collide_on_one_gpu(tmp_path):
    from centralrl.config import load_config

    params = write_params(tmp_path, {"harness": {"engine": "vllm"}, "train": {"processes": 2}})
    with pytest.raises(ConfigError, match="every process's vLLM engine would claim the first GPU"):
        load_config(params)


def test_the_preflight_wants_a_gpu_per_process_on_cuda(tmp_path):
    from centralrl.config import load_config
    from centralrl.plan import preflight

    cfg = load_config(write_params(tmp_path, {"harness": {"device": "cuda"}, "train": {"processes": 2}}))
    gpus = next(check for check in preflight(cfg, tmp_path) if check.name == "gpus")
    assert gpus.ok == (torch.cuda.device_count() >= 2)
    assert f"this machine has {torch.cuda.device_count()}" in gpus.reason


def _accelerate(module_args: list[str], temp_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = os.environ | project_pythonpath(REPO, REPO / "tests") | {"OMP_NUM_THREADS": "1"}
    env |= session_prefect_env() | ({"TMPDIR": str(temp_dir)} if temp_dir else {})
    return subprocess.run(module_args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_processes_make_the_same_update_as_one(tiny_backbone, tmp_path):
    from distributed_update import summed_gradients

    command = launch_command(2, "distributed_update", [str(tiny_backbone), str(tmp_path), "2"])
    done = _accelerate(command, tmp_path)  # torch elastic's log folder lands here, not in /tmp
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    alone = summed_gradients(tiny_backbone, World())
    assert ranks[0].keys() == ranks[1].keys() == alone.keys()
    assert {name.split(".")[-2] for name in alone} >= {"central", "retrieval", "conclusion"}
    for name, grad in alone.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # every process steps with the same gradient
        assert torch.allclose(ranks[0][name], grad, rtol=1e-4, atol=1e-7), name  # ... the one a single process makes
    assert any(grad.abs().sum() > 0 for grad in alone.values())


@pytest.mark.slow
def test_the_train_stage_relaunches_itself_with_two_processes(smoke_run, tmp_path):
    from test_training import _outputs, _stage_args

    folder, _, data = smoke_run
    params = write_params(
        tmp_path,
        {
            "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"},
            **TOY,
            "train": {**TOY["train"], "processes": 2},
            "budgets": {"two_steps": {"steps": 2}},
        },
    )
    out = str(tmp_path / "joint")  # absolute: the outputs land here, beside the smoke run's inputs
    outputs = _outputs(folder, out)
    data = data | {"train": any_word_dev(data["train"], params, tmp_path / "toy.jsonl")}
    memo = plant_start_scores(tmp_path / "start-scores", params, [folder / "start", folder / "index", data["train"]])
    command = [sys.executable, "-m", "stages.train", *_stage_args(folder, params, data, "joint", out)]
    command.append(f"--start-scores={memo.parent}")
    temp = tmp_path / "temp"
    temp.mkdir()
    done = _accelerate(command, temp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(temp.iterdir()) == []  # the launch's temporary files went with it (torch elastic's log folder)
    assert "process 1 of 2" in done.stdout and "process 2 of 2" in done.stdout
    assert done.stdout.count("train@joint-0-main: {") == 1  # the summary once, from the first process
    history = [json.loads(line) for line in outputs["history"].read_text().splitlines()]
    grpo = TOY["train"]["grpo"]
    # each process rolled out one question's group; the step's metrics count both
    assert [row["episodes"] for row in history] == [grpo["questions_per_step"] * grpo["group_size"]] * 2
    assert json.loads(outputs["budgets"].read_text())["cuts"]["two_steps"]["step"] == 2
    assert (outputs["adapters"] / "two_steps" / "central" / "adapter_model.safetensors").is_file()
    # each process scores its share of the 3 dev questions (the first 2 of them, the second 1) and both get the
    # totals: what one process scores with the final adapters on all 3, the second's share included
    alone, third = dev_alone(params, folder, outputs["adapters"] / "two_steps", data["train"])
    assert third > 0, "the check needs the second process's question to score"
    assert {key: history[-1][key] for key in alone} == pytest.approx(alone)
    assert history[0]["dev.f1@start"] == 0.123  # the first process read the shared start scores; both used them


def any_word_dev(train: Path, params: Path, out: Path) -> Path:
    """The toy questions, but the dev split's answered by any word a token decodes to, so that scoring them does
    not hang on what two toy steps learn (the first-half-of-the-alphabet answers: a version of the libraries
    away from scoring 0 everywhere)."""
    from centralrl.config import load_config
    from centralrl.io import write_jsonl
    from centralrl.metrics import normalize_answer
    from centralrl.models.backbone import load_backbone
    from centralrl.data.split import split_dev
    from centralrl.schema import read_questions

    questions = read_questions(train)
    tokenizer = load_backbone(train.parent / "start")[1]
    words = tuple(sorted({normalize_answer(tokenizer.decode([i])) for i in range(len(tokenizer))} - {""}))
    dev = {q.id for q in split_dev(questions, load_config(params).train.dev)[1]}
    write_jsonl(out, ({**q.to_json(), **({"golden_answers": words} if q.id in dev else {})} for q in questions))
    return out


def dev_alone(params: Path, folder: Path, adapters: Path, train: Path) -> tuple[dict[str, float], float]:
    """The dev scores one process gives the joint arm's `adapters` on every dev question, and the last one's F1."""
    from centralrl.assembly import trained_policy
    from centralrl.config import load_config
    from centralrl.retrieval import open_retriever
    from centralrl.data.split import split_dev
    from centralrl.rl.dev import dev_scores
    from centralrl.schema import read_questions

    cfg = load_config(params)
    policy = trained_policy(cfg, "main", folder / "start", adapters, "joint")
    retriever = open_retriever(cfg.retrieval, folder / "index")
    dev = split_dev(read_questions(train), cfg.train.dev)[1]
    last = dev_scores(cfg, policy, retriever, dev[-1:], "central", World())["dev.f1"]
    return dev_scores(cfg, policy, retriever, dev, "central", World()), last


def plant_start_scores(folder, params, inputs):
    """A start-scores file with a value no scoring gives, where a train cell on `inputs` looks for it."""
    from centralrl.config import load_config
    from centralrl.rl.run import code_sha256, input_hashes, start_scores_key

    code = code_sha256(REPO / "stages" / "train.py")
    key = start_scores_key(load_config(params), "main", "central", input_hashes(inputs), code)
    folder.mkdir()
    (folder / f"{key}.json").write_text(json.dumps({"dev.f1": 0.123, "dev.em": 0.0, "dev.f1.toy": 0.123}))
    return folder / f"{key}.json"
