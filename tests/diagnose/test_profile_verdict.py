"""The profile verdict as a pure function over trace events: committed fixtures in the
profiler's Chrome-trace format (synthetic ones with known numbers; real CPU and H200 captures)
give the expected verdicts and numbers. No process is started here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from torchkiln.diagnose.trace_metrics import analyze, kernel_class
from torchkiln.diagnose.trace_trim import trim_events
from torchkiln.diagnose.verdict import KINDS, classify, diagnose
from torchkiln.measure.kernels import count_kernel_events, load_trace_events

FIXTURES = Path(__file__).parent / "fixtures" / "profile"
EAGER_BF16 = {"backend": "eager", "precision": "bf16", "cudagraphs": False}


def _synthetic():
    spec = importlib.util.spec_from_file_location("profile_synthetic", FIXTURES / "synthetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SYNTH = _synthetic()


def _load(name: str) -> list[dict]:
    return load_trace_events(str(FIXTURES / name))


def test_committed_synthetic_fixtures_match_their_generator() -> None:
    for name, (build, _) in SYNTH.SCENARIOS.items():
        committed = json.loads((FIXTURES / f"synthetic-{name}.json").read_text())
        assert committed["traceName"] == f"SYNTHETIC {name}"
        assert committed["traceEvents"] == json.loads(json.dumps(build().events)), name


@pytest.mark.parametrize("name", sorted(SYNTH.SCENARIOS))
def test_synthetic_fixture_verdict(name: str) -> None:
    expected = SYNTH.SCENARIOS[name][1]
    result = diagnose(_load(f"synthetic-{name}.json"), EAGER_BF16)
    verdict = result["verdict"]
    assert verdict["kind"] == expected
    assert verdict["kind"] in KINDS
    assert verdict["next_step"] and verdict["explanation"]
    assert verdict["evidence"]["steps"] == 3
    assert verdict["evidence"]["gpu_busy_share"] is not None
    assert json.loads(json.dumps(result)) == result  # plain JSON, as kiln tune reads it


def test_launch_bound_numbers_are_exact() -> None:
    # 3 steps x 40 ops of 25 us; kernels 4 us (even) / 12 us (odd) start 2 us after their
    # launch returns; step durations 1001, 1001, 1003 us (the last one synchronises).
    m = analyze(_load("synthetic-launch-bound-eager.json"))
    gpu = m["gpu"]
    window = 3005.0
    assert m["steps"] == 3
    assert m["wall_ms_per_step"] == pytest.approx(window / 3 / 1e3)
    assert gpu["kernels_per_step"] == 40
    assert gpu["busy_share"] == pytest.approx(3 * 20 * (4 + 12) / window)
    assert gpu["idle"]["between_kernels"] == pytest.approx(120 * 2.0 / window)
    assert gpu["idle"]["data_wait"] == 0.0
    assert gpu["idle"]["unattributed"] == 0.0
    total = gpu["busy_share"] + sum(gpu["idle"].values())
    assert total == pytest.approx(1.0)  # every microsecond of the window is accounted for
    assert gpu["small_kernels"]["count_share"] == pytest.approx(0.5)
    assert gpu["small_kernels"]["time_share"] == pytest.approx(4 / 16)
    assert gpu["launch"]["mean_api_us"] == pytest.approx(5.0)
    assert gpu["launch"]["mean_queue_us"] == pytest.approx(7.0)
    assert gpu["launch"]["api_to_kernel_time"] == pytest.approx(5.0 * 2 / 16)
    assert gpu["top_kernels"][0]["class"] == "math"
    assert gpu["top_kernels"][0]["share_of_device_time"] == pytest.approx(12 / 16)
    assert gpu["kernels_per_step"] * 3 == count_kernel_events(
        _load("synthetic-launch-bound-eager.json")
    )
    verdict = classify(m, EAGER_BF16)
    assert "CUDA graphs" in verdict["next_step"]
    assert verdict["evidence"]["idle_waiting_for_host"] > 0.5


def test_input_bound_gpu_idle_is_attributed_to_data() -> None:
    m = analyze(_load("synthetic-input-bound.json"))
    # The GPU is drained at the end of every step, so it is idle for the whole data wait.
    assert m["gpu"]["idle"]["data_wait"] == pytest.approx(m["data_wait"]["share"])
    assert m["data_wait"]["ms_per_step"] == pytest.approx(3.0)
    assert m["gpu"]["memcpy_ms_per_step"] == pytest.approx(0.1)
    v = classify(m)
    assert v["kind"] == "input-bound"
    assert "compiling" in v["next_step"] and "DataLoader" in v["next_step"]


def test_gaps_between_queued_kernels_are_not_host_waiting() -> None:
    m = analyze(_load("synthetic-tiny-kernels-queued.json"))
    idle = m["gpu"]["idle"]
    assert idle["between_kernels"] > 0.5 > idle["host"]
    assert m["gpu"]["small_kernels"]["count_share"] == 1.0
    assert "Fewer, larger kernels" in classify(m, EAGER_BF16)["next_step"]


def test_graph_replay_counts_graph_kernels_and_not_their_queueing() -> None:
    m = analyze(_load("synthetic-graph-replay.json"))
    launch = m["gpu"]["launch"]
    assert launch["graph_launches_per_step"] == 1
    assert launch["graph_kernels_per_step"] == 30
    assert launch["graph_kernels_missing"] is False
    assert launch["mean_queue_us"] is None  # graph kernels wait on their neighbours, not a launch
    assert m["host"]["sync_share"] > 0.5  # the host ran ahead and waited for the device
    assert m["gpu"]["kernel_mix"]["math"] == pytest.approx(600 / 720)


def test_missing_graph_kernels_fall_back_to_host_sync_with_low_confidence() -> None:
    v = diagnose(_load("synthetic-graph-kernels-missing.json"))["verdict"]
    assert v["kind"] == "gpu-compute-bound"
    assert v["confidence"] == "low"
    assert any("lower bound" in n for n in v["notes"])
    assert "cannot be told" in v["explanation"]


def test_context_changes_the_advice_not_the_kind() -> None:
    compute = analyze(_load("synthetic-matmul-compute-bound.json"))
    fp32 = classify(compute, {"backend": "eager", "precision": "fp32"})
    bf16 = classify(compute, EAGER_BF16)
    assert fp32["kind"] == bf16["kind"] == "gpu-compute-bound"
    assert "+bf16" in fp32["next_step"] and "+tf32" in fp32["next_step"]
    assert "max-autotune" in bf16["next_step"] and "+tf32" not in bf16["next_step"]
    memory = analyze(_load("synthetic-memory-bound.json"))
    assert "torch.compile" in classify(memory, EAGER_BF16)["next_step"]
    compiled = classify(memory, {"backend": "inductor", "precision": "bf16"})
    assert compiled["kind"] == "gpu-memory-bound"
    assert "Already compiled" in compiled["next_step"]
    launch = analyze(_load("synthetic-launch-bound-eager.json"))
    graphs = classify(launch, {"backend": "inductor", "cudagraphs": True})
    assert graphs["kind"] == "host/launch-bound"
    assert "kiln explain" in graphs["next_step"]


def test_trimming_keeps_the_device_work_of_the_kept_steps() -> None:
    # In the graph replay the host runs ahead: the kept steps' kernels run after the host has
    # left them, and must still be kept (and nothing from later steps).
    events = _load("synthetic-graph-replay.json")
    trimmed = trim_events(events, steps=2)
    m_full, m_trim = analyze(events), analyze(trimmed)
    assert m_trim["steps"] == 2
    assert m_trim["gpu"]["kernels_per_step"] == m_full["gpu"]["kernels_per_step"] == 30
    assert all(set(e) <= {"ph", "cat", "name", "pid", "tid", "ts", "dur", "args"} for e in trimmed)
    assert classify(m_trim)["kind"] == classify(m_full)["kind"]


def test_self_time_subtracts_nested_operators() -> None:
    def op(name: str, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 200.0,
        },
        op("aten::linear", 10.0, 100.0),
        op("aten::addmm", 20.0, 60.0),
        op("aten::t", 85.0, 5.0),
        op("aten::relu", 120.0, 30.0),
    ]
    m = analyze(events)
    ops = {o["name"]: o["self_ms_per_step"] * 1e3 for o in m["host"]["top_ops"]}
    assert ops == pytest.approx(
        {"aten::linear": 35.0, "aten::addmm": 60.0, "aten::t": 5.0, "aten::relu": 30.0}
    )
    assert m["host"]["in_ops_share"] == pytest.approx(130 / 200)
    assert m["gpu"] is None
    assert "gpu.kernels_per_step" in m["unavailable"]


def test_cpu_trace_verdicts() -> None:
    real = diagnose(_load("cpu-sleepy-loader.json"))
    assert real["metrics"]["gpu"] is None
    assert real["metrics"]["steps"] == 2
    assert real["verdict"]["kind"] == "input-bound"
    assert real["metrics"]["data_wait"]["share"] > 0.5
    assert any(o["name"] == "aten::addmm" for o in real["metrics"]["host"]["top_ops"])
    assert any("GPU-only figures" in n for n in real["verdict"]["notes"])
    # The same trace without its data-wait annotations: nothing waits, and a CPU run cannot
    # be called launch- or compute-bound.
    no_wait = [e for e in _load("cpu-sleepy-loader.json") if e.get("name") != "kiln:data_wait"]
    v = diagnose(no_wait)["verdict"]
    assert v["kind"] == "balanced"
    assert v["confidence"] == "low"


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "math"),
        ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NTN", "math"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4>", "math"),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", "math"),
        ("triton_tem_fused_addmm_relu_0", "math"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "math"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            "memory",
        ),
        ("triton_poi_fused__to_copy_add_0", "memory"),
        ("triton_per_fused_native_layer_norm_1", "memory"),
        ("void cudnn::bn_fw_inf_1C11_kernel_NCHW<__nv_bfloat16, float, true, 1>", "memory"),
        (
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int>",
            "memory",
        ),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>",
            "memory",
        ),
        ("my_custom_kernel", "other"),
    ],
)
def test_kernel_class(name: str, cls: str) -> None:
    assert kernel_class(name) == cls


H200 = [
    ("h200-resnet50-eager-bf16.json", {"host/launch-bound"}),
    ("h200-resnet50-reduce-overhead-bf16.json", {"gpu-compute-bound", "gpu-memory-bound"}),
    ("h200-matmul-bf16.json", {"gpu-compute-bound"}),
]


@pytest.mark.parametrize(("name", "kinds"), H200)
def test_real_h200_fixture_verdict(name: str, kinds: set[str]) -> None:
    path = FIXTURES / name
    if not path.exists():
        pytest.skip(
            f"{name} is captured on the H200 by benchmarks/capture_profile_fixtures.py "
            "and not committed yet"
        )
    doc = json.loads(path.read_text())
    context = {
        "backend": "inductor" if "reduce-overhead" in name else "eager",
        "precision": "bf16",
        "cudagraphs": "reduce-overhead" in name,
    }
    verdict = diagnose(load_trace_events(str(path)), context)["verdict"]
    assert verdict["kind"] in kinds
    assert verdict["kind"] == doc["kiln"]["full_trace_verdict"]  # trimming kept the verdict


def test_terminal_view_shows_verdict_layers_and_top_kernels() -> None:
    from rich.console import Console

    from torchkiln.diagnose.render_profile import render

    result = diagnose(_load("synthetic-launch-bound-eager.json"), EAGER_BF16)
    doc = {
        "status": "ok",
        "request": {"workload": "w", "variant": "eager+bf16", "step": "infer", "steps": 3},
        "unprofiled_ms_per_step": 0.9,
        "flops": {"achieved_tflops": 1.5, "pct_of_peak": 0.15, "peak_tflops": 989.4},
        "trace": "/tmp/t.json",
        **result,
    }
    console = Console(record=True, width=200)
    render(doc, console)
    text = console.export_text()
    assert "verdict  host/launch-bound" in text
    assert "busy 0.32 ms per step (32%)" in text
    assert "40 per step" in text
    assert "sm90_xmma_gemm" in text and "ui.perfetto.dev" in text
