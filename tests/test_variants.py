"""Variant spec strings: round trips, canonical forms, and refusals that list the choices."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchkiln.variants import PRECISIONS, VariantSpecError, parse_variant
from torchkiln.variants.builtin import DYNAMIC, INDUCTOR_MODES


@pytest.mark.parametrize(
    "spec",
    [
        "eager",
        "inductor",
        "inductor:mode=max-autotune,dynamic=false+bf16+channels_last",
        "inductor:mode=reduce-overhead,fullgraph=true,scope=step+fp16",
        "cudagraphs:scope=step+tf32",
        "eager+bf16",
        "inductor:mode=reduce-overhead,dynamic=false,freezing=true+bf16",
    ],
)
def test_canonical_specs_round_trip(spec):
    v = parse_variant(spec)
    assert v.spec == spec
    assert parse_variant(v.spec) == v


def test_defaults_are_dropped_from_the_canonical_form():
    v = parse_variant("inductor:mode=default,dynamic=auto+fp32")
    assert v.spec == "inductor"
    assert v.backend.mode == "default" and v.precision == "fp32"


@given(
    mode=st.sampled_from(INDUCTOR_MODES),
    dynamic=st.sampled_from(DYNAMIC),
    fullgraph=st.booleans(),
    scope=st.sampled_from(["model", "step"]),
    precision=st.sampled_from(PRECISIONS),
    channels_last=st.booleans(),
)
def test_every_inductor_combination_round_trips(
    mode, dynamic, fullgraph, scope, precision, channels_last
):
    text = f"inductor:mode={mode},dynamic={dynamic},fullgraph={str(fullgraph).lower()}"
    text += f",scope={scope}+{precision}" + ("+channels_last" if channels_last else "")
    v = parse_variant(text)
    assert (v.backend.mode, v.backend.dynamic, v.backend.fullgraph) == (mode, dynamic, fullgraph)
    assert (v.precision, v.channels_last) == (precision, channels_last)
    assert parse_variant(v.spec) == v


@pytest.mark.parametrize(
    "bad, expect",
    [
        ("turbo", "choose from ['cudagraphs', 'eager', 'inductor'"),
        ("inductor:mode=fast", "'max-autotune-no-cudagraphs'"),
        ("inductor:dynamic=sometimes", "['auto', 'true', 'false']"),
        ("inductor:fullgraph=maybe", "['true', 'false']"),
        ("inductor:speed=11", "unknown parameter 'speed'"),
        ("inductor:mode", "must be key=value"),
        ("inductor+int8", "'channels_last'"),
        ("inductor+bf16+fp16", "more than one precision"),
        ("", "empty"),
    ],
)
def test_bad_specs_are_refused_with_the_choices(bad, expect):
    with pytest.raises(VariantSpecError, match=None) as info:
        parse_variant(bad)
    assert expect in str(info.value)


def test_numerics_changing_policies_are_flagged():
    assert not parse_variant("inductor").changes_numerics
    assert parse_variant("inductor+bf16").changes_numerics
    assert parse_variant("eager+tf32").changes_numerics


def test_cudagraphs_needs_cuda():
    v = parse_variant("cudagraphs")
    assert "needs a CUDA device" in v.backend.unsupported_reason("cpu")
    assert v.backend.unsupported_reason("cuda") is None


def test_regions_finds_the_repeated_layers():
    from torchkiln.variants.regions import NoRepeatedBlocks, repeated_blocks
    from torchkiln.workloads import load_workload

    pytest.importorskip("transformers")
    bert = repeated_blocks(load_workload("bert-base", preset="tiny").model)
    assert [type(b).__name__ for b in bert] == ["BertLayer"] * 12
    with pytest.raises(NoRepeatedBlocks, match="does not apply"):
        repeated_blocks(load_workload("simple", preset="tiny").model)


def test_regions_finds_resnets_bottlenecks():
    from torchkiln.variants.regions import repeated_blocks
    from torchkiln.workloads import load_workload

    pytest.importorskip(
        "torchvision"
    )  # the vision extra (none imports beside torch 2.13's CPU build)
    resnet = repeated_blocks(load_workload("resnet50", preset="tiny").model)
    assert len(resnet) == 16 and type(resnet[0]).__name__ == "Bottleneck"


def test_regions_is_an_inductor_scope_only():
    assert parse_variant("inductor:scope=regions").backend.scope == "regions"
    with pytest.raises(VariantSpecError, match="choose from"):
        parse_variant("cudagraphs:scope=regions")


def test_a_list_of_specs_splits_only_where_a_backend_name_follows_the_comma():
    from torchkiln.variants import split_variants

    text = "eager, inductor:mode=max-autotune,dynamic=false+bf16,cudagraphs,inductor:scope=step"
    assert split_variants(text) == [
        "eager",
        "inductor:mode=max-autotune,dynamic=false+bf16",
        "cudagraphs",
        "inductor:scope=step",
    ]
    for spec in split_variants(text):
        parse_variant(spec)  # every piece is a whole, valid spec
    assert split_variants("eager,,inductor") == ["eager", "inductor"]
    # A first piece that names no backend is kept, for parse_variant to refuse with the choices.
    assert split_variants("mode=fast,eager") == ["mode=fast", "eager"]


def test_frozen_weights_ship_as_the_config_flag_with_the_mode_kept():
    from torchkiln.tune.recommend import code

    text = code("inductor:mode=reduce-overhead,freezing=true+bf16", "infer", "cuda")
    assert "torch._inductor.config.freezing = True" in text
    assert 'torch.compile(model, mode="reduce-overhead")' in text
    assert "with torch.no_grad()" in text
    assert "freezing" not in code("inductor:mode=reduce-overhead+bf16", "infer", "cuda")


def test_whole_step_code_takes_its_first_step_eagerly_before_compiling():
    import ast

    from torchkiln.tune.recommend import code

    text = code("inductor:mode=reduce-overhead,dynamic=false,scope=step+bf16", "train", "cuda")
    ast.parse(text)  # it is Python a user can paste
    lines = text.splitlines()
    eager = lines.index("train_step(x, y)")
    compiled = next(i for i, s in enumerate(lines) if s.startswith("train_step = torch.compile("))
    defined = lines.index("def train_step(x, y):")
    assert defined < eager < compiled
    assert 'mode="reduce-overhead"' in lines[compiled]
    assert "optimizer.step()" in text and "torch.autocast" in text
