"""A max-autotune compile pauses between its rounds of benchmarks for its neighbours' timed turns.

On one GPU a trial times its reps only while no other trial compiles (host_lock.py), and a
max-autotune compile runs for minutes: on an H200 (kiln 388cb3a, resnet50 training at bf16,
`tune_speed/h200/tune8-resnet50-results.json`) its two max-autotune candidates were still
autotuning after 330 s while seven trials that had compiled waited 283-337 s each for their
timed turn, so the leader's refinements were planned too late to fit. Between two rounds of its
kernel benchmarks (Inductor's feedback call after each choice set is timed) the compile has
nothing running: its benchmarks have synchronised and its choices are built. There it lets
the waiting trials time their reps (Phases.pause), as long as every other compile in flight
may pause too; the seconds paused are the trial's host_wait, not its compile's."""

from __future__ import annotations

import threading
from typing import Any

from torchkiln.variants import Variant


def autotunes(variant: Variant) -> bool:
    """Whether the variant's compile benchmarks kernel choices (a max-autotune mode)."""
    return "max-autotune" in str(getattr(variant.backend, "mode", "") or "")


def install(phases: Any, variant: Variant) -> bool:
    """Pause ``phases``' compile after each round of the variant's kernel benchmarks, when the
    trial takes turns on a host (``phases.lock``) and the variant autotunes. Returns whether
    the pause points were installed: torch without Inductor's feedback call has none. Once
    per process: a second arm's compile (replicas) pauses through the same hook."""
    if phases.lock is None or not autotunes(variant):
        return False
    if phases.pause_points:
        return True
    try:
        from torch._inductor.select_algorithm import add_feedback_saver
    except ImportError:
        return False

    def after_round(*_args: Any, **_kwargs: Any) -> None:
        # Inductor's opt-in pipelined autotuning benchmarks in a thread of its own while the
        # compile goes on in the main thread: a pause there would not stop the compile.
        if threading.current_thread() is threading.main_thread():
            phases.pause()

    add_feedback_saver(after_round)
    phases.pause_points = True
    return True
