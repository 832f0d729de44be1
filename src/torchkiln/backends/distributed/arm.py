"""One arm of a distributed training trial: the workload's model wrapped in DDP or FSDP2, then
the variant's compiler applied to the wrapped model (how users compile data-parallel models)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchkiln.errors import UnsupportedVariant
from torchkiln.runner.protocol.executable import default_loss, default_optimizer
from torchkiln.runner.protocol.settings import (
    autocast,
    call_model,
    map_tensors,
    precision_flags,
    seed_everything,
)
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.variants import Variant
from torchkiln.workloads import load_workload

# FSDP2's `fully_shard` is public in torch.distributed.fsdp from torch 2.6; older builds (and
# some nightlies) keep it in the composable namespace only.
FULLY_SHARD_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


def find_fully_shard() -> tuple[Callable[..., Any] | None, str | None]:
    """FSDP2's ``fully_shard`` and the module it was found in, or (None, None)."""
    for name in FULLY_SHARD_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        fn = getattr(module, "fully_shard", None)
        if fn is not None:
            return fn, name
    return None, None


def dist_unsupported(variant: Variant) -> str | None:
    if variant.backend.scope == "step":
        return (
            "under DDP/FSDP kiln compiles the wrapped model; a whole-step scope "
            "(optimizer included) is not supported"
        )
    if variant.precision == "fp16":
        return "fp16 needs a sharded grad scaler under FSDP; use bf16"
    return None


def _has_params(module: Any) -> bool:
    return any(True for _ in module.parameters(recurse=True))


def shard_fsdp(model: Any, fully_shard: Callable[..., Any], compile_block: Callable) -> Any:
    """Compile, then shard, each block, then shard the root: torchtitan's recipe. Blocks are
    the items of the model's ModuleLists (a transformer's layers; embeddings and heads are
    sharded but run eagerly) or, in a model without one, each parameter-holding child.
    Compiling the FSDP2 root instead traces nothing: its hooks are dynamo-disabled (0 graphs,
    1 break, torch 2.14 CPU), so it would run eagerly. Per-block all-gathers also let FSDP2
    prefetch the next block while this one computes."""
    import torch.nn as nn

    has_lists = any(isinstance(m, nn.ModuleList) for m in model.modules())

    def shard(parent: Any, name: str, child: Any, compile_it: bool) -> None:
        block = compile_block(child) if compile_it else child
        if not isinstance(block, nn.Module):
            raise UnsupportedVariant(
                "under FSDP each block is compiled apart, and this backend returns a "
                "function rather than a module"
            )
        if block is not child:
            parent.register_module(name, block)
        fully_shard(block)

    def walk(module: Any, in_list: bool) -> None:
        for name, child in list(module.named_children()):
            if not _has_params(child):
                continue
            if isinstance(child, nn.ModuleList):
                walk(child, True)
            elif isinstance(child, nn.ModuleDict) or (
                has_lists and not in_list and _holds_list(child)
            ):
                walk(child, in_list)
            else:
                shard(module, name, child, compile_it=in_list or not has_lists)

    walk(model, False)
    fully_shard(model)
    return model


def _holds_list(module: Any) -> bool:
    import torch.nn as nn

    return any(isinstance(m, nn.ModuleList) for m in module.modules())


@dataclass
class DistArm:
    variant: Variant
    model: Any
    step: Callable[[], Any]
    batch: int | None


def _batch_size(workload: Any, inputs: Any) -> int | None:
    meta = getattr(workload, "meta", None) or {}
    if meta.get("batch"):
        return int(meta["batch"])
    leaves = []
    map_tensors(inputs, leaves.append)
    return int(leaves[0].shape[0]) if leaves and leaves[0].dim() else None


def build_dist_arm(spec: TrialSpec, variant: Variant, strategy: str, local_rank: int) -> DistArm:
    """Every rank builds the same seeded model and steps on the same seeded batch, so every
    rank's loss must match (and DDP's averaged gradient equals one process's)."""
    import torch

    reason = dist_unsupported(variant)
    if reason:
        raise UnsupportedVariant(reason)
    seed_everything(spec.seed)
    device = spec.device
    workload = load_workload(
        spec.workload, preset=spec.preset, batch_size=spec.batch_size, step="train"
    )
    model = workload.model.to(device)
    if variant.channels_last:
        model = model.to(memory_format=torch.channels_last)

    def move(t: Any) -> Any:
        t = t.to(device)
        if variant.channels_last and t.dim() == 4 and t.is_floating_point():
            t = t.contiguous(memory_format=torch.channels_last)
        return t

    inputs = map_tensors(workload.example_inputs, move)
    targets = map_tensors(workload.targets, lambda t: t.to(device))
    model.train()
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [local_rank] if device.startswith("cuda") else None
        wrapped = DistributedDataParallel(model, device_ids=ids)
    elif strategy == "fsdp":
        fully_shard, _ = find_fully_shard()
        if fully_shard is None:
            raise UnsupportedVariant(
                f"this torch {torch.__version__} has no FSDP2 fully_shard "
                f"(looked in {', '.join(FULLY_SHARD_MODULES)})"
            )
        wrapped = shard_fsdp(
            model, fully_shard, lambda m: variant.backend.wrap(m, compile_scope="model")
        )
    else:
        raise ValueError(f"strategy={strategy!r}; choose from ['ddp', 'fsdp']")
    loss_fn = workload.loss_fn or default_loss
    optimizer = (workload.make_optimizer or default_optimizer)(wrapped)
    backend, precision = variant.backend, variant.precision
    # DDP: compile the wrapped model (dynamo's DDPOptimizer splits graphs at bucket bounds so
    # gradient all-reduces overlap backward). FSDP: the blocks were compiled above.
    compiled = backend.wrap(wrapped, compile_scope="model") if strategy == "ddp" else wrapped

    def step() -> Any:
        backend.before_step()
        with precision_flags(precision):
            with autocast(device, precision):
                loss = loss_fn(call_model(compiled, inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

    return DistArm(variant=variant, model=wrapped, step=step, batch=_batch_size(workload, inputs))
