"""A trial process ends when the kiln process that launched it is gone.

Trials run in their own session (so a timeout can end a trial with its compile workers), which
also puts them out of reach of the signals that end their launcher: a Ctrl-C in the terminal,
`timeout`'s SIGTERM, an out-of-memory kill. An H200 run (c1f183a) left one such orphan: its
launcher stopped by a queue's time limit, a max-autotune trial went on compiling and then timed
its steps for eight minutes on the GPU while the next benchmark measured there. So each trial
watches for its launcher (KILN_LAUNCHER_PID, and its own parent) and, when either is gone,
ends itself and, where it leads its process group, that group (its compile workers).

The launcher's side: a trial waited on in this process's main thread is ended when a Ctrl-C
interrupts the wait (runner.launch.trial_process). Trials waited on in a pool's threads are
not interrupted by it, and the pool's shutdown would wait for them to finish (minutes of
compiling), so the pool calls `stop_trials()` on its way out and each waiting thread ends its
trial and raises `TrialsStopped`.
"""

from __future__ import annotations

import os
import signal
import threading
import time

LAUNCHER_ENV = "KILN_LAUNCHER_PID"
POLL_S = 0.5


def launcher_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a trial process this process launches: it names this process, and
    imports what this process can (import_path.py)."""
    from torchkiln.runner.launch.import_path import caller_path

    env[LAUNCHER_ENV] = str(os.getpid())
    env["PYTHONPATH"] = caller_path(env.get("PYTHONPATH"))
    return env


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user holds the number now: ours is gone
        return False
    return True


def launcher_gone(launcher: int | None, parent: int) -> bool:
    """The parent changed (this process was re-parented: its parent died, even unreaped) or
    the launcher named in the environment (a torchrun rank's grandparent) no longer exists."""
    return os.getppid() != parent or (launcher is not None and not alive(launcher))


def end_self() -> None:
    """SIGKILL to this process's group where it leads it (a trial started in its own session:
    its compile workers go with it), else to this process alone (a rank in torchrun's group,
    which notices its ranks ending and exits)."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def exit_with_launcher(poll_s: float = POLL_S) -> threading.Thread | None:
    """Starts a daemon thread that ends this process once its launcher is gone; None when
    this process was not launched by kiln (no KILN_LAUNCHER_PID: run by hand)."""
    named = os.environ.get(LAUNCHER_ENV)
    if not named:
        return None
    launcher, parent = int(named), os.getppid()

    def watch() -> None:
        while not launcher_gone(launcher, parent):
            time.sleep(poll_s)
        end_self()

    thread = threading.Thread(target=watch, name="kiln-launcher-watch", daemon=True)
    thread.start()
    return thread


class TrialsStopped(BaseException):
    """Raised in a thread waiting on a trial once `stop_trials()` was called: the trial has
    been ended. A BaseException, like the KeyboardInterrupt it follows, so that no handler
    turning a trial's failure into a status records it as the trial's own."""


_stop = threading.Event()


def stop_trials() -> None:
    """Every trial this process is waiting on is to be ended now (see TrialsStopped)."""
    _stop.set()


def trials_may_run() -> None:
    """After a stop, once its threads have ended: later trials run again (an interactive
    session that caught the Ctrl-C goes on)."""
    _stop.clear()


def stopping() -> bool:
    return _stop.is_set()
