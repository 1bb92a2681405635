"""The DVC command lines behind the `experiment` and `evaluation` flows, and running one with its output streamed.

The command: `dvc repro` when params.yaml already says what was asked; `dvc exp run -S profile=... -S
'seeds=[...]'` when the profile or the seeds differ from params.yaml (an experiment: DVC writes the overrides
into params.yaml in the workspace and records the run as a git-backed experiment, `dvc exp show`).

Arms are DVC targets, not a params override. `arms` in params.yaml is a dict that is also a matrix axis of
`train` and `evaluate` and a param of `compare`; overriding it with -S would change the experiment's identity
(the MLflow parent run, compare's inputs) and silently drop the other arms from dvc.lock's view. Selecting arms
instead reproduces only `evaluate@<arm>-<seed>-<backbone>` (and what it depends on: data, index, backbone,
warm start, `train@<arm>-...`) for the given arms. `compare` is left out then, because it reads every arm in
params.yaml: run it (or the whole pipeline) once all arms are done.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from centralrl.config import MAX_SEED
from centralrl.errors import ConfigError
from centralrl.processes import tied_to_this_process

ARM_STAGES = ("train", "evaluate")  # matrix stages over arms x seeds x backbones: <stage>@<arm>-<seed>-<backbone>
EVALUATION_STAGES = ("evaluate", "evaluate_reference", "compare")
TAIL_LINES = 40  # the output lines a failed run's error message carries
# seconds from SIGINT to SIGKILL of an interrupted dvc: a stage ends itself 20 s after a signal
# (`terminate_as_interrupt`), and Prefect SIGKILLs a cancelled flow run 30 s after its SIGTERM
INTERRUPT_GRACE = 22.0


def read_params(repo: str | Path) -> dict:
    """params.yaml of the repo (the matrix axes live there only; profiles may not set them), with its axes
    checked: `seeds` and `backbones` lists, `arms` a mapping."""
    path = Path(repo) / "params.yaml"
    if not path.is_file():
        raise ConfigError(f"{path} not found: `repo` must be the root of a centralrl checkout")
    try:
        params = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: expected a mapping of params, got {type(params).__name__}")
    for axis, kind in (("seeds", list), ("backbones", list), ("arms", dict)):
        if not isinstance(params.get(axis), kind):
            wanted = "a list" if kind is list else "a mapping"
            raise ConfigError(f"{path}: {axis} (an axis of the DVC matrix) must be {wanted}, got {params.get(axis)!r}")
    return params


def check_profile(repo: str | Path, params: dict, profile: str | None) -> None:
    """A profile other than params.yaml's must be a file of the repo's profiles/ (DVC would fail only inside a
    stage, after copying the workspace for the experiment)."""
    if profile is None or profile == params.get("profile"):
        return
    known = sorted(path.stem for path in (Path(repo) / "profiles").glob("*.yaml"))
    if profile not in known:
        raise ConfigError(f"profile {profile!r}: no profiles/{profile}.yaml in {repo}; known: {', '.join(known)}")


def overrides(params: dict, profile: str | None, seeds: list[int] | None) -> list[str]:
    """The -S options for what differs from params.yaml (none: a plain `dvc repro` suffices).

    >>> overrides({"profile": "default", "seeds": [0, 1]}, "smoke", [0])
    ['-S', 'profile=smoke', '-S', 'seeds=[0]']
    >>> overrides({"profile": "default", "seeds": [0, 1]}, "default", [0, 1])
    []
    """
    options = []
    if profile is not None and profile != params.get("profile"):
        options += ["-S", f"profile={profile}"]
    if seeds is not None and list(seeds) != params.get("seeds"):
        options += ["-S", f"seeds=[{','.join(str(int(s)) for s in seeds)}]"]
    return options


def stage_targets(
    params: dict, targets: list[str] | None, arms: list[str] | None, seeds: list[int] | None
) -> list[str]:
    """DVC targets: `targets` as given (stage or group names; none: the whole pipeline), with the arm stages
    narrowed to `arms` (`evaluate` when only arms are given).

    >>> stage_targets({"arms": {"a": {}, "b": {}}, "seeds": [0], "backbones": ["main"]}, None, ["b"], None)
    ['evaluate@b-0-main']
    """
    if not arms:
        return list(targets or [])
    known = list(params.get("arms") or {})
    unknown = [arm for arm in arms if arm not in known]
    if unknown:
        raise ConfigError(f"unknown arm(s) {unknown}; params.yaml defines: {', '.join(known)}")
    if targets and not set(targets) & set(ARM_STAGES):
        raise ConfigError(
            f"arms narrows only the {' and '.join(ARM_STAGES)} stages, and targets {targets} hold neither: "
            "leave arms out, or add one of them to targets"
        )
    cells = [
        (arm, seed, backbone)
        for arm in arms
        for seed in (seeds or params["seeds"])
        for backbone in params["backbones"]
    ]
    names = []
    for target in targets or ["evaluate"]:
        names += [f"{target}@{a}-{s}-{b}" for a, s, b in cells] if target in ARM_STAGES else [target]
    return names


def dvc_command(
    params: dict,
    profile: str | None,
    arms: list[str] | None,
    seeds: list[int] | None,
    targets: list[str] | None,
    dry_run: bool,
    single_item: bool = False,
) -> list[str]:
    """The dvc arguments (after `dvc`) for one run.

    >>> dvc_command({"profile": "default", "seeds": [0]}, "smoke", None, None, ["compare"], True)
    ['exp', 'run', '-S', 'profile=smoke', '--dry', 'compare']
    """
    for seed in seeds or ():  # a deployment's parameter: -1 or true was written into params.yaml by `exp run -S`
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:  # as params' `Seed`
            raise ConfigError(f"seeds: {seed!r} is not a seed; a seed is a whole number from 0 to {MAX_SEED}")
    for name, chosen in (("arms", arms), ("seeds", seeds), ("targets", targets)):
        if chosen is not None and not chosen:
            raise ConfigError(f"{name}: an empty list selects nothing; name at least one, or leave {name} out for all")
        if any(isinstance(item, str) and not item.strip() for item in chosen or ()):  # `--targets ''`: dvc ran all
            raise ConfigError(f"{name}: a blank name selects nothing (DVC read it as the whole pipeline)")
        twice = sorted(str(item) for item, count in collections.Counter(chosen or ()).items() if count > 1)
        if twice:  # params would refuse them, but only after `dvc exp run` had written them into params.yaml
            raise ConfigError(f"{name}: {', '.join(twice)} given twice; name each once")
    options = overrides(params, profile, seeds)
    verb = ["exp", "run", *options] if options else ["repro"]
    flags = (["--single-item"] if single_item else []) + (["--dry"] if dry_run else [])
    return [*verb, *flags, *stage_targets(params, targets, arms, seeds)]


def dvc_env() -> dict[str, str]:
    """The environment of the dvc subprocess: this venv first on PATH (stages run `python -m stages...`),
    unbuffered Python (lines arrive as they are printed), slower progress bars (fewer log lines)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TQDM_MININTERVAL", "10")
    return env


def stream(argv: list[str], cwd: str | Path, log, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run argv in cwd, pass every output line to `log`; return the exit code and the last lines. The child
    leads its own process group; if we are interrupted (Ctrl-C, a cancelled flow run), the group gets SIGINT as
    from a terminal (DVC stops the stage; training resumes from its saved state next time), then SIGKILL after
    INTERRUPT_GRACE seconds. If we die without unwinding (SIGKILL), Linux SIGKILLs the child
    (`tied_to_this_process`), whose stage then stops with it: no `dvc repro` left holding the repo's lock."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,
        preexec_fn=tied_to_this_process(),
    )
    try:
        for line in process.stdout:
            line = line.rstrip()
            if line:
                tail.append(line)
                log(line)
        return process.wait(), list(tail)
    finally:
        if process.poll() is None:
            _interrupt(process)


def _interrupt(process: subprocess.Popen, grace: float = INTERRUPT_GRACE) -> None:
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
            process.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
