"""The instrument itself: timer, memory tracker, statistics, correctness rule, kernel count."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from torchkiln.measure import correctness as corr
from torchkiln.measure import host_load
from torchkiln.measure.memory import MemoryTracker
from torchkiln.measure.stats import paired_speedup, summarize, unpaired_speedup
from torchkiln.measure.timer import StepTimer, calibrate_steps, time_round_robin
from torchkiln.runner.protocol.trial import TrialSpec


def test_timer_measures_a_known_sleep():
    # A sleep never returns early, and oversleeps by a little, more on a loaded host (CI's
    # 2 cores during a compile): the bound above catches a timer off by a factor (steps, units).
    ms = StepTimer("cpu").time(lambda: time.sleep(0.02), steps=5)
    assert 19.5 <= ms <= 30.0, ms


def test_first_call_timer_returns_the_output():
    seconds, out = StepTimer("cpu").time_once_s(lambda: (time.sleep(0.01), 7)[1])
    assert out == 7
    assert 0.009 <= seconds <= 0.05


class _FixedTimer:
    """A timer whose one step always takes `ms`: calibrate_steps' arithmetic without the host's
    noise (a real 5 ms sleep read 6 steps for 50 ms on a loaded 2-core CI machine)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def time(self, fn, steps: int) -> float:
        fn()
        return self.ms


def test_calibrate_steps_targets_the_rep_length():
    calls = []
    assert calibrate_steps(_FixedTimer(5.0), lambda: calls.append(1), target_ms=50) == 10
    assert calls == [1]  # one timed call decides it
    assert calibrate_steps(_FixedTimer(7.0), lambda: None, target_ms=50) == 7  # rounded
    assert calibrate_steps(_FixedTimer(80.0), lambda: None, target_ms=50) == 1  # at least one
    assert calibrate_steps(_FixedTimer(0.001), lambda: None, target_ms=50, max_steps=300) == 300
    assert calibrate_steps(_FixedTimer(0.0), lambda: None, target_ms=50, max_steps=40) == 40


def test_memory_tracker_sees_a_known_allocation():
    size = 256 * 2**20
    with MemoryTracker("cpu") as mem:
        block = torch.ones(size // 4, dtype=torch.float32)  # ones() touches every page
        time.sleep(0.05)
        del block
    delta = mem.report.peak_rss_delta_bytes
    assert 0.9 * size <= delta <= 1.15 * size, delta / 2**20


@pytest.mark.gpu
def test_cuda_memory_tracker_sees_a_known_allocation():
    size = 512 * 2**20
    with MemoryTracker("cuda") as mem:
        block = torch.ones(size // 4, device="cuda")
        del block
    assert mem.report.peak_allocated_bytes >= size
    assert mem.report.peak_allocated_bytes <= size + 64 * 2**20
    assert mem.report.peak_reserved_bytes >= mem.report.peak_allocated_bytes


@pytest.mark.gpu
def test_cuda_event_timer_agrees_with_a_synchronised_host_clock():
    timer = StepTimer("cuda")
    work = lambda: torch.cuda._sleep(20_000_000)  # noqa: E731
    work()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        work()
    torch.cuda.synchronize()
    host_ms = (time.perf_counter() - t0) * 1e3 / 5
    event_ms = timer.time(work, 5)
    assert abs(event_ms / host_ms - 1) < 0.10


def test_summary_of_known_samples():
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s.median == 3.0
    assert s.q25 == 2.0 and s.q75 == 4.0 and s.iqr == 2.0
    assert s.n == 5
    assert math.isclose(s.cv, np.std([1, 2, 3, 4, 5], ddof=1) / 3.0)
    assert s.ci95[0] <= 3.0 <= s.ci95[1]
    assert 1.0 <= s.ci95[0] and s.ci95[1] <= 5.0


def test_paired_speedup_of_a_clear_win_is_significant():
    base = [10.0, 10.2, 9.9, 10.1, 10.0, 10.3, 9.8, 10.0]
    var = [5.0, 5.1, 4.9, 5.0, 5.05, 5.1, 4.95, 5.0]
    sp = paired_speedup(base, var)
    assert 1.95 <= sp.median <= 2.05
    assert sp.significant and sp.verdict == "faster"
    assert sp.ci95[0] > 1.9


def test_paired_speedup_of_noise_is_no_significant_difference():
    rng = np.random.default_rng(0)
    base = 10 + rng.normal(0, 0.3, 30)
    var = 10 + rng.normal(0, 0.3, 30)
    sp = paired_speedup(base, var)
    assert sp.ci95[0] <= 1.0 <= sp.ci95[1]
    assert not sp.significant
    assert sp.verdict == "no significant difference"


def test_a_tiny_but_consistent_difference_is_below_the_minimum_effect():
    base = [10.00 + 0.001 * i for i in range(20)]
    var = [b / 1.002 for b in base]  # 0.2% faster, every rep
    sp = paired_speedup(base, var)
    assert sp.ci95[0] > 1.0  # the interval excludes 1 ...
    assert not sp.significant  # ... but 0.2% is below the 1% minimum effect


def test_slower_variant_is_reported_slower():
    sp = paired_speedup([5.0] * 10, [10.0 + 0.01 * i for i in range(10)])
    assert sp.verdict == "slower" and sp.median < 0.51


def _tensors(*values):
    return [(f"t{i}", torch.tensor(v, dtype=torch.float64)) for i, v in enumerate(values)]


def test_correctness_accepts_errors_like_eagers_own():
    ref = _tensors([1.0, 2.0, 3.0])
    eager = _tensors([1.001, 2.0, 3.0])
    variant = _tensors([1.0, 2.0015, 3.0])
    report = corr.compare(variant, eager, ref)
    assert report.passed
    assert report.checks[0].threshold == pytest.approx(
        2.0 * (0.001 / math.sqrt(3)) + 1e-4 * math.sqrt(14 / 3)
    )


def test_correctness_rejects_errors_far_beyond_eagers():
    ref = _tensors([1.0, 2.0, 3.0])
    eager = _tensors([1.001, 2.0, 3.0])
    variant = _tensors([1.1, 2.0, 3.0])
    report = corr.compare(variant, eager, ref)
    assert not report.passed
    assert report.worst_ratio > 10


def test_correctness_rejects_nan_and_shape_changes():
    ref = _tensors([1.0, 2.0])
    assert not corr.compare(_tensors([float("nan"), 2.0]), ref, ref).passed
    assert not corr.compare(_tensors([1.0, 2.0, 3.0]), ref, ref).passed
    assert not corr.compare(_tensors([1.0], [2.0]), ref, ref).passed


def test_flatten_tensors_walks_nested_outputs():
    out = {"logits": torch.ones(2), "hidden": (torch.zeros(1), [torch.ones(3)]), "n": 3}
    names = [n for n, _ in corr.flatten_tensors(out)]
    assert names == ["out.logits", "out.hidden[0]", "out.hidden[1][0]"]


def test_sixteen_bit_rule_admits_moved_rounding_but_not_a_perturbation():
    torch.manual_seed(0)
    ref = torch.randn(4096, dtype=torch.float64) * 25
    eager = ref + 0.134 * torch.randn(4096, dtype=torch.float64)
    compiled = ref + 0.281 * torch.randn(4096, dtype=torch.float64)  # 2.1x eager's error
    perturbed = ref + 0.05 * ref.std() * torch.randn(4096, dtype=torch.float64)
    m16, f16 = corr.TOLERANCES["bf16"]
    m32, f32 = corr.TOLERANCES["fp32"]
    one = lambda t: [("out", t)]  # noqa: E731
    assert corr.compare(
        one(compiled), one(eager), one(ref), multiplier=m16, relative_floor=f16
    ).passed
    assert not corr.compare(
        one(compiled), one(eager), one(ref), multiplier=m32, relative_floor=f32
    ).passed
    assert not corr.compare(
        one(perturbed), one(eager), one(ref), multiplier=m16, relative_floor=f16
    ).passed


def test_a_tensor_that_is_exactly_zero_is_judged_on_its_groups_scale():
    # An attention key bias gets an exactly-zero gradient; rounding noise must not fail it,
    # while the same noise on every update would still be judged per tensor.
    ref = [
        ("update.w", torch.full((100,), 1e-4, dtype=torch.float64)),
        ("update.key_bias", torch.zeros(10, dtype=torch.float64)),
    ]
    eager = [("update.w", ref[0][1] + 1e-9), ("update.key_bias", torch.full((10,), 6e-9))]
    variant = [("update.w", ref[0][1] + 2e-9), ("update.key_bias", torch.full((10,), 2e-8))]
    report = corr.compare(variant, eager, ref, multiplier=3.0, relative_floor=1e-3)
    assert report.passed
    wrong = [("update.w", ref[0][1] * 1.5), ("update.key_bias", torch.full((10,), 2e-8))]
    assert not corr.compare(wrong, eager, ref, multiplier=3.0, relative_floor=1e-3).passed


def test_unpaired_speedup_is_a_ratio_of_medians_with_an_interval_around_it():
    rng = np.random.default_rng(1)
    base = 10.0 + rng.normal(0, 0.1, 30)
    var = 5.0 + rng.normal(0, 0.05, 20)
    sp = unpaired_speedup(base, var)
    assert sp.median == pytest.approx(np.median(base) / np.median(var))
    assert sp.ci95[0] < sp.median < sp.ci95[1]
    assert 1.9 < sp.ci95[0] and sp.ci95[1] < 2.1
    assert sp.significant and not sp.paired and sp.to_dict()["paired"] is False
    assert paired_speedup(base[:20], var).to_dict()["paired"] is True


def _reading(load: float, cpus: int) -> dict:
    return {"loadavg": [load, load, load], "cpus": cpus}


def test_a_busy_host_is_noted_with_its_load_and_the_trials_own_threads_are_not_counted():
    # 32 CPUs, a second queue compiling on 16 of them: noted, with the figures.
    note = host_load.busy_note(_reading(2.0, 32), _reading(17.5, 32), own_threads=1)
    assert note is not None
    assert "load average 17.5 on 32 usable CPUs" in note and "about 16 runnable" in note
    # The same load made by a CPU trial's own 16 intra-op threads is not "busy".
    assert host_load.busy_note(_reading(2.0, 32), _reading(17.5, 32), own_threads=16) is None
    # A quiet host, and a host with one other thread, carry no note.
    assert host_load.busy_note(_reading(0.3, 32), _reading(1.2, 32), own_threads=1) is None
    assert host_load.busy_note(_reading(1.9, 2), _reading(1.9, 2), own_threads=1) is None
    # The lagging 1-minute average: either reading above the line is enough.
    assert host_load.busy_note(_reading(12.0, 16), _reading(1.0, 16), own_threads=1)
    assert host_load.busy_note(None, None, own_threads=1) is None


def test_a_host_load_snapshot_reads_this_machine():
    snap = host_load.snapshot()
    assert snap is not None  # Linux has load averages
    assert len(snap["loadavg"]) == 3 and all(x >= 0 for x in snap["loadavg"])
    assert snap["cpus"] == host_load.usable_cpus() >= 1


def _cpu_reading(at, host_busy_s, procs, threads, load=0.5, steal_s=0.0):
    hz = host_load._ticks_per_s()
    return {
        "loadavg": [load, load, load],
        "cpus": 16,
        "cpu": {
            "at": at,
            "host": (int(host_busy_s * hz), int(at * 16 * hz), int(steal_s * hz)),
            "pid": 100,
            "procs": {p: [pp, name, int(s * hz)] for p, (pp, name, s) in procs.items()},
            "threads": {t: [name, int(s * hz)] for t, (name, s) in threads.items()},
        },
    }


def test_the_cpu_time_of_other_processes_during_the_reps_is_measured_and_named():
    # 4 s of reps: this trial (pid 100) used 4 CPU-seconds, its compile worker (pid 200) 2,
    # an unrelated compiler (pid 300) 6, a process born in the window (pid 400) 1; pid 500
    # ended before the second reading and is not named.
    before = _cpu_reading(
        10.0,
        50.0,
        {
            100: (1, "python3", 1.0),
            200: (100, "python3", 0.5),
            300: (1, "cc1plus", 3.0),
            500: (1, "gone", 9.0),
        },
        {100: ("python3", 1.0), 101: ("sampler", 0.0)},
        load=12.0,
    )
    after = _cpu_reading(
        14.0,
        63.0,
        {
            100: (1, "python3", 5.0),
            200: (100, "python3", 2.5),
            300: (1, "cc1plus", 9.0),
            400: (200, "python3", 1.0),
        },
        {100: ("python3", 3.5), 101: ("sampler", 1.5)},
        load=12.0,
    )
    during = host_load.usage(before, after)
    assert during["wall_s"] == 4.0
    assert during["host_cpus"] == 13.0 / 4 and during["own_cpus"] == 1.0
    assert during["other_cpus"] == (13.0 - 4.0) / 4
    assert [(o["pid"], o["cpu_s"], o["ours"]) for o in during["top_others"]] == [
        (300, 6.0, False),
        (200, 2.0, True),
        (400, 1.0, True),  # a grandchild, new in the window: all its time counts
    ]
    assert [(t["name"], t["cpu_s"], t["main"]) for t in during["own_threads_top"]] == [
        ("python3", 2.5, True),
        ("sampler", 1.5, False),
    ]
    note = host_load.busy_note(before, after, own_threads=1)
    assert "over 4.0 s, other processes kept 2.2 of 16 usable CPUs busy" in note
    assert during["steal_cpus"] == 0.0 and "steal" not in note
    assert "cc1plus (pid 300) 6.0 s" in note and "(pid 200, this trial's child) 2.0 s" in note
    # Measured quiet beats the lagging load average: 0.5 other CPUs is no busy host, though
    # the 1-minute average still reads 12 after a neighbour's compile.
    quiet = _cpu_reading(14.0, 56.0, {100: (1, "python3", 5.0)}, {100: ("python3", 5.0)}, 12.0)
    assert host_load.usage(before, quiet)["other_cpus"] == 0.5
    assert host_load.busy_note(before, quiet, own_threads=1) is None
    # A virtual machine's CPUs taken by its hypervisor for other guests: noted on its own.
    stolen = _cpu_reading(14.0, 56.0, {100: (1, "python3", 5.0)}, {}, 12.0, steal_s=2.0)
    assert host_load.usage(before, stolen)["steal_cpus"] == 0.5
    assert "the hypervisor gave 0.50 CPUs to other guests (steal)" in host_load.busy_note(
        before, stolen, own_threads=1
    )
    assert host_load.public(after) == {"loadavg": [12.0, 12.0, 12.0], "cpus": 16}


def test_a_spinning_process_and_thread_beside_the_reps_are_seen_on_this_machine():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    thread = threading.Thread(target=spin, name="kiln-test-spin")
    try:
        time.sleep(0.3)  # past the interpreter's start
        before = host_load.snapshot()
        thread.start()
        time.sleep(1.5)
        record, _ = host_load.reading(before, own_threads=1)
    finally:
        stop.set()
        spinner.kill()
        spinner.wait()
        if thread.is_alive():
            thread.join()
    during = record["during"]
    assert record["before"] is not None and "cpu" not in record["before"]
    assert 1.4 <= during["wall_s"] < 10
    mine = [o for o in during["top_others"] if o["pid"] == spinner.pid]
    # Two cores shared with the test run: the spinner still gets a share of one.
    assert mine and mine[0]["cpu_s"] >= 0.2 and mine[0]["ours"] is True
    assert "-c while True: pass" in mine[0]["cmdline"]
    assert during["other_cpus"] >= 0.1
    # Python names its threads for itself, not always for the OS: the spinning one is the
    # busiest besides the main thread, which slept.
    assert any(not t["main"] and t["cpu_s"] >= 0.2 for t in during["own_threads_top"])


def _timing(tid, run_s, wait_s, involuntary, cpu, migrations=None):
    return {
        "tid": tid,
        "run_ns": int(run_s * 1e9),
        "wait_ns": int(wait_s * 1e9),
        "slices": int(involuntary * 2),
        "involuntary": involuntary,
        "cpu": cpu,
        "migrations": migrations,
    }


def test_the_timing_threads_waits_for_a_cpu_and_a_cpu_quota_are_measured_and_noted():
    procs = {100: (1, "python3", 1.0)}
    before = _cpu_reading(10.0, 20.0, procs, {100: ("python3", 1.0)})
    after = _cpu_reading(14.0, 24.0, {100: (1, "python3", 4.6)}, {100: ("python3", 4.6)})
    before["cpu"]["timing"] = _timing(100, 1.0, 0.5, 10, 3, migrations=2)
    after["cpu"]["timing"] = _timing(100, 4.6, 0.9, 210, 7, migrations=42)
    before["cpu"]["cgroup"] = {"throttled_periods": 5, "throttled_s": 1.0, "quota_cpus": 8.0}
    after["cpu"]["cgroup"] = {"throttled_periods": 9, "throttled_s": 1.3, "quota_cpus": 8.0}
    during = host_load.usage(before, after)
    assert during["timing_thread"] == {
        "tid": 100,
        "cpu_s": 3.6,
        "runqueue_wait_s": 0.4,
        "runqueue_share": 0.1,
        "timeslices": 400,
        "involuntary_switches": 200,
        "migrations": 40,
        "cpus": [3, 7],
    }
    assert during["cgroup"] == {"quota_cpus": 8.0, "throttled_periods": 4, "throttled_s": 0.3}
    note = host_load.busy_note(before, after, own_threads=1, during=during)
    assert "the timing thread waited 0.40 s for a CPU while runnable (10% of the reps)" in note
    assert "the cgroup's CPU quota of 8 CPUs stopped its threads for 0.30 s (4 periods)" in note
    assert "other processes" not in note  # nothing else ran: only what was measured is said
    # Below both lines (4% waiting, 0.02 s throttled of 4 s): no note.
    after["cpu"]["timing"] = _timing(100, 4.6, 0.66, 210, 7)
    after["cpu"]["cgroup"] = {"throttled_periods": 6, "throttled_s": 1.02, "quota_cpus": 8.0}
    assert host_load.busy_note(before, after, own_threads=1) is None
    # Readings of two different threads are not compared; a kernel without either file
    # leaves the field null.
    after["cpu"]["timing"] = _timing(101, 4.6, 9.0, 210, 7)
    after["cpu"]["cgroup"] = None
    during = host_load.usage(before, after)
    assert during["timing_thread"] is None and during["cgroup"] is None


def test_a_step_varying_rep_to_rep_is_noted_saying_whether_the_host_was_quiet():
    quiet = {
        "wall_s": 4.0,
        "other_cpus": 0.3,
        "steal_cpus": 0.0,
        "timing_thread": {"runqueue_share": 0.0004},
        "cgroup": {"throttled_s": 0.0},
    }
    result = {
        "steady_ms": {"median": 11.5, "cv": 0.10},
        "baseline_ms": {"median": 29.3, "cv": 0.004},
        "host_load": {"during": quiet},
    }
    (note,) = host_load.unsteady_notes(result)
    assert note.startswith(
        "the step varied rep to rep (coefficient of variation: variant 10%), with no other "
        "process busy and the timing thread on its CPU throughout: a host-bound step"
    )
    # A busy host: the busy note names the neighbour; this one does not call the host quiet.
    result["host_load"]["during"] = {**quiet, "other_cpus": 2.0}
    result["baseline_ms"]["cv"] = 0.06
    (note,) = host_load.unsteady_notes(result)
    assert "(coefficient of variation: variant 10%, baseline 6%): a host-bound" in note
    # Steady arms, or a result without timings: no note.
    assert host_load.unsteady_notes({"steady_ms": {"cv": 0.049}, "baseline_ms": {"cv": 0}}) == []
    assert host_load.unsteady_notes({}) == []


def test_a_timing_thread_sharing_its_cpu_with_a_spinning_process_is_seen_waiting():
    if host_load._thread_sched(threading.get_native_id()) is None:
        pytest.skip("this kernel has no per-thread schedstat")
    cpu = min(os.sched_getaffinity(0))
    mask = os.sched_getaffinity(0)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {cpu})
        os.sched_setaffinity(0, {cpu})  # this thread only: the two take turns on one CPU
        time.sleep(0.3)  # past the spinner's start
        before = host_load.snapshot()
        end = time.perf_counter() + 1.5
        while time.perf_counter() < end:
            pass
        record, note = host_load.reading(before, own_threads=1)
    finally:
        os.sched_setaffinity(0, mask)
        spinner.kill()
        spinner.wait()
    timing = record["during"]["timing_thread"]
    assert timing["tid"] == threading.get_native_id() and timing["cpus"] == [cpu, cpu]
    # The scheduler shares one CPU about evenly between two spinning threads: about half of
    # the wall time waiting; a third is a wide margin for a noisy machine.
    assert timing["runqueue_share"] >= 0.33, timing
    assert timing["cpu_s"] + timing["runqueue_wait_s"] >= 0.8 * record["during"]["wall_s"]
    assert timing["involuntary_switches"] is None or timing["involuntary_switches"] >= 1
    assert note is not None and "the timing thread waited" in note


def test_round_robin_rotates_the_order_every_rep_and_pairs_samples_by_rep():
    calls = []

    class CountingTimer:
        def time(self, fn, steps):
            calls.append(fn())
            return float(len(calls))

    fns = [lambda: "a", lambda: "b", lambda: "c"]
    samples = time_round_robin(CountingTimer(), fns, reps=3, steps=2)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # Sample k of each arm comes from rep k.
    assert samples == [[1.0, 6.0, 8.0], [2.0, 4.0, 9.0], [3.0, 5.0, 7.0]]


def test_round_robin_runs_each_arm_its_own_steps_per_rep():
    seen = []

    class StepsTimer:
        def time(self, fn, steps):
            seen.append((fn(), steps))
            return 1.0

    fns = [lambda: "fast", lambda: "slow"]
    time_round_robin(StepsTimer(), fns, reps=2, steps=[30, 3])
    assert seen == [("fast", 30), ("slow", 3), ("slow", 3), ("fast", 30)]
    with pytest.raises(ValueError, match="2 step counts for 3"):
        time_round_robin(StepsTimer(), [*fns, fns[0]], reps=1, steps=[1, 2])


def test_a_trial_calibrates_every_arm_to_a_rep_of_about_rep_ms(monkeypatch):
    from torchkiln.runner.protocol import measure_trial

    step_ms = {"variant": 1.0, "base": 10.0}

    class Arm:
        def __init__(self, name):
            self.name = name

        def __call__(self):
            return self.name

    class ArmTimer:
        def time(self, fn, steps):
            return step_ms[fn()]

    spec = TrialSpec(workload="simple", variant="eager", reps=3, min_reps=3, rep_ms=50.0)
    result = {"notes": []}
    measure_trial.timed_reps(
        spec, ArmTimer(), [Arm("variant"), Arm("base"), Arm("base")], result, lambda s: None
    )
    assert result["steps_per_rep_by_arm"] == [50, 5, 5]
    assert result["steps_per_rep"] == 50


def test_eager_errors_stand_for_eager_outputs_in_the_check():
    torch.manual_seed(0)
    ref = [("out", torch.randn(64, dtype=torch.float64)), ("aux", torch.randn(8).double())]
    eager = [(n, t + 1e-3 * torch.randn_like(t)) for n, t in ref]
    for scale in (1e-3, 1e-1):  # a pass and a fail
        variant = [(n, t + scale * torch.randn_like(t)) for n, t in ref]
        with_tensors = corr.compare(variant, eager, ref)
        with_errors = corr.compare(variant, None, ref, eager_errors=corr.errors_against(eager, ref))
        assert with_errors.to_dict() == with_tensors.to_dict()
    assert corr.errors_against(eager[:1], ref) == [math.inf, math.inf]
    assert not corr.compare(eager, None, ref, eager_errors=[0.1]).passed  # structure differs


def test_the_check_keeps_outputs_in_their_dtype_and_measures_their_error_in_fp64():
    import math

    import torch

    from torchkiln.measure import correctness as corr

    ref = torch.randn(64, 33, dtype=torch.float64)
    out = (ref + 1e-2 * torch.randn_like(ref)).to(torch.bfloat16)
    kept = corr.detach_to_cpu({"logits": out, "n": torch.arange(3)})
    assert [t.dtype for _, t in kept] == [torch.bfloat16, torch.int64]
    out.mul_(2)  # a copy: what the step does to its output later is not seen
    assert not torch.equal(kept[0][1], out)
    want = math.sqrt(((kept[0][1].double() - ref) ** 2).mean().item())
    assert corr.rmse(kept[0][1], ref) == pytest.approx(want, rel=1e-12)
    # Two narrow tensors are still compared in fp64, not in their own dtype.
    a = torch.tensor([1.0, 1.0 + 2**-7], dtype=torch.bfloat16)
    b = torch.tensor([1.0 + 2**-7, 1.0], dtype=torch.bfloat16)
    assert corr.rmse(a, b) == pytest.approx(2**-7, rel=1e-12)
    assert corr.rmse(torch.empty(0), torch.empty(0, dtype=torch.float64)) == math.inf
    report = corr.compare(kept[:1], None, [("logits", ref)], eager_errors=[want])
    assert report.passed and report.checks[0].variant_rmse == pytest.approx(want, rel=1e-12)


def test_what_cannot_change_while_kiln_runs_is_asked_once(monkeypatch):
    """kiln's commit, the driver and the packages' versions: asked ahead (as the warm-start server
    does before it forks trials), then read without a subprocess or a package lookup."""
    from torchkiln.measure import environment

    environment.warm()

    def asked_again(*args, **kwargs):
        raise AssertionError(f"asked again: {args}")

    monkeypatch.setattr(environment.subprocess, "run", asked_again)
    monkeypatch.setattr("importlib.metadata.version", asked_again)
    env = environment.collect("cpu")
    assert env["kiln_git_sha"] == environment.git_sha() and env["kiln_git_sha"]
    assert env["transformers"] == environment._version("transformers")


class _ProfilerEvent:
    """A stand-in for torch's ``_KinetoEvent`` as torch 2.11 has it: no activity type."""

    def __init__(self, name: str, device: str, annotation: bool = False) -> None:
        self._name, self._annotation = name, annotation
        self._device = getattr(torch.autograd.DeviceType, device)

    def name(self) -> str:
        return self._name

    def device_type(self):
        return self._device

    def is_user_annotation(self) -> bool:
        return self._annotation


class _TypedProfilerEvent(_ProfilerEvent):
    """As torch 2.14 has it: kineto's activity type, the Chrome trace's "cat"."""

    def __init__(self, name: str, device: str, activity: str) -> None:
        super().__init__(name, device, annotation=activity.endswith("user_annotation"))
        self._activity = activity

    def activity_type(self) -> str:
        return self._activity


def test_the_in_memory_kernel_count_leaves_out_copies_sets_and_cpu_events_by_name():
    from torchkiln.measure.kernels import count_profiler_kernels

    events = [
        _ProfilerEvent("void at::native::vectorized_elementwise_kernel<4>(int)", "CUDA"),
        _ProfilerEvent("triton_poi_fused_gelu_0", "CUDA"),
        _ProfilerEvent("Memcpy HtoD (Pageable -> Device)", "CUDA"),
        _ProfilerEvent("Memcpy DtoD (Device -> Device)", "CUDA"),
        _ProfilerEvent("Memset (Device)", "CUDA"),
        _ProfilerEvent("Stream Sync", "CUDA"),
        # A record_function's range as kineto shows it on the GPU.
        _ProfilerEvent("## Call CompiledFxGraph ##", "CUDA", annotation=True),
        _ProfilerEvent("aten::addmm", "CPU"),
        _ProfilerEvent("cudaLaunchKernel", "CPU"),
    ]
    assert count_profiler_kernels(events) == 2


def test_the_in_memory_kernel_count_goes_by_the_activity_type_where_events_have_one():
    from torchkiln.measure.kernels import count_profiler_kernels

    events = [
        _TypedProfilerEvent("void gemv2T_kernel_val<float>(...)", "CUDA", "kernel"),
        _TypedProfilerEvent("Memcpy HtoD (Pageable -> Device)", "CUDA", "gpu_memcpy"),
        _TypedProfilerEvent("Memset (Device)", "CUDA", "gpu_memset"),
        # The type decides, not the name: a range named like a kernel is still not one.
        _TypedProfilerEvent("triton_poi_fused_gelu_0", "CUDA", "gpu_user_annotation"),
        _TypedProfilerEvent("aten::addmm", "CPU", "cpu_op"),
        _TypedProfilerEvent("cudaLaunchKernel", "CPU", "cuda_runtime"),
    ]
    assert count_profiler_kernels(events) == 1


def test_torchs_own_profiler_events_pass_through_the_filter_on_the_cpu():
    """The filter against real ``_KinetoEvent`` objects of this torch (no device here: none is a
    kernel)."""
    from torch.profiler import ProfilerActivity, profile

    from torchkiln.measure.kernels import count_profiler_kernels

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("a range"):
            torch.ones(8).add_(1)
    events = prof.profiler.kineto_results.events()
    assert len(events) > 0
    assert count_profiler_kernels(events) == 0


def test_kernels_per_step_profiles_the_cuda_activity_alone_and_counts_in_memory(monkeypatch):
    """No trace is written and no CPU op recorded: the count comes from the finished profile's
    events (a stand-in profiler here; benchmarks/check_kernel_count.py holds the real one
    against the Chrome trace's count on a GPU)."""
    from torch.profiler import ProfilerActivity

    from torchkiln.measure import kernels

    seen: dict = {}

    class _Profile:
        def __init__(self, activities):
            seen["activities"] = list(activities)
            events = [
                _ProfilerEvent("ampere_sgemm_128x64_tn", "CUDA"),
                _ProfilerEvent("ampere_sgemm_128x64_tn", "CUDA"),
                _ProfilerEvent("Memset (Device)", "CUDA"),
                _ProfilerEvent("elementwise_kernel", "CUDA"),
            ]
            result = type("Result", (), {"events": lambda self: events})()
            self.profiler = type("Inner", (), {"kineto_results": result})()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def export_chrome_trace(self, path):
            raise AssertionError("no trace is written")

    steps: list[int] = []
    monkeypatch.setattr("torch.profiler.profile", _Profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    assert kernels.kernels_per_step(lambda: steps.append(1), 3, "cuda:0") == 1.0
    assert steps == [1, 1, 1]
    assert seen["activities"] == [ProfilerActivity.CUDA]
    assert kernels.kernels_per_step(lambda: steps.append(1), 3, "cpu") is None
    assert steps == [1, 1, 1]


def test_the_trace_count_reads_the_exported_chrome_trace_and_removes_it():
    from torchkiln.measure.kernels import count_kernels_from_trace

    written: list[str] = []

    class _Finished:
        def export_chrome_trace(self, path):
            written.append(path)
            events = [
                {"ph": "X", "cat": "kernel", "name": "elementwise_kernel"},
                {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn"},
                {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)"},
                {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)"},
                {"ph": "X", "cat": "cpu_op", "name": "aten::addmm"},
                {"ph": "f", "cat": "kernel", "name": "flow"},
            ]
            with open(path, "w") as f:
                json.dump({"traceEvents": events}, f)

    assert count_kernels_from_trace(_Finished()) == 2
    assert written and not os.path.exists(written[0])
