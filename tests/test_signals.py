"""SIGTERM, SIGKILL or Ctrl-C to `dvc repro` stop the running stage, its Prefect server and every other process
it started, within seconds, and leave no partial output (a real DVC project, real processes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, project_pythonpath, write_params

pytestmark = pytest.mark.slow

DVC = Path(sys.executable).with_name("dvc")


def dvc_project(folder: Path) -> None:
    """A DVC project (no git) whose one stage is tests/blocking_stage.py."""
    write_params(folder)
    shutil.copy(REPO / "tests" / "blocking_stage.py", folder / "blocking_stage.py")
    (folder / "dvc.yaml").write_text(
        "stages:\n  block:\n    cmd: python blocking_stage.py --params params.yaml --out out/result.json"
        " --started started.json\n    deps: [blocking_stage.py]\n    outs: [out/result.json]\n"
    )
    subprocess.run([str(DVC), "init", "--no-scm", "-q"], cwd=folder, check=True)


def start_repro(folder: Path, prefect_home: Path) -> subprocess.Popen:
    env = (
        os.environ
        | project_pythonpath()
        | {
            "PATH": f"{DVC.parent}{os.pathsep}{os.environ['PATH']}",
            "PREFECT_HOME": str(prefect_home),
            "OMP_NUM_THREADS": "1",
            "TMPDIR": str(prefect_home),  # a SIGKILLed stage cannot remove its Prefect server's log folder
        }
    )
    env.pop("PREFECT_API_URL", None)
    # the log goes to a file, not a pipe: nobody reads a pipe while the test waits, and a full one (64 KB of
    # Prefect and dvc lines, more on a loaded machine) blocks dvc and its stage in a write, so they never exit
    with (folder / "repro.log").open("wb") as log:
        return subprocess.Popen(
            [str(DVC), "repro", "-q"],
            cwd=folder,
            env=env,
            start_new_session=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_for(path: Path, repro: subprocess.Popen, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.is_file() or not path.read_text():
        if repro.poll() is not None:
            log = (path.parent / "repro.log").read_text(errors="replace")
            pytest.fail(f"dvc repro exited early ({repro.returncode}): {log}")
        assert time.monotonic() < deadline, "the stage did not start its flow in time"
        time.sleep(0.2)
    return json.loads(path.read_text())


def test_a_signal_to_dvc_stops_the_stage_and_everything_it_started(tmp_path, migrated_prefect_home):
    """One project per way of stopping dvc, all started at once (each stage starts a Prefect server: seconds)."""
    hows = ("SIGTERM", "SIGKILL", "Ctrl-C")
    for how in hows:
        dvc_project(tmp_path / how)
    repros = {how: start_repro(tmp_path / how, migrated_prefect_home(f"prefect-{how}")) for how in hows}
    families = {}
    for how, repro in repros.items():
        stage = psutil.Process(wait_for(tmp_path / how / "started.json", repro)["stage"])
        families[how] = [stage, *stage.children(recursive=True)]  # the stage's Prefect server among them
        assert len(families[how]) >= 2, "the stage should have its own Prefect server as a child"

    for how, repro in repros.items():
        if how == "Ctrl-C":  # a terminal sends SIGINT to the whole foreground process group
            os.killpg(repro.pid, signal.SIGINT)
        else:
            os.kill(repro.pid, getattr(signal, how))
    for how, repro in repros.items():
        _, alive = psutil.wait_procs(families[how], timeout=60)  # generous: a loaded 2-core machine is slow to reap
        repro.wait(60)
        assert not alive, f"still running after {how} to dvc: {[p.cmdline() for p in alive]}"
        out = tmp_path / how / "out"
        log = (tmp_path / how / "repro.log").read_text(errors="replace")[-3000:]  # how the stage stopped
        assert not out.is_dir() or not list(out.iterdir()), f"{how}: a partial output or temporary was left:\n{log}"


STOPPABLE = """
import signal, sys, time
sys.path.insert(0, {src!r})
from centralrl.processes import terminate_as_interrupt
terminate_as_interrupt(grace={grace})
if {swallow}:  # what Prefect's SIGTERM handler amounts to when its exception lands in a __del__
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
try:
    print("ready", flush=True)  # inside the try: a signal right after it must meet the hanging cleanup
    while True:
        time.sleep(0.1)
finally:
    time.sleep(1000)  # cleanup that never finishes (a crash report to a server that does not answer)
"""


def start_stoppable(tmp_path: Path, grace: float, swallow: bool = False) -> subprocess.Popen:
    script = tmp_path / "stoppable.py"
    script.write_text(STOPPABLE.format(src=str(REPO / "src"), grace=grace, swallow=swallow))
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.mark.parametrize("how", ["grace", "second signal"])
def test_a_stop_whose_cleanup_hangs_still_ends_the_process(tmp_path, how):
    process = start_stoppable(tmp_path, grace=1.0 if how == "grace" else 600.0)
    process.send_signal(signal.SIGINT)
    if how == "second signal":
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT, err
    expected = "still stopping 1 s later" if how == "grace" else "a second signal"
    assert f"SIGINT, then {expected}: exiting without further cleanup" in err


HANDED_ON = """
import os, signal, sys, time
sys.path.insert(0, {src!r})
from centralrl.processes import Terminated, terminate_as_interrupt
terminate_as_interrupt(grace=600)
ours = signal.getsignal(signal.SIGTERM)

def prefect_like(signum, frame):  # Prefect's flow engine: its handler, then the signal again for the one it replaced
    signal.signal(signum, ours)
    os.kill(os.getpid(), signum)

signal.signal(signal.SIGTERM, prefect_like)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
except Terminated:
    time.sleep(1)  # unwinding (temporaries removed, children stopped) must not be cut short
    print("unwound", flush=True)
"""


def test_one_signal_handed_on_by_another_handler_is_not_a_second_one(tmp_path):
    """One `kill -TERM` to a stage in a flow run printed 'SIGTERM, then a second signal' and skipped the
    unwinding the stage promises: Prefect sends the signal it caught to the process again."""
    script = tmp_path / "handed_on.py"
    script.write_text(HANDED_ON.format(src=str(REPO / "src")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "unwound\n"), done.stderr


def test_a_signal_whose_exception_is_swallowed_still_ends_the_process(tmp_path):
    """Another handler (Prefect's, during flow runs) took the signal and its exception never surfaced."""
    process = start_stoppable(tmp_path, grace=1.0, swallow=True)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert "SIGTERM, then still stopping 1 s later: exiting without further cleanup" in err
