"""Create an optimizer's state before the training step is compiled, without changing the step.

Optimizers create their state (momentum buffers, Adam's moments) lazily, in their first step.
When that first step runs inside a compiled whole step (`scope=step`), the state is an output
of the compiled graph: Dynamo recompiles on the second step (the state now exists), and under
CUDA graphs the state lives in the graphs' memory pool, which the next replay overwrites. On an
H200 (torch 2.11, commit 50de622) reduce-overhead over bert-base's and resnet50's whole step failed
with "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run" in
SGD's first step. With the state created first, outside, the whole step under reduce-overhead
+ bf16 ran 5.68 ms against 6.09 ms for the model alone (bert-base, commit c137b97,
a train-step probe there), and in two-GPU tunes 7.01 against 7.23 ms (resnet50) and 6.07
against 6.35 ms (bert-base; the same commit's two-GPU training tunes).

A user simply runs their first step eagerly. A trial cannot: its first call is what the
correctness check compares against eager. So the state is created by a step on zero gradients,
the parameters are put back, and every state tensor is zeroed. For the optimizers listed here a
zeroed state gives the same next step as no state at all: SGD with dampening 0 (a momentum
buffer of zeros times momentum, plus the gradient, is the gradient, as `clone(grad)` on the first
step), Adam, AdamW and RMSprop (their state starts at zeros, the step counter at 0)."""

from __future__ import annotations

from typing import Any

PRIMED = ("SGD", "Adam", "AdamW", "RMSprop")


class CannotPrime(ValueError):
    """The optimizer's state cannot be created ahead without changing its first step."""


def prime_reason(optimizer: Any) -> str | None:
    """Why ``optimizer``'s state cannot be created ahead (None when it can)."""
    import torch

    name = type(optimizer).__name__
    if type(optimizer) not in tuple(getattr(torch.optim, n) for n in PRIMED):
        return (
            f"{name}: kiln creates the optimizer state ahead only for {', '.join(PRIMED)} (where "
            "a zeroed state steps as no state); run one eager step before compiling instead"
        )
    if name == "SGD":
        damp = [g.get("dampening", 0) for g in optimizer.param_groups]
        if any(d != 0 for d in damp):
            return (
                f"SGD with dampening={damp[0]}: its first step skips the dampening, so a zeroed "
                "momentum buffer would step differently"
            )
    return None


def prime_optimizer_state(optimizer: Any) -> int:
    """Create ``optimizer``'s state without changing the model or the optimizer's next step.

    Returns the number of state tensors created; raises CannotPrime (with the reason) for an
    optimizer not known to step the same from a zeroed state."""
    import torch

    why = prime_reason(optimizer)
    if why is not None:
        raise CannotPrime(why)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    fresh = [p for p in params if not optimizer.state.get(p)]
    if not fresh:
        return 0
    kept = {p: p.detach().clone() for p in fresh}
    grads = {p: p.grad for p in params}
    with torch.no_grad():
        for p in params:
            # Gradients of zeros, and none for parameters that already have a state, so that
            # only the fresh ones step (an optimizer skips parameters whose grad is None).
            p.grad = torch.zeros_like(p) if p in kept else None
        optimizer.step()
        for p, value in kept.items():
            p.copy_(value)  # weight decay moved it even on a zero gradient
        created = 0
        for p in fresh:
            for value in optimizer.state[p].values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
                    created += 1
        for p in params:
            p.grad = grads[p]
    return created
