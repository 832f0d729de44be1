"""GPU benchmark of shape-bucketed serving: bert-base inference in bf16 over a generated trace.

    PYTHONPATH=src python3 benchmarks/bench_serve.py --out DIR

Replays >= 2000 generated requests (sequence 8..512 long-tailed, batch 1..32) through eager,
torch.compile(dynamic=True), torch.compile with automatic dynamic shapes, and BucketedModule with
power-of-two and learned buckets (inductor:mode=reduce-overhead+bf16), interleaved per request;
buckets are learned from a separately generated sample of 400 requests, the "observed" traffic.
Writes DIR/serve_bert-base.json (environment included) and prints the goals and a table last.

Budget (one H200, ~8 min including compiles): each BucketedModule compiles one graph dynamic in
batch and sequence (plus one for batch 1) and captures one CUDA graph per bucket, so 42 pow2 and
384 learned buckets cost seconds of capture rather than a compilation each; the two bucketed arms
share compiled code (same model, same variant). `--specialize seq` compiles one graph per
sequence bucket instead (about 10-30 s each on Inductor) and will not fit the budget with 24.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

GOAL_SPEEDUP_EAGER = 2.0
GOAL_SPEEDUP_DYNAMIC = 1.3
GOAL_WASTE = 0.15


def _goal(name: str, value, target: str, ok: bool | None, ci=None) -> dict:
    return {"goal": name, "value": value, "target": target, "ci95": ci, "met": ok}


def check_goals(result: dict) -> list[dict]:
    arms = {a["arm"]: a for a in result["arms"]}
    learned, eager = arms.get("learned", {}), arms.get("eager", {})
    goals = []
    for key, target, name in (
        ("speedup_vs_eager", GOAL_SPEEDUP_EAGER, "learned throughput vs eager"),
        ("speedup_vs_dynamic", GOAL_SPEEDUP_DYNAMIC, "learned throughput vs compile(dynamic=True)"),
    ):
        r = learned.get(key) or {}
        ratio = r.get("ratio")
        goals.append(
            _goal(
                name,
                ratio,
                f">= {target}x",
                None if ratio is None else ratio >= target,
                r.get("ci95"),
            )
        )
    p99 = learned.get("latency_ms", {}).get("p99")
    e99 = eager.get("latency_ms", {}).get("p99")
    goals.append(
        _goal(
            "learned p99 latency (ms) vs eager p99",
            p99,
            f"<= {e99}",
            None if p99 is None or e99 is None else p99 <= e99,
        )
    )
    after = {
        n: (arms[n].get("compilations_replay"), arms[n].get("recompiles_blocked"))
        for n in ("pow2", "learned")
        if n in arms and arms[n]["status"] == "ok"
    }
    goals.append(
        _goal(
            "compilations / blocked recompiles after warm-up",
            after,
            "0 / 0",
            bool(after) and all(c == 0 and b == 0 for c, b in after.values()),
        )
    )
    waste = learned.get("padding_waste")
    goals.append(
        _goal(
            "learned padding waste",
            waste,
            f"<= {GOAL_WASTE:.0%}",
            None if waste is None else waste <= GOAL_WASTE,
        )
    )
    return goals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for the JSON result and the traces")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--sample", type=int, default=400, help="observed requests to learn from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k-batch", type=int, default=16, help="learned batch buckets")
    p.add_argument("--k-seq", type=int, default=24, help="learned sequence buckets")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-seq", type=int, default=512)
    p.add_argument("--variant", default="inductor:mode=reduce-overhead+bf16")
    p.add_argument("--specialize", default="", help="comma-separated symbols to specialise")
    p.add_argument("--arms", default="eager,dynamic,auto,pow2,learned")
    p.add_argument(
        "--sdp-backends",
        default="",
        help="comma-separated scaled_dot_product_attention backends to turn off for every arm "
        "(cudnn, flash, mem_efficient), e.g. to test whether eager's per-new-shape cost is "
        "cuDNN attention building a graph per shape",
    )
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="smoke-test on CPU (numbers meaningless; use small --max-* and --variant)",
    )
    args = p.parse_args(argv)

    import torch

    from torchkiln.serve import generate_trace, write_trace
    from torchkiln.serve.bench import environment
    from torchkiln.serve.replay import ServeBenchConfig, render_table, serve_bench
    from torchkiln.serve.shapes import Request
    from torchkiln.workloads import load_workload

    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("bench_serve.py needs a CUDA GPU (or --allow-cpu for a smoke test)")
        return 2
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    limits = {"seq": (8, args.max_seq), "batch": (1, args.max_batch)}
    trace = generate_trace(args.requests, seed=args.seed, **limits)
    sample = generate_trace(args.sample, seed=args.seed + 1, **limits)
    write_trace(out / "trace.jsonl", trace)
    write_trace(out / "sample.jsonl", sample)

    # All arms compile the same BERT code objects, so their cache entries count against one
    # per-function recompile limit (8 by default); raised so no arm silently falls back to eager.
    dyn = torch._dynamo.config
    limit = "recompile_limit" if hasattr(dyn, "recompile_limit") else "cache_size_limit"
    setattr(dyn, limit, max(64, getattr(dyn, limit)))
    disabled = [b for b in args.sdp_backends.split(",") if b]
    for backend in disabled:
        toggle = getattr(torch.backends.cuda, f"enable_{backend}_sdp", None)
        if toggle is None:
            print(f"--sdp-backends: this torch has no torch.backends.cuda.enable_{backend}_sdp")
            return 2
        toggle(False)
    log(f"loading bert-base on {device}")
    workload = load_workload("bert-base", preset="full", step="infer")
    model = workload.model.to(device).eval()
    example = Request((), {k: v.to(device) for k, v in workload.example_inputs.items()})
    dims = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    config = ServeBenchConfig(
        variant=args.variant,
        arms=[a for a in args.arms.split(",") if a],
        learned_k={"batch": args.k_batch, "seq": args.k_seq},
        max_buckets=max(256, args.k_batch * args.k_seq),
        specialize=tuple(s for s in args.specialize.split(",") if s),
        max_sizes={"batch": args.max_batch, "seq": args.max_seq},
        pow2_min={"batch": 1, "seq": 8},
        keep_latencies=True,
    )
    result = serve_bench(model, example, dims, trace, sample, config, log=log)
    from torch._dynamo.utils import counters

    result["workload"] = "bert-base (BertForSequenceClassification, BertConfig(), random weights)"
    result["inductor_counters"] = {k: dict(v) for k, v in counters.items() if k == "inductor"}
    result["environment"] = environment()
    result["sdp_backends_disabled"] = disabled
    result["command"] = "PYTHONPATH=src python3 benchmarks/bench_serve.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    result["goals"] = check_goals(result)
    path = out / "serve_bert-base.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    log(f"wrote {path}")

    print()
    for g in result["goals"]:
        status = {True: "PASS", False: "FAIL", None: "n/a "}[g["met"]]
        value = f"{g['value']:.3f}" if isinstance(g["value"], float) else g["value"]
        ci = f" ci95 [{g['ci95'][0]:.2f}, {g['ci95'][1]:.2f}]" if g.get("ci95") else ""
        print(f"{status} {g['goal']}: {value} (goal {g['target']}){ci}")
    env = result["environment"]
    gpu = env.get("gpu") or {}
    print(
        f"{gpu.get('name', 'cpu')}, driver {gpu.get('driver')}, "
        f"torch {env['torch']}, "
        f"total {time.perf_counter() - t0:.0f}s"
    )
    print(render_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
