"""Distributed trials on the CPU: 2 gloo ranks under torchrun, DDP and FSDP2, eager and inductor.

Every rank steps on the same seeded batch, so their losses must agree exactly; a rank that
raises, dies or hangs must end the trial with that rank named, never hang the run."""

from __future__ import annotations

import json

import pytest

from torchkiln.api import bench
from torchkiln.backends.distributed.arm import find_fully_shard
from torchkiln.backends.distributed.comm import exposed_share, subtract, union
from torchkiln.backends.distributed.config import check_dist
from torchkiln.backends.distributed.launch import (
    dist_summary_lines,
    merge_ranks,
    root_cause,
    run_dist_trial,
)
from torchkiln.backends.distributed.worker import losses_agree
from torchkiln.errors import KilnUserError
from torchkiln.runner.protocol.trial import TrialSpec

TRANSFORMER = "tests/fixtures/dist_workloads.py:tiny_transformer"
FIXTURES = "tests/fixtures/dist_workloads.py"
# Short reps: these tests check what is reported, not how fast anything is.
FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 2}


def spec(workload: str, variant: str, **kw) -> TrialSpec:
    return TrialSpec(workload=workload, variant=variant, step="train", preset="tiny", **FAST, **kw)


def assert_healthy(result: dict, nproc: int = 2) -> None:
    assert result["status"] == "ok", result.get("reason")
    assert result["dist"]["nproc"] == nproc
    assert len(result["ranks"]) == nproc
    for i, rank in enumerate(result["ranks"]):
        assert rank["rank"] == i and rank["status"] == "ok"
        assert rank["world_size"] == nproc and rank["backend"] == "gloo"
        assert rank["steady_ms"]["n"] == FAST["reps"]
        assert rank["steady_ms"]["ci95"][0] <= rank["steady_ms"]["median"]
        assert rank["memory"]["peak_rss_bytes"] > 0
        assert len(rank["losses"]) == 3
    losses = result["losses"]
    assert losses["match"] and losses["max_rel_diff"] == 0.0  # same batch, same math
    assert losses["per_rank"][0] == losses["per_rank"][1]
    assert result["correctness"]["passed"]
    assert result["throughput_samples_s"] > 0
    assert 0.0 <= result["exposed_comm_share"] <= 1.0
    assert result["speedup"]["ci95"][0] <= result["speedup"]["median"]


def test_ddp_simple_eager_and_inductor_through_bench(tmp_path):
    doc = bench(
        "simple",
        ["eager", "inductor"],
        step="train",
        preset="tiny",
        out=tmp_path / "run",
        timeout_s=300,
        spec_overrides=FAST,
        nproc=2,
        dist="ddp",
    )
    assert doc["dist"] == {"nproc": 2, "strategy": "ddp"}
    assert [t["variant"] for t in doc["trials"]] == ["eager", "inductor"]
    for t in doc["trials"]:
        assert_healthy(t)
        assert t["dist"]["strategy"] == "ddp"
        # rank 0 also timed the variant in one plain process: the scaling reference
        assert t["single_process"]["steady_ms"]["median"] > 0
        assert t["scaling_efficiency"] > 0
        # DDP averages two identical gradients: the same updates as one process
        assert t["losses"]["vs_single_process"]["match"]
    compiled = doc["trials"][1]
    assert all(r["dynamo"]["graphs"] >= 1 for r in compiled["ranks"])
    # The reference is warmed like any arm, and Dynamo's counters show that it compiled its own
    # graphs (a reference that silently ran eager would read slower than the compiled ranks).
    single = compiled["single_process"]
    assert single["warmup"]["steps"] >= FAST.get("warmup_steps", 1)
    assert single["dynamo_after_warmup"]["graphs"] > single["dynamo_before"]["graphs"]
    saved = json.loads((tmp_path / "run" / "trials" / "01-inductor" / "result.json").read_text())
    assert saved["status"] == "ok" and saved["dist"]["nproc"] == 2
    lines = dist_summary_lines(doc)  # what `kiln bench --dist` prints under its table
    assert lines[0].strip().startswith("ddp on 2 rank(s)")
    assert lines[2].split()[:2] == ["inductor", "ok"] and "samples/s" in lines[2]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--nproc", "2"], "--nproc 2 needs --dist"),
        (["--dist", "ddp"], "add --step train"),
        (["--executor", "local", "--address", "auto"], "--address is for --executor ray"),
    ],
)
def test_cli_rejects_bad_dist_options_with_exit_2(args, expect, capsys):
    from torchkiln.cli import main

    assert main(["bench", "simple", "--device", "cpu", *args]) == 2
    assert expect in capsys.readouterr().err


@pytest.mark.parametrize(
    ("workload", "variant", "strategy"),
    [
        (TRANSFORMER, "inductor", "fsdp"),  # its baseline arm is eager FSDP on the same model
        (TRANSFORMER, "eager", "ddp"),
        ("simple", "eager", "fsdp"),
    ],
)
def test_rank_figures_and_matching_losses(tmp_path, workload, variant, strategy):
    result = run_dist_trial(
        spec(workload, variant),
        tmp_path / "trial",
        nproc=2,
        strategy=strategy,
        timeout_s=300,
        single_process=variant == "eager",  # the reference's compile is tested above
    )
    assert_healthy(result)
    assert result["dist"]["strategy"] == strategy
    assert result["baseline_ms"]["median"] > 0  # the eager arm under the same wrapper
    if variant == "inductor":
        # FSDP2: each block is compiled apart (both layers share one graph)
        assert all(r["dynamo"]["graphs"] >= 1 for r in result["ranks"])
    else:
        assert result["scaling_efficiency"] > 0


def test_a_rank_that_raises_ends_the_trial_with_its_error(tmp_path):
    result = run_dist_trial(
        spec(f"{FIXTURES}:rank1_raises", "eager"),
        tmp_path / "trial",
        nproc=2,
        strategy="ddp",
        timeout_s=120,
    )
    assert result["status"] == "runtime_error"
    assert result["failed_rank"] == 1
    assert result["reason"].startswith("rank 1: RuntimeError")
    assert "planted failure on rank 1" in result["reason"]
    assert "planted failure on rank 1" in result["traceback"]
    assert result["ranks"][1]["status"] == "runtime_error"


def test_a_hung_rank_times_out_and_the_run_goes_on(tmp_path):
    result = run_dist_trial(
        spec(f"{FIXTURES}:rank1_hangs", "eager"),
        tmp_path / "trial",
        nproc=2,
        strategy="ddp",
        timeout_s=15,
    )
    assert result["status"] == "timeout"
    assert "no result after 15 s" in result["reason"]
    assert "rank 1: " in result["reason"]  # where each rank was when it was killed
    assert all(r["status"] == "no result" for r in result["ranks"])


def test_check_dist_validates_its_options():
    assert check_dist(None, None, "train") is None
    assert check_dist("fsdp", None, "train") == {"nproc": 1, "strategy": "fsdp"}
    with pytest.raises(KilnUserError, match="add --step train"):
        check_dist("ddp", 2, "infer")
    with pytest.raises(KilnUserError, match=r"choose from \['ddp', 'fsdp'\]"):
        check_dist("zero3", 2, "train")
    with pytest.raises(KilnUserError, match="needs --dist"):
        check_dist(None, 2, "train")
    with pytest.raises(KilnUserError, match="at least 1"):
        check_dist("ddp", 0, "train")


def test_fully_shard_is_found_on_this_torch():
    fn, module = find_fully_shard()
    assert callable(fn)
    assert module in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


def test_exposed_communication_is_what_compute_does_not_cover():
    # comm 0-4 and 6-10; compute 1-3 and 7-12 -> exposed 0-1, 3-4, 6-7 = 3 of wall 20
    assert union([(6, 10), (0, 2), (1, 4)]) == [(0, 4), (6, 10)]
    assert subtract([(0, 4), (6, 10)], [(1, 3), (7, 12)]) == 3
    out = exposed_share([(0, 4), (6, 10)], [(1, 3), (7, 12)], wall=20)
    assert out["comm_us"] == 8 and out["exposed_comm_us"] == 3
    assert out["exposed_comm_share"] == pytest.approx(0.15)
    assert exposed_share([(0, 4)], [], wall=8)["exposed_comm_share"] == 0.5
    assert exposed_share([(2, 3)], [(0, 10)], wall=10)["exposed_comm_share"] == 0.0


def test_losses_agree_within_the_precisions_tolerance():
    assert losses_agree([[2.0, 1.5], [2.0, 1.5]], "fp32")["match"]
    off = losses_agree([[2.0, 1.5], [2.0, 1.6]], "fp32")
    assert not off["match"] and off["max_rel_diff"] == pytest.approx(0.1 / 1.5)
    assert losses_agree([[2.0], [2.01]], "bf16")["match"]


def test_merge_names_torchruns_root_cause_over_its_peers_errors(tmp_path):
    """A rank killed by a signal writes nothing; torchrun's summary names it (the format
    below is what torch 2.14 prints when rank 1 is SIGKILLed)."""
    stderr = (
        "Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 1)\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : x\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 2)\n"
    )
    cause = root_cause(stderr)
    assert cause == (1, -9)
    (tmp_path / "rank0.json").write_text(
        json.dumps({"rank": 0, "status": "runtime_error", "reason": "peer closed connection"})
    )
    (tmp_path / "rank1-phase.txt").write_text("measure")
    result = merge_ranks(spec("simple", "eager"), tmp_path, 2, 1, False, 60, cause)
    assert result["status"] == "crashed" and result["failed_rank"] == 1
    assert result["reason"] == "rank 1: killed by SIGKILL during measure without writing a result"
    assert [r["status"] for r in result["ranks"]] == ["runtime_error", "no result"]
