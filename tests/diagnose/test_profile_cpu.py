"""`kiln profile` end to end on the CPU: each test runs the real worker process."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from torchkiln.diagnose import profile as profile_cmd
from torchkiln.diagnose.profile import run_profile
from torchkiln.diagnose.verdict import KINDS
from torchkiln.errors import KilnUserError
from torchkiln.measure.kernels import load_trace_events

FIXTURES = Path(__file__).parent / "fixtures"
SLEEPY = f"{FIXTURES / 'sleepy_loader.py'}:build"
MISBEHAVING = FIXTURES / "misbehaving.py"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    profile_cmd.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture(scope="module")
def loader_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, Path]:
    out = tmp_path_factory.mktemp("profile")
    args = _args(
        SLEEPY,
        "--with-loader",
        "--device",
        "cpu",
        "--steps",
        "3",
        "--json",
        str(out / "profile.json"),
        "--trace",
        str(out / "trace.json"),
    )
    code = profile_cmd.run(args)
    return code, json.loads((out / "profile.json").read_text()), out / "trace.json"


def test_a_sleeping_loader_is_input_bound(loader_run: tuple[int, dict, Path]) -> None:
    code, doc, _ = loader_run
    assert code == 0
    assert doc["status"] == "ok", doc.get("error")
    verdict = doc["verdict"]
    assert verdict["kind"] == "input-bound"
    assert set(verdict) >= {"kind", "evidence", "next_step", "explanation"}
    # 100 ms of sleep per batch against a model step of at most a few ms.
    assert verdict["evidence"]["data_wait_share"] > 0.5
    assert doc["metrics"]["data_wait"]["ms_per_step"] >= 100.0
    assert doc["metrics"]["steps"] == 3
    assert "loader" in verdict["next_step"] or "DataLoader" in verdict["next_step"]
    assert doc["environment"]["torch"] and doc["environment"]["kiln_git_sha"]
    assert doc["unprofiled_ms_per_step"] >= 100.0
    assert doc["warmup"]["first_call_s"] > 0


def test_cpu_report_names_the_gpu_figures_it_cannot_give(loader_run) -> None:
    _, doc, _ = loader_run
    assert doc["metrics"]["gpu"] is None
    assert "gpu.kernels_per_step" in doc["metrics"]["unavailable"]
    assert any("GPU-only figures not available" in n for n in doc["verdict"]["notes"])
    assert doc["metrics"]["host"]["top_ops"], "the operator breakdown is what a CPU run can give"
    assert doc["flops"]["per_step"] == 2 * 4 * (16 * 32 + 32 * 4)  # two linears, batch 4


def test_the_chrome_trace_is_kept_with_kiln_annotations(loader_run) -> None:
    _, doc, trace = loader_run
    assert doc["trace"] == str(trace.resolve())
    names = {e.get("name") for e in load_trace_events(str(trace))}
    assert {"ProfilerStep#1", "ProfilerStep#3", "kiln:data_wait", "kiln:load_batch"} <= names


def test_without_the_loader_nothing_waits_for_data() -> None:
    doc = run_profile(SLEEPY, steps=2, count_flops=False, timeout_s=300)
    assert doc["status"] == "ok", doc.get("error")
    assert doc["verdict"]["kind"] in KINDS
    assert doc["verdict"]["kind"] != "input-bound"
    assert doc["metrics"]["data_wait"]["share"] == 0.0
    assert doc["trace"] is None  # not asked to keep it


def test_with_loader_but_no_input_stream_is_a_user_error() -> None:
    with pytest.raises(KilnUserError, match="no input_stream"):
        run_profile(f"{FIXTURES / 'sleepy_loader.py'}:no_stream", with_loader=True, timeout_s=300)


def test_bad_requests_fail_before_a_process_starts() -> None:
    with pytest.raises(KilnUserError, match="choose from"):
        run_profile(SLEEPY, variant="nosuchbackend")
    with pytest.raises(KilnUserError, match="--steps"):
        run_profile(SLEEPY, steps=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a GPU where there is none")
def test_asking_for_cuda_without_a_gpu_fails_before_a_process_starts() -> None:
    with pytest.raises(KilnUserError, match="cuda"):
        run_profile(SLEEPY, device="cuda")


@pytest.mark.parametrize(
    ("factory", "timeout", "status", "where"),
    # The sleepy factory outlasts a 4 s limit wherever the worker has got to by then.
    [("exits", 300, "crashed", "during build"), ("sleepy", 4, "timeout", "within 4 s")],
)
def test_failures_become_statuses_without_a_verdict(factory, timeout, status, where) -> None:
    doc = run_profile(f"{MISBEHAVING}:{factory}", timeout_s=timeout, count_flops=False)
    assert doc["status"] == status
    assert doc["verdict"] is None
    assert where in doc["error"]


def test_a_failing_step_is_a_status_and_exit_code_1(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.json"
    code = profile_cmd.run(
        _args(f"{MISBEHAVING}:raises_in_forward", "--device", "cpu", "--json", str(out))
    )
    doc = json.loads(out.read_text())
    assert code == 1
    assert doc["status"] == "runtime_error"
    assert doc["verdict"] is None
    assert "forward is broken on purpose" in doc["error"] and "warmup" in doc["error"]
    assert "runtime_error" in capsys.readouterr().out
