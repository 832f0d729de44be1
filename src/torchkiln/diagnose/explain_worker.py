"""The explain worker: runs Dynamo over one workload in this throwaway process, writes JSON.

    python -m torchkiln.diagnose.explain_worker REQUEST.json RESULT.json

It calls `torch._dynamo.reset()` and turns on torch's logging artifacts, both process-global,
which is why it never runs inside the caller. The result file is rewritten after every phase, so
a crash or a timeout in a later phase still leaves the earlier phases' findings.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torchkiln.runner.launch.orphan import exit_with_launcher

SCHEMA = "kiln.explain/1"
MAX_STREAM_ITEMS = 8


def _write(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    os.replace(tmp, path)  # atomic: the parent never reads half a file


def _to(obj: Any, device: str) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def _shapes(inputs: Any) -> Any:
    import torch

    if isinstance(inputs, torch.Tensor):
        return list(inputs.shape)
    if isinstance(inputs, dict):
        return {k: _shapes(v) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return [_shapes(v) for v in inputs]
    return type(inputs).__name__


def _call(fn: Callable[..., Any], inputs: Any) -> Any:
    return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)


def _op_counter() -> Any:
    """A dispatch mode counting aten ops: eager and in-graph ops in the same unit."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            self.count += 1
            return func(*args, **(kwargs or {}))

    return OpCounter()


class GraphRecorder:
    """A Dynamo backend that runs each graph as is (no codegen) and records what it captured."""

    def __init__(self, count_ops: bool) -> None:
        self.graphs: list[dict[str, Any]] = []
        self.compile_reasons: list[Any] = []
        self.count_ops = count_ops

    def __call__(self, gm: Any, example_inputs: Any) -> Callable[..., Any]:
        nodes = [
            n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")
        ]
        info: dict[str, Any] = {
            "index": len(self.graphs),
            "ops": len(nodes),
            "aten_ops": 0,
            "op_names": [str(getattr(n.target, "__name__", n.target)) for n in nodes][:50],
        }
        self.graphs.append(info)
        self.compile_reasons.append(getattr(gm, "compile_subgraph_reason", None))
        if not self.count_ops:
            return gm.forward

        def run(*args: Any) -> Any:
            with _op_counter() as counter:
                out = gm.forward(*args)
            info["aten_ops"] += counter.count
            return out

        return run


def _grad_ctx(step: str) -> Any:
    import torch

    return torch.no_grad() if step == "infer" else contextlib.nullcontext()


def _capture_phase(model: Any, inputs: Any, step: str, dynamic: bool | None) -> dict[str, Any]:
    import torch

    from torchkiln.diagnose.breaks import BreakCollector

    with _grad_ctx(step), _op_counter() as counter:
        _call(model, inputs)  # eager reference: the op total, and proof the model runs at all
    eager_ops = counter.count
    torch._dynamo.reset()
    collector = BreakCollector()
    collector.attach()
    recorder = GraphRecorder(count_ops=True)
    try:
        compiled = torch.compile(model, backend=recorder, dynamic=dynamic)
        with _grad_ctx(step):
            _call(compiled, inputs)
    finally:
        collector.detach()
    breaks = collector.breaks(recorder.compile_reasons)
    captured = sum(g["aten_ops"] for g in recorder.graphs)
    if recorder.graphs and not breaks:
        share: float | None = 1.0  # one graph, no break: the whole forward ran inside it
    elif eager_ops or captured:
        # Traced code can take other paths than eager (libraries test is_compiling()), so the
        # in-graph count may exceed eager's: the larger of the two is the total.
        share = captured / max(eager_ops, captured)
    else:
        share = None
    return {
        "graphs": {
            "count": len(recorder.graphs),
            "per_graph": recorder.graphs,
            "captured_aten_ops": captured,
            "eager_aten_ops": eager_ops,
            "captured_share": share,
        },
        "breaks": [b.to_json() for b in breaks],
    }


def _input_sets(req: dict[str, Any], workload: Any) -> tuple[str, list[tuple[str, Any]]]:
    from torchkiln.workloads import load_workload

    if req.get("stream") or req.get("stream_len"):
        from torchkiln.workloads.stream import workload_stream

        stream = workload_stream(workload, req.get("stream"), req.get("stream_len"))
        where = req.get("stream") or "the workload's default stream"
        return f"the stream ({where}, {len(stream)} items)", [
            (stream.where(i), x) for i, x in enumerate(stream)
        ]
    sizes = req.get("batch_sizes")
    if not sizes and workload.input_stream is not None:
        items: Iterator[Any] = iter(workload.input_stream())
        out = []
        for i, inputs in enumerate(items):
            if i >= MAX_STREAM_ITEMS:
                break
            out.append(
                (f"stream item {i}", inputs if isinstance(inputs, (tuple, dict)) else (inputs,))
            )
        return "input stream", out
    sizes = sizes or [2, 3, 4]
    sets = []
    for b in sizes:
        w = load_workload(req["workload"], preset=req["preset"], batch_size=b, step=req.get("step"))
        sets.append((f"batch {b}", w.example_inputs))
    return "batch sizes " + ",".join(map(str, sizes)), sets


def _same_shapes(sets: list[tuple[str, Any]]) -> bool:
    return len({json.dumps(_shapes(inputs)) for _, inputs in sets}) <= 1


def _recompile_phase(
    model: Any, req: dict[str, Any], workload: Any, dynamic: bool | None, device: str
) -> dict[str, Any]:
    import torch
    import torch._dynamo.config as dconfig

    from torchkiln.diagnose.breaks import BreakCollector
    from torchkiln.diagnose.recompiles import summarize

    source, sets = _input_sets(req, workload)
    limit_name = "recompile_limit" if hasattr(dconfig, "recompile_limit") else "cache_size_limit"
    if req.get("recompile_limit"):
        setattr(dconfig, limit_name, int(req["recompile_limit"]))
    torch._dynamo.reset()
    from torch._dynamo.utils import guard_failures  # reset() clears it; imported after

    from torchkiln.measure import compile_watch

    collector = BreakCollector()
    collector.attach()
    recorder = GraphRecorder(count_ops=False)
    steps = []
    before_all, t0 = compile_watch.snapshot(), time.perf_counter()
    try:
        compiled = torch.compile(model, backend=recorder, dynamic=dynamic)
        for label, inputs in sets:
            before = {code: len(v) for code, v in guard_failures.items()}
            n_limit = len(collector.limit_warnings)
            n_graphs = len(recorder.graphs)
            with _grad_ctx(req.get("step") or workload.step):
                _call(compiled, _to(inputs, device))
            # One recompilation of a function fails the guards of each of its cache entries:
            # keep them together, most recent entry first (Dynamo's order).
            failures = [
                {
                    "function": getattr(code, "co_name", str(code)),
                    "file": getattr(code, "co_filename", None),
                    "line": getattr(code, "co_firstlineno", None),
                    "guards": [str(t) for t in reasons[before.get(code, 0) :]],
                }
                for code, reasons in guard_failures.items()
                if len(reasons) > before.get(code, 0)
            ]
            steps.append(
                {
                    "label": label,
                    "shapes": _shapes(inputs),
                    "graphs_compiled": len(recorder.graphs) - n_graphs,
                    "guard_failures": failures,
                    "limit_hit": len(collector.limit_warnings) > n_limit,
                }
            )
    finally:
        collector.detach()
    wall_s = time.perf_counter() - t0
    summary = summarize(source, steps, collector.limit_warnings, getattr(dconfig, limit_name))
    if req.get("stream") or req.get("stream_len"):
        summary["stream_cost"] = _stream_cost(
            compile_watch.delta(before_all, compile_watch.snapshot()), wall_s
        )
    if len(sets) > 1 and _same_shapes(sets):
        summary["note"] = (
            "every run had the same input shapes: the workload's factory ignores batch_size "
            "(accept a `batch_size` argument, or give the workload an input_stream)"
        )
    return summary


def _stream_cost(counts: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Dynamo's tracing seconds over the replay's: explain runs no code generation, so this is a
    lower bound of what compiling costs the stream under Inductor."""
    from torchkiln.diagnose.stream_cost import compile_share, stream_verdicts

    m = {"compile_time_s": counts["compile_time_s"], "total_s": wall_s}
    return {**m, "compile_share": compile_share(m), "verdicts": stream_verdicts(m)}


def _cudagraph_phase(model: Any, inputs: Any, req: dict[str, Any], step: str) -> dict[str, Any]:
    import torch

    from torchkiln.diagnose.breaks import BreakCollector
    from torchkiln.diagnose.recompiles import classify_cudagraph_skip

    kwargs = req.get("compile_kwargs") or {}
    mode = kwargs.get("mode")
    if not torch.cuda.is_available():
        return {
            "status": "not-applicable",
            "mode": mode,
            "note": "no CUDA device here: CUDA graphs exist only on a GPU, so Inductor runs "
            "without them on this machine; rerun on the GPU to see why they would be skipped",
            "skips": [],
        }
    torch._dynamo.reset()
    collector = BreakCollector()
    collector.attach()
    try:
        model = model.to("cuda")
        compiled = torch.compile(model, dynamic=req.get("dynamic"), **kwargs)
        for _ in range(3):  # cudagraph trees record on a later call than the first
            with _grad_ctx(step):
                _call(compiled, _to(inputs, "cuda"))
        torch.cuda.synchronize()
    finally:
        collector.detach()
    from torch._dynamo.utils import counters

    skips = [classify_cudagraph_skip(m) for m in dict.fromkeys(collector.cudagraph_skips)]
    return {
        "status": "skipped" if skips or counters["inductor"]["cudagraph_skips"] else "ok",
        "mode": mode,
        "skip_count": int(counters["inductor"]["cudagraph_skips"]),
        "skips": skips,
        "note": "" if skips else "CUDA graphs were recorded; no skip reported",
    }


def _phase(result: dict[str, Any], name: str, out: Path, fn: Callable[[], dict[str, Any]]) -> None:
    start = time.perf_counter()
    result["phases"][name] = {"status": "running"}
    _write(out, result)
    try:
        result.update(fn())
        result["phases"][name] = {"status": "ok"}
    except Exception as exc:  # noqa: BLE001  (user code may raise anything: it becomes a status)
        result["phases"][name] = {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc)[-8:]),
        }
    result["phases"][name]["elapsed_s"] = round(time.perf_counter() - start, 3)
    _write(out, result)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    req = json.loads(Path(args[0]).read_text())
    out = Path(args[1])
    result: dict[str, Any] = {"schema": SCHEMA, "status": "running", "request": req, "phases": {}}
    _write(out, result)

    import torch

    from torchkiln.errors import KilnUserError
    from torchkiln.workloads import load_workload

    result["environment"] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda_available": torch.cuda.is_available(),
    }
    try:
        workload = load_workload(
            req["workload"],
            preset=req["preset"],
            step=req.get("step"),
        )
    except KilnUserError as exc:
        result.update(status="workload-error", error=str(exc))
        _write(out, result)
        return 0
    step = workload.step
    device = req.get("device", "cpu")
    model = workload.model.to(device)
    model.train(step == "train")
    inputs = _to(workload.example_inputs, device)
    dynamic = req.get("dynamic")
    result["workload"] = {
        "name": workload.name,
        "step": step,
        "device": device,
        "input_shapes": _shapes(inputs),
    }
    _phase(result, "capture", out, lambda: _capture_phase(model, inputs, step, dynamic))
    if req.get("recompiles", True):
        _phase(
            result,
            "recompiles",
            out,
            lambda: {"recompiles": _recompile_phase(model, req, workload, dynamic, device)},
        )
    if req.get("cudagraphs"):
        _phase(
            result,
            "cudagraphs",
            out,
            lambda: {"cudagraphs": _cudagraph_phase(model, inputs, req, step)},
        )
    failed = [n for n, p in result["phases"].items() if p["status"] != "ok"]
    result["status"] = "ok" if not failed else "phase-error"
    if failed:
        result["error"] = "; ".join(f"{n}: {result['phases'][n]['error']}" for n in failed)
    _write(out, result)
    return 0


if __name__ == "__main__":
    exit_with_launcher()  # ends with the kiln that launched it (runner/launch/orphan.py)
    sys.exit(main())
