"""The Workload dataclass and the registry of built-in workloads."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

STEP_KINDS = ("infer", "train")
PRESETS = ("full", "tiny")

# Inputs are either positional arguments (a tuple) or keyword arguments (a dict).
Inputs = Any


@dataclass
class Workload:
    """What to run: a model, example inputs, and how a training step computes its loss.

    ``train`` means forward, loss, backward and an optimizer step. ``loss_fn(output, targets)``
    defaults to the output's ``.loss`` (Hugging Face models given labels), else cross-entropy
    against ``targets``, else the mean square of the output. ``make_optimizer`` defaults to SGD
    (lr 0.01, momentum 0.9): with SGD the first update is ``-lr * grad``, which is how the
    correctness check reads gradients for every scope, the compiled whole step included.
    ``input_stream`` yields inputs of varying shapes, for workloads whose traffic varies.
    ``make_inputs(**sizes)`` makes the inputs for sizes such as ``batch=4, seq=77`` (what a
    ``--stream`` trace line gives), ``size_limits`` caps each size at what the model accepts, and
    ``default_sizes(n)`` samples n sizes of realistic traffic (see torchkiln.workloads.stream).
    ``pad_values`` names, per input, the value that pads it without changing the training loss
    (0 for an attention mask, the loss's ignore index for labels): a bucketed training stream
    pads only a workload that declares one for every input it pads.
    """

    model: Any
    example_inputs: Inputs
    name: str = "custom"
    step: str = "infer"
    targets: Any = None
    loss_fn: Callable[[Any, Any], Any] | None = None
    make_optimizer: Callable[[Any], Any] | None = None
    input_stream: Callable[[], Iterator[Inputs]] | None = None
    make_inputs: Callable[..., Inputs] | None = None
    size_limits: dict[str, int] = field(default_factory=dict)
    default_sizes: Callable[[int], list[dict[str, int]]] | None = None
    description: str = ""
    convolutional: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    pad_values: dict[Any, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.step not in STEP_KINDS:
            raise ValueError(f"step={self.step!r}; choose from {list(STEP_KINDS)}")
        if not isinstance(self.example_inputs, (tuple, list, dict)):
            self.example_inputs = (self.example_inputs,)
        if isinstance(self.example_inputs, list):
            self.example_inputs = tuple(self.example_inputs)


@dataclass(frozen=True)
class WorkloadEntry:
    name: str
    factory: Callable[..., Workload]
    description: str
    extra: str | None  # the optional extra its factory imports, if any


_REGISTRY: dict[str, WorkloadEntry] = {}


def register_workload(
    name: str, *, description: str = "", extra: str | None = None
) -> Callable[[Callable[..., Workload]], Callable[..., Workload]]:
    """Register a factory ``f(preset=..., batch_size=..., step=...) -> Workload`` under ``name``.

    The factory may accept any subset of those keywords; kiln passes only what it accepts.
    """

    def deco(factory: Callable[..., Workload]) -> Callable[..., Workload]:
        if name in _REGISTRY and _REGISTRY[name].factory is not factory:
            raise ValueError(f"workload {name!r} is already registered")
        doc = description or (inspect.getdoc(factory) or "").split("\n")[0]
        _REGISTRY[name] = WorkloadEntry(name, factory, doc, extra)
        return factory

    return deco


def registry() -> dict[str, WorkloadEntry]:
    # The built-ins registered on the import of the package torchkiln.workloads (its zoo).
    return _REGISTRY


def available_workloads() -> list[str]:
    return sorted(registry())


def call_factory(factory: Callable[..., Any], **kwargs: Any) -> Any:
    """Call a factory with the subset of ``kwargs`` its signature accepts."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return factory()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return factory(**{k: v for k, v in kwargs.items() if v is not None})
    accepted = {k: v for k, v in kwargs.items() if k in params and v is not None}
    return factory(**accepted)
