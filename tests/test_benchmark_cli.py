"""The benchmark scripts refuse bad input before measuring: a missing input file is one line and exit 1, a zero
count a usage error naming the argument, an --out that could not be written an error naming --out, with the
previous result left as it was; `--help` and usage errors come before torch and the rest are imported; a test
file given as training questions, or more dev questions than there are, refused before the model loads. Real
runs of `python benchmarks/<script>.py`, each failing before any model loads or torch is imported (under a
second), or of a script's `main` in this process where its imports are torch's."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from centralrl.errors import ConfigError, DataError
from centralrl.io import write_jsonl
from conftest import REPO, write_params


def bench(script: str, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, f"benchmarks/{script}.py", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def one_line_error(done: subprocess.CompletedProcess, script: str, *says: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), done.stderr
    assert all(part in lines[0] for part in says), lines[0]


def test_a_missing_questions_file_is_one_line(tmp_path):
    done = bench("rollout", "--questions", "nosuch.jsonl", "--out", str(tmp_path / "r.json"))
    one_line_error(done, "rollout", "nosuch.jsonl", "no such file")
    assert not (tmp_path / "r.json").exists()
    done = bench("rollout", "--old-vs-new", "--questions", "README.md", "--eval-questions", "gone.jsonl")
    one_line_error(done, "rollout", "gone.jsonl", "no such file")


def test_a_missing_params_file_is_one_line_not_a_failed_child(tmp_path):
    done = bench("stage_startup", "--params", str(tmp_path / "nosuch.yaml"), "--out", str(tmp_path / "s.json"))
    one_line_error(done, "stage_startup", "nosuch.yaml")
    assert "round" not in done.stdout  # refused before the first variant ran


def test_a_missing_stage_input_is_one_line_before_any_stage_runs(tmp_path):
    done = bench("warmstart_stage", "--model", str(tmp_path / "nosuch"), "--out", str(tmp_path / "w.json"))
    one_line_error(done, "warmstart_stage", "nosuch: not found", "dvc repro")
    assert "round" not in done.stdout and not (tmp_path / "w.json").exists()


@pytest.mark.parametrize(
    "script, args, argument",
    [
        ("stage_startup", ["--rounds", "0"], "--rounds"),
        ("stage_startup", ["--rounds", "-1"], "--rounds"),
    ],  # every script's counts use cli.count; rollout.py would add ~10 s of imports to show it again
)
def test_a_count_below_one_is_a_usage_error_naming_the_argument(tmp_path, script, args, argument):
    done = bench(script, *args, "--out", str(tmp_path / "out.json"))
    assert done.returncode == 2, done.stderr
    assert f"argument {argument}: must be at least 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_rollout_adapters_are_for_the_runner_modes_only():
    """--old-vs-new always attaches its adapters; --adapters there would say otherwise, so it is refused."""
    done = bench("rollout", "--old-vs-new", "--adapters")
    assert done.returncode == 2 and "--adapters: not read by --old-vs-new" in done.stderr, done.stderr


@pytest.mark.parametrize("script", ["stage_startup"])  # every script checks --out with cli.check_out
def test_an_out_in_a_missing_folder_is_refused_before_measuring(tmp_path, script):
    out = tmp_path / "nosuch" / "result.json"
    done = bench(script, "--out", str(out))
    one_line_error(done, script, f"--out {out}", "does not exist")
    assert done.stdout == ""  # nothing measured
    assert not out.parent.exists()


def test_an_empty_out_or_one_ending_in_a_separator_is_refused_before_measuring(tmp_path):
    """--out '' was the current folder ("is a folder"); --out new/ wrote a file named new."""
    for blank in ("", "  "):  # "  " was written as a file named by two spaces
        one_line_error(
            bench("stage_startup", "--out", blank), "stage_startup", "--out: blank path; name the .json file"
        )
    done = bench("stage_startup", "--out", f"{tmp_path / 'new'}/")
    one_line_error(done, "stage_startup", f"--out {tmp_path / 'new'}/: ends in /, as a folder does")
    assert done.stdout == "" and not (tmp_path / "new").exists()


def test_an_out_in_a_folder_that_refuses_files_is_refused_before_measuring(read_only_folder):
    out = read_only_folder / "result.json"
    done = bench("stage_startup", "--out", str(out))
    one_line_error(done, "stage_startup", f"--out {out}: cannot be written:", "takes no new file")
    assert done.stdout == ""
    assert out.read_text() == '{\n  "old": true\n}\n'
    assert sorted(p.name for p in read_only_folder.iterdir()) == ["result.json"]


def test_an_out_naming_an_input_is_refused_before_measuring(tmp_path):
    """--out params.yaml replaced the params file with the figures, exit 0; a profile overlay too."""
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text())
    (tmp_path / "profiles").mkdir()
    done = bench("stage_startup", "--params", str(params), "--out", str(params))
    one_line_error(done, "stage_startup", f"--out {params} overlaps the input --params {params}")
    done = bench("stage_startup", "--params", str(params), "--out", str(tmp_path / "profiles" / "smoke.yaml"))
    one_line_error(done, "stage_startup", "overlaps the input --params", "profiles")
    assert done.stdout == "" and params.read_text() == (REPO / "params.yaml").read_text()


def test_an_out_not_named_as_a_json_result_is_refused_before_measuring(tmp_path):
    """--out notes.txt replaced someone's file with the figures; an earlier result (.json) is replaced. A new
    name without .json is refused too: once written, the same command would be refused on its rerun."""
    (tmp_path / "notes.txt").write_text("mine\n")
    done = bench("stage_startup", "--out", str(tmp_path / "notes.txt"))
    one_line_error(done, "stage_startup", f"--out {tmp_path / 'notes.txt'}: not a .json file name")
    assert done.stdout == "" and (tmp_path / "notes.txt").read_text() == "mine\n"
    done = bench("stage_startup", "--out", str(tmp_path / "figures"))
    one_line_error(done, "stage_startup", f"--out {tmp_path / 'figures'}: not a .json file name")
    assert not (tmp_path / "figures").exists()


@pytest.mark.parametrize("script", ["overfit", "headroom", "temperature", "role_swap"])
def test_a_test_split_given_as_training_questions_is_refused_before_the_model_loads(
    smoke_world, tmp_path, monkeypatch, script
):
    """overfit.py trained on the test questions, headroom.py, temperature.py and role_swap.py drew their dev
    questions from them: each reads --train as the stages do, train questions only."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    module = importlib.import_module(script)
    write_jsonl(tmp_path / "test.jsonl", [q.to_json() for q in smoke_world[0] if q.split == "test"])
    argv = ["--params", str(write_params(tmp_path)), "--model", "m", "--index", "i", "--out", str(tmp_path / "o.json")]
    argv += ["--train", str(tmp_path / "test.jsonl")] + (["--benchmarks", "synth-2hop"] if script == "overfit" else [])
    argv += ["--adapters", "a", "--arm", "joint"] if script == "role_swap" else []
    with pytest.raises(
        DataError, match=r"test\.jsonl:1 \(question .*\): a test question where train questions are read"
    ):
        module.main(module.arguments(argv))
    assert not (tmp_path / "o.json").exists()


def test_role_swap_refuses_an_arm_params_do_not_define_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import role_swap

    argv = ["--params", str(write_params(tmp_path)), "--model", "m", "--index", "i", "--out", str(tmp_path / "o.json")]
    argv += ["--train", "t.jsonl", "--adapters", "a", "--arm", "centrl_only"]
    with pytest.raises(ConfigError, match="arms has no 'centrl_only'; known arms: central_only, joint"):
        role_swap.main(role_swap.arguments(argv))
    assert not (tmp_path / "o.json").exists()


def test_temperature_refuses_more_dev_questions_than_the_split_holds(smoke_world, tmp_path, monkeypatch):
    """--n 999 ran the smoke split's 3 dev questions and wrote the figures, without a word (overfit.py's
    --per-benchmark refuses too few questions so)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import temperature

    write_jsonl(tmp_path / "train.jsonl", [q.to_json() for q in smoke_world[0] if q.split == "train"])
    argv = ["--params", str(write_params(tmp_path)), "--model", "m", "--index", "i", "--out", str(tmp_path / "o.json")]
    with pytest.raises(ConfigError, match=r"train\.jsonl: 3 dev questions \(train\.dev\), --n 999 asked"):
        temperature.main(temperature.arguments([*argv, "--train", str(tmp_path / "train.jsonl"), "--n", "999"]))


def test_options_a_mode_ignores_and_impossible_values_are_usage_errors(monkeypatch, capsys):
    """Each was taken silently: rollout.py ignored --steps without --old-vs-new (and --n with it), temperature.py
    sampled at -1, and retrieval.py's flat index found 22% of its own top 50 among 10 vectors."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import retrieval
    import rollout
    import temperature

    cases = [
        (rollout, ["--steps", "3"], "--steps: not read by this mode"),
        (rollout, ["--old-vs-new", "--n", "3"], "--n: not read by --old-vs-new"),
        (rollout, ["--compare-engines", "--engine", "vllm"], "--engine: not read by --compare-engines"),
        (temperature, ["--model=m", "--index=i", "--train=t", "--temperatures=-1"], "is not a temperature above 0"),
        (retrieval, ["--passages", "10", "--k", "50"], "--k 50 is more than --passages 10"),
    ]
    for script, args, says in cases:
        with pytest.raises(SystemExit) as stop:
            script.arguments(args)
        assert stop.value.code == 2 and says in capsys.readouterr().err, args


SCRIPTS = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if p.stem != "cli")


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_describes_every_option_and_answers_before_torch_is_imported(script):
    """`--help` took 11-18 s (torch, transformers and faiss came first); each option now says what it is."""
    command = [sys.executable, "-X", "importtime", f"benchmarks/{script}.py", "--help"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "transformers", "faiss", "prefect", "mlflow"}
    entries = done.stdout.split("options:\n")[1].replace("\n" + " " * 24, " ").splitlines()  # one line per option
    undescribed = [line.split()[0] for line in entries if not line[24:].strip()]  # help text starts at column 24
    assert len(entries) > 1 and undescribed == [], done.stdout


def test_an_unknown_path_name_is_a_usage_error_listing_the_known_ones():
    done = bench("update", "--paths", "new", "new_heap_kpt", "--micro-batches", "4")
    assert done.returncode == 2, done.stderr
    assert "--paths: unknown new_heap_kpt; known: old, new," in done.stderr
    assert "new_heap_kept" in done.stderr and "new_mb4" in done.stderr and "Traceback" not in done.stderr


def test_the_gpu_check_script_parses():
    """benchmarks/gpu_check.sh runs only on a GPU machine (and runs dvc repro); here its syntax is checked."""
    done = subprocess.run(["bash", "-n", "benchmarks/gpu_check.sh"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_gpu_check_answers_help_without_emptying_its_results_or_starting(tmp_path):
    """`--help` ran the check: it emptied its results folder, then started the 10-minute run on a GPU machine."""
    env = {**os.environ, "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--help"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert (done.returncode, done.stderr) == (0, "") and done.stdout.startswith("The GPU check: on a CUDA machine")
    assert "DEVICE=cpu N=4 runs the same steps on CPU" in done.stdout and not (tmp_path / "gpu_check").exists()
    wrong = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "now"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert wrong.returncode == 2 and "takes no arguments" in wrong.stderr and not (tmp_path / "gpu_check").exists()


def test_the_gpu_check_watchdog_picks_only_the_stage_processes_of_its_own_scratch_folder(tmp_path):
    """The watchdog sent SIGABRT to every `python -m stages.*` process of the host (pgrep -f), other checkouts'
    experiments included; now `stage_pids` picks those working in the check's scratch folder, and only stages."""
    for folder in ("ours", "theirs"):
        (tmp_path / folder / "stages").mkdir(parents=True)
        (tmp_path / folder / "stages" / "__init__.py").write_text("")
        (tmp_path / folder / "stages" / "wait.py").write_text("import time\ntime.sleep(60)\n")
    runs = [
        ("ours", "-m", "stages.wait"),
        ("theirs", "-m", "stages.wait"),
        ("ours", "-c", "import time; time.sleep(60)"),
    ]
    started = [subprocess.Popen([sys.executable, *args], cwd=tmp_path / folder) for folder, *args in runs]
    try:
        script = "source <(sed -n '/^stage_pids() {/,/^}/p' benchmarks/gpu_check.sh) && stage_pids \"$1\""
        done = subprocess.run(
            ["bash", "-c", script, "bash", str(tmp_path / "ours")], cwd=REPO, capture_output=True, text=True
        )
    finally:
        for process in started:
            process.kill()
            process.wait()
    assert done.stdout.split() == [str(started[0].pid)], done.stderr
