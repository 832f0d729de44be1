"""Configuration remedies are offered only where this torch has their settings, and ship as the
lines that set them; the plan offers configuration only for a workload without a source file;
`kiln variants` lists every remedy; the fix policies round-trip through spec strings."""

from __future__ import annotations

import torch

from torchkiln.cli import main
from torchkiln.repair import config as cfg
from torchkiln.repair import policy
from torchkiln.repair.plan import build_plan, fix_tokens
from torchkiln.variants import parse_variant


def test_every_offered_config_remedy_sets_settings_this_torch_has():
    import torch._dynamo.config as dyn

    for name, remedy in cfg.CONFIG_REMEDIES.items():
        if not remedy.available():
            continue
        for key in cfg.settings([name]):
            assert hasattr(dyn, key), (name, key)


def test_capture_scalar_outputs_lines_and_patch_around_calls():
    assert cfg.code_lines(["capture_scalar_outputs"]) == [
        "torch._dynamo.config.capture_scalar_outputs = True"
    ]
    before = torch._dynamo.config.capture_scalar_outputs
    with cfg.patched(["capture_scalar_outputs"]):
        assert torch._dynamo.config.capture_scalar_outputs is True
    assert torch._dynamo.config.capture_scalar_outputs == before


def test_an_old_torch_without_the_logging_lists_is_not_offered_ignore_logging(monkeypatch):
    import torch._dynamo.config as dyn

    for attr in ("reorderable_logging_functions", "ignore_logger_methods"):
        monkeypatch.delattr(dyn, attr, raising=False)
    assert not cfg.CONFIG_REMEDIES["ignore_logging"].available()
    assert "ignore_logging" not in cfg.offered_for({"print-logging"}, has_helpers=False)


def test_a_workload_without_source_gets_configuration_remedies_only(tmp_path):
    brk = {"file": "/nowhere/model.py", "line": 3, "category": "tensor-to-scalar",
           "source": "return x * t.item()", "reason": "Tensor.item()"}  # fmt: skip
    plan = build_plan("torchkiln.tune.inmemory:load", [brk], tmp_path)
    assert plan["code"] == {}
    assert plan["source_note"] == (
        "configuration remedies only: an in-memory model has no source file to rewrite"
    )
    assert fix_tokens(plan) == ["config:capture_scalar_outputs"]


def test_fix_none_offers_nothing(tmp_path):
    brk = {"file": "/x.py", "line": 1, "category": "tensor-to-scalar", "source": ""}
    assert build_plan("simple", [brk], tmp_path, "none")["fixes"] == []


def test_every_fix_policy_round_trips():
    for token in policy.choices():
        v = parse_variant(f"inductor:mode=reduce-overhead+bf16+fix={token}")
        assert v.fixes == (token,)
        assert parse_variant(v.spec) == v


def test_kiln_variants_lists_the_remedies(capsys):
    assert main(["variants"]) == 0
    out = capsys.readouterr().out
    for token in ("+fix=code:guard", "+fix=code:custom_op", "+fix=config:capture_scalar_outputs"):
        assert token in out


def test_kiln_workloads_lists_the_zoo(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    for name in ("zoo-encoder", "zoo-gated-mlp", "zoo-smooth-net", "zoo-clean-mlp"):
        assert name in out


def test_remedies_are_candidates_after_the_primaries_and_refine_the_leader():
    from torchkiln.tune.search import Evidence, candidates, refinements

    ev = Evidence(device="cuda", step="infer", graph_breaks=3, allow_precision={"bf16"},
                  fixes=["code:all", "code:guard", "config:capture_scalar_outputs"])  # fmt: skip
    specs = [c.spec for c in candidates(ev)]
    assert specs[:4] == [
        "inductor:dynamic=false+bf16",
        "inductor:dynamic=false+bf16+fix=code:all",
        "inductor:mode=reduce-overhead,dynamic=false+bf16",
        "inductor:mode=reduce-overhead,dynamic=false+bf16+fix=code:all",
    ]
    assert "inductor:dynamic=false+bf16+fix=code:guard" in specs
    assert "inductor:dynamic=false+bf16+fix=config:capture_scalar_outputs" in specs
    first = refinements("inductor:mode=max-autotune,dynamic=false+bf16", ev)[0]
    assert first.spec == "inductor:mode=max-autotune,dynamic=false+bf16+fix=code:all"
    none = Evidence(device="cuda", step="infer", graph_breaks=3, allow_precision={"bf16"})
    assert not any("+fix=" in c.spec for c in candidates(none))


def test_a_pick_with_remedies_ships_config_lines_and_fixes_patch(tmp_path):
    from repair.helpers import kiln_breaks, project
    from torchkiln.repair import judge
    from torchkiln.repair.loader import import_file

    proj = project(tmp_path, "scaled_head.py")
    torch.manual_seed(0)
    w = import_file(proj / "scaled_head.py").build(preset="tiny")
    plan = build_plan(f"{proj / 'scaled_head.py'}:build", kiln_breaks(w.model, w.example_inputs),
                      tmp_path / "repair")  # fmt: skip
    out = tmp_path / "run"
    out.mkdir()
    shipped = judge.shipped(plan, "inductor+fix=all+fix=config:capture_scalar_outputs", out)
    assert (out / "fixes.patch").read_text() == plan["code"]["all"]["patch"]
    assert shipped["code"]["patch_file"] == "fixes.patch"
    assert shipped["config"]["lines"] == ["torch._dynamo.config.capture_scalar_outputs = True"]
    assert "configuration only" in shipped["config"]["changes"]
    assert judge.shipped(plan, "inductor", tmp_path) is None
