"""Build one arm of a trial: a fresh model from the workload, the variant applied, and a
`step()` that runs one inference or one full training step under the arm's own settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchkiln.repair import arm as repair_arm
from torchkiln.runner.protocol import workload_copies
from torchkiln.runner.protocol.arm_facts import arm_facts
from torchkiln.runner.protocol.optim_state import CannotPrime, prime_optimizer_state
from torchkiln.runner.protocol.settings import (
    autocast,
    call_model,
    disable_dropout,
    map_tensors,
    precision_flags,
    seed_everything,
)
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.variants import Variant
from torchkiln.workloads import Workload, load_workload


def default_loss(output: Any, targets: Any) -> Any:
    import torch.nn.functional as F

    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    logits = output
    if not hasattr(logits, "float"):
        logits = getattr(output, "logits", None)
        if logits is None:
            logits = output[0]
    if targets is not None:
        return F.cross_entropy(logits.float(), targets)
    return logits.float().pow(2).mean()


def default_optimizer(model: Any) -> Any:
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


@dataclass
class TrainStep:
    """One training step of a workload on given inputs: forward and loss under the precision's
    autocast, backward (through a GradScaler for fp16), the optimizer's step, gradients cleared.
    A fixed-input arm calls it on its example inputs, a training stream on each item's."""

    loss_fn: Callable[[Any, Any], Any]
    optimizer: Any
    device: str
    precision: str
    scaler: Any = None

    @classmethod
    def for_workload(
        cls, workload: Workload, model: Any, device: str, precision: str, grad_scaler: bool
    ) -> TrainStep:
        """The workload's loss and optimizer (default_loss, default_optimizer) over ``model``."""
        import torch

        optimizer = (workload.make_optimizer or default_optimizer)(model)
        scaler = torch.amp.GradScaler(device.split(":")[0]) if grad_scaler else None
        return cls(workload.loss_fn or default_loss, optimizer, device, precision, scaler)

    def __call__(self, model: Any, inputs: Any, targets: Any, *, update: bool = True) -> Any:
        """The step's loss, detached. ``update=False`` leaves the weights as they were (no
        optimizer step): a warm-up that compiles the forward and backward graphs only."""
        with autocast(self.device, self.precision):
            out = call_model(model, inputs)
            loss = self.loss_fn(out, targets)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if update:
                self.scaler.step(self.optimizer)
                self.scaler.update()
        else:
            loss.backward()
            if update:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


@dataclass
class Arm:
    """One way of running the workload, ready to step.

    ``inputs`` are the device tensors every step reads; ``load_batch`` copies a new batch of the
    same shapes into them in place, so compiled code and CUDA graphs see the same storage."""

    variant: Variant
    workload: Workload
    model: Any
    step: Callable[[], Any]
    inputs: Any = None

    def load_batch(self, batch: Any) -> None:
        import torch

        src = batch if isinstance(batch, (tuple, list, dict)) else (batch,)
        dst_leaves = _leaves(self.inputs)
        src_leaves = _leaves(src)
        if len(dst_leaves) != len(src_leaves):
            raise ValueError(
                f"a batch with {len(src_leaves)} tensors cannot replace {len(dst_leaves)}"
            )
        for d, s in zip(dst_leaves, src_leaves, strict=True):
            if not isinstance(s, torch.Tensor) or s.shape != d.shape:
                raise ValueError(
                    f"batch tensor of shape {getattr(s, 'shape', None)} does not match the "
                    f"example input's {tuple(d.shape)}"
                )
            d.copy_(s, non_blocking=True)


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [leaf for v in obj.values() for leaf in _leaves(v)]
    if isinstance(obj, (tuple, list)):
        return [leaf for v in obj for leaf in _leaves(v)]
    return [obj]


def _prepare_inputs(inputs: Any, device: str, fp64: bool, channels_last: bool) -> Any:
    import torch

    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device)
        if fp64 and t.is_floating_point():
            t = t.double()
        if channels_last and t.dim() == 4 and t.is_floating_point():
            t = t.contiguous(memory_format=torch.channels_last)
        return t

    return map_tensors(inputs, move)


def _prime_for_step_scope(optimizer: Any, backend: Any, device: str) -> None:
    """The optimizer's state made before the whole step is compiled (runner.protocol.optim_state
    says why). Required under CUDA graphs; elsewhere it saves a recompile, and an optimizer that
    cannot be primed is left to create its state inside the compiled step, as before."""
    graphs = backend.uses_cudagraphs
    try:
        prime_optimizer_state(optimizer)
    except CannotPrime as exc:
        if graphs and device.startswith("cuda"):
            raise CannotPrime(
                f"scope=step under CUDA graphs needs the optimizer state first: {exc}"
            ) from exc


def build_arm(
    spec: TrialSpec,
    variant: Variant,
    *,
    fp64: bool = False,
    no_dropout: bool = False,
) -> Arm:
    """A fresh model seeded with ``spec.seed``: every arm starts from identical weights/inputs.

    ``fp64`` builds the high-precision reference (eager only); ``no_dropout`` sets dropout p=0
    so a training step is deterministic for the correctness check."""
    import torch

    builder = variant.backend.arm_builder
    if builder is not None:  # a backend that builds its own arm (Backend.arm_builder)
        return builder(spec, variant, fp64=fp64, no_dropout=no_dropout)
    if fp64 and variant.backend.name != "eager":
        raise ValueError("the fp64 reference is always eager")
    seed_everything(spec.seed)
    # A `+fix=` variant (torchkiln.repair) loads the rewritten copy with the original's weights.
    workload, fixes = repair_arm.load_for(
        spec,
        variant,
        lambda: workload_copies.load(
            (spec.workload, spec.preset, spec.batch_size, spec.step, spec.seed),
            lambda: load_workload(
                spec.workload, preset=spec.preset, batch_size=spec.batch_size, step=spec.step
            ),
            spec.device,
        ),
    )
    # The steps besides compiling, shared with the recommendation's code (runner.arm_facts).
    facts = arm_facts(variant, workload.step, spec.device)
    model = workload.model.to(spec.device)
    if fp64:
        model = model.double()
    if no_dropout:
        disable_dropout(model)
    if facts.channels_last:
        model = model.to(memory_format=torch.channels_last)
    inputs = _prepare_inputs(workload.example_inputs, spec.device, fp64, facts.channels_last)
    repair_arm.mark_inputs_dynamic(inputs, fixes)
    targets = map_tensors(workload.targets, lambda t: t.to(spec.device))
    backend = variant.backend
    precision = variant.precision
    device = spec.device

    model.train(not facts.eval_mode)
    if workload.step == "infer":

        def infer_step(m: Any = model) -> Any:
            with torch.no_grad(), autocast(device, precision):
                return call_model(m, inputs)

        if backend.scope == "step":
            compiled_step = backend.wrap(infer_step, compile_scope="step")
        else:
            compiled_model = backend.wrap(model, compile_scope="model")

            def compiled_step() -> Any:
                return infer_step(compiled_model)

    else:
        trainer = TrainStep.for_workload(workload, model, device, precision, facts.grad_scaler)

        def train_step(m: Any = model) -> Any:
            return trainer(m, inputs, targets)

        if facts.eager_first_step:
            _prime_for_step_scope(trainer.optimizer, backend, device)
            compiled_step = backend.wrap(train_step, compile_scope="step")
        else:
            compiled_model = backend.wrap(model, compile_scope="model")

            def compiled_step() -> Any:
                return train_step(compiled_model)

    def step() -> Any:
        backend.before_step()
        with precision_flags(precision), repair_arm.around_calls(fixes):
            return compiled_step()

    return Arm(variant=variant, workload=workload, model=model, step=step, inputs=inputs)
