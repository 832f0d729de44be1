"""The recommendation's code takes every step the trial took: run on a small model, it leaves
the model in the mode the trial measured and computes what the trial's arm computes."""

from __future__ import annotations

import ast

import pytest
import torch
import torch.nn as nn

from torchkiln.runner.protocol.arm_facts import arm_facts
from torchkiln.runner.protocol.executable import build_arm
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.tune.recommend import code
from torchkiln.variants import parse_variant


def _model() -> nn.Module:
    torch.manual_seed(0)
    # Built as from a config: in train mode, dropout on.
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize(
    "spec,device",
    [
        ("eager", "cpu"),
        ("inductor", "cpu"),
        ("inductor:mode=max-autotune+bf16", "cuda"),
        ("inductor:scope=regions+channels_last", "cuda"),
        ("inductor:freezing=true", "cpu"),
    ],
)
def test_inference_code_sets_eval_mode_no_grad_and_the_device(spec, device):
    text = code(spec, "infer", device)
    ast.parse(text)
    lines = text.splitlines()
    assert any(s.startswith("model.eval()") for s in lines)
    assert "with torch.no_grad()" in text
    assert f'device = "{device}"' in lines and "model = model.to(device)" in lines
    assert "x = x.to(device)" in lines
    # eval before the compile (compiled code specialises on the mode)
    compile_at = next(
        (i for i, s in enumerate(lines) if "torch.compile" in s or ".compile(" in s), len(lines)
    )
    assert lines.index(next(s for s in lines if s.startswith("model.eval()"))) < compile_at


def test_training_code_sets_train_mode_and_scales_fp16_losses():
    text = code("inductor+fp16", "train", "cuda")
    ast.parse(text)
    assert "model.train()" in text and "model.eval()" not in text
    assert 'scaler = torch.amp.GradScaler("cuda")' in text
    assert "scaler.scale(loss).backward()" in text and "scaler.update()" in text
    assert "torch.no_grad" not in text


def test_the_facts_are_the_ones_the_trial_arm_follows():
    """The arm built for an inference trial is in eval mode, as the facts (and so the code) say;
    a training arm is in train mode."""
    for step in ("infer", "train"):
        spec = TrialSpec(
            workload="tests/fixtures/workloads.py:tiny_mlp",
            variant="eager",
            step=step,
            device="cpu",
        )
        arm = build_arm(spec, parse_variant("eager"))
        facts = arm_facts(parse_variant("eager"), step, "cpu")
        assert arm.model.training is (not facts.eval_mode)
        assert ("model.eval()" in code("eager", step, "cpu")) is facts.eval_mode


def _conv_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.5), nn.Flatten())


@pytest.mark.parametrize(
    "spec,make,shape",
    [("eager", _model, (4, 8)), ("eager+channels_last", _conv_model, (2, 3, 6, 6))],
)
def test_the_emitted_inference_code_runs_the_model_the_trial_measured(spec, make, shape):
    model = make()
    x = torch.randn(*shape)
    scope = {"model": model, "x": x}
    exec(code(spec, "infer", "cpu"), scope)
    assert scope["model"].training is False  # dropout off, as in the trial
    out = scope["out"]
    assert not out.requires_grad  # under no_grad, as in the trial
    reference = make().eval()  # batch norm on its running statistics, dropout off
    with torch.no_grad():
        expected = reference(x)
    torch.testing.assert_close(out, expected)  # deterministic: dropout is off


def test_the_emitted_training_code_runs_one_training_step():
    model = _model()
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scope = {
        "model": model,
        "x": x,
        "y": y,
        "optimizer": optimizer,
        "loss_fn": nn.functional.cross_entropy,
    }
    exec(code("eager", "train", "cpu"), scope)
    assert scope["model"].training is True
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_apply_of_an_inference_pick_runs_in_eval_mode_under_no_grad():
    from torchkiln.tune.recommend import apply

    model = _model()
    x = torch.randn(4, 8)
    fast = apply(model, "eager", "cpu", step="infer")
    out = fast(x)
    assert model.training is False and not out.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(out, _model().eval()(x))
    train = apply(_model(), "eager", "cpu", step="train")
    assert train.model.training is True and train(x).requires_grad
