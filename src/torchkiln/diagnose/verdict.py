"""The bottleneck verdict: a pure function of the trace metrics (``trace_metrics.analyze``).

Layers, in the order a performance engineer checks them; the first that holds is the verdict:

1. **input-bound**: the GPU sits idle while the host waits for the next batch for at least
   ``INPUT_SHARE`` of the step (on the CPU: the step waits for data that long). Compiling
   cannot help until the loader keeps up.
2. **GPU-bound**: the GPU is busy at least ``GPU_BUSY`` of the step. Then the kernel mix says
   which: matrix-unit kernels (GEMM, convolution, attention) at least ``CLASS_SHARE`` of device
   time is **gpu-compute-bound**; elementwise, reductions, norms and copies that much is
   **gpu-memory-bound**; neither, the larger of the two, with low confidence.
3. **host/launch-bound**: the GPU is idle, for reasons other than data, at least ``HOST_IDLE``
   of the step: waiting for the host to dispatch and launch work, or in gaps between many small
   kernels.
4. **balanced**: none of the above; no single layer dominates.

On a CPU-only trace there is no device timeline: the verdict is input-bound or balanced and
says that the host/device split needs a GPU run.
"""

from __future__ import annotations

from typing import Any

KINDS = ("input-bound", "host/launch-bound", "gpu-compute-bound", "gpu-memory-bound", "balanced")

# A quarter of the step lost waiting for data caps the speedup any compiler can give at 1.33x,
# while fixing the loader gives it back directly: that is where to look first.
INPUT_SHARE = 0.25
# Above 80% busy, removing every host gap left would gain at most 1.25x; below it, kernels are
# not what sets the step time. (resnet50 bf16 on H200: reduce-overhead replays the step in
# 1.8 ms against 6.4-11.8 ms eager, so eager's GPU is idle most of its step.)
GPU_BUSY = 0.80
# GPU idle (not for data) this much of the step: launches and dispatch are the lever.
HOST_IDLE = 0.35
CLASS_SHARE = 0.5
# When graph replays' kernels are missing from the trace, a host blocked this long in device
# synchronisation shows the GPU was busy that long, whatever the kernel records say.
SYNC_SHARE = 0.5
MARGIN = 0.10  # the deciding number this far past its threshold: high confidence


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _confidence(value: float, threshold: float) -> str:
    return "high" if abs(value - threshold) >= MARGIN else "medium"


def _evidence(m: dict[str, Any]) -> dict[str, Any]:
    gpu = m.get("gpu")
    ev: dict[str, Any] = {
        "step_ms": _r(m["wall_ms_per_step"]),
        "steps": m["steps"],
        "data_wait_share": _r(m["data_wait"]["share"]),
        "host_sync_share": _r(m["host"]["sync_share"]),
        "host_in_ops_share": _r(m["host"]["in_ops_share"]),
    }
    if gpu is not None:
        idle = gpu["idle"]
        launch = gpu["launch"]
        ev.update(
            gpu_busy_share=_r(gpu["busy_share"]),
            gpu_idle_share=_r(gpu["idle_share"]),
            idle_waiting_for_data=_r(idle["data_wait"]),
            idle_waiting_for_host=_r(idle["host"]),
            idle_between_kernels=_r(idle["between_kernels"]),
            idle_unattributed=_r(idle["unattributed"]),
            kernels_per_step=_r(gpu["kernels_per_step"]),
            small_kernel_count_share=_r(gpu["small_kernels"]["count_share"]),
            small_kernel_time_share=_r(gpu["small_kernels"]["time_share"]),
            mean_kernel_us=_r(gpu["mean_kernel_us"]),
            mean_launch_api_us=_r(launch["mean_api_us"]),
            launch_api_to_kernel_time=_r(launch["api_to_kernel_time"]),
            mean_launch_to_start_us=_r(launch["mean_queue_us"]),
            graph_launches_per_step=_r(launch["graph_launches_per_step"]),
            math_share=_r(gpu["kernel_mix"]["math"]),
            memory_share=_r(gpu["kernel_mix"]["memory"]),
        )
    return ev


def _input_bound(share: float, m: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    wait_ms = m["data_wait"]["ms_per_step"]
    where = "the GPU sits idle" if on_gpu else "the step waits"
    return {
        "kind": "input-bound",
        "explanation": (
            f"{where} for the next batch {_pct(share)} of the {m['wall_ms_per_step']:.3g} ms "
            f"step ({wait_ms:.3g} ms per step fetching data): the input pipeline, not the "
            "model, sets the step time."
        ),
        "next_step": (
            "Fix the input pipeline first; compiling the model will not help while it waits "
            "for data. Use more DataLoader workers (num_workers), pin_memory=True with "
            "non_blocking copies, prefetch_factor, and move decoding/augmentation off the "
            "training process or onto the GPU."
        ),
        "confidence": _confidence(share, INPUT_SHARE),
    }


def _gpu_bound(
    busy: float, gpu: dict[str, Any], ctx: dict[str, Any], mix_known: bool = True
) -> dict[str, Any]:
    mix = gpu["kernel_mix"]
    math, memory = mix["math"] or 0.0, mix["memory"] or 0.0
    told = mix_known and (math >= CLASS_SHARE or memory >= CLASS_SHARE)
    # Compute is the default GPU-bound verdict: memory-bound is said only where it can be told.
    kind = "gpu-memory-bound" if told and memory > math else "gpu-compute-bound"
    top = gpu["top_kernels"][0] if gpu["top_kernels"] else None
    top_txt = (
        f" The top kernel, {top['name'][:70]}, takes {_pct(top['share_of_device_time'])}."
        if top
        else ""
    )
    explanation = (
        f"The GPU is busy {_pct(busy)} of the step; matrix-unit kernels (GEMM, convolution, "
        f"attention) take {_pct(math)} of device time and memory-bound ones (elementwise, "
        f"reductions, norms, copies) {_pct(memory)}.{top_txt}"
    )
    if not mix_known:
        explanation = (
            f"The host waited on the device {_pct(busy)} of the step, so the GPU was busy at "
            "least that long; its kernels are missing from the trace, so whether they are "
            "compute- or memory-bound cannot be told."
        )
    elif not told:
        explanation += " Neither class reaches half of device time: the split is a guess."
    precision = ctx.get("precision", "fp32")
    backend = ctx.get("backend", "eager")
    if kind == "gpu-compute-bound":
        if precision in ("fp32", "tf32"):
            next_step = (
                "Run the matrix units at a lower precision: bf16 autocast (variant +bf16) or, "
                "keeping fp32 storage, TF32 (+tf32); then max-autotune "
                "(inductor:mode=max-autotune-no-cudagraphs) for better GEMM/convolution configs."
            )
        else:
            next_step = (
                "Already in 16-bit: try max-autotune (inductor:mode=max-autotune-no-cudagraphs) "
                "for better GEMM/convolution configs, and compare achieved FLOP/s with the "
                "device's peak; beyond that, less math (smaller model, sparsity, caching)."
            )
    elif backend == "eager":
        next_step = (
            "Fuse: torch.compile (variant inductor) merges elementwise and reduction kernels "
            "so intermediate tensors stay in registers instead of going through memory; bf16 "
            "(+bf16) halves the bytes moved; channels_last (+channels_last) for convolutions."
        )
    else:
        next_step = (
            "Already compiled: halve the bytes with bf16 (+bf16), try channels_last for "
            "convolutions, and look at the top kernels below for ones Inductor did not fuse."
        )
    conf = _confidence(busy, GPU_BUSY) if told else "low"
    return {"kind": kind, "explanation": explanation, "next_step": next_step, "confidence": conf}


def _launch_bound(idle: float, m: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    gpu = m["gpu"]
    split = gpu["idle"]
    host, gaps = split["host"] or 0.0, split["between_kernels"] or 0.0
    small = gpu["small_kernels"]
    launch = gpu["launch"]
    explanation = (
        f"The GPU is busy only {_pct(gpu['busy_share'])} of the "
        f"{m['wall_ms_per_step']:.3g} ms step: {_pct(host)} of the step it waits for the host "
        f"to dispatch and launch work, {_pct(gaps)} goes in gaps between queued kernels. "
        f"{gpu['kernels_per_step']:.0f} kernels per step, {_pct(small['count_share'])} of them "
        f"shorter than {small['threshold_us']:.0f} us"
    )
    if launch["mean_api_us"] is not None and gpu["mean_kernel_us"] is not None:
        explanation += (
            f"; a launch call takes {launch['mean_api_us']:.1f} us on the host against "
            f"{gpu['mean_kernel_us']:.1f} us for a mean kernel"
        )
    explanation += "."
    sync = m["host"]["sync_share"] or 0.0
    if ctx.get("cudagraphs"):
        next_step = (
            "The step already replays CUDA graphs yet the GPU still waits on the host: look "
            "for graph breaks and CUDA-graph skips (kiln explain --variant ...), host-device "
            "synchronisation (.item(), .cpu(), printing tensors) and Python work between steps."
        )
    elif sync >= 0.2 and host >= gaps:
        next_step = (
            f"The host spends {_pct(sync)} of the step blocked in device synchronisation: "
            "remove .item()/.cpu()/print(tensor) from the step so launches can run ahead; "
            "then CUDA graphs (inductor:mode=reduce-overhead)."
        )
    elif gaps > host:
        next_step = (
            "Fewer, larger kernels: torch.compile (inductor) fuses the many small elementwise "
            "kernels; a larger batch makes each kernel longer against its fixed cost; CUDA "
            "graphs (inductor:mode=reduce-overhead) also shorten the gaps between kernels."
        )
    else:
        next_step = (
            "Remove the per-kernel launch cost: capture the step in CUDA graphs "
            "(inductor:mode=reduce-overhead, or the cudagraphs backend), which replays all "
            "its kernels with one launch; torch.compile's fusion also cuts the kernel count."
        )
    return {
        "kind": "host/launch-bound",
        "explanation": explanation,
        "next_step": next_step,
        "confidence": _confidence(idle, HOST_IDLE),
    }


def classify(metrics: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict for one profile: ``kind`` (one of ``KINDS``), ``evidence`` (the numbers),
    ``explanation``, ``next_step`` and ``confidence``.

    ``context`` shapes the advice, not the kind: ``backend`` (eager, inductor, ...),
    ``precision`` (fp32, tf32, bf16, fp16) and ``cudagraphs`` (the variant already replays
    CUDA graphs)."""
    ctx = context or {}
    m = metrics
    gpu = m.get("gpu")
    evidence = _evidence(m)
    thresholds = {
        "input_share": INPUT_SHARE,
        "gpu_busy": GPU_BUSY,
        "host_idle": HOST_IDLE,
        "class_share": CLASS_SHARE,
    }
    notes: list[str] = []
    if gpu is None:
        share = m["data_wait"]["share"] or 0.0
        if share >= INPUT_SHARE:
            verdict = _input_bound(share, m, on_gpu=False)
        else:
            verdict = {
                "kind": "balanced",
                "explanation": (
                    f"No device timeline (a CPU run): the {m['wall_ms_per_step']:.3g} ms step is "
                    f"the host's own work, {_pct(m['data_wait']['share'])} of it waiting for "
                    "data. Whether a GPU would be launch- or compute-bound needs a GPU run."
                ),
                "next_step": (
                    "The top operators below are where the step goes; torch.compile (variant "
                    "inductor, Inductor's C++ backend) fuses elementwise work on the CPU. "
                    "Profile on the GPU (--device cuda) for the launch/compute split."
                ),
                "confidence": "low",
            }
        notes.append("GPU-only figures not available: " + ", ".join(m["unavailable"]))
    else:
        data = gpu["idle"]["data_wait"] or 0.0
        busy = gpu["busy_share"] or 0.0
        if gpu["launch"]["graph_kernels_missing"]:
            sync = m["host"]["sync_share"] or 0.0
            notes.append(
                "CUDA-graph replays are in the trace but their kernels are not: the GPU busy "
                f"share is a lower bound; the host waited on the device {_pct(sync)} of the step"
            )
            busy = max(busy, sync if sync >= SYNC_SHARE else 0.0)
        idle = 1.0 - busy - data
        if data >= INPUT_SHARE:
            verdict = _input_bound(data, m, on_gpu=True)
        elif busy >= GPU_BUSY:
            verdict = _gpu_bound(busy, gpu, ctx, not gpu["launch"]["graph_kernels_missing"])
        elif idle >= HOST_IDLE:
            verdict = _launch_bound(idle, m, ctx)
        else:
            verdict = {
                "kind": "balanced",
                "explanation": (
                    f"The GPU is busy {_pct(busy)} of the {m['wall_ms_per_step']:.3g} ms step and "
                    f"idle {_pct(idle)} for host reasons: no single layer dominates."
                ),
                "next_step": (
                    "No single lever: try torch.compile (inductor) for fusion, then CUDA graphs "
                    "(inductor:mode=reduce-overhead) for the remaining host gaps, and re-profile; "
                    "expect modest gains from either."
                    if ctx.get("backend", "eager") == "eager"
                    else "No single lever: the top kernels and host ops below are where the "
                    "remaining time goes; a larger batch raises GPU occupancy if memory allows."
                ),
                "confidence": "medium",
            }
        if gpu["launch"]["graph_kernels_missing"]:
            verdict["confidence"] = "low"
    return {
        "kind": verdict["kind"],
        "evidence": {**evidence, "thresholds": thresholds},
        "next_step": verdict["next_step"],
        "explanation": verdict["explanation"],
        "confidence": verdict["confidence"],
        "notes": notes,
    }


def diagnose(events: list[dict[str, Any]], context: dict[str, Any] | None = None) -> dict:
    """Metrics and verdict of a parsed trace: ``{"metrics": ..., "verdict": ...}``."""
    from torchkiln.diagnose.trace_metrics import analyze

    metrics = analyze(events)
    return {"metrics": metrics, "verdict": classify(metrics, context)}
