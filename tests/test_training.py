"""GRPO training on the smoke profile: which weights move per arm, resume byte for byte, reward rises."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from centralrl.config import load_config
from centralrl.models.backbone import content_sha256

from conftest import REPO, TOY, project_pythonpath, session_prefect_env, toy_questions, write_params


def _stage_args(folder: Path, params: Path, data: dict, arm: str, out: str) -> list[str]:
    return [
        "--params",
        str(params),
        "--arm",
        arm,
        "--seed",
        "0",
        "--backbone",
        "main",
        "--model",
        str(folder / "start"),
        "--index",
        str(folder / "index"),
        "--train",
        str(data["train"]),
        *[f"--{k}={v}" for k, v in _outputs(folder, out).items()],
    ]


def _outputs(folder: Path, out: str) -> dict[str, Path]:
    return {
        "adapters": folder / out / "adapters",
        "budgets": folder / out / "budgets.json",
        "state": folder / out / "state",
        "history": folder / out / "history.jsonl",
        "metrics": folder / out / "metrics.json",
    }


def train(folder: Path, params: Path, data: dict, arm: str, out: str, *extra: str) -> dict[str, Path]:
    from stages import train as train_stage

    train_stage.main([*_stage_args(folder, params, data, arm, out), *extra])
    return _outputs(folder, out)


def adapter_weights(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {p.name: load_file(p / "adapter_model.safetensors") for p in sorted(folder.iterdir()) if p.is_dir()}


def fresh_adapter_weights(folder: Path, params: Path, arm: str) -> dict[str, dict[str, torch.Tensor]]:
    """What the arm's adapters are before any step: the same seeded initialisation the trainer uses."""
    from centralrl.config import TOPOLOGY_ROLES
    from centralrl.config import role_adapters
    from centralrl.models.adapters import attach_adapters, save_adapters
    from centralrl.models.backbone import load_backbone
    from centralrl.seeding import derive_seed

    cfg = load_config(params)
    spec = cfg.arm(arm)
    model, _ = load_backbone(folder / "start")
    torch.manual_seed(derive_seed(0, "lora-init"))
    model = attach_adapters(
        model, role_adapters(spec.trainable_roles, cfg.lora.sharing, TOPOLOGY_ROLES[spec.topology]), cfg.lora
    )
    save_adapters(model, folder / f"init-{arm}")
    return adapter_weights(folder / f"init-{arm}")


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> bool:
    assert before.keys() == after.keys()
    return any(not torch.equal(before[k], after[k]) for k in before)


@pytest.fixture(scope="module")
def central_only_run(smoke_run) -> dict[str, Path]:
    """The train stage on central_only, in this process; every base (non-LoRA) weight of the model it trained is
    unchanged in memory at the end (the saved adapters hold LoRA weights only, so a base weight that trained would
    show nowhere else). The policy is the one `fresh_policy` built for the run, seen through a wrapper."""
    from centralrl.rl import run

    folder, params, data = smoke_run
    built, fresh_policy = [], run.fresh_policy

    def recorded(*args, **kwargs):
        policy = fresh_policy(*args, **kwargs)
        built.append((policy, _base_weights(policy.model)))
        return policy

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run, "fresh_policy", recorded)
        paths = train(
            folder, params, data, "central_only", "central_only", f"--start-scores={folder / 'start-scores'}"
        )
    [(policy, start)] = built
    after = _base_weights(policy.model)
    assert after.keys() == start.keys() and len(start) > 10
    assert [name for name in start if not torch.equal(start[name], after[name])] == []
    return paths


def _base_weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}


def test_central_only_trains_the_central_adapter_and_nothing_else(smoke_run, central_only_run):
    folder, params, _ = smoke_run
    paths = central_only_run
    trained = adapter_weights(paths["adapters"] / "two_steps")
    assert list(trained) == ["central"]  # retrieval and conclusion have no adapter: they run the start checkpoint
    assert changed(fresh_adapter_weights(folder, params, "central_only")["central"], trained["central"])


def test_budgets_cut_the_run_at_the_first_step_that_reaches_them(central_only_run):
    import json

    from centralrl.codedeps import folder_sha256

    paths = central_only_run
    budgets = json.loads(paths["budgets"].read_text())
    # the cell that wrote it, the start it trained from and each cut's adapters: what evaluate checks
    start = content_sha256(paths["adapters"].parents[1] / "start")
    assert budgets["cell"] == {"arm": "central_only", "seed": 0, "backbone": "main", "start": start}
    assert {name: cut["adapters"] for name, cut in budgets["cuts"].items()} == {
        name: folder_sha256(paths["adapters"] / name) for name in budgets["cuts"]
    }
    cuts = {name: cut for name, cut in budgets["cuts"].items() if name in TOY["budgets"]}
    assert {name: cut["step"] for name, cut in cuts.items()} == {"any_token": 1, "one_step": 1, "two_steps": 2}
    assert all(cut["reached"] for cut in cuts.values())
    # the smoke profile's equal_tokens is more than 2 steps can train (2 questions x 4 episodes x 4 central tokens
    # each): cut at the last step, unreached, with what was spent
    unreached = budgets["cuts"]["equal_tokens"]
    assert unreached["step"] == 2 and unreached["reached"] is False
    assert unreached["spent"]["trained_tokens"] < unreached["budget"]["trained_tokens"] == 150
    first_step = json.loads(paths["history"].read_text().splitlines()[0])
    assert cuts["one_step"]["spent"]["trained_tokens"] == first_step["trained_tokens.central"] > 0
    assert cuts["two_steps"]["spent"]["flops"] > cuts["one_step"]["spent"]["flops"] > 0
    assert _file_hashes(paths["adapters"] / "any_token") == _file_hashes(paths["adapters"] / "one_step")
    assert changed(
        adapter_weights(paths["adapters"] / "one_step")["central"],
        adapter_weights(paths["adapters"] / "two_steps")["central"],
    )


def test_a_tracking_store_that_fails_at_the_last_log_leaves_the_trained_outputs_written(smoke_run, tmp_path):
    """The outputs are written before the run's last logs: an artifact store that could not take budgets.json
    (here a file where its folder goes) failed the stage with the cuts saved in its state but none written out."""
    folder, _, data = smoke_run
    params = write_params(tmp_path, {"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"}, **TOY})
    (tmp_path / "mlruns").write_text("not the artifacts folder")
    with pytest.raises(NotADirectoryError, match="mlruns"):
        train(folder, params, data, "central_only", "unlogged")
    paths = _outputs(folder, "unlogged")
    budgets = json.loads(paths["budgets"].read_text())
    assert (
        sorted(p.name for p in paths["adapters"].iterdir())
        == sorted(budgets["cuts"])
        == sorted(load_config(params).budgets)
    )
    assert json.loads(paths["metrics"].read_text())["steps"] == len(paths["history"].read_text().splitlines()) == 2


class ScriptedSampler:
    """Stands in for sampling from a language model (the outside boundary) so that every role acts: the central
    agent delegates (max_turns 1, so the conclusion is then forced), the conclusion answers right in every other
    episode, and the central agent's plan words and the retrieval agent's notes differ in those same episodes.
    Were every episode's call of a role the same sequence, its group-normalised advantages would sum to zero on
    it and that adapter would get no gradient (only float round-off, which Adam would blow up to a step). The
    update itself runs the real tiny model with its real adapters."""

    def __init__(self, right: str, wrong: str):
        self.right, self.wrong, self.calls = right, wrong, {}

    def __call__(self, role: str, prompt: str) -> str:
        self.calls[role] = self.calls.get(role, 0) + 1
        odd = self.calls[role] % 2
        if role == "central":
            plan = "plan" if odd else "other plan"
            action = "<conclude></conclude>" if "Note:" in prompt else "<subquestion>Which word?</subquestion>"
            return f"{plan}</think>{action}"
        if role == "retrieval":
            return "nothing relevant</note>" if odd else "no relevant passage</note>"
        return (self.right if odd else self.wrong) + "</answer>"


def test_the_starts_dev_scores_are_scored_by_one_cell_and_read_by_the_others(smoke_run, central_only_run):
    """The first cell leaves the start's dev scores in the shared folder under a key of what they depend on; a
    cell of the other arm reads them instead of scoring the start again (a planted value shows it did)."""
    import json

    folder, params, data = smoke_run
    (memo,) = (folder / "start-scores").iterdir()
    first_row = json.loads(central_only_run["history"].read_text().splitlines()[0])
    written = json.loads(memo.read_text())
    assert written == {k.removesuffix("@start"): v for k, v in first_row.items() if k.endswith("@start")}
    assert sorted(written) == ["dev.em", "dev.f1", "dev.f1.toy"]  # F1 per benchmark too
    assert written["dev.f1.toy"] == written["dev.f1"]  # the dev questions are all of one benchmark
    memo.write_text(json.dumps(dict.fromkeys(written, 0.123)))
    joint = train(folder, params, data, "joint", "joint-memo", f"--start-scores={folder / 'start-scores'}")
    first_row = json.loads(joint["history"].read_text().splitlines()[0])
    assert {k: v for k, v in first_row.items() if k.endswith("@start")} == {f"{k}@start": 0.123 for k in written}


def test_joint_trains_all_three_adapters(smoke_run):
    from centralrl.harness.engine import Generation, RolePolicy
    from centralrl.config import role_adapters
    from centralrl.models.adapters import attach_adapters
    from centralrl.models.backbone import load_backbone
    from centralrl.retrieval import open_retriever
    from centralrl.rl.trainer import Trainer

    folder, params, _ = smoke_run
    cfg = load_config(params)
    model, tokenizer = load_backbone(folder / "start")
    adapters = role_adapters(["central", "retrieval", "conclusion"], "per_role")
    model = attach_adapters(model, adapters, cfg.lora)
    questions = toy_questions(tokenizer)
    script = ScriptedSampler(right=questions[0].golden_answers[0], wrong="zebra")

    class Scripted(RolePolicy):
        def generate(self, role, prompts, max_new_tokens, greedy, temperature=1.0, seed=0):
            texts = [script(role, self.tokenizer.decode(p)) for p in prompts]
            ids = [tuple(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts]
            return [
                Generation(tuple(p), i, tuple(0.0 for _ in i), self.tokenizer.decode(i)) for p, i in zip(prompts, ids)
            ]

    policy = Scripted(model, tokenizer, adapters)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(cfg, policy, open_retriever(cfg.retrieval, folder / "index"), questions, "central", seed=0)
    metrics = trainer.train_step()
    assert metrics["reward_std"] > 0
    for role in ("central", "retrieval", "conclusion"):
        moved = [n for n, p in model.named_parameters() if f".{role}." in n and not torch.equal(before[n], p)]
        assert moved, f"the {role} adapter did not change"
        assert metrics[f"trained_tokens.{role}"] > 0
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if "lora_" not in n)


def _stage_command(folder: Path, params: Path, data: dict, out: str) -> list[str]:
    return [sys.executable, "-m", "stages.train", *_stage_args(folder, params, data, "joint", out)]


def _file_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_a_killed_run_resumes_and_ends_byte_identical(smoke_run, tmp_path, capsys):
    folder, _, data = smoke_run
    params = write_params(
        tmp_path,
        {
            "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"},
            **TOY,
            "train": {"grpo": {"steps": 4, "questions_per_step": 2, "group_size": 4, "learning_rate": 0.05}},
            "budgets": {"end": {"steps": 4}},
        },
    )
    train(folder, params, data, "joint", "straight")  # in this process: a stage process's imports cost ~15 s
    straight = capsys.readouterr().out
    assert "(process 1 of 1): started at step 0, now at step 4;" in straight, straight
    env = os.environ | project_pythonpath() | session_prefect_env()

    interrupted = subprocess.Popen(
        _stage_command(folder, params, data, "killed"),
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    state = folder / "killed" / "state"
    deadline = time.time() + 300
    while not list(state.glob("step-*/meta.json")) and interrupted.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(interrupted.pid, signal.SIGKILL)
    interrupted.wait()
    saved = sorted(state.glob("step-*"))
    assert saved and saved[-1].name < "step-000004", "the run finished before it could be killed"
    assert not (folder / "killed" / "adapters").exists()

    resumed = subprocess.run(
        _stage_command(folder, params, data, "killed"), check=True, env=env, cwd=REPO, capture_output=True, text=True
    )
    assert re.search(r"\(process 1 of 1\): resumed from step [1-3], now at step 4;", resumed.stdout), resumed.stdout
    assert _file_hashes(folder / "killed" / "adapters") == _file_hashes(folder / "straight" / "adapters")
    for name in ("history.jsonl", "budgets.json", "metrics.json"):  # every output, not the adapters alone
        assert (folder / "killed" / name).read_bytes() == (folder / "straight" / name).read_bytes(), name
    initial = fresh_adapter_weights(folder, params, "joint")
    assert changed(
        initial["central"], adapter_weights(folder / "killed" / "adapters" / "end")["central"]
    )  # it learned


def test_mean_reward_rises_on_a_task_the_tiny_model_can_learn(tiny_backbone, tmp_path):
    """A conclusion-only arm (arms are data) on the toy task. Measured here: mean reward 0.31, 0.38, 0.28, 0.59 in
    the first four steps, 1.0 from the fifth on."""
    from centralrl.harness.engine import RolePolicy
    from centralrl.config import role_adapters
    from centralrl.models.adapters import attach_adapters
    from centralrl.models.backbone import load_backbone
    from centralrl.retrieval.bm25 import Bm25sIndex
    from centralrl.rl.trainer import Trainer
    from centralrl.schema import Passage

    model, tokenizer = load_backbone(tiny_backbone)
    params = write_params(
        tmp_path,
        {
            **TOY,
            "train": {
                "grpo": {"steps": 6, "questions_per_step": 4, "group_size": 8, "learning_rate": 0.05, "kl_coef": 0.0}
            },
        },
    )
    cfg = load_config(params)
    adapters = role_adapters(["conclusion"], "per_role")
    torch.manual_seed(0)
    policy = RolePolicy(attach_adapters(model, adapters, cfg.lora), tokenizer, adapters, 32)
    index = Bm25sIndex.build([Passage("p", "Nothing", "nothing to find here")], 1.2, 0.75, True)
    trainer = Trainer(cfg, policy, index, toy_questions(tokenizer), "central", seed=0)
    rewards = [trainer.train_step()["reward_mean"] for _ in range(6)]
    print("mean reward per step:", [round(r, 3) for r in rewards])
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.25, rewards


def test_a_state_saved_by_other_params_is_never_resumed(tmp_path):
    from centralrl.io import write_json
    from centralrl.rl.checkpoint import StateKey, latest_state

    state, cell = tmp_path / "state", {"arm": "joint", "seed": 0, "backbone": "main"}
    write_json(state / "step-000002" / "meta.json", {"step": 2, "cell": cell, "fingerprint": "params-a"})
    assert latest_state(state, StateKey("joint", 0, "main", "params-a")) == state / "step-000002"
    assert latest_state(state, StateKey("joint", 0, "main", "params-b")) is None
    assert not state.exists()  # the stale states are gone, so nothing can resume from them later
    write_json(state / "step-000002" / "meta.json", {"step": 2, "fingerprint": "old"})  # an older version's: no cell
    assert latest_state(state, StateKey("joint", 0, "main", "params-a")) is None
    assert not state.exists()


def test_another_cells_state_is_refused_naming_both_cells_and_kept(smoke_run, central_only_run, tmp_path):
    """The train stage of joint given central_only's `--state` removed it ("saved by a run with other params, ...;
    starting from step 0") and trained joint there."""
    import shutil

    from centralrl.errors import DataError

    folder, params, data = smoke_run
    state = tmp_path / "central_only_state"
    shutil.copytree(central_only_run["state"], state)
    before = _file_hashes(state)
    saver, runner = (f'{{"arm": "{arm}", "backbone": "main", "seed": 0}}' for arm in ("central_only", "joint"))
    with pytest.raises(
        DataError, match=re.escape(f"{state}: the training state of another cell ({saver}, not {runner});")
    ):
        train(folder, params, data, "joint", "joint_elsewhere", f"--state={state}")
    assert _file_hashes(state) == before


def test_a_damaged_state_is_named_not_resumed(smoke_run, central_only_run, tmp_path):
    """A truncated optimizer state was a torch traceback, a history row without its fields a KeyError at the
    end of the run, a state that lost an adapter was resumed with that role's adapter fresh, a meta.json that is
    no JSON object an AttributeError, and a newest state without meta.json was passed over for the one before
    (a step silently undone)."""
    import json
    import shutil

    from centralrl.distributed import World
    from centralrl.errors import DataError
    from centralrl.rl.checkpoint import StateKey
    from centralrl.rl.run import build_trainer
    from conftest import poison_adapter

    folder, params, data = smoke_run
    state = central_only_run["state"]
    saved = max(state.glob("step-*"))  # the newest
    assert len(list(state.glob("step-*"))) == 2  # the one before it is kept too: never resumed in its place
    key = StateKey("central_only", 0, "main", json.loads((saved / "meta.json").read_text())["fingerprint"])
    cut = r"cuts/two_steps holds other files than the run cut there"
    damages = {
        "trainer.pt": (lambda s: (s / "trainer.pt").write_bytes(b"\0" * 100), "RuntimeError|UnpicklingError"),
        "adapter": (lambda s: shutil.rmtree(s / "adapters" / "central"), r"adapters \[\], but the arm trains"),
        "history": (lambda s: (s / "history.jsonl").write_text('{"step": 1}\n'), "history.jsonl:1 has no skipped"),
        "nan": (lambda s: poison_adapter(s / "adapters" / "central"), r"adapter central: .*lora_.* non-finite"),
        # without the cuts beside it, the run would end hashing them as empty folders
        "cuts": (lambda s: shutil.rmtree(s.parent / "cuts"), r"it cut .*two_steps, but .*cuts has no such folder"),
        "meta": (lambda s: (s / "meta.json").write_text("[]\n"), r"meta.json holds a JSON list, not an object"),
        # a damaged cut was resumed from and published as the budget's adapters, exit 0 (evaluate failed on them)
        "cut": (lambda s: os.truncate(s.parent / "cuts/two_steps/central/adapter_model.safetensors", 60), cut),
        "cut_adapter": (lambda s: shutil.rmtree(s.parent / "cuts/two_steps/central"), cut),
        "json": (lambda s: (s / "meta.json").write_text("{"), r"meta.json:1: malformed JSON"),
        "no_meta": (lambda s: (s / "meta.json").unlink(), r"no meta.json"),
        # a state that lost its last history row resumed and published a history one step short, exit 0 (compare
        # refused it after every evaluation); one cut mid-line was the only damage not said to be the state's
        "lost_row": (lambda s: _drop_last_line(s / "history.jsonl"), r"history.jsonl holds steps \[1\], not 1 to 2"),
        "cut_row": (lambda s: os.truncate(s / "history.jsonl", 40), r"history.jsonl:1: malformed JSON"),
        # each a traceback once the run was over (its outputs written), or after the next step's work
        "wall": (lambda s: _edit_meta(s, wall_seconds="1.5"), r"meta.json's wall_seconds is '1.5', not a number"),
        "cut_list": (lambda s: _edit_meta(s, cuts=["two_steps"]), r"cuts are \['two_steps'\], not a mapping"),
    }
    inputs = [str(folder / "start"), str(folder / "index"), str(data["train"])]
    shutil.copytree(state, tmp_path / "whole")  # undamaged, with its cut: resumed where it was
    _, progress = build_trainer(
        load_config(params), "central_only", 0, "main", *inputs, str(tmp_path / "whole"), key, World()
    )
    assert progress.cuts and len(progress.history) == int(saved.name.split("-")[1])
    for name, (damage, says) in damages.items():
        shutil.copytree(state, tmp_path / name)
        damage(tmp_path / name / saved.name)
        with pytest.raises(DataError, match=rf"{name}/step-\d+: a damaged training state \(.*({says})"):
            build_trainer(load_config(params), "central_only", 0, "main", *inputs, str(tmp_path / name), key, World())


def _edit_meta(state: Path, **fields) -> None:
    meta = state / "meta.json"
    meta.write_text(json.dumps(json.loads(meta.read_text()) | fields))


def _drop_last_line(path: Path) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))


def test_spending_sums_what_the_budgets_are_stated_in():
    from centralrl.rl.run import spending

    history = [
        {
            "skipped": 0.0,
            "trained_tokens.central": 10.0,
            "trained_tokens.retrieval": 5.0,
            "flops.generation": 100.0,
            "flops.update": 300.0,
        },
        {"skipped": 0.0, "trained_tokens.central": 7.0, "flops.generation": 50.0, "flops.update": 150.0},
    ]
    # tokens 10 + 5 + 7 = 22; FLOPs (100 + 300) + (50 + 150) = 600
    assert spending(history, 12.5) == {"steps": 2.0, "trained_tokens": 22.0, "flops": 600.0, "wall_seconds": 12.5}


def test_the_run_ends_where_its_horizon_or_its_last_budget_cut_is_and_is_scored_there():
    """A run stops once every budget is cut, which can be before `train.grpo.steps`: that step is its last, so the
    dev curve must end there (it was scored only every `train.dev.every` steps and at the horizon). Under `revisit`
    it goes on to the horizon, where the replayed batches are."""
    from centralrl.config import Config
    from centralrl.rl.checkpoint import Progress
    from centralrl.rl.run import ends_run

    budgets = {"four": {"steps": 4}, "tokens": {"trained_tokens": 30}}
    cfg = Config.model_validate({"budgets": budgets, "train": {"grpo": {"steps": 6, "revisit": 0}}})
    row = {"skipped": 0.0, "trained_tokens.central": 10.0, "flops.generation": 1.0, "flops.update": 1.0}
    progress = Progress([row] * 2)
    assert not ends_run(cfg, progress, row, 1.0, 3)  # 3 steps, 30 tokens: "four" not yet reached
    assert not ends_run(cfg, progress, {**row, "skipped": 1.0}, 1.0, 3)
    progress.cuts["tokens"] = {}
    assert ends_run(cfg, Progress([row] * 3, cuts=progress.cuts), row, 1.0, 4)  # the 4th trained step
    assert ends_run(cfg, Progress([row] * 3), row, 1.0, 4)  # both reached at this step: both cut now
    assert ends_run(cfg, Progress([row]), {**row, "skipped": 1.0}, 1.0, 6)  # the horizon
    replaying = Config.model_validate({"budgets": budgets, "train": {"grpo": {"steps": 6, "revisit": 1}}})
    assert not ends_run(replaying, Progress([row] * 3), row, 1.0, 4)  # revisit: on to the replayed last batch
    assert ends_run(replaying, Progress([row] * 5), row, 1.0, 6)


def test_a_change_to_the_training_code_makes_saved_states_unresumable(tmp_path):
    """A fix to the trainer must retrain, not resume (and so rewrite) what the old trainer left. The code hashed
    is what the train stage imports, the rule of its DVC deps; a module it does not import is left out."""
    from centralrl.codedeps import project_sources
    from centralrl.rl.run import code_sha256, fingerprint, input_hashes, start_scores_key

    assert Path("src/centralrl/rl/grpo.py") in project_sources([REPO / "stages" / "train.py"], REPO)
    project = tmp_path / "project"
    files = {
        "stages/train.py": "from centralrl.rl import grpo\n",
        "src/centralrl/rl/grpo.py": "clip = 0.2\n",
        "src/centralrl/report.py": "title = 'report'\n",
    }
    for name, text in {**files, "src/centralrl/__init__.py": "", "src/centralrl/rl/__init__.py": ""}.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    entry = project / "stages" / "train.py"
    before = code_sha256(entry)
    (project / "src/centralrl/report.py").write_text("title = 'another report'\n")
    assert code_sha256(entry) == before
    (project / "src/centralrl/rl/grpo.py").write_text("clip = 0.3\n")
    after = code_sha256(entry)
    assert after != before
    cfg = load_config(write_params(tmp_path))
    inputs = input_hashes([entry])
    assert len({fingerprint(cfg, "joint", 0, "main", inputs, code) for code in (before, after)}) == 2
    assert len({start_scores_key(cfg, "main", "central", inputs, code) for code in (before, after)}) == 2


def test_a_state_saved_under_another_thread_count_is_not_resumed(tmp_path):
    """`threads: auto` follows the machine, and another thread count sums floats in another order: a run killed
    under 2 threads and resumed under 1 matched neither uninterrupted run."""
    from centralrl.rl.run import fingerprint, start_scores_key

    cfg = load_config(write_params(tmp_path))
    threads, keys = torch.get_num_threads(), set()
    try:
        for n in (threads, threads + 1):
            torch.set_num_threads(n)
            keys.add(
                (fingerprint(cfg, "joint", 0, "main", [], "code"), start_scores_key(cfg, "main", "x", [], "code"))
            )
    finally:
        torch.set_num_threads(threads)
    assert len({fingerprint for fingerprint, _ in keys}) == len({key for _, key in keys}) == 2
