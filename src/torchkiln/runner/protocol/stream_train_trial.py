"""A training stream trial: one variant replays a workload's stream, each item one training step,
paired per item with eager. Called by runner.protocol.stream_trial for ``step: "train"``.

Eager and the candidate each own a copy of the model (the same weights) and an optimizer of their
own, built by the workload's training step (runner.protocol.executable.TrainStep). Dropout is off
in both, so their losses can be compared item by item (measure.stream_train.LossCheck).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.runner.protocol import stream_progress


def _refusal(variant: Any) -> str | None:
    if variant.backend.scope == "step":
        return (
            "a training stream compiles the model (scope=model); a compiled whole step "
            "(scope=step) is measured on a fixed input (kiln bench --step train)"
        )
    return variant.backend.step_unsupported_reason("train")


def run_train(spec: dict[str, Any], cand: Any, variant: Any, tol: float) -> dict[str, Any]:
    import torch

    from torchkiln.measure.stream_buckets import dynamic_dims, stream_buckets
    from torchkiln.measure.stream_replay import replay
    from torchkiln.measure.stream_train import (
        LossCheck,
        as_item_fn,
        item_sizes,
        keeping_buffers,
        pad_item,
        pad_refusal,
    )
    from torchkiln.runner.protocol.arm_facts import arm_facts
    from torchkiln.runner.protocol.executable import TrainStep
    from torchkiln.runner.protocol.settings import (
        disable_dropout,
        map_tensors,
        precision_flags,
        seed_everything,
    )
    from torchkiln.runner.protocol.stream_setup import _raise_recompile_limit, _varying_dims
    from torchkiln.serve.bucketed import _compile_statically
    from torchkiln.serve.buckets import BucketGrid, padding_waste
    from torchkiln.tune.stream_plan import LEARNED_BUCKETS
    from torchkiln.workloads.loader import load_workload
    from torchkiln.workloads.stream import workload_stream

    reason = _refusal(variant)
    if cand.mark_dynamic:
        reason = "+mark_dynamic is measured on inference streams; a training stream marks no dims"
    if reason:
        raise KilnUserError(f"variant {spec['variant']!r}: {reason}")
    device = spec["device"]
    reason = variant.backend.unsupported_reason(device)
    if reason:
        raise KilnUserError(f"variant {spec['variant']!r}: {reason}")
    seed_everything(spec.get("seed", 0))
    w = load_workload(
        spec["workload"], preset=spec["preset"], batch_size=spec.get("batch_size"), step="train"
    )
    stream = workload_stream(w, spec.get("stream"), spec.get("stream_len"))
    warmup_fraction = spec.get("warmup_fraction", 0.2)
    dims: dict[Any, dict[int, str]] = {}
    grid = None
    if cand.bucket:
        dims = dynamic_dims(stream)  # refuses a stream without sizes, or with nothing to pad
        reason = pad_refusal(w, dims)
        if reason:
            raise KilnUserError(f"variant {spec['variant']!r}: {reason}")
        buckets = stream_buckets(
            stream, cand.bucket, int(len(stream) * warmup_fraction), LEARNED_BUCKETS
        )
        grid = BucketGrid(buckets)

    eager_model = w.model.to(device)
    disable_dropout(eager_model)  # the two copies' losses are compared: no random masks
    eager_model.train()
    model = copy.deepcopy(eager_model)
    eager_step = TrainStep.for_workload(w, eager_model, device, "fp32", grad_scaler=False)
    facts = arm_facts(variant, "train", device)
    cand_step = TrainStep.for_workload(w, model, device, variant.precision, facts.grad_scaler)
    targets = map_tensors(w.targets, lambda t: t.to(device))
    if cand.recompile_limit:
        _raise_recompile_limit(cand.recompile_limit)
    # buckets are fixed shapes: automatic dynamic would fold them into one generic graph
    backend = _compile_statically(variant.backend) if grid else variant.backend
    compiled = backend.wrap(model, compile_scope="model")

    def candidate(inputs: Any, update: bool = True) -> Any:
        if grid is not None:
            # the data path pads, as a bucketing loader would: the step sees bucket shapes only
            key = grid.bucket(item_sizes(inputs, dims))
            inputs = pad_item(inputs, dims, dict(zip(grid.symbols, key, strict=True)), w.pad_values)
        backend.before_step()
        # the replay calls under no_grad (inference); a training step needs autograd back
        with torch.enable_grad(), precision_flags(variant.precision):
            return cand_step(compiled, inputs, targets, update=update)

    def eager(inputs: Any, update: bool = True) -> Any:
        with torch.enable_grad(), precision_flags("fp32"):
            return eager_step(eager_model, inputs, targets, update=update)

    def prime(inputs: Any) -> Any:
        # eager's untimed first call, with no optimizer step: its weights stay the candidate's
        return keeping_buffers(eager_model, lambda: eager(inputs, update=False))

    setup: dict[str, Any] = {}
    if grid is not None:
        setup = _warm_buckets(w, stream, grid, candidate, model, device)
        setup["buckets"] = {k: list(v) for k, v in grid.sizes.items()}
    check = LossCheck(tol)
    stream_progress.phase("replay", items=len(stream))
    out = replay(
        as_item_fn(candidate),
        as_item_fn(eager),
        stream,
        device=device,
        warmup_fraction=warmup_fraction,
        check=check,
        prime=as_item_fn(prime),
        on_item=stream_progress.item,
        on_steady=stream_progress.steady,
    )
    out.update(setup)
    out.update(check.report())
    if grid is not None:
        # nothing compiles after warm-up when every item's bucket was compiled then
        out["recompiles_after_warmup"] = out["compiles"]
        out["padding_waste"] = padding_waste(stream.sizes, grid.sizes)
        out["pad_values"] = {k: w.pad_values[k] for k in dims}
    else:
        out["padding_waste"] = 0.0  # nothing padded: comparable with a bucketed candidate's
    out["varying_dims"] = _varying_dims(stream)
    out["step"] = "train"
    return out


def _warm_buckets(
    w: Any, stream: Any, grid: Any, candidate: Any, model: Any, device: str
) -> dict[str, Any]:
    """Every bucket's forward and backward compiled before the stream starts, on inputs made at
    the bucket's sizes, without an optimizer step and with the buffers put back: the weights the
    replay starts from are eager's. Its cost is reported apart and charged to the total."""
    from torchkiln.measure import compile_watch
    from torchkiln.measure.stream_replay import _sync, _to
    from torchkiln.measure.stream_train import keeping_buffers

    base = stream.sizes[0]
    # CUDA-graph trees warm a graph on its first call, record on the second, replay after
    # (as BucketedModule's warm-up): the recordings too belong to the warm-up
    calls = 3 if device.startswith("cuda") else 1
    before = compile_watch.snapshot()
    t0 = time.perf_counter()
    keys = sorted(grid.keys(), reverse=True)
    stream_progress.phase("warm-up", buckets=len(keys), buckets_done=0)
    for j, key in enumerate(keys):
        sizes = {**base, **dict(zip(grid.symbols, key, strict=True))}
        x = w.make_inputs(**sizes)
        x = _to(x if isinstance(x, (tuple, dict)) else (x,), device)
        for _ in range(calls):
            keeping_buffers(model, lambda x=x: candidate(x, update=False))
        stream_progress.bucket(j + 1, len(keys))
    _sync(device)
    done = compile_watch.delta(before, compile_watch.snapshot())
    return {"warmup_s": time.perf_counter() - t0, "warmup_compiles": done["compiles"]}
