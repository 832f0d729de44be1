"""Training streams: each item one training step, paired with eager's own model and optimizer;
the loss rule, padding to buckets in the data path, the compiles per shape and per bucket, the
tune's plan, and bad input.

Dynamo's counters and the trial's logic are what is tested, not Inductor's code generation: the
in-process trials compile with dynamo's ``aot_eager`` backend (forward and backward graphs, no
code generation), which keeps them fast on two cores."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests_helpers import assert_stream_pick
from torchkiln.errors import KilnUserError
from torchkiln.measure.stream_train import LossCheck, pad_item, pad_refusal

# A per-token model whose loss ignores masked positions (labels -100): padding is exact.
FACTORY = """
import torch
from torchkiln.workloads.base import Workload


class Tok(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.lin = torch.nn.Linear(16, 50)

    def forward(self, input_ids, attention_mask, labels):
        h = torch.relu(self.emb(input_ids)) * attention_mask[..., None]
        logits = self.lin(h)
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=-100
        )


def make(preset="full", batch_size=None, pads=True, **_):
    torch.manual_seed(0)

    def mk(batch, seq):
        return {"input_ids": torch.randint(0, 50, (batch, seq)),
                "attention_mask": torch.ones(batch, seq, dtype=torch.long),
                "labels": torch.randint(0, 50, (batch, seq))}

    pad = {"input_ids": 0, "attention_mask": 0, "labels": -100} if pads else {}
    return Workload(name="tok", model=Tok(), example_inputs=mk(2, 8), make_inputs=mk,
                    size_limits={"seq": 64}, loss_fn=lambda out, _targets: out, pad_values=pad)


def make_unpadded(**kw):
    return make(pads=False, **kw)
"""


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "tok.py").write_text(FACTORY)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"batch": 2, "seq": {s}}}\n' for s in [5, 9, 16, 9, 5]))
    return str(tmp_path / "tok.py"), trace


@pytest.fixture
def aot_eager(monkeypatch):
    """Inductor candidates compiled by dynamo with aot_eager; dynamo's caches and its
    recompile limit as they were, before and after."""
    import torch._dynamo.config as cfg

    from torchkiln.variants.builtin import Inductor

    def wrap(self, fn, *, compile_scope):
        dynamic = {"auto": None, "true": True, "false": False}[self.dynamic]
        return torch.compile(fn, backend="aot_eager", dynamic=dynamic)

    monkeypatch.setattr(Inductor, "wrap", wrap)
    # set back by hand: monkeypatch's undo deletes the attribute from dynamo's config module
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    limit = getattr(cfg, name)
    torch._dynamo.reset()
    yield
    setattr(cfg, name, limit)
    torch._dynamo.reset()


def _trial(factory: str, trace: Path, variant: str) -> dict:
    from torchkiln.runner.protocol.stream_trial import run

    torch._dynamo.reset()
    spec = {"workload": factory, "preset": "tiny", "device": "cpu", "stream": str(trace),
            "step": "train", "variant": variant}  # fmt: skip
    return run(spec)


def test_loss_rule_holds_the_first_items_and_every_loss_finite():
    check = LossCheck(tol=1e-4, checked_items=2)
    assert check(torch.tensor(1.0), torch.tensor(1.00005))
    assert not check(torch.tensor(1.1), torch.tensor(1.0))  # item 1: held to the tolerance
    assert check(torch.tensor(1.5), torch.tensor(1.0))  # item 2: drift is not a mismatch
    assert not check(torch.tensor(float("nan")), torch.tensor(1.0))  # but a NaN is
    r = check.report()
    assert r["loss_checked_items"] == 2 and r["loss_per_item"][3] is None


def test_pad_item_keeps_the_real_values_first_and_pads_with_the_declared_values():
    x = {"ids": torch.tensor([[3, 4]]), "mask": torch.ones(1, 2, dtype=torch.long)}
    dims = {"ids": {1: "seq"}, "mask": {1: "seq"}}
    p = pad_item(x, dims, {"seq": 4}, {"ids": 7, "mask": 0})
    assert p["ids"].tolist() == [[3, 4, 7, 7]] and p["mask"].tolist() == [[1, 1, 0, 0]]
    t = pad_item((torch.ones(1, 3),), {0: {1: "seq"}}, {"seq": 3}, {0: 0.0})
    assert isinstance(t, tuple) and t[0].shape == (1, 3)


def test_pad_refusal_names_what_is_missing():
    class W:
        name = "w"
        pad_values = {"ids": 0}

    assert "no pad value for input(s) ['mask']" in pad_refusal(W(), {"ids": {1: "s"}, "mask": {}})
    W.pad_values = {}
    assert "declares no pad_values" in pad_refusal(W(), {"ids": {1: "s"}})


def test_static_training_stream_recompiles_per_shape_and_its_losses_match_eager(tiny, aot_eager):
    factory, trace = tiny
    r = _trial(f"{factory}:make", trace, "inductor:dynamic=false+recompile_limit=64")
    assert r["status"] == "ok", r
    assert r["step"] == "train" and r["items"] == 5 and r["distinct_shapes"] == 3
    # one graph per distinct static shape: the first plus one recompile each
    assert r["compiles"] == 3 and r["recompiles"] == 2
    assert r["eager_fallbacks"] == 0 and r["mismatched_items"] == []
    assert r["loss_checked_items"] == 5
    for a, b in zip(r["loss_per_item"], r["eager_loss_per_item"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    # the weights move: each item's loss comes from weights one optimizer step further on
    assert len(set(r["eager_loss_per_item"])) == 5
    assert r["recompile_limit"] == 64 and r["total_s"] > 0


def test_bucketed_training_stream_compiles_once_per_bucket_and_never_after(tiny, aot_eager):
    factory, trace = tiny
    r = _trial(f"{factory}:make", trace, "inductor:dynamic=false+bucket=pow2")
    assert r["status"] == "ok", r
    assert r["buckets"] == {"seq": [8, 16]}  # powers of two from the smallest size, 5
    assert r["warmup_compiles"] == 2
    assert r["compiles"] == 0 and r["recompiles_after_warmup"] == 0
    # seqs 5, 9, 16, 9, 5 padded to 8, 16, 16, 16, 8: 64 elements for 44
    assert r["padding_waste"] == pytest.approx(64 / 44 - 1)
    assert r["pad_values"] == {"input_ids": 0, "attention_mask": 0, "labels": -100}
    # padding with the loss's ignore index leaves every loss as eager's on the unpadded batch,
    # and the warm-up's steps left the weights where eager's start
    assert r["mismatched_items"] == []
    for a, b in zip(r["loss_per_item"], r["eager_loss_per_item"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)


def test_bucketed_training_without_pad_values_is_refused(tiny, aot_eager):
    factory, trace = tiny
    with pytest.raises(KilnUserError, match="declares no pad_values"):
        _trial(f"{factory}:make_unpadded", trace, "inductor:dynamic=false+bucket=pow2")


def test_tune_on_a_training_stream_plans_the_family_and_picks_the_fastest_after_warm_up(
    tiny, aot_eager, monkeypatch, tmp_path
):
    import torchkiln.cli_stream as cli_stream
    from torchkiln.report.schema import validate
    from torchkiln.runner.protocol.stream_trial import run
    from torchkiln.tune.stream_search import tune_stream

    def in_process(spec, timeout_s, **_):  # the trial's own code, without a process each
        torch._dynamo.reset()
        try:
            return {"variant": spec["variant"], **run(spec)}
        except KilnUserError as exc:
            return {"variant": spec["variant"], "status": "error", "error": str(exc)}

    monkeypatch.setattr(cli_stream, "run_stream_trial", in_process)
    factory, trace = tiny
    doc = tune_stream(f"{factory}:make", device="cpu", preset="tiny", batch_size=None,
                      budget_s=600, allow_precision=set(), out=tmp_path / "tune",
                      stream=str(trace), stream_len=None, step="train")  # fmt: skip
    validate(doc)
    assert doc["step"] == "train"
    assert doc["stages"]["search"]["planned"] == [
        "inductor:dynamic=false+bucket=learned",
        "inductor:dynamic=false+bucket=pow2",
        "inductor:dynamic=true",
        "inductor",
        "inductor:dynamic=false+recompile_limit=64",
    ]
    assert all(t["step"] == "train" and t["status"] == "ok" for t in doc["trials"]), doc["trials"]
    sel = doc["selection"]
    assert_stream_pick(sel, {t["variant"]: t["stream"] for t in doc["trials"]})
    code = doc["recommendation"]["code"]
    assert ".train()" in code
    if sel["best"] != "eager":
        assert "optimizer.step()" in code
    # a workload that declares no pad values gets no bucketed candidate, and says why
    doc = tune_stream(f"{factory}:make_unpadded", device="cpu", preset="tiny", batch_size=None,
                      budget_s=600, allow_precision=set(), out=tmp_path / "tune2",
                      stream=str(trace), stream_len=None, step="train")  # fmt: skip
    search = doc["stages"]["search"]
    assert not any("bucket" in n for n in search["planned"])
    assert "declares no pad_values" in search["evidence"]["bucketing_refused"]


def test_code_for_a_bucketed_training_pick():
    from torchkiln.tune.stream_train_code import train_stream_code

    metrics = {"varying_dims": [["input_ids", 1, "seq"]], "buckets": {"seq": [8, 16]},
               "pad_values": {"input_ids": 0}}  # fmt: skip
    code = train_stream_code("inductor:dynamic=false+bucket=pow2", metrics, "cpu")
    assert "BUCKETS = {'seq': (8, 16)}" in code and "batch = pad_batch(batch)" in code
    assert "PAD = {'input_ids': 0}" in code
    assert "torch.compile(model, dynamic=False)" in code and "optimizer.step()" in code
    code = train_stream_code("inductor:mode=reduce-overhead+fp16", {}, "cuda")
    assert 'torch.autocast("cuda", dtype=torch.float16)' in code
    assert "scaler.step(optimizer)" in code
    compile(code, "<pick>", "exec")


def _kiln(*argv: str):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    return subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", *argv], capture_output=True, text=True, env=env
    )


def test_bench_training_stream_end_to_end_and_bad_input(tiny, tmp_path):
    factory, trace = tiny
    out = tmp_path / "run"
    common = ("bench", f"{factory}:make", "--device", "cpu", "--step", "train")
    r = _kiln(*common, "--variants", "eager", "--stream", str(trace), "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "stream.json").read_text())
    assert doc["step"] == "train"
    (t,) = doc["trials"]
    assert t["status"] == "ok" and t["items"] == 5 and t["mismatched_items"] == []
    # eager against eager: each owns its copy and optimizer from the same weights, in step
    assert t["loss_per_item"] == t["eager_loss_per_item"]
    before = (out / "stream.json").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"batch": 2, "seq": 5}\n{"batch": 2, "seq": 0}\n')
    r = _kiln(*common, "--variants", "eager", "--stream", str(bad), "--out", str(out))
    assert r.returncode == 2 and f"{bad}:2:" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    # a bucketed candidate of a workload without pad values: refused, one line, exit 2
    r = _kiln("bench", f"{factory}:make_unpadded", "--device", "cpu", "--step", "train",
              "--variants", "inductor:dynamic=false+bucket=pow2", "--stream", str(trace),
              "--out", str(out))  # fmt: skip
    assert r.returncode == 2 and "declares no pad_values" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert (out / "stream.json").read_text() == before
