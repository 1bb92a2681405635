"""Process lifetimes: a stage dies with whatever started it, and its children die with the stage.

DVC runs a stage's cmd as `$SHELL -c "<cmd>"` (/bin/sh when SHELL is unset). bash and dash 0.5.11+ exec a
single command, so the stage is DVC's child; other shells, or a cmd of several commands, keep the shell in
between. `die_with_parent` asks Linux to signal this process when its parent exits (`PR_SET_PDEATHSIG`, any
cause of death, SIGKILL included); `watch_grandparent` covers the shell in between by polling whether the
shell's parent is still there. Children a stage starts itself (a Prefect server, `accelerate launch`) get
`die_with_parent` as their `preexec_fn`, so a SIGKILLed stage takes them down too. The signal is sent when the
*thread* that started the child exits, so start children from the thread that waits for them.

Elsewhere than Linux these are no-ops: the stage then stops with its parent only on a signal it receives.

`exit_with` ends a command whose output was piped into a reader that stopped early (`plan | head`) quietly.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import psutil

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SHELLS = frozenset({"sh", "dash", "bash", "zsh", "ksh", "fish"})
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None  # loaded before any fork


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Have Linux send `sig` to this process when its parent (`parent`, default: the current one) exits; if it
    has exited already, send it now. Safe in a `preexec_fn`: no import, no allocation beyond the call."""
    if _LIBC is None:
        return
    parent = os.getppid() if parent is None else parent
    if _LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # orphaned before the request took effect
        os.kill(os.getpid(), sig)


def tied_to_this_process(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when this process (its starting thread) exits."""
    me = os.getpid()
    return functools.partial(die_with_parent, sig, me)


def watch_grandparent(interval: float = 0.5) -> threading.Thread | None:
    """When the parent is a shell (`sh -c` that did not exec), SIGTERM this process once the shell's own
    parent exits (the shell is then re-parented). Returns the daemon thread that polls, or None."""
    try:
        shell = psutil.Process(os.getppid())
        if shell.name() not in SHELLS:
            return None
        starter = shell.ppid()
    except psutil.Error:
        return None

    def poll() -> None:
        while True:
            try:
                if shell.ppid() != starter:
                    break
            except psutil.NoSuchProcess:  # the shell is gone: PR_SET_PDEATHSIG has signalled us already
                return
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=poll, name="watch-grandparent", daemon=True)
    thread.start()
    return thread


class Terminated(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP as an exception: code unwinds as on Ctrl-C, so temporaries and children are
    cleaned."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


_STOPPING: list[int] = []  # the signals our handler has raised as `Terminated`


def _raise_terminated(signum, frame) -> None:
    if _STOPPING:
        _exit_now(signum, "a second signal")
    _STOPPING.append(signum)
    raise Terminated(signum)


def terminate_as_interrupt(grace: float = 20.0) -> threading.Thread:
    """Turn SIGINT, SIGTERM and SIGHUP into `Terminated` in the main thread, so the process unwinds, and
    make sure a stopped process ends: a second signal, or `grace` seconds after the first, ends it at once
    (exit status 128 + the signal's number). Its atomic writes were discarded while unwinding or are removed
    by the next run (`clean_stale_temporaries`); its servers are SIGKILLed by Linux (`tied_to_this_process`).

    Why the deadline: the exception a handler raises lands wherever the main thread is, and inside a `__del__`
    Python only prints it ("Exception ignored in ..."), so the signal is lost and `dvc repro` waits for its
    stage forever (seen here under load, with Prefect's own SIGTERM handler, which it installs during flow
    runs). So the deadline is not armed by a Python handler: the C-level handler writes every signal's number
    to a wakeup pipe (`signal.set_wakeup_fd`), whichever Python handler is installed, and a thread reading
    it arms the deadline. Returns that thread."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_terminated)
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    thread = threading.Thread(target=_deadline_after_stop, args=(read, grace), name="stop-deadline", daemon=True)
    thread.start()
    return thread


ECHO_SECONDS = 5.0  # Prefect hands the signal on after its flow run unwinds: API calls, under load


def _deadline_after_stop(wakeup: int, grace: float) -> None:
    """Arm the deadline at the first stop signal; end the process at a second. The same signal again within
    ECHO_SECONDS is the first one handed on, not a second: Prefect's flow engine, whose SIGTERM handler is
    installed during a flow run, sends the signal it caught to the process again (`os.kill`) for the handler it
    replaced, and one `kill -TERM` had ended stages at once, skipping the unwinding."""
    first, first_at = None, 0.0
    while received := os.read(wakeup, 1):
        signum = received[0]
        if signum not in STOP_SIGNALS:
            continue
        if first is not None:
            if signum == first and time.monotonic() - first_at < ECHO_SECONDS:
                continue
            _exit_now(signum, "a second signal")
        first, first_at = signum, time.monotonic()
        timer = threading.Timer(grace, _exit_now, (signum, f"still stopping {grace:g} s later"))
        timer.daemon = True
        timer.start()


def _exit_now(signum: int, why: str) -> None:
    name = os.path.basename(sys.argv[0]) or "python"
    sys.stderr.write(f"{name}: {signal.Signals(signum).name}, then {why}: exiting without further cleanup\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def exit_with(main: Callable[[], int]) -> None:
    """`sys.exit(main())`; a reader of stdout that went away (`python -m centralrl.plan | head -3`) ends the
    command as it ends `cat`, with exit status 141 (128 + SIGPIPE) and no BrokenPipeError traceback. stdout is
    pointed at /dev/null first, so the interpreter's last flush does not raise again."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + signal.SIGPIPE
    sys.exit(code)
