"""What a trial is (TrialSpec) and the statuses its result can carry."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

TRIAL_SCHEMA = "torchkiln.trial/1"

STATUSES = (
    "ok",
    "compile_error",
    "runtime_error",
    "oom",
    "timeout",
    "crashed",
    "accuracy_fail",
    "unsupported",
)

# In a tune's baseline trial's `extra`: the [precision, channels_last] pairs the search's trials
# are judged and counted at. The baseline pays their fixed costs (references.prepay), alone on
# the device before the search, instead of each search trial paying them beside the others.
PREPAY = "fixed_costs_for"


@dataclass
class TrialSpec:
    """One (workload, variant) pair and how to measure it. Serialised to the worker as JSON."""

    workload: str
    variant: str
    baseline: str = "eager"
    step: str = "infer"
    device: str = "cpu"
    preset: str = "full"
    batch_size: int | None = None
    reps: int = 15  # the most paired reps: fewer once the speedup is known (stop_halfwidth)
    # Reps stop once the speedup's 95% interval is within +-this fraction of its median, after
    # at least min_reps (measure.stopping); None runs every rep (the head-to-head does).
    stop_halfwidth: float | None = 0.005
    min_reps: int = 10
    # Seconds of timed reps after which they stop whatever the interval (None: no limit); the
    # stop then reads "time".
    max_measure_s: float | None = None
    rep_ms: float = 100.0  # target duration of one timed rep (steps per rep are calibrated)
    warmup_s: float = 0.5  # warm-up past compilation: at least this long and `warmup_steps`
    warmup_steps: int = 5
    seed: int = 0
    threads: int | None = None
    check_accuracy: bool = True
    count_kernels: bool = True
    cudnn_benchmark: bool = False
    # Time two eager baseline instances, one built before the variant and one after, against
    # it (see measure_trial.baseline_instances): build order alone moves host-bound eager ~1%.
    bracket: bool = True
    # k > 1: k instances of the variant and of the baseline, the speedup's interval over the
    # k pairs (runner.protocol.replicas): it then includes instance-to-instance variation.
    replicas: int = 1
    index: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.index:02d}-{slug(self.variant)}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpec:
        return cls(**data)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "trial"


def base_result(spec: TrialSpec, status: str | None = None, reason: str | None = None) -> dict:
    """The fields every trial result starts with, whoever writes it (the worker, the launcher
    for a crash or timeout, an executor for a lost worker)."""
    return {
        "schema": TRIAL_SCHEMA,
        "id": spec.id,
        "workload": spec.workload,
        "variant": spec.variant,
        "baseline": spec.baseline,
        "step": spec.step,
        "device": spec.device,
        "preset": spec.preset,
        "status": status,
        "reason": reason,
        "phase": None,
        "notes": [],
    }
