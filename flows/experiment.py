"""Prefect flows `experiment` and `evaluation`: the DVC pipeline, or a part of it, as one Prefect flow run, so it
can be deployed, scheduled, triggered from the UI and run by a worker (prefect.yaml at the repo root).

DVC still decides what is stale and runs the stages; these flows only plan the command
(`centralrl.dvc_runs`, which says how arms, seeds and profiles become DVC targets and -S options), run it in
the repo root as a subprocess, stream its output to the flow run's log line by line, and fail the run with its
last lines when it exits non-zero. The stages' own flows (build-index, train-arm, evaluate-harness) show up as
separate flow runs on the same Prefect server (the subprocess inherits PREFECT_API_URL).

`evaluation` runs evaluation alone: `dvc repro --single-item` of the `evaluate` and `evaluate_reference`
stages (and `compare` when no arm subset is given) on the adapters already trained, without reproducing
training even if it is stale (`dvc status` still says so afterwards).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from centralrl.services import ServiceError, check_prefect_api, check_prefect_url, quiet_known_errors_in_prefect_logs


def _refuse_a_bad_prefect_url() -> None:
    """Run as a script, exit with one line when PREFECT_API_URL is no http(s) URL, as a stage does: Prefect's
    import below validates it, and a URL it cannot parse (`http://[::1`) was a 39-line pydantic traceback. A module
    that imports this one (a worker's) is left to Prefect: it could not have started with that URL."""
    url = os.environ.get("PREFECT_API_URL")
    if __name__ == "__main__" and url:
        try:
            check_prefect_url(url)
        except ServiceError as error:
            sys.exit(f"experiment: error: {error}")


_refuse_a_bad_prefect_url()

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from centralrl.config import load_config
from centralrl.dvc_runs import (
    EVALUATION_STAGES,
    check_profile,
    dvc_command,
    dvc_env,
    overrides,
    read_params,
    stream,
)
from centralrl.errors import CentralRLError, RunError
from centralrl.processes import exit_with

REPO = Path(__file__).resolve().parents[1]


def command(
    repo: str,
    profile: str | None,
    arms: list[str] | None,
    seeds: list[int] | None,
    targets: list[str] | None,
    dry_run: bool,
    single_item: bool = False,
) -> list[str]:
    """The full dvc command line for this run, checked against params.yaml (unknown arms or profiles fail here).
    A profile or seeds that differ from params.yaml's are validated with it as the stages will read them: `dvc exp
    run -S` writes them into params.yaml and leaves them there when a stage then refuses them (a profile with an
    unknown key or a matrix axis passed this check, which only looked for its file)."""
    params = read_params(repo)
    check_profile(repo, params, profile)
    argv = [sys.executable, "-m", "dvc", *dvc_command(params, profile, arms, seeds, targets, dry_run, single_item)]
    if overrides(params, profile, seeds):
        chosen = {"profile": profile, "seeds": seeds}
        load_config(Path(repo) / "params.yaml", {key: value for key, value in chosen.items() if value is not None})
    return argv


plan = task(command, name="plan", cache_policy=NO_CACHE)  # a visible step of the flow run


@task(cache_policy=NO_CACHE)
def run_dvc(repo: str, argv: list[str]) -> list[str]:
    """Run the command, its output streamed to this run's log; fail with its last lines on a non-zero exit."""
    logger = get_run_logger()
    logger.info("in %s: dvc %s", repo, " ".join(argv[3:]))
    code, tail = stream(argv, repo, logger.info, dvc_env())
    if code != 0:
        lines = "\n".join(tail) + _hint(argv, tail)
        raise RunError(f"`dvc {' '.join(argv[3:])}` exited with code {code}; its last lines:\n{lines}")
    return tail


def _hint(argv: list[str], tail: list[str]) -> str:
    """What a dry run's failure means when DVC's dry run met a stage whose inputs are not made yet."""
    if "--dry" in argv and any("failed to reproduce" in line and "No such file" in line for line in tail):
        if "--single-item" in argv and "repro" in argv:  # evaluation in the workspace: a real run fails the same
            return (
                "\nevaluation reproduces nothing upstream (--single-item), so an input missing here is missing "
                "for a real run too: make it first with the experiment flow (train, or the stage that writes it)"
            )
        return (
            "\nDVC's dry run reads the inputs of every stage it would run, so it fails where an upstream stage's "
            "outputs do not exist yet (DVC issue #9021; always so for `exp run`, which runs in a copy without "
            "them): run without --dry, or name targets whose inputs exist"
        )
    return ""


@flow(name="experiment")
def experiment(
    profile: str | None = None,
    arms: list[str] | None = None,
    seeds: list[int] | None = None,
    targets: list[str] | None = None,
    dry_run: bool = False,
    repo: str | None = None,
) -> list[str]:
    """Reproduce the pipeline (or `targets`, DVC stage or group names) with `profile` and `seeds` (None: as
    params.yaml says; a literal "default" overrode a params.yaml whose profile was smoke), only for `arms` when
    given; `dry_run` prints what would run (`--dry`). Returns the last output lines."""
    root = str(Path(repo or REPO).resolve())
    return run_dvc(root, plan(root, profile, arms, seeds, targets, dry_run))


@flow(name="evaluation")
def evaluation(
    profile: str | None = None,
    arms: list[str] | None = None,
    seeds: list[int] | None = None,
    dry_run: bool = False,
    repo: str | None = None,
) -> list[str]:
    """Evaluation alone: the evaluate and evaluate_reference stages (and compare, unless `arms` narrows the run)
    on the adapters already trained, without reproducing anything upstream (`dvc repro --single-item`)."""
    root = str(Path(repo or REPO).resolve())
    targets = [stage for stage in EVALUATION_STAGES if not (arms and stage == "compare")]
    return run_dvc(root, plan(root, profile, arms, seeds, targets, dry_run, single_item=True))


def seed(text: str) -> int:
    """A seed from the command line: a whole number >= 0 (params' `seeds`), refused by argparse otherwise."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a seed is a whole number >= 0")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """`python flows/experiment.py [--dry] ...`: the experiment flow as the deployment runs it, from a shell."""
    parser = argparse.ArgumentParser(prog="python flows/experiment.py", description=experiment.description)
    parser.add_argument("--dry", action="store_true", help="print what would run (dvc --dry)")
    parser.add_argument("--profile", help="a profile of profiles/ (default: params.yaml's)")
    parser.add_argument("--arms", nargs="+", help="only these arms' train and evaluate stages")
    parser.add_argument("--seeds", nargs="+", type=seed, help="these seeds instead of params.yaml's")
    parser.add_argument("--targets", nargs="+", help="DVC stage or group names (default: the whole pipeline)")
    args = parser.parse_args(argv)
    try:
        command(str(REPO), args.profile, args.arms, args.seeds, args.targets, args.dry)  # before any Prefect server
        if os.environ.get("PREFECT_API_URL"):  # a server that is down: one line, not Prefect's 112-line traceback
            check_prefect_api(os.environ["PREFECT_API_URL"])
        experiment(args.profile, args.arms, args.seeds, args.targets, args.dry)
    except CentralRLError as error:
        print(f"experiment: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # dvc and its stage were stopped (`dvc_runs.stream`); a traceback says nothing more
        resumes = "" if args.dry else "; a rerun resumes training from its last saved step"
        print(f"experiment: interrupted{resumes}", file=sys.stderr)
        return 130
    return 0


quiet_known_errors_in_prefect_logs()  # a bad parameter or a failed dvc run: its message, not a traceback

if __name__ == "__main__":
    exit_with(main)
