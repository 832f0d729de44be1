"""A max-autotune compile pauses between its rounds of benchmarks for neighbours' timed turns:
the pause points are Inductor's feedback calls, and a paused second is host wait, not compile
time (the lock's side is in test_host_lock.py)."""

from __future__ import annotations

from pathlib import Path

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
