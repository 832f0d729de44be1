"""A stream trial: one variant replays a workload's stream in order, in its own process, paired
per item with eager on the same inputs.

    python -m torchkiln.runner.protocol.stream_trial SPEC.json OUT.json

SPEC.json names the workload, step (``infer``, or ``train``: runner.protocol.stream_train_trial),
preset, batch size, device, variant, trace path and length. OUT.json
gets the replay's measurements, or ``{"status": "error", "error": ...}`` with a one-line reason.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.runner.protocol import stream_progress
from torchkiln.runner.protocol.stream_setup import _raise_recompile_limit, _varying_dims


def _close(a: Any, b: Any, atol: float, rtol: float) -> bool:
    import torch

    a = getattr(a, "logits", a)
    b = getattr(b, "logits", b)
    if isinstance(a, (tuple, list)):
        return all(_close(x, y, atol, rtol) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return bool(torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol))
    return a == b


def tolerance(device: str, precision: str) -> float:
    """atol and rtol of an output (or a training loss) against eager's."""
    if precision in ("bf16", "fp16"):
        return 5e-2  # 16-bit autocast rounds every matmul
    return 1e-2 if device.startswith("cuda") else 1e-4  # TF32/cuDNN reorderings on GPU


def _marks(stream: Any) -> list[tuple[Any, int]]:
    """(input, dim) for each dim ``+mark_dynamic`` marks: those following a varying size."""
    dims = _varying_dims(stream)
    if not dims:
        raise KilnUserError(
            "+mark_dynamic needs a stream made from sizes (a trace or the workload's default "
            "stream) with an input dim that follows a varying size"
        )
    return [(k, d) for k, d, _ in dims]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import copy
    import time

    import torch

    from torchkiln.measure import compile_watch
    from torchkiln.measure.stream_replay import replay
    from torchkiln.runner.protocol.settings import autocast, precision_flags
    from torchkiln.tune.stream_plan import LEARNED_BUCKETS, parse_stream_candidate
    from torchkiln.variants import parse_variant
    from torchkiln.workloads.loader import load_workload
    from torchkiln.workloads.stream import workload_stream

    cand = parse_stream_candidate(spec["variant"])
    variant = parse_variant(cand.variant)
    if variant.channels_last or variant.fixes:
        raise KilnUserError(
            f"variant {spec['variant']!r}: a stream trial takes a backend and a precision "
            "(no +channels_last or +fix=)"
        )
    tol = tolerance(spec["device"], variant.precision)
    if spec.get("step", "infer") == "train":
        from torchkiln.runner.protocol.stream_train_trial import run_train

        return _finish(run_train(spec, cand, variant, tol), cand)
    w = load_workload(spec["workload"], preset=spec["preset"], batch_size=spec.get("batch_size"))
    stream = workload_stream(w, spec.get("stream"), spec.get("stream_len"))
    device = spec["device"]
    eager = w.model.to(device).eval()
    model = copy.deepcopy(eager)
    reason = variant.backend.unsupported_reason(device)
    if reason:
        raise KilnUserError(f"variant {spec['variant']!r}: {reason}")
    if cand.recompile_limit:
        _raise_recompile_limit(cand.recompile_limit)
    warmup_fraction = spec.get("warmup_fraction", 0.2)
    bucketed = None
    setup: dict[str, Any] = {}
    if cand.bucket:
        from torchkiln.measure.stream_buckets import dynamic_dims, stream_buckets
        from torchkiln.serve.bucketed import BucketedModule

        buckets = stream_buckets(
            stream, cand.bucket, int(len(stream) * warmup_fraction), LEARNED_BUCKETS
        )
        bucketed = BucketedModule(model, dynamic_dims(stream), buckets, variant=variant)
        from torchkiln.measure.stream_replay import _to

        # the example request fixes the inputs that do not vary: on the model's device, as the
        # replay's own items are (a CPU index into CUDA weights fails on the first bucket)
        first = _to(stream.items[0], device)
        # every bucket compiled before the stream starts, as a server warms up before traffic;
        # its cost is reported apart and charged to the stream's total
        stream_progress.phase("warm-up", buckets=math.prod(len(b) for b in buckets.values()))
        bucketed._on_warm_bucket = stream_progress.bucket
        before = compile_watch.snapshot()
        t0 = time.perf_counter()
        with torch.no_grad():
            bucketed.warmup(**first) if isinstance(first, dict) else bucketed.warmup(*first)
        done = compile_watch.delta(before, compile_watch.snapshot())
        setup = {
            "buckets": {k: list(v) for k, v in buckets.items()},
            "warmup_s": time.perf_counter() - t0,
            "warmup_compiles": done["compiles"],
            "warmup_compile_time_s": done["compile_time_s"],
        }
        run_candidate = bucketed
    else:
        compiled = variant.backend.wrap(model, compile_scope="model")
        marks = _marks(stream) if cand.mark_dynamic else []

        def run_candidate(*args: Any, **kwargs: Any) -> Any:
            for key, dim in marks:
                # each request's own tensors are marked, as a server marks what it receives
                torch._dynamo.mark_dynamic(kwargs[key] if isinstance(key, str) else args[key], dim)
            variant.backend.before_step()
            with precision_flags(variant.precision), autocast(device, variant.precision):
                return compiled(*args, **kwargs)

    stream_progress.phase("replay", items=len(stream))
    out = replay(
        run_candidate,
        eager,
        stream,
        device=device,
        warmup_fraction=warmup_fraction,
        check=lambda a, b: _close(a, b, tol, tol),
        on_item=stream_progress.item,
        on_steady=stream_progress.steady,
    )
    out.update(setup)
    if bucketed is not None:
        # requests no bucket covered ran eagerly: BucketedModule counts them, dynamo does not
        stats = bucketed.stats()
        out["eager_fallbacks"] = stats["eager_fallbacks"]
        out["recompiles_after_warmup"] = stats["recompiles_after_warmup"]
        out["padding_waste"] = stats["padding_waste"]
        if setup["warmup_compiles"]:
            # the first item compiled nothing (warm-up did): the graphs per bucket instead
            combos = math.prod(len(b) for b in buckets.values())
            out["graphs_per_item"] = max(1, math.ceil(setup["warmup_compiles"] / combos))
        bucketed.close()
    else:
        out["padding_waste"] = 0.0  # nothing padded: comparable with a bucketed candidate's
    out["varying_dims"] = _varying_dims(stream)
    return _finish(out, cand)


def _finish(out: dict[str, Any], cand: Any) -> dict[str, Any]:
    from torchkiln.diagnose.stream_cost import stream_verdicts

    out["recompile_limit"] = cand.recompile_limit
    out["mark_dynamic"] = cand.mark_dynamic
    # what the stream cost the candidate in all, a bucketed one's warm-up included
    out["total_s"] = out["time_per_item_s"] * out["items"] + out.get("warmup_s", 0.0)
    out["status"] = "ok" if not out["mismatched_items"] else "incorrect"
    out["verdicts"] = stream_verdicts(out)
    return out


def main(argv: list[str] | None = None) -> int:
    spec_path, out_path = argv if argv is not None else sys.argv[1:]
    spec = json.loads(Path(spec_path).read_text())
    stream_progress.start(spec.get("progress"))
    try:
        result = run(spec)
    except KilnUserError as exc:
        result = {"status": "error", "error": str(exc).splitlines()[0]}
    result.update(stream_progress.finish())
    Path(out_path).write_text(json.dumps({"variant": spec["variant"], **result}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
