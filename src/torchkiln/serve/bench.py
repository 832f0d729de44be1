"""`kiln serve-bench WORKLOAD --trace FILE.jsonl`: replay a request trace through eager,
torch.compile (dynamic=True, automatic dynamic) and BucketedModule (powers of two, learned)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchkiln import defaults
from torchkiln.cli_args import non_negative_int, positive_int
from torchkiln.errors import KilnUserError
from torchkiln.serve.replay import ARMS, ServeBenchConfig, render_table, serve_bench
from torchkiln.serve.shapes import DynamicDims, Request
from torchkiln.serve.trace import generate_trace, read_trace, write_trace

GPU_VARIANT = "inductor:mode=reduce-overhead+bf16"
CPU_VARIANT = "inductor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "workload", help="a registered workload, 'file.py:factory' or 'pkg.mod:factory'"
    )
    parser.add_argument("--trace", required=True, help="JSONL trace, one request's sizes per line")
    parser.add_argument(
        "--generate",
        type=positive_int,
        metavar="N",
        help="first write a generated trace of N requests to --trace",
    )
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="seed of --generate (default 0)"
    )
    parser.add_argument(
        "--preset",
        choices=list(defaults.PRESETS),
        default=defaults.PRESET,
        help="workload size: auto = full on a GPU, tiny on the CPU (default %(default)s)",
    )
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument(
        "--variant",
        default=None,
        help=f"BucketedModule's variant (default {GPU_VARIANT} on cuda, "
        f"{CPU_VARIANT} on cpu); its precision applies to every arm",
    )
    parser.add_argument(
        "--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}"
    )
    parser.add_argument(
        "--sample",
        type=positive_int,
        default=200,
        help="the first N requests are the observed sample: buckets are learned "
        "from it and compile arms warm up on it (default 200)",
    )
    parser.add_argument("--k", default="8", help="learned buckets per symbol: 8 or batch=16,seq=16")
    parser.add_argument("--max-buckets", type=positive_int, default=256)
    parser.add_argument(
        "--specialize",
        default="none",
        help="symbols compiled into the code, one compilation per size: 'all', "
        "'none' (default: one shared graph, one CUDA graph per bucket) or "
        "a comma-separated list",
    )
    parser.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="INPUT=SYM,SYM",
        help="dims of an input by position, '_' for static, e.g. "
        "input_ids=batch,seq (default: batch,seq for rank>=2, batch otherwise)",
    )
    parser.add_argument(
        "--max",
        default="",
        metavar="SYM=N,...",
        help="largest bucket per symbol (default: the trace's maximum)",
    )
    parser.add_argument("--out", help="write the result JSON here")
    from torchkiln.history import add_arguments as add_history_arguments

    add_history_arguments(parser)


def _pairs(text: str, what: str) -> dict[str, int]:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not value.isdigit():
            raise KilnUserError(f"{what}: {item!r} must look like name=N")
        out[key] = int(value)
    return out


def parse_dynamic(items: list[str]) -> dict[Any, dict[int, str]]:
    out: dict[Any, dict[int, str]] = {}
    for item in items:
        name, eq, syms = item.partition("=")
        if not eq or not syms:
            raise KilnUserError(f"--dynamic {item!r} must look like input_ids=batch,seq")
        key: Any = int(name) if name.isdigit() else name
        out[key] = {d: s for d, s in enumerate(syms.split(",")) if s != "_"}
    return out


def default_dynamic_dims(example: Request) -> DynamicDims:
    """Batch (and sequence, for rank >= 2) of every tensor input: the usual NLP serving case."""
    import torch

    dims: dict[Any, dict[int, str]] = {}
    for key in example.keys():
        t = example.get(key)
        if isinstance(t, torch.Tensor) and t.dim() >= 1:
            has_seq = t.dim() >= 2 and isinstance(key, str)
            dims[key] = {0: "batch", 1: "seq"} if has_seq else {0: "batch"}
    return dims


def environment() -> dict[str, Any]:
    """Rule 7: every result carries what is needed to reproduce it (kiln's shared collector)."""
    import torch

    from torchkiln.measure.environment import collect

    return collect("cuda" if torch.cuda.is_available() else "cpu")


def _to_device(x: Any, device: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, Mapping):
        return {k: _to_device(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_to_device(v, device) for v in x)
    return x


def run(args: argparse.Namespace) -> int:
    import torch

    from torchkiln.cli_args import check_inputs
    from torchkiln.workloads import load_workload

    check_inputs(args, files=("out", "trace") if args.generate else ("out",))
    if not args.generate and not Path(args.trace).is_file():
        raise KilnUserError(
            f"--trace {args.trace!r}: no such file; give a JSONL trace, or --generate N to "
            "write one there"
        )

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise KilnUserError("--device cuda, but no CUDA device is available")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise KilnUserError(f"unknown arm(s) {unknown}; choose from {list(ARMS)}")
    if args.generate:
        write_trace(args.trace, generate_trace(args.generate, seed=args.seed))
    trace = read_trace(args.trace)

    preset = defaults.preset(args.preset, device.type)
    workload = load_workload(args.workload, preset=preset, step="infer")
    model = workload.model.to(device).eval()
    inputs = _to_device(workload.example_inputs, device)
    example = (
        Request((), dict(inputs)) if isinstance(inputs, Mapping) else Request(tuple(inputs), {})
    )
    dynamic = parse_dynamic(args.dynamic) or default_dynamic_dims(example)
    symbols = list(dict.fromkeys(s for dims in dynamic.values() for s in dims.values()))
    missing = sorted(set(symbols) - set(trace[0]))
    if missing:
        raise KilnUserError(
            f"the trace has no sizes for {missing}; its lines name {sorted(trace[0])}"
        )
    trace = [{s: r[s] for s in symbols} for r in trace]

    k: int | dict[str, int] = int(args.k) if args.k.isdigit() else _pairs(args.k, "--k")
    specialize = {"all": None, "none": ()}.get(args.specialize)
    if args.specialize not in ("all", "none"):
        specialize = tuple(s.strip() for s in args.specialize.split(",") if s.strip())
    config = ServeBenchConfig(
        variant=args.variant or (GPU_VARIANT if device.type == "cuda" else CPU_VARIANT),
        arms=arms,
        learned_k=k,
        max_buckets=args.max_buckets,
        specialize=specialize,
        max_sizes=_pairs(args.max, "--max") or None,
    )
    sample = trace[: max(1, min(args.sample, len(trace)))]
    result = serve_bench(model, example, dynamic, trace, sample, config)
    result["workload"] = args.workload
    result["environment"] = environment()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(render_table(result))
    _append_history(result, args)
    return 0


def _append_history(result: dict[str, Any], args: argparse.Namespace) -> None:
    from torchkiln.history import from_args, record
    from torchkiln.history.store import status_line

    line = status_line(record(result, "serve-bench", from_args(args)))
    if line:
        print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kiln serve-bench", description=__doc__)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except KilnUserError as exc:
        print(f"error: {exc}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
