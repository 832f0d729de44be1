"""Workload registry, presets, and user specs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchkiln.workloads import available_workloads, load_workload
from torchkiln.workloads.loader import WorkloadSpecError

FIXTURES = Path(__file__).parent / "fixtures" / "workloads.py"


def test_builtins_are_registered():
    assert {"simple", "resnet50", "bert-base"} <= set(available_workloads())


def test_simple_full_and_tiny_presets():
    full = load_workload("simple")
    assert full.example_inputs[0].shape == (32, 3, 224, 224)
    tiny = load_workload("simple", preset="tiny", step="train")
    assert tiny.example_inputs[0].shape == (4, 3, 32, 32)
    assert tiny.step == "train" and tiny.targets.shape == (4,)
    out = tiny.model(*tiny.example_inputs)
    assert out.shape == (4, 10)


def test_simple_has_the_classic_layers():
    model = load_workload("simple", preset="tiny").model
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [
        (3, 64, (3, 3)),
        (64, 128, (3, 3)),
    ]
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == 2
    assert model.fc.in_features == 128 and model.fc.out_features == 10


def test_resnet50_tiny_builds_without_downloads():
    pytest.importorskip(
        "torchvision"
    )  # the vision extra (none imports beside torch 2.13's CPU build)
    r = load_workload("resnet50", preset="tiny")
    assert r.example_inputs[0].shape == (2, 3, 64, 64)


def test_bert_tiny_builds_without_downloads():
    pytest.importorskip("transformers")
    b = load_workload("bert-base", preset="tiny", step="train")
    assert b.example_inputs["input_ids"].shape == (2, 32)
    assert "labels" in b.example_inputs
    assert sum(p.numel() for p in b.model.parameters()) > 100e6  # the real BERT-base size


def test_batch_size_override():
    assert load_workload("simple", preset="tiny", batch_size=3).example_inputs[0].shape[0] == 3


def test_user_file_spec_returning_a_tuple():
    w = load_workload(f"{FIXTURES}:tiny_mlp", batch_size=5)
    assert w.example_inputs[0].shape == (5, 8)
    assert w.step == "infer"


def test_a_user_files_module_has_the_same_name_in_every_process():
    """Compiled artifacts name the model's module; another process must import it by that name
    (Python's str hash differs per process, so a name built from it would not)."""
    import subprocess
    import sys

    code = (
        "from torchkiln.workloads import load_workload;"
        f"print(type(load_workload({f'{FIXTURES}:aborts'!r}).model).__module__)"
    )
    names = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    }
    here = type(load_workload(f"{FIXTURES}:aborts").model).__module__
    assert names == {here} and here.startswith("kiln_user_")


def test_user_module_spec():
    w = load_workload("torchkiln.workloads.zoo:simple", preset="tiny")
    assert w.example_inputs[0].shape[0] == 4


@pytest.mark.parametrize(
    "spec, expect",
    [
        ("no-such-model", "choose from ['bert-base', 'gpt2', 'resnet50', 'simple'"),
        ("missing/file.py:factory", "does not exist"),
        (f"{FIXTURES}:nope", "has no attribute 'nope'"),
        (f"{FIXTURES}:broken_factory", "the factory itself is broken"),
        ("no_such_pkg_xyz.mod:f", "cannot import module"),
    ],
)
def test_bad_specs_name_the_problem(spec, expect):
    with pytest.raises(WorkloadSpecError) as info:
        load_workload(spec)
    assert expect in str(info.value)
