"""A max-autotune compile pauses between its rounds of benchmarks for neighbours' timed turns:
the pause points are Inductor's feedback calls, and a paused second is host wait, not compile
time (the lock's side is in test_host_lock.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from torchkiln.runner.protocol import compile_pause
from torchkiln.runner.protocol.trial import TrialSpec, base_result
from torchkiln.variants import parse_variant

WL = Path(__file__).parent / "fixtures" / "workloads.py"


class _Phases:
    """Stands in for the worker's Phases: a lock, and the pauses asked for."""

    def __init__(self, lock) -> None:
        self.lock = lock
        self.pauses = 0
        self.pause_points = False

    def pause(self) -> None:
        self.pauses += 1


def test_pause_points_are_installed_for_autotuned_modes_on_a_shared_host(monkeypatch):
    import torch._inductor.select_algorithm as sa

    hooks = []
    monkeypatch.setattr(sa, "add_feedback_saver", hooks.append)
    shared = _Phases(lock=object())
    assert compile_pause.install(shared, parse_variant("inductor:mode=max-autotune+bf16"))
    other = _Phases(lock=object())
    assert compile_pause.install(other, parse_variant("inductor:mode=max-autotune-no-cudagraphs"))
    # A second arm in the same trial (replicas) pauses through the hook already there.
    assert compile_pause.install(shared, parse_variant("inductor:mode=max-autotune+bf16"))
    # Inductor calls each hook after a round of benchmarks, with its timings and choices.
    hooks[0]({}, "mm", [], [], None, {})
    assert shared.pauses == 1
    # Called from another thread (pipelined autotuning), the compile goes on: no pause.
    beside = threading.Thread(target=hooks[0], args=({}, "mm", [], []))
    beside.start()
    beside.join()
    assert shared.pauses == 1
    # No autotuning, or no neighbours to pause for: nothing installed.
    assert not compile_pause.install(shared, parse_variant("inductor:mode=reduce-overhead"))
    assert not compile_pause.install(shared, parse_variant("eager"))
    alone = _Phases(lock=None)
    assert not compile_pause.install(alone, parse_variant("inductor:mode=max-autotune"))
    assert len(hooks) == 2


def test_a_first_call_leaves_out_the_seconds_it_paused(monkeypatch):
    import torchkiln.runner.protocol.measure_trial as mt
    from torchkiln.measure.timer import StepTimer
    from torchkiln.runner.protocol.worker import Phases

    phases = Phases(None)

    def first_call_with_a_pause(arm, timer, before):
        phases.paused_s += 0.25  # what Phases.pause adds while neighbours time their reps
        return 1.0, []

    monkeypatch.setattr(mt, "capture", first_call_with_a_pause)
    spec = TrialSpec(f"{WL}:tiny_mlp", "eager", device="cpu", warmup_s=0.0, warmup_steps=1)
    result = base_result(spec)
    mt.variant_alone(spec, parse_variant("eager"), StepTimer("cpu"), result, phases)
    assert result["first_call_paused_s"] == 0.25
    assert result["first_call_s"] == 0.75
    assert result["compile_pauses"] is False  # eager: no pause points


# A real max-autotune compile on the CPU: Inductor benchmarks its C++ GEMM template against
# ATen for each frozen linear layer, a round of benchmarks per layer, and calls its feedback
# hooks after each. It walks the worker's phases with the pool's lock and records when it
# compiled and when it paused.
COMPILE = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import torch._inductor.config as inductor_config
    from torchkiln.runner.launch.host_lock import HostLock
    from torchkiln.runner.protocol import compile_pause
    from torchkiln.runner.protocol.worker import Phases
    from torchkiln.variants import parse_variant

    inductor_config.max_autotune_gemm_backends = "ATEN,CPP"
    inductor_config.freezing = True
    lock = HostLock.from_env()
    lock.enter("start")
    phases = Phases(None, None, lock)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
        torch.nn.ReLU(), torch.nn.Linear(256, 256),
    ).eval()
    run = torch.compile(model, mode="max-autotune-no-cudagraphs")
    assert compile_pause.install(phases, parse_variant("inductor:mode=max-autotune-no-cudagraphs"))
    rounds, pauses, real_pause = [], [], phases.pause

    def pause():
        t0, before = time.monotonic(), phases.paused_s
        rounds.append(t0)
        real_pause()
        if phases.paused_s > before:
            pauses.append([t0, time.monotonic()])

    phases.pause = pause
    phases("first_call")
    open(sys.argv[1], "w").close()  # the waiter asks for its timed turn from here
    t0 = time.monotonic()
    with torch.no_grad():
        run(torch.randn(64, 256))
    end = time.monotonic()
    phases("done")
    print(json.dumps({"compile": [t0, end], "rounds": rounds, "pauses": pauses,
                      "host_wait": phases.seconds.get("host_wait", 0.0),
                      "first_call_s": phases.seconds["first_call"]}))
    """
)


# A trial that asks for its timed turn once the compile has begun, and times 0.2 s of reps.
WAITER = textwrap.dedent(
    """
    import json, os, sys, time
    from torchkiln.runner.launch.host_lock import HostLock
    from torchkiln.runner.protocol.worker import Phases

    lock = HostLock.from_env()
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    phases = Phases(None, None, lock)
    phases("measure")
    t0 = time.monotonic()
    time.sleep(0.2)
    t1 = time.monotonic()
    phases("done")
    print(json.dumps([t0, t1]))
    """
)


def test_a_real_max_autotune_compile_pauses_for_a_waiting_trial(tmp_path):
    from torchkiln.runner.launch.host_lock import HOST_LOCK_ENV, set_compile_slots

    lock, begun = tmp_path / "host.lock", str(tmp_path / "compiling")
    set_compile_slots(str(lock), 2)
    env = {**os.environ, HOST_LOCK_ENV: str(lock)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, begun], env=env, stdout=subprocess.PIPE, text=True
        )
        for code in (COMPILE, WAITER)
    ]
    out, (m0, m1) = (json.loads(p.communicate(timeout=300)[0]) for p in procs)
    assert len(out["rounds"]) >= 2, "Inductor called no feedback hook between rounds"
    c0, c1 = out["compile"]
    if m0 >= c1:
        pytest.fail(f"the waiter timed its reps after the whole compile: {out}")
    # Its reps ran inside one of the compile's pauses; the pause is the compile's host wait,
    # not its compile time.
    assert any(p0 <= m0 and m1 <= p1 for p0, p1 in out["pauses"])
    assert out["host_wait"] >= m1 - m0
    assert out["first_call_s"] < c1 - c0 - (m1 - m0)
