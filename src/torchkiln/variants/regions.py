"""Find a model's repeated blocks (transformer layers, ResNet bottlenecks) for regional
compilation: compile one block type, reuse its code for every instance."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torchkiln.errors import UnsupportedVariant

# A block type qualifies when it repeats and its instances hold at least this share of the
# model's parameters; otherwise most of the model would stay in eager.
MIN_PARAM_SHARE = 0.5


class NoRepeatedBlocks(UnsupportedVariant):
    pass


def _params(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def repeated_blocks(model: Any) -> list[Any]:
    """The instances of the module type that repeats most usefully: at least two instances,
    none inside another, together holding the largest share of parameters (>= 50%)."""
    import torch.nn as nn

    if not isinstance(model, nn.Module):
        raise NoRepeatedBlocks("scope=regions needs an nn.Module, not a step function")
    total = _params(model) or 1
    by_type: dict[type, list[nn.Module]] = defaultdict(list)
    for name, m in model.named_modules():
        if name and not isinstance(m, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
            by_type[type(m)].append(m)
    scored = []
    for mods in by_type.values():
        # A block is composite (a layer, not a single Linear or Conv2d).
        if len(mods) < 2 or not any(True for _ in mods[0].children()):
            continue
        # Drop instances nested inside another instance of the same type.
        inner = {id(c) for m in mods for c in m.modules() if c is not m}
        outer = [m for m in mods if id(m) not in inner]
        if len(outer) < 2:
            continue
        scored.append((sum(_params(m) for m in outer) / total, outer))
    best_share = max((s for s, _ in scored), default=0.0)
    best = None
    # Among types within 10% of the best share, take the one with the fewest (largest) blocks:
    # a transformer layer rather than its attention sublayers.
    near = [(len(mods), mods) for s, mods in scored if s >= 0.9 * best_share]
    if near:
        best = min(near, key=lambda t: t[0])[1]
    if best is None or best_share < MIN_PARAM_SHARE:
        raise NoRepeatedBlocks(
            f"no repeated block holds >= {MIN_PARAM_SHARE:.0%} of the parameters "
            f"(best: {best_share:.0%}); scope=regions does not apply to this model"
        )
    return best


def model_facts(workload: Any) -> dict[str, bool]:
    """What the tune's plan asks of the model: convolutions (channels-last candidates) and
    repeated blocks (regional compiles). Read by the eager baseline's trial from the model it
    builds anyway, so that the tune's own process need not build it (nor import its libraries)."""
    import torch.nn as nn

    model = workload.model
    conv = bool(workload.convolutional) or (
        isinstance(model, nn.Module) and any(isinstance(m, nn.Conv2d) for m in model.modules())
    )
    try:
        repeated_blocks(model)
    except NoRepeatedBlocks:
        return {"convolutional": conv, "repeated_blocks": False}
    return {"convolutional": conv, "repeated_blocks": True}
