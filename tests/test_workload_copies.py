"""One build of the workload per trial process: later arms are copies with the same weights,
inputs and random generators' states as a fresh build, nothing shared between them; workloads
that cannot be kept are built each time, with the reason."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from torchkiln.runner.protocol import workload_copies as wc
from torchkiln.runner.protocol.settings import seed_everything
from torchkiln.workloads import Workload


@pytest.fixture(autouse=True)
def trial_process():
    wc.forget()
    wc.activate()
    yield
    wc.forget()


def factory(calls: list, device: str = "cpu", width: int = 8):
    def build() -> Workload:
        calls.append(1)
        model = nn.Sequential(nn.Linear(width, 16), nn.Dropout(0.5), nn.Linear(16, 4)).to(device)
        return Workload(model=model, example_inputs=(torch.randn(4, width, device=device),))

    return build


def built_then_drawn(load, key, build):
    seed_everything(0)
    w = wc.load(key, build)
    return w, (torch.rand(3), random.random())


def test_a_copy_is_a_fresh_build_with_the_generators_where_the_build_left_them():
    calls: list = []
    first, drawn_first = built_then_drawn(wc.load, "k", factory(calls))
    second, drawn_second = built_then_drawn(wc.load, "k", factory(calls))
    assert len(calls) == 1 and wc.counts == {"built": 1, "copied": 1}
    pairs = zip(first.model.state_dict().values(), second.model.state_dict().values(), strict=True)
    for a, b in pairs:
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert torch.equal(first.example_inputs[0], second.example_inputs[0])
    assert torch.equal(drawn_first[0], drawn_second[0]) and drawn_first[1] == drawn_second[1]
    # What the factory would have drawn next after a build of its own.
    wc.forget()
    rebuilt, drawn_rebuilt = built_then_drawn(wc.load, "k", factory(calls))
    assert torch.equal(drawn_rebuilt[0], drawn_second[0])
    # Nothing is shared: training one copy leaves the other (and the kept build) as they were.
    with torch.no_grad():
        second.model[0].weight.add_(1.0)
    assert not torch.equal(first.model[0].weight, second.model[0].weight)
    third, _ = built_then_drawn(wc.load, "k", factory(calls))
    assert torch.equal(third.model[0].weight, first.model[0].weight)


def test_another_key_is_built_apart():
    calls: list = []
    a = wc.load("a", factory(calls, width=8))
    b = wc.load("b", factory(calls, width=6))
    assert len(calls) == 2 and a.model[0].in_features == 8 and b.model[0].in_features == 6


def test_what_cannot_be_kept_is_built_each_time_with_the_reason(monkeypatch):
    calls: list = []
    monkeypatch.setattr(wc, "MAX_KEPT_BYTES", 64)
    wc.load("big", factory(calls))
    wc.load("big", factory(calls))
    assert len(calls) == 2
    assert "GiB" in wc.record()["rebuilt_because"][0]
    monkeypatch.undo()

    def not_copyable() -> Workload:
        calls.append(1)
        w = factory([])()
        w.meta = {"stream": (i for i in range(3))}  # a generator cannot be deep-copied
        return w

    wc.load("gen", not_copyable)
    wc.load("gen", not_copyable)
    assert len(calls) == 4
    assert any("deep-copied" in why for why in wc.record()["rebuilt_because"])


def test_a_workload_on_a_device_is_not_kept():
    calls: list = []
    w = factory(calls)()
    assert wc.why_not_kept(w) is None
    w.model.to("meta")
    assert "device" in wc.why_not_kept(w)


def test_outside_a_trial_process_or_switched_off_every_arm_is_built(monkeypatch):
    calls: list = []
    wc.forget()  # not activated: a tune of an in-memory model in the caller's process
    wc.load("k", factory(calls))
    wc.load("k", factory(calls))
    assert len(calls) == 2
    wc.activate()
    monkeypatch.setenv(wc.BUILD_ONCE_ENV, "0")
    wc.load("k", factory(calls))
    wc.load("k", factory(calls))
    assert len(calls) == 4


def test_a_copy_for_a_device_is_made_there_as_a_moved_host_copy_would_be():
    """Copies onto the device the arm runs on, from the kept host build (the meta device stands
    in for a GPU): weights and inputs there, tied weights tied, parameters still parameters that
    require grad, strides kept; other tensors and the kept build stay on the host."""

    def build() -> Workload:
        emb = nn.Embedding(10, 4)
        head = nn.Linear(4, 10, bias=False)
        head.weight = emb.weight  # tied, as a language model's head
        model = nn.Sequential(emb, head)
        model.register_buffer("scale", torch.ones(3))
        model.note = torch.zeros(2)  # a plain attribute: `model.to` would leave it too
        x = torch.randint(0, 10, (4, 2)).t()  # not contiguous
        return Workload(model=model, example_inputs=(x,), targets=torch.randn(2, 4))

    seed_everything(0)
    kept = wc.load("k", build)
    seed_everything(0)
    copied = wc.load("k", build, device="meta")
    assert wc.counts == {"built": 1, "copied": 1}
    emb, head = copied.model
    assert emb.weight.device.type == "meta" and head.weight is emb.weight
    assert isinstance(emb.weight, nn.Parameter) and emb.weight.requires_grad
    assert copied.model.scale.device.type == "meta" and copied.targets.device.type == "meta"
    (x,) = copied.example_inputs
    assert x.device.type == "meta" and x.stride() == kept.example_inputs[0].stride()
    assert not x.requires_grad
    assert copied.model.note.device.type == "cpu"
    assert all(p.device.type == "cpu" for p in kept.model.parameters())
    assert wc.load("k", build, device="cpu").model[0].weight.device.type == "cpu"
