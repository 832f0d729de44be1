"""The `xla` variant (torchax + jax.jit) on JAX's CPU client: ok and correct on `simple` for
inference and training, `unsupported` with the operator and line for what jit cannot trace, and
process isolation (torchax's import breaks torch.compile, so an inductor trial after an xla
trial must still work). jax/torchax are never imported in this pytest process: only in trials.

The factories at the bottom are workloads the trials load as ``tests/test_xla.py:<name>``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from torchkiln import Workload
from torchkiln.api import bench, run_trials
from torchkiln.errors import UnsupportedVariant
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.variants import VariantSpecError, parse_variant

HERE = Path(__file__).resolve()
# Small reps keep each trial to seconds on 2 cores; the numbers are not the point.
FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1}
needs_xla = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("jax", "torchax", "optax")),
    reason="needs the xla extra (jax, torchax, optax)",
)


def test_xla_spec_round_trips_and_validates():
    v = parse_variant("xla:donate=false+bf16")
    assert v.name == "xla" and v.backend.donate is False and v.precision == "bf16"
    assert parse_variant(v.spec) == v
    assert parse_variant("xla").spec == "xla"
    with pytest.raises(VariantSpecError, match="choose from \\['donate'\\]"):
        parse_variant("xla:mode=fast")
    with pytest.raises(VariantSpecError, match="choose from \\['true', 'false'\\]"):
        parse_variant("xla:donate=maybe")
    assert parse_variant("xla").backend.unsupported_reason("mps") is not None
    assert parse_variant("xla").backend.unsupported_reason("cuda:0") is None
    # Never in the caller's process: torchax's import would break torch.compile there.
    with pytest.raises(UnsupportedVariant, match="only inside kiln's trial processes"):
        parse_variant("xla").backend.wrap(nn.Linear(2, 2), compile_scope="model")


@needs_xla
def test_optax_twin_of_sgd_momentum_matches_torch_over_three_steps():
    import jax.numpy as jnp

    from torchkiln.backends.xla.arm import optax_twin

    w0 = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    grads = [torch.tensor(g, dtype=torch.float64) for g in ([1, 2, 3], [-1, 0, 5], [2, 2, -2])]
    p = nn.Parameter(w0.clone())
    opt = torch.optim.SGD([p], lr=0.01, momentum=0.9, weight_decay=1e-2)
    tx = optax_twin(opt)
    w = jnp.asarray(w0.numpy())
    state = tx.init(w)
    for g in grads:
        p.grad = g.clone()
        opt.step()
        updates, state = tx.update(jnp.asarray(g.numpy()), state, w)
        w = w + updates
    assert torch.allclose(p.detach(), torch.tensor(w.tolist(), dtype=torch.float64), atol=1e-6)


@needs_xla
@pytest.mark.slow
def test_xla_infer_is_correct_and_an_inductor_trial_after_it_still_compiles(tmp_path):
    doc = bench(
        "simple",
        ["xla", "inductor"],
        device="cpu",
        preset="tiny",
        out=tmp_path / "run",
        timeout_s=300,
        spec_overrides=FAST,
    )
    by = {t["variant"]: t for t in doc["trials"]}
    xla = by["xla"]
    assert xla["status"] == "ok", xla["reason"]
    assert xla["correctness"]["passed"]
    assert xla["first_call_s"] > 0 and xla["steady_ms"]["median"] > 0
    assert xla["xla"]["jax_device"].startswith("TFRT_CPU") or "cpu" in xla["xla"]["jax_device"]
    assert "jax_peak_bytes_in_use" in xla["memory"]
    assert xla["kernels_per_step"] is None
    # The baseline ran first, before torchax was imported: the speedup cannot be paired.
    assert xla["speedup"]["paired"] is False and xla["speedup"]["ratios"] == []
    assert xla["baseline_ms"]["n"] == FAST["reps"] and xla["achieved_tflops"] > 0
    assert any("not interleaved" in n for n in xla["notes"])
    # Process isolation: torchax's import in the xla trial cannot reach this one.
    assert by["inductor"]["status"] == "ok", by["inductor"]["reason"]
    assert by["inductor"]["correctness"]["passed"]


@needs_xla
@pytest.mark.slow
def test_xla_train_step_matches_eager_loss_and_updates(tmp_path):
    doc = bench(
        "simple",
        ["xla"],
        step="train",
        device="cpu",
        preset="tiny",
        out=tmp_path / "run",
        timeout_s=300,
        spec_overrides=FAST,
    )
    (xla,) = doc["trials"]
    assert xla["status"] == "ok", xla["reason"]
    corr = xla["correctness"]
    assert corr["passed"]
    # Loss and every parameter's first update (BN weight/bias included) were compared.
    text = str(corr)
    assert "loss" in text and "update.features.0.weight" in text


@needs_xla
def test_an_unchecked_xla_trial_says_why_it_was_not_checked(tmp_path):
    """As every backend's trial does: a head-to-head trial (its search trial checked it) says so,
    not "--no-check"."""
    why = "a head-to-head trial: its search trial checked it"
    spec = TrialSpec(
        workload="simple",
        variant="xla",
        preset="tiny",
        check_accuracy=False,
        extra={"unchecked_because": why},
        **FAST,
    )
    (xla,) = run_trials([spec], tmp_path, timeout_s=300)
    assert xla["status"] == "ok", xla["reason"]
    assert xla["correctness"] is None
    assert f"correctness check skipped ({why})" in xla["notes"]


@needs_xla
@pytest.mark.slow
def test_unsupported_ops_become_statuses_and_new_shapes_are_reported_as_recompiles(tmp_path):
    specs = [
        TrialSpec(workload=f"{HERE}:with_nonzero", variant="xla", index=0, **FAST),
        TrialSpec(workload=f"{HERE}:with_branch", variant="xla", step="train", index=1, **FAST),
        TrialSpec(workload=f"{HERE}:with_nonzero", variant="eager", index=2, **FAST),
        TrialSpec(workload=f"{HERE}:varying_batches", variant="xla", index=3, **FAST),
    ]
    nonzero, branch, eager, varying = run_trials(specs, tmp_path, timeout_s=300)
    assert nonzero["status"] == "unsupported"
    assert "aten.nonzero" in nonzero["reason"]
    assert "torch.nonzero(h > 0" in nonzero["reason"]  # the model's own line
    assert branch["status"] == "unsupported"
    assert "data-dependent" in branch["reason"]
    assert "if h.sum() > 0" in branch["reason"]
    assert eager["status"] == "ok"
    # The input stream brings batch sizes 2 and 6 besides the example's 4: each compiles anew.
    assert varying["status"] == "ok", varying["reason"]
    rows = varying["xla"]["shape_recompiles"]
    assert [r["shapes"] for r in rows] == [[[2, 8]], [[6, 8]]]
    assert all(r["recompiled"] and r["first_call_s"] > 0 for r in rows)


# Workloads for the trials above (loaded by path in the trial processes).


class WithNonzero(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        h = self.lin(x)
        return h[torch.nonzero(h > 0, as_tuple=True)].sum().reshape(1, 1)


class WithBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:
            return h * 2
        return h


def with_nonzero(batch_size: int | None = None):
    return WithNonzero(), (torch.randn(batch_size or 4, 8),)


def with_branch(batch_size: int | None = None):
    return WithBranch(), (torch.randn(batch_size or 4, 8),)


def varying_batches(batch_size: int | None = None):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def stream():
        for b in (4, 2, 4, 6, 2):
            yield (torch.randn(b, 8),)

    return Workload(model, (torch.randn(4, 8),), name="varying", input_stream=stream)
