"""Pooled trials take turns on the host: timed reps never overlap another trial's work."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchkiln.runner.launch.host_lock import HOST_LOCK_ENV, HostLock, lock_mode
from torchkiln.runner.launch.trial_process import run_trial
from torchkiln.runner.protocol.trial import TrialSpec

ROOT = Path(__file__).resolve().parents[1]

# A stand-in trial: walks the phases it is given through the worker's Phases with the pool's
# lock, recording when each phase held the host (after any wait) and when it ended.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    from torchkiln.runner.launch.host_lock import HostLock
    from torchkiln.runner.protocol.worker import Phases

    plan = json.loads(sys.argv[1])
    time.sleep(plan["delay"])
    lock = HostLock.from_env()
    lock.enter("start")
    phases = Phases(None, None, lock)
    spans = []
    pauses = []
    # [name, seconds] or, for a compile that stops at pause points (max-autotune's rounds),
    # [name, seconds a round, rounds]: a pause point between rounds.
    for name, hold, *rounds in plan["phases"]:
        phases(name)
        for i in range(rounds[0] if rounds else 1):
            if i:
                before = phases.paused_s
                phases.pause()
                if phases.paused_s > before:
                    # From when the pause began (after its checks) to now.
                    end = time.monotonic()
                    pauses.append([end - (phases.paused_s - before), end])
            t0 = time.monotonic()
            time.sleep(hold)
            spans.append([name, t0, time.monotonic()])
    phases("done")
    print(json.dumps({"spans": spans, "host_wait": phases.seconds.get("host_wait", 0.0),
                      "pauses": pauses, "paused_s": phases.paused_s}))
    """
)


def _start(lock_path: Path, plan: dict) -> subprocess.Popen:
    env = {**os.environ, HOST_LOCK_ENV: str(lock_path), "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(plan)], env=env, stdout=subprocess.PIPE, text=True
    )


def test_timed_phases_are_exclusive_and_the_rest_shared():
    assert lock_mode("measure") == lock_mode("measure_baseline") == fcntl.LOCK_EX
    for phase in ("start", "setup", "build", "first_call", "warmup", "baseline", "correctness"):
        assert lock_mode(phase) == fcntl.LOCK_SH
    assert lock_mode("done") is None


def test_two_trials_never_time_reps_while_the_other_works(tmp_path):
    lock = tmp_path / "host.lock"
    # A compiles for 1.5 s then measures; B, started while A compiles, wants to measure at once.
    a = _start(lock, {"delay": 0.0, "phases": [["first_call", 1.5], ["measure", 0.5]]})
    b = _start(lock, {"delay": 0.5, "phases": [["measure", 0.5], ["correctness", 0.2]]})
    out_a, out_b = (json.loads(p.communicate(timeout=60)[0]) for p in (a, b))
    _never_beside(_spans({"a": out_a, "b": out_b}))
    # B's reps waited for A's compile to end (it asked ~1 s before): the wait is its own phase.
    b_measure = next(s for s in out_b["spans"] if s[0] == "measure")
    a_compile = next(s for s in out_a["spans"] if s[0] == "first_call")
    assert b_measure[1] >= a_compile[2]
    assert out_b["host_wait"] > 0.5


def test_compiles_overlap_each_other(tmp_path):
    # Shared phases do not wait on each other: the pool's compiles still run side by side.
    lock = tmp_path / "host.lock"
    procs = [_start(lock, {"delay": 0.0, "phases": [["first_call", 1.0]]}) for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    (_, a0, a1), (_, b0, b1) = outs[0]["spans"][0], outs[1]["spans"][0]
    assert a0 < b1 and b0 < a1


def test_a_lock_is_released_between_phases_and_when_closed(tmp_path):
    path = tmp_path / "host.lock"
    lock = HostLock(str(path))
    lock.enter("measure")
    probe = os.open(path, os.O_RDWR)
    with pytest.raises(BlockingIOError):
        fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
    lock.enter("build")  # exclusive -> shared: another shared holder may now enter
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
    fcntl.flock(probe, fcntl.LOCK_UN)
    lock.close()
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nothing held any more
    os.close(probe)


def test_a_pooled_trial_records_its_wait_for_the_host(tmp_path):
    spec = TrialSpec(
        "tests/fixtures/workloads.py:tiny_mlp", "eager", preset="tiny", index=0, reps=3,
        rep_ms=5.0, warmup_s=0.0, warmup_steps=2, check_accuracy=False,
    )  # fmt: skip
    result = run_trial(spec, tmp_path / "t", timeout_s=120, host_lock=str(tmp_path / "h.lock"))
    assert result["status"] == "ok", result.get("reason")
    assert result["phase_s"]["host_wait"] >= 0.0  # the worker took turns through the file
    alone = run_trial(spec, tmp_path / "u", timeout_s=120)
    assert "host_wait" not in alone["phase_s"]


def test_a_trial_waiting_for_its_timed_turn_waits_for_one_phase_not_all(tmp_path):
    # A works through three shared phases; B asks for its timed turn during A's first. B
    # measures as soon as that phase ends and A's next phase waits for B's reps: without the
    # turnstile A held the host through all three (2.2 s) and B waited for every one.
    lock = tmp_path / "host.lock"
    a = _start(lock, {"delay": 0.0, "phases": [["first_call", 1.0], ["warmup", 1.0],
                                                ["correctness", 0.2]]})  # fmt: skip
    b = _start(lock, {"delay": 0.3, "phases": [["measure", 0.4]]})
    out_a, out_b = (json.loads(p.communicate(timeout=60)[0]) for p in (a, b))
    spans_a = {name: (t0, t1) for name, t0, t1 in out_a["spans"]}
    (_, m0, m1), = out_b["spans"]  # fmt: skip
    assert spans_a["first_call"][1] <= m0  # still never beside A's work
    assert m1 <= spans_a["warmup"][0]  # A's next phase waited for B's reps
    assert out_b["host_wait"] < 1.6  # the rest of A's first phase, not A's 2.2 s of work
    assert out_a["host_wait"] >= 0.3  # A waited out B's reps


def test_the_pool_removes_its_lock_file_and_turnstile(tmp_path):
    from torchkiln.runner.launch.host_lock import TURNSTILE_SUFFIX, remove_lock_files

    path = str(tmp_path / "host.lock")
    lock = HostLock(path)
    lock.enter("build")
    lock.close()
    assert os.path.exists(path + TURNSTILE_SUFFIX)
    remove_lock_files(path)
    assert not os.path.exists(path) and not os.path.exists(path + TURNSTILE_SUFFIX)


def test_processes_sharing_a_host_take_turns_through_kiln_host_turns(tmp_path, monkeypatch):
    # KILN_HOST_TURNS: a run's trials take turns on the file as a pool's do (their host_wait
    # is recorded), and a diagnosis subprocess runs holding a shared turn, which an exclusive
    # (timed) turn elsewhere cannot take meanwhile; neither child sees the variable.
    from torchkiln.diagnose._subproc import run_module
    from torchkiln.runner.launch.host_lock import HOST_TURNS_ENV

    turns = str(tmp_path / "turns.lock")
    monkeypatch.setenv(HOST_TURNS_ENV, turns)
    spec = TrialSpec(
        "tests/fixtures/workloads.py:tiny_mlp", "eager", preset="tiny", index=0, reps=3,
        rep_ms=5.0, warmup_s=0.0, warmup_steps=2, check_accuracy=False,
    )  # fmt: skip
    result = run_trial(spec, tmp_path / "t", timeout_s=120)
    assert result["status"] == "ok", result.get("reason")
    assert "host_wait" in result["phase_s"]

    (tmp_path / "probe_turn.py").write_text(
        textwrap.dedent(
            f"""
            import fcntl, json, os
            fd = os.open({turns!r}, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                exclusive = True
            except BlockingIOError:
                exclusive = False
            print(json.dumps({{"exclusive": exclusive, "env": os.environ.get({HOST_TURNS_ENV!r})}}))
            """
        )
    )
    proc = run_module("probe_turn", [], timeout=60, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"exclusive": False, "env": None}
    fd = os.open(turns, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the turn ended with the subprocess
    os.close(fd)


def test_a_phase_hands_its_turn_on_only_once_its_gpu_work_is_done(monkeypatch):
    # Trials sharing one GPU: kernels a phase queued must not run beside a neighbour's reps.
    from torchkiln.runner.protocol import worker

    calls: list[str] = []

    class Lock:
        def enter(self, phase: str) -> float:
            calls.append(f"enter {phase}")
            return 0.0

    monkeypatch.setattr(worker, "device_idle", lambda: calls.append("idle"))
    phases = worker.Phases(None, lock=Lock())
    phases("warmup")
    phases("measure")
    assert calls == ["idle", "enter warmup", "idle", "enter measure"]
    calls.clear()
    worker.Phases(None)("measure")  # a trial alone takes no turns and waits for nothing
    assert calls == []


def test_a_search_with_several_slots_takes_its_turns_on_the_shared_file(tmp_path, monkeypatch):
    # With KILN_HOST_TURNS set, the search's in-flight trials take turns on that file (with
    # the other kiln processes of the host), not on a private one, and it is left in place.
    from torchkiln.runner.launch import executors
    from torchkiln.runner.launch.host_lock import HOST_TURNS_ENV

    turns = tmp_path / "turns.lock"
    turns.write_text("")
    monkeypatch.setenv(HOST_TURNS_ENV, str(turns))
    specs = [TrialSpec("w.py:f", f"v{i}", index=i) for i in range(3)]
    seen: list[str | None] = []

    def run_one(spec, gpu, host_lock=None):
        seen.append(host_lock)
        return {"status": "ok", "variant": spec.variant}

    done: list[str] = []
    items = iter([(s.variant, s) for s in specs])
    executors.stream([None, None], lambda: next(items, None), run_one, lambda t, r: done.append(t))
    assert sorted(done) == ["v0", "v1", "v2"]
    assert seen == [str(turns)] * 3
    assert turns.exists()


def test_a_timed_turn_is_exclusive_and_a_busy_one_shared(tmp_path):
    # a stream replay (timed) shuts every other turn out; a diagnosis subprocess (busy) only
    # a timed one
    from torchkiln.runner.launch.host_lock import shared_turn

    path = str(tmp_path / "turns.lock")

    def can(mode: int) -> bool:
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    with shared_turn(path, timed=True):
        assert not can(fcntl.LOCK_SH) and not can(fcntl.LOCK_EX)
    with shared_turn(path):
        assert can(fcntl.LOCK_SH) and not can(fcntl.LOCK_EX)
    assert can(fcntl.LOCK_EX)


def _spans(outs: dict) -> list:
    return [(who, *s) for who, out in outs.items() for s in out["spans"]]


def _never_beside(spans: list) -> None:
    """No trial's timed reps overlap anything another trial did."""
    for who, name, t0, t1 in spans:
        if name != "measure":
            continue
        for other, other_name, u0, u1 in spans:
            if other != who:
                assert t1 <= u0 or u1 <= t0, f"{who}'s reps overlapped {other}'s {other_name}"


def test_a_compile_may_start_while_a_trial_waits_for_its_timed_turn(tmp_path):
    # A compiles for 2.5 s; B asks for its timed turn at 0.3 s; C starts a compile at 0.8 s. B
    # waits for compiles without holding the turnstile, so C compiles beside A (one wait for B
    # instead of two, one after the other), and B times its reps once both are done.
    lock = tmp_path / "host.lock"
    a = _start(lock, {"delay": 0.0, "phases": [["first_call", 2.5]]})
    b = _start(lock, {"delay": 0.3, "phases": [["measure", 0.3]]})
    c = _start(lock, {"delay": 0.8, "phases": [["build", 0.05], ["first_call", 0.5]]})
    procs = {"a": a, "b": b, "c": c}
    outs = {k: json.loads(p.communicate(timeout=60)[0]) for k, p in procs.items()}
    spans = _spans(outs)
    _never_beside(spans)
    a_compile = next(s for s in outs["a"]["spans"] if s[0] == "first_call")
    c_compile = next(s for s in outs["c"]["spans"] if s[0] == "first_call")
    (b_measure,) = outs["b"]["spans"]
    assert c_compile[1] < a_compile[2]  # C compiled beside A: B's wait did not hold it back
    assert b_measure[1] >= max(a_compile[2], c_compile[2])


def test_no_more_compiles_run_at_once_than_the_pool_allows(tmp_path):
    from torchkiln.runner.launch.host_lock import compile_slots, set_compile_slots

    for slots, beside in ((1, False), (2, True)):
        lock = tmp_path / f"host{slots}.lock"
        set_compile_slots(str(lock), slots)
        assert compile_slots(str(lock)) == slots
        procs = [_start(lock, {"delay": 0.0, "phases": [["first_call", 0.8]]}) for _ in range(2)]
        (_, a0, a1), (_, b0, b1) = (json.loads(p.communicate(timeout=60)[0])["spans"][0]
                                    for p in procs)  # fmt: skip
        assert (a0 < b1 and b0 < a1) is beside


def test_the_pool_removes_every_file_beside_its_lock(tmp_path):
    from torchkiln.runner.launch.host_lock import remove_lock_files, set_compile_slots

    path = str(tmp_path / "host.lock")
    set_compile_slots(path, 2)
    lock = HostLock(path)
    lock.enter("first_call")
    lock.enter("measure")
    lock.close()
    assert len(list(tmp_path.iterdir())) >= 5
    remove_lock_files(path)
    assert list(tmp_path.iterdir()) == []


def test_many_trials_with_compile_slots_all_finish_and_never_time_beside_work(tmp_path):
    import random

    from torchkiln.runner.launch.host_lock import set_compile_slots

    lock = tmp_path / "host.lock"
    set_compile_slots(str(lock), 2)
    rng = random.Random(7)
    kinds = ["build", "first_call", "warmup", "measure", "correctness", "correctness_compile"]
    plans = [
        {"delay": rng.uniform(0, 0.3),
         "phases": [[rng.choice(kinds), rng.uniform(0.02, 0.25)] for _ in range(8)]}
        for _ in range(6)
    ]  # fmt: skip
    procs = {str(i): _start(lock, plan) for i, plan in enumerate(plans)}
    outs = {k: json.loads(p.communicate(timeout=120)[0]) for k, p in procs.items()}
    spans = _spans(outs)
    _never_beside(spans)
    compiling = ("first_call", "correctness_compile")
    compiles = [(t0, t1) for _, name, t0, t1 in spans if name in compiling]
    for t0, _ in compiles:  # never more than two compiling at once
        assert sum(u0 <= t0 < u1 for u0, u1 in compiles) <= 2


def _rounds(out: dict, name: str = "first_call") -> list:
    return [s for s in out["spans"] if s[0] == name]


def _pool(tmp_path, slots: int, plans: dict) -> dict:
    """Stand-in trials started together on a pool with ``slots`` compile slots: each one's
    output, once all have ended; none timed its reps beside another's work."""
    from torchkiln.runner.launch.host_lock import set_compile_slots

    lock = tmp_path / "host.lock"
    set_compile_slots(str(lock), slots)
    procs = {who: _start(lock, plan) for who, plan in plans.items()}
    outs = {who: json.loads(p.communicate(timeout=60)[0]) for who, p in procs.items()}
    _never_beside(_spans(outs))
    return outs


def test_a_pausable_compile_lets_a_waiting_trial_time_its_reps_between_rounds(tmp_path):
    # A compiles in 30 rounds of 0.2 s with a pause point between rounds; B wants its timed
    # turn soon after A starts.
    outs = _pool(
        tmp_path,
        2,
        {
            "a": {"delay": 0.0, "phases": [["first_call", 0.2, 30]]},
            "b": {"delay": 0.5, "phases": [["measure", 0.3]]},
        },
    )
    (b_measure,) = outs["b"]["spans"]
    # B timed its reps inside one of A's pauses, not after A's whole compile.
    assert b_measure[2] < _rounds(outs["a"])[-1][1]
    assert any(p0 <= b_measure[1] and b_measure[2] <= p1 for p0, p1 in outs["a"]["pauses"])
    # The pause is A's wait for the host: it lasted at least B's reps, and is not compile time.
    assert outs["a"]["host_wait"] >= b_measure[2] - b_measure[1]
    assert outs["a"]["paused_s"] >= b_measure[2] - b_measure[1]


def test_a_compile_with_nothing_waiting_never_pauses(tmp_path):
    out = _pool(tmp_path, 2, {"a": {"delay": 0.0, "phases": [["first_call", 0.05, 10]]}})["a"]
    assert out["pauses"] == [] and out["paused_s"] == 0.0


def test_a_compile_that_cannot_pause_holds_the_pausable_one_to_its_rounds(tmp_path):
    # C compiles for 2 s without pause points: B's timed turn waits for it whatever A does,
    # so A does not pause (for nothing) until C is done, then lets B through.
    outs = _pool(
        tmp_path,
        3,
        {
            "a": {"delay": 0.0, "phases": [["first_call", 0.2, 40]]},
            "c": {"delay": 0.0, "phases": [["first_call", 2.0]]},
            "b": {"delay": 0.5, "phases": [["measure", 0.3]]},
        },
    )
    (c_compile,) = outs["c"]["spans"]
    (b_measure,) = outs["b"]["spans"]
    assert outs["a"]["pauses"], "A never let B through"
    # A may have paused before C began, when B alone waited (C's process can start late on a
    # busy host); then it resumed on seeing C compile, before C was done. It never began a
    # pause while C compiled.
    # A pause's start is stamped just before the lock reads C's state (a file read, well under
    # 5 ms), and C's end just before C writes it: a pause that began as C ended may read a hair
    # earlier than C's end.
    stamps = 0.005
    for p0, p1 in outs["a"]["pauses"]:
        assert p0 < c_compile[1] or p0 >= c_compile[2] - stamps, (p0, p1, c_compile)
        if p0 < c_compile[1] < p1:
            assert p1 < c_compile[2], (p0, p1, c_compile)
    assert b_measure[2] < _rounds(outs["a"])[-1][1]


def test_two_pausable_compiles_pause_together_for_a_waiting_trial(tmp_path):
    # Rounds of different lengths: the waiter gets its turn once both reach a pause point.
    outs = _pool(
        tmp_path,
        2,
        {
            "a1": {"delay": 0.0, "phases": [["first_call", 0.2, 30]]},
            "a2": {"delay": 0.1, "phases": [["first_call", 0.3, 20]]},
            "b": {"delay": 0.6, "phases": [["measure", 0.3]]},
        },
    )
    (b_measure,) = outs["b"]["spans"]
    for who in ("a1", "a2"):
        assert b_measure[2] < _rounds(outs[who])[-1][1]
        assert outs[who]["paused_s"] > 0.0


def test_a_paused_compile_keeps_its_compile_slot(tmp_path):
    # One slot: D, which starts its compile while A is paused for B, still waits for A's
    # whole compile (A resumes its compile where it stopped, not behind D's).
    outs = _pool(
        tmp_path,
        1,
        {
            "a": {"delay": 0.0, "phases": [["first_call", 0.2, 15]]},
            "b": {"delay": 0.5, "phases": [["measure", 0.5]]},
            "d": {"delay": 0.7, "phases": [["first_call", 0.2]]},
        },
    )
    (d_compile,) = outs["d"]["spans"]
    assert d_compile[1] >= _rounds(outs["a"])[-1][2]


def test_waiters_behind_compiles_that_all_pause_are_not_blocked(tmp_path):
    from torchkiln.runner.launch.host_lock import every_compile_pauses, set_compile_slots
    from torchkiln.runner.launch.trial_process import blocked_waiters

    path = str(tmp_path / "host.lock")
    assert not every_compile_pauses(path)  # no slots: no compile is known to pause
    set_compile_slots(path, 2)
    assert not every_compile_pauses(path)  # none in flight
    a, b = HostLock(path), HostLock(path)
    a.enter("first_call")
    assert not every_compile_pauses(path)  # A has not said it pauses
    a.mark_pausable()
    assert every_compile_pauses(path)
    b.enter("first_call")
    assert not every_compile_pauses(path)  # B's compile holds waiters whatever A does
    b.enter("warmup")
    assert every_compile_pauses(path)
    # A trial waiting for its timed turn behind A alone is not blocked: A lets it through.
    waiter = HostLock(path)
    fcntl.flock(waiter.writers_fd, fcntl.LOCK_SH)  # what a trial holds while it waits
    assert not blocked_waiters(path)
    a.enter("warmup")  # A's compile ended: its slot's state is cleared
    b.enter("first_call")
    assert blocked_waiters(path)
    for lock in (a, b, waiter):
        lock.close()
