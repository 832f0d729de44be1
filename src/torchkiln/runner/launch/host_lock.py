"""One host, several trials: timed phases run only while no other trial is busy on the host.

Trials run side by side, one per GPU, still share the host's cores, clocks and caches, and a
compile keeps every core busy for tens of seconds, so the pool takes turns: every pooled trial
holds a shared lock on one file while it is busy (importing, building, compiling, checking)
and an exclusive one while it times its reps. Reps are never taken while another trial works,
and compiles still overlap each other. A trial holds at most one lock at a time and releases it
between phases, so no two trials can wait on each other. Every lock is taken through a second
file, the turnstile, which a trial waiting for its timed turn holds: a neighbour finishing a
phase then waits for that turn instead of starting its next phase, so the wait is for the
neighbour's current phase, not for all of its work. (Before commit c137b97 a trial kept its shared
lock from one shared phase to the next, so a trial waiting for its timed turn waited for all of
its neighbour's build, compile, warm-up and checks; on two H200s a bert-base whole-step trial
spent 99 s of its 205 s waiting and was stopped by the search's share of the budget.)
Time spent waiting is its own phase
(`host_wait` in the trial's `phase_s`), never part of the phase that follows: a compile's
measured time does not include a wait for the lock, nor does the trial's time limit count it
(WAITING_SUFFIX). (On two H200s, at commit 8399fa1, a host-bound
variant read 2.60-4.97 ms over four runs with different neighbours and hosts, so what a
neighbour costs was not isolated; the turns make the question moot for the reps.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

HOST_LOCK_ENV = "KILN_HOST_LOCK"
# Set by a user (or a benchmark) running several kiln processes on one host: each process's
# trials take turns on this file as a pool's do, and its diagnosis subprocesses (profile,
# explain) hold a shared turn while they run, so no process times its reps while another
# compiles. Removed from every child's environment: a nested run takes no turns.
HOST_TURNS_ENV = "KILN_HOST_TURNS"
# The turnstile beside the lock file: path + this suffix.
TURNSTILE_SUFFIX = ".turn"
# Appended to the phase a trial writes for its parent while it waits for its turn: the parent's
# clock for the trial's own time limit stops meanwhile (launch._spawn). At 94c62e6, bert-base
# training on two H200s: a regional-compile trial waited ~60 s for its neighbour's whole-step
# compile, and that wait, counted against its 125 s cap, stopped it in its timed reps.
WAITING_SUFFIX = " (waiting for the host)"
# A wait for a turn shorter than this (an uncontended lock) gets no interval of its own in a
# phase record (``phase_at``); its seconds still count in ``host_wait``.
WAIT_SHOWN_S = 0.001
# Phases whose timing is the result: the paired reps. Warm-up runs before them under the shared
# lock (its steps are not the result, and a compiled baseline's warm-up may compile).
TIMED_PHASES = frozenset({"measure", "measure_baseline"})
# Phases that hold no lock: the trial is finished.
IDLE_PHASES = frozenset({"done"})
# Compiles: a trial waiting for its timed turn waits for them without holding the turnstile, so
# the others may start phases (and compiles) meanwhile; at most the pool's compile slots run at
# once. On an H200, GPT-2 tunes at 80a1fc3 (tune_speed/h200): while one max-autotune compile ran
# (83 and 96 s), three trials that had compiled waited for their timed turn holding every
# other trial at its next phase; each wait was one long compile, paid twice in a tune.
COMPILE_PHASES = frozenset({"first_call", "correctness_compile"})
# Beside the lock file: held shared by every trial compiling now.
COMPILING_SUFFIX = ".compiling"
# Held shared by every trial waiting for its timed turn, until it holds the turnstile.
WRITERS_SUFFIX = ".writers"
# The number of compiles the pool allows at once (a file the pool writes), and one lock file
# per compile slot.
SLOTS_SUFFIX = ".slots"
SLOT_SUFFIX = ".compile-slot-"
# Beside each slot's lock: what its holder is doing, "<state> <pid>" (pause_compile).
STATE_SUFFIX = ".state"
COMPILING, PAUSABLE, PAUSED = "compiling", "pausable", "paused"
POLL_S = 0.01
# A trial whose compile ends while trials wait for their timed turn lets them take it first:
# it waits until they hold the turnstile, at most this long (they may be waiting for another
# trial's compile, which it need not wait out).
YIELD_MAX_S = 1.0


def lock_mode(phase: str) -> int | None:
    """The flock mode a phase holds: exclusive for timed phases, none when done, else shared."""
    if phase in TIMED_PHASES:
        return fcntl.LOCK_EX
    if phase in IDLE_PHASES:
        return None
    return fcntl.LOCK_SH


class HostLock:
    """The trial's side of the pool's lock file (HOST_LOCK_ENV). `enter(phase)` releases what
    the previous phase held, takes what this one needs, and returns the seconds it waited."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.turn_fd = os.open(path + TURNSTILE_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
        self.compiling_fd = os.open(path + COMPILING_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
        self.writers_fd = os.open(path + WRITERS_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
        self.slots = compile_slots(path)
        self.slot_fd: int | None = None
        self.slot: int | None = None
        self.compiling = False
        self.mode: int | None = None

    @classmethod
    def from_env(cls) -> HostLock | None:
        path = os.environ.get(HOST_LOCK_ENV)
        return cls(path) if path else None

    def enter(self, phase: str) -> float:
        """Release the last phase's turn and take this one's; the seconds waited. A compile
        takes a compile slot and marks itself compiling; a timed phase waits, without holding
        the turnstile, until nothing compiles, then takes its turn as any phase does."""
        mode = lock_mode(phase)
        compile_phase = phase in COMPILE_PHASES
        if not (compile_phase or self.compiling) and mode == self.mode and mode != fcntl.LOCK_SH:
            return 0.0  # one timed phase to the next (or done to done): the turn is kept
        t0 = time.perf_counter()
        was_compiling = self.compiling
        self.hold(None)
        self._end_compile()
        if was_compiling:
            self._yield_to_writers()
        if compile_phase:
            self._take_slot()
            fcntl.flock(self.compiling_fd, fcntl.LOCK_SH)
            self.compiling = True
        elif mode == fcntl.LOCK_EX:
            return time.perf_counter() - t0 + self._timed_turn()
        self.hold(mode)
        return time.perf_counter() - t0

    def mark_pausable(self) -> None:
        """Say that this trial's compile stops at points where it may pause (pause_compile):
        a neighbour's pause then waits for it instead of giving up."""
        if self.compiling and self.slot is not None:
            self._set_state(PAUSABLE)

    def pause_compile(self, max_s: float) -> float:
        """At a point inside a compile where this trial runs nothing (max-autotune between two
        rounds of its benchmarks: runner/protocol/compile_pause.py), let the trials waiting for
        their timed turn take it, when every other compile in flight may pause too (a compile
        that cannot holds them anyway). Releases the compile's turn and its mark as compiling,
        keeps its compile slot, waits until no trial waits for its timed turn any more (each
        holds the turnstile: it times next) or a compile that cannot pause starts, at most
        ``max_s``, then takes the compile's turn again, after their reps. Returns the seconds
        paused: 0 when nothing waits, the pool sets no compile slots (their states are how
        compiles are known) or this trial is not compiling."""
        if not self.may_pause():
            return 0.0
        t0 = time.perf_counter()
        self._set_state(PAUSED)
        fcntl.flock(self.compiling_fd, fcntl.LOCK_UN)
        self.hold(None)
        deadline = time.monotonic() + max_s
        while trials_wait_for_compiles(self.path) and time.monotonic() < deadline:
            if self._unpausable_compile():
                break
            time.sleep(POLL_S)
        fcntl.flock(self.compiling_fd, fcntl.LOCK_SH)
        self._set_state(PAUSABLE)
        self.hold(fcntl.LOCK_SH)
        return time.perf_counter() - t0

    def may_pause(self) -> bool:
        """Whether a pause now would let a trial time its reps: this trial compiles in a pool
        with compile slots, a trial waits for its timed turn, and every other compile in flight
        may pause too."""
        if self.slot is None or not self.compiling or not trials_wait_for_compiles(self.path):
            return False
        return not self._unpausable_compile()

    def _set_state(self, state: str) -> None:
        with open(f"{self.path}{SLOT_SUFFIX}{self.slot}{STATE_SUFFIX}", "w") as f:
            f.write(f"{state} {os.getpid()}\n" if state else "")

    def _unpausable_compile(self) -> bool:
        """Whether another trial holds a compile slot without having said it may pause."""
        return COMPILING in slot_states(self.path, skip=self.slot)

    def _timed_turn(self) -> float:
        """Wait until no trial compiles, holding nothing the others need (a compile may start
        meanwhile: it is waited for too), then take the turnstile and the exclusive lock."""
        t0 = time.perf_counter()
        fcntl.flock(self.writers_fd, fcntl.LOCK_SH)
        try:
            fcntl.flock(self.compiling_fd, fcntl.LOCK_EX)
            fcntl.flock(self.compiling_fd, fcntl.LOCK_UN)
            fcntl.flock(self.turn_fd, fcntl.LOCK_EX)
        finally:
            fcntl.flock(self.writers_fd, fcntl.LOCK_UN)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        finally:
            fcntl.flock(self.turn_fd, fcntl.LOCK_UN)
        self.mode = fcntl.LOCK_EX
        return time.perf_counter() - t0

    def _yield_to_writers(self) -> None:
        """After a compile: while trials wait for their timed turn (their compile was perhaps
        the last they waited for), let them reach the turnstile first, for at most
        YIELD_MAX_S."""
        deadline = time.monotonic() + YIELD_MAX_S
        while True:
            try:
                fcntl.flock(self.writers_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(POLL_S)
                continue
            fcntl.flock(self.writers_fd, fcntl.LOCK_UN)
            return

    def _take_slot(self) -> None:
        """One of the pool's compile slots, when it set a number (else none is needed)."""
        if not self.slots:
            return
        while True:
            for i in range(self.slots):
                fd = os.open(f"{self.path}{SLOT_SUFFIX}{i}", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self.slot_fd, self.slot = fd, i
                self._set_state(COMPILING)
                return
            time.sleep(POLL_S * 5)

    def _end_compile(self) -> None:
        if self.compiling:
            fcntl.flock(self.compiling_fd, fcntl.LOCK_UN)
            self.compiling = False
        if self.slot_fd is not None:
            self._set_state("")
            os.close(self.slot_fd)  # closing it drops its lock
            self.slot_fd, self.slot = None, None

    def hold(self, mode: int | None) -> float:
        """Take ``mode`` (fcntl.LOCK_EX for timed work, LOCK_SH for other work, None for
        nothing), releasing what was held; returns the seconds waited. For a process whose
        phases are not a trial's (the profile worker's timed steps)."""
        if mode == self.mode and mode != fcntl.LOCK_SH:
            return 0.0  # one timed phase to the next (or done to done): the turn is kept
        if self.mode is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.mode = None
        if mode is None:
            return 0.0
        t0 = time.perf_counter()
        # Through the turnstile: held while this trial waits, so that, when it waits for its
        # timed turn, no neighbour starts another phase meanwhile. Nothing waits on the
        # turnstile while holding the lock file, so no two trials wait on each other.
        fcntl.flock(self.turn_fd, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.fd, mode)
        finally:
            fcntl.flock(self.turn_fd, fcntl.LOCK_UN)
        self.mode = mode
        return time.perf_counter() - t0

    def close(self) -> None:
        self._end_compile()
        for fd in (self.fd, self.turn_fd, self.compiling_fd, self.writers_fd):
            os.close(fd)  # closing the descriptor drops any lock it holds
        self.mode = None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs, as another user
    return True


def compile_slots(path: str) -> int | None:
    """The compiles the pool of ``path`` allows at once (None: no limit)."""
    try:
        n = int(open(path + SLOTS_SUFFIX).read().strip())
    except (OSError, ValueError):
        return None
    return n if n > 0 else None


def set_compile_slots(path: str, n: int) -> None:
    """Allow ``n`` compiles at once among the trials taking turns on ``path``."""
    with open(path + SLOTS_SUFFIX, "w") as f:
        f.write(f"{n}\n")


def slot_states(path: str, skip: int | None = None) -> list[str]:
    """What the living holders of the pool's compile slots (but slot ``skip``) are doing:
    COMPILING, PAUSABLE or PAUSED. A released slot's state is empty; a trial killed while
    compiling leaves its state behind, read as nothing."""
    states = []
    for i in range(compile_slots(path) or 0):
        if i == skip:
            continue
        try:
            state, pid = open(f"{path}{SLOT_SUFFIX}{i}{STATE_SUFFIX}").read().split()
        except (OSError, ValueError):
            continue  # never used, or released: an empty file
        if _alive(int(pid)):
            states.append(state)
    return states


def every_compile_pauses(path: str) -> bool:
    """Whether every compile in flight among the trials taking turns on ``path`` has said it
    pauses for waiting trials (HostLock.mark_pausable): they then time their reps at its next
    pause point. False when the pool sets no compile slots or none is held."""
    states = slot_states(path)
    return bool(states) and COMPILING not in states


def trials_wait_for_compiles(path: str) -> bool:
    """Whether any trial taking turns on ``path`` is waiting for its timed turn (for the
    compiles to end): it holds the writers file shared while it waits."""
    try:
        fd = os.open(path + WRITERS_SUFFIX, os.O_RDWR)
    except OSError:
        return False  # no trial has waited yet: the file is made by the first
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False


def host_turns() -> str | None:
    """The lock file of the processes sharing this host (HOST_TURNS_ENV), if any."""
    return os.environ.get(HOST_TURNS_ENV) or None


@contextlib.contextmanager
def shared_turn(path: str | None, *, timed: bool = False) -> Iterator[float]:
    """Hold a shared turn on ``path`` (no-op for None) while a block runs a busy subprocess,
    or with ``timed`` an exclusive one (a stream replay, whose compiles and timed items
    interleave, so the whole run is timed); yields the seconds waited for it."""
    if path is None:
        yield 0.0
        return
    lock = HostLock(path)
    try:
        yield lock.enter("measure" if timed else "busy")
    finally:
        lock.close()


def remove_lock_files(path: str) -> None:
    """Remove the pool's lock file, its turnstile and the files beside them (the pool's own
    cleanup)."""
    slots = compile_slots(path) or 0
    beside = (TURNSTILE_SUFFIX, COMPILING_SUFFIX, WRITERS_SUFFIX, SLOTS_SUFFIX)
    per_slot = [f"{path}{SLOT_SUFFIX}{i}{end}" for i in range(slots) for end in ("", STATE_SUFFIX)]
    files = [path, *(path + s for s in beside), *per_slot]
    for p in files:
        if os.path.exists(p):
            os.unlink(p)
