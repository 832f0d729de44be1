"""Replay a request trace through several ways of serving one model, interleaved, and summarise.

Arms: ``eager``; ``dynamic`` = torch.compile(dynamic=True); ``auto`` = torch.compile with its
default automatic dynamic shapes; ``pow2`` and ``learned`` = BucketedModule with power-of-two or
learned buckets. All use the variant's precision. Every arm is set up first (compile arms over
the observation sample, BucketedModule by warmup()), then the trace is replayed with the arms
taking turns on each request, in a rotating order, so drift hits all alike; each call is timed
between device synchronisations. Compilations are dynamo's graph count, before and during replay.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchkiln.serve.bucketed import BucketedModule
from torchkiln.serve.buckets import learn_buckets, powers_of_two
from torchkiln.serve.guard import compile_count
from torchkiln.serve.shapes import DynamicDims, InputSpec, Request
from torchkiln.serve.stats import percentiles_ms
from torchkiln.variants import parse_variant

ARMS = ("eager", "dynamic", "auto", "pow2", "learned")
ARM_SPECS = {"eager": "eager", "dynamic": "inductor:dynamic=true", "auto": "inductor"}


@dataclass
class ServeBenchConfig:
    variant: str
    arms: Sequence[str] = ARMS
    learned_k: int | Mapping[str, int] = 8
    max_buckets: int = 256
    # Symbols compiled into the code; the rest share one graph (one CUDA graph per bucket).
    specialize: Collection[str] | None = ()
    max_sizes: Mapping[str, int] | None = None  # top bucket per symbol; default: trace maximum
    pow2_min: Mapping[str, int] | None = None  # default: a power of two <= the smallest size seen
    check_requests: int = 16
    keep_latencies: bool = False  # per-request latencies (ms) in the result, for later analysis


@dataclass
class _Arm:
    name: str
    spec: str
    call: Callable[[Request], Any] | None = None
    served: BucketedModule | None = None
    setup_s: float = 0.0
    compilations_setup: int = 0
    compilations_replay: int = 0
    # cudaMalloc retries (the caching allocator freeing every cached block, a device-wide
    # synchronisation) during this arm's requests: CUDA-graph pools of other arms in the same
    # process can push an arm into them.
    alloc_retries: int = 0
    latencies: list[float] = field(default_factory=list)
    # Per request: was this the first time this arm saw the request's exact sizes? Eager's
    # latencies on the H200 split in two levels (10 ms vs 60-80 ms); this says whether the
    # slow level is a per-new-shape cost.
    new_shape: list[bool] = field(default_factory=list)
    seen: set = field(default_factory=set)
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _autocast(precision: str, device: Any) -> contextlib.AbstractContextManager[Any]:
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def _plain_arm(name: str, model: Any, precision: str, device: Any) -> _Arm:
    import torch

    spec = ARM_SPECS[name] + ("" if precision == "fp32" else f"+{precision}")
    variant = parse_variant(spec)
    fn = variant.backend.wrap(model, compile_scope="model")

    def call(req: Request) -> Any:
        with torch.no_grad(), _autocast(precision, device):
            variant.backend.before_step()
            return fn(*req.args, **req.kwargs)

    return _Arm(name, spec, call)


def _served_call(served: BucketedModule) -> Callable[[Request], Any]:
    return lambda req: served(*req.args, **req.kwargs)


def _leaves(out: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_flatten

    return [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]


def serve_bench(
    model: Any,
    example: Request,
    dynamic_dims: DynamicDims,
    trace: Sequence[Mapping[str, int]],
    sample: Sequence[Mapping[str, int]],
    config: ServeBenchConfig,
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    import torch

    t_start = time.perf_counter()
    variant = parse_variant(config.variant)
    first = next(iter(model.parameters()))
    device = first.device
    spec = InputSpec(dynamic_dims)
    spec.set_reference(example)
    symbols = spec.symbols
    tops = {s: max(r[s] for r in [*trace, *sample]) for s in symbols}
    tops.update(config.max_sizes or {})
    lows = {s: _pow2_floor(min(r[s] for r in sample)) for s in symbols}
    lows.update(config.pow2_min or {})

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def request(sizes: Mapping[str, int]) -> Request:
        return spec.resize(example, {s: sizes[s] for s in symbols})

    log(f"[serve-bench] building {len(trace)} requests on {device}")
    reqs = [request(r) for r in trace]
    warm_reqs = [request(r) for r in sample]
    elements = np.array([np.prod([r[s] for s in symbols]) for r in trace], dtype=np.float64)

    arms: list[_Arm] = []
    for name in config.arms:
        t0, c0 = time.perf_counter(), compile_count()
        try:
            if name in ARM_SPECS:
                arm = _plain_arm(name, model, variant.precision, device)
                # Warm past compilation on the observation sample, as a server would have.
                for req in warm_reqs if name != "eager" else warm_reqs[:3]:
                    arm.call(req)
            else:
                if name == "pow2":
                    buckets = {s: powers_of_two(tops[s], lows[s]) for s in symbols}
                else:
                    buckets = learn_buckets(sample, config.learned_k, max_sizes=tops)
                served = BucketedModule(
                    model,
                    dynamic_dims,
                    buckets,
                    variant,
                    max_buckets=config.max_buckets,
                    specialize=config.specialize,
                )
                arm = _Arm(name, f"{variant.spec} {name} buckets", _served_call(served), served)
                log(f"[serve-bench] {name}: warming {served.grid.count} buckets {buckets}")
                arm.extra["warmup"] = served.warmup(*example.args, **example.kwargs)
            sync()
        except Exception as exc:  # noqa: BLE001  (a failing arm is reported; the others still run)
            arm = _Arm(name, name, error=f"{type(exc).__name__}: {exc}")
        arm.setup_s, arm.compilations_setup = time.perf_counter() - t0, compile_count() - c0
        log(
            f"[serve-bench] {name}: set up in {arm.setup_s:.1f}s, "
            f"{arm.compilations_setup} compilation(s){' ERROR ' + arm.error if arm.error else ''}"
        )
        arms.append(arm)

    def alloc_retries() -> int:
        if device.type != "cuda":
            return 0
        return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))

    live = [a for a in arms if a.error is None]
    log(f"[serve-bench] replaying {len(reqs)} requests through {[a.name for a in live]}")
    for i, req in enumerate(reqs):
        k = i % max(1, len(live))
        for arm in live[k:] + live[:k]:
            if arm.error is not None:
                continue
            sync()
            r0 = alloc_retries()
            c0, t0 = compile_count(), time.perf_counter()
            try:
                arm.call(req)
                sync()
            except Exception as exc:  # noqa: BLE001  (reported as the arm's status)
                arm.error = f"request {i} {trace[i]}: {type(exc).__name__}: {exc}"
                continue
            arm.latencies.append(time.perf_counter() - t0)
            shape = tuple(sorted(trace[i].items()))
            arm.new_shape.append(shape not in arm.seen)
            arm.seen.add(shape)
            arm.compilations_replay += compile_count() - c0
            arm.alloc_retries += alloc_retries() - r0
        if (i + 1) % max(1, len(reqs) // 10) == 0:
            log(f"[serve-bench] {i + 1}/{len(reqs)} requests, {time.perf_counter() - t_start:.0f}s")

    for arm in arms:
        if arm.served is not None:
            arm.extra["stats"] = arm.served.stats()
    errors = _check_outputs(model, arms, reqs[: config.check_requests], device)
    for arm in arms:
        if arm.served is not None:
            arm.served.close()
    summary = _summarise(arms, elements, errors)
    memory = None
    if device.type == "cuda":
        memory = {
            "reserved_bytes": torch.cuda.memory_reserved(device),
            "max_reserved_bytes": torch.cuda.max_memory_reserved(device),
            "device_total_bytes": torch.cuda.get_device_properties(device).total_memory,
        }
    return {
        "variant": variant.spec,
        "device_memory": memory,
        "device": str(device),
        "symbols": list(symbols),
        "trace": {
            "requests": len(trace),
            "sample": len(sample),
            "max_sizes": tops,
            "mean_elements": float(elements.mean()),
        },
        "config": {
            "learned_k": config.learned_k,
            "max_buckets": config.max_buckets,
            "specialize": sorted(config.specialize) if config.specialize is not None else "all",
            "pow2_min": lows,
        },
        "arms": summary,
        "wall_s": time.perf_counter() - t_start,
        **(
            {"latencies_ms": {a.name: [round(x * 1e3, 4) for x in a.latencies] for a in arms}}
            if config.keep_latencies
            else {}
        ),
    }


def _check_outputs(
    model: Any, arms: list[_Arm], reqs: list[Request], device: Any
) -> dict[str, float]:
    """Max abs difference from an fp32 eager reference over a few requests (rule 5: a variant
    that changes numerics is checked against higher precision; eager bf16 shows the baseline)."""
    import torch

    worst: dict[str, float] = {}
    for req in reqs:
        with torch.no_grad():
            ref = _leaves(model(*req.args, **req.kwargs))
        for arm in arms:
            if arm.error is not None or arm.call is None:
                continue
            got = _leaves(arm.call(req))
            if [g.shape for g in got] != [r.shape for r in ref]:
                worst[arm.name] = float("inf")  # wrong shapes: as wrong as it gets
                continue
            err = max(
                float((g.float() - r.float()).abs().max()) for g, r in zip(got, ref, strict=True)
            )
            worst[arm.name] = max(worst.get(arm.name, 0.0), err)
    return worst


def _ratio_ci(base: np.ndarray, other: np.ndarray, seed: int = 0) -> dict[str, Any]:
    """Throughput ratio (time of base over time of other, same requests) with a paired bootstrap
    95% interval over requests."""
    n = min(len(base), len(other))
    if n == 0:
        return {"ratio": None, "ci95": None}
    base, other = base[:n], other[:n]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(1000, n))
    boots = base[idx].sum(axis=1) / other[idx].sum(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"ratio": float(base.sum() / other.sum()), "ci95": [float(lo), float(hi)]}


def _by_shape(latencies: np.ndarray, new: np.ndarray) -> dict[str, Any]:
    """Latency percentiles of requests whose sizes the arm met for the first time, and of the
    rest (sizes it had served before)."""
    return {
        "first_time": percentiles_ms(latencies[new]) if new.any() else None,
        "seen_before": percentiles_ms(latencies[~new]) if (~new).any() else None,
    }


def _summarise(arms: list[_Arm], elements: np.ndarray, errors: Mapping[str, float]) -> list[dict]:
    lat = {a.name: np.array(a.latencies) for a in arms}
    out = []
    for arm in arms:
        x = lat[arm.name]
        row: dict[str, Any] = {
            "arm": arm.name,
            "spec": arm.spec,
            "status": "ok" if arm.error is None else "error",
            "error": arm.error,
            "setup_s": arm.setup_s,
            "compilations_setup": arm.compilations_setup,
            "compilations_replay": arm.compilations_replay,
            "alloc_retries": arm.alloc_retries,
            "requests": int(x.size),
        }
        if x.size:
            row.update(
                replay_s=float(x.sum()),
                throughput_rps=float(x.size / x.sum()),
                elements_per_s=float(elements[: x.size].sum() / x.sum()),
                latency_ms=percentiles_ms(x),
                latency_ms_by_shape=_by_shape(x, np.array(arm.new_shape, dtype=bool)),
                max_abs_err_vs_fp32=errors.get(arm.name),
            )
            for base in ("eager", "dynamic"):
                if base in lat and lat[base].size and base != arm.name:
                    row[f"speedup_vs_{base}"] = _ratio_ci(lat[base], x)
        stats = arm.extra.get("stats")
        if stats:
            row.update(
                buckets=stats["buckets"],
                bucket_sizes=stats["bucket_sizes"],
                padding_waste=stats["padding_waste"],
                eager_fallbacks=stats["eager_fallbacks"],
                fallback_reasons=stats["fallback_reasons"],
                recompiles_blocked=stats["recompiles_after_warmup"],
                cold_first_hits=stats["cold_first_hits"],
                warmup=arm.extra.get("warmup"),
            )
        out.append(row)
    return out


def _ratio(row: Mapping[str, Any], key: str) -> str:
    v = row.get(key)
    return f"{v['ratio']:.2f}" if v and v["ratio"] is not None else "-"


def render_table(result: Mapping[str, Any]) -> str:
    head = f"{'arm':<9}{'req/s':>9}{'x eager':>9}{'x dyn':>7}{'p50 ms':>9}{'p99 ms':>9}"
    head += f"{'compiles':>10}{'waste':>8}{'eager':>7}  setup"
    lines = [
        f"serve-bench: {result['trace']['requests']} requests, {result['variant']}, "
        f"{result['device']}",
        head,
    ]
    for r in result["arms"]:
        if r["status"] != "ok" or not r["requests"]:
            lines.append(f"{r['arm']:<9}  {r['error']}")
            continue

        waste = f"{r['padding_waste'] * 100:.1f}%" if "padding_waste" in r else "-"
        falls = str(r.get("eager_fallbacks", "-"))
        comp = f"{r['compilations_setup']}/{r['compilations_replay']}"
        lines.append(
            f"{r['arm']:<9}{r['throughput_rps']:>9.1f}{_ratio(r, 'speedup_vs_eager'):>9}"
            f"{_ratio(r, 'speedup_vs_dynamic'):>7}{r['latency_ms']['p50']:>9.2f}"
            f"{r['latency_ms']['p99']:>9.2f}{comp:>10}{waste:>8}{falls:>7}  {r['setup_s']:.0f}s"
        )
    lines.append("compiles = during set-up / during replay; waste = padded over real elements")
    cold = [
        f"{r['arm']} {r['cold_first_hits']['buckets']} bucket(s), "
        f"{r['cold_first_hits']['requests']} request(s)"
        for r in result["arms"]
        if (r.get("cold_first_hits") or {}).get("buckets")
    ]
    if cold:
        lines.append(
            "cold first hits after warm-up (over 3x the bucket's median): " + "; ".join(cold)
        )
    return "\n".join(lines)
