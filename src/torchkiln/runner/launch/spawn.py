"""The one way kiln starts and ends a child process: the trial runner, the distributed launcher
and the diagnose subprocesses all spawn through here.

Every child runs in a session of its own, so one signal to its process group reaches the
compile workers Inductor forks (and torchrun's ranks). The same session puts the child out of
reach of the signals that end kiln (a Ctrl-C in the terminal), so a caller interrupted while it
waits ends the group itself (`ended_on_error`); a child that outlives kiln anyway ends itself
(runner/launch/orphan.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from torchkiln.runner.launch.orphan import TrialsStopped, stopping

# A polite end first (SIGTERM, then this long to exit), then SIGKILL and as long again.
END_GRACE_S = 5.0


def start(
    cmd: list[str],
    *,
    env: Mapping[str, str],
    stdout: IO[Any] | int,
    stderr: IO[Any] | int,
    cwd: str | None = None,
    text: bool = False,
) -> subprocess.Popen:
    """``cmd`` in a new session with no stdin; ``text`` decodes its pipes (errors replaced)."""
    decode: dict[str, Any] = {"text": True, "errors": "replace"} if text else {}
    return subprocess.Popen(
        cmd,
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        **decode,
    )


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the child's whole group, at once; nothing to do when it is gone already."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it and its group had exited: nothing left to end


def end_group(proc: subprocess.Popen, grace_s: float = END_GRACE_S) -> None:
    """End the child's whole group, politely first: SIGTERM, then SIGKILL if it has not exited
    within ``grace_s``, waiting as long again for it to go."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def ended_on_error(
    proc: subprocess.Popen, end: Callable[[subprocess.Popen], None] = end_group
) -> Iterator[subprocess.Popen]:
    """Ends the child's group (``end``) when the body raises anything, a Ctrl-C or a stop
    (orphan.stop_trials) included, and re-raises: the child must not go on running."""
    try:
        yield proc
    except BaseException:
        end(proc)
        raise


def wait_unless_stopped(proc: subprocess.Popen, timeout_s: float, poll_s: float = 0.5) -> bool:
    """True when the child exited within ``timeout_s``; raises TrialsStopped on a stop."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            proc.wait(timeout=min(poll_s, max(0.0, deadline - time.monotonic())))
            return True
        except subprocess.TimeoutExpired:
            if stopping():
                raise TrialsStopped("the run was interrupted") from None
    return proc.poll() is not None
