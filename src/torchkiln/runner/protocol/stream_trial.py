"""A stream trial: one variant replays a workload's stream in order, in its own process, paired
per item with eager on the same inputs.

    python -m torchkiln.runner.protocol.stream_trial SPEC.json OUT.json

SPEC.json names the workload, preset, batch size, device, variant, trace path and length. OUT.json
gets the replay's measurements, or ``{"status": "error", "error": ...}`` with a one-line reason.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError


def _close(a: Any, b: Any, atol: float, rtol: float) -> bool:
    import torch

    a = getattr(a, "logits", a)
    b = getattr(b, "logits", b)
    if isinstance(a, (tuple, list)):
        return all(_close(x, y, atol, rtol) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return bool(torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol))
    return a == b


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import copy

    from torchkiln.measure.stream_replay import replay
    from torchkiln.variants import parse_variant
    from torchkiln.workloads.loader import load_workload
    from torchkiln.workloads.stream import workload_stream

    if spec.get("step", "infer") != "infer":
        raise KilnUserError(
            "a stream trial replays inference (--step infer); training streams are not measured yet"
        )
    variant = parse_variant(spec["variant"])
    if variant.precision != "fp32" or variant.channels_last or variant.fixes:
        raise KilnUserError(
            f"variant {spec['variant']!r}: a stream trial takes a backend alone (no +policy)"
        )
    w = load_workload(spec["workload"], preset=spec["preset"], batch_size=spec.get("batch_size"))
    stream = workload_stream(w, spec.get("stream"), spec.get("stream_len"))
    device = spec["device"]
    eager = w.model.to(device).eval()
    model = copy.deepcopy(eager)
    reason = variant.backend.unsupported_reason(device)
    if reason:
        raise KilnUserError(f"variant {spec['variant']!r}: {reason}")
    candidate = variant.backend.wrap(model, compile_scope="model")
    tol = 1e-2 if device.startswith("cuda") else 1e-4  # TF32/cuDNN reorderings on GPU
    out = replay(
        candidate,
        eager,
        stream,
        device=device,
        warmup_fraction=spec.get("warmup_fraction", 0.2),
        check=lambda a, b: _close(a, b, tol, tol),
    )
    out["status"] = "ok" if not out["mismatched_items"] else "incorrect"
    return out


def main(argv: list[str] | None = None) -> int:
    spec_path, out_path = argv if argv is not None else sys.argv[1:]
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = run(spec)
    except KilnUserError as exc:
        result = {"status": "error", "error": str(exc).splitlines()[0]}
    Path(out_path).write_text(json.dumps({"variant": spec["variant"], **result}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
