"""The runner, tune and the report reach a backend's own code through the registry's hooks
(Backend.arm_builder, .protocol, .tune_candidate, .report_section), never by its name: a
backend registered here, under a name no module knows, gets the same treatment as xla."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from torchkiln.backends.xla.arm import build_xla_arm
from torchkiln.backends.xla.protocol import measure_xla_trial
from torchkiln.runner.protocol.executable import build_arm
from torchkiln.runner.protocol.measure_trial import measure_trial
from torchkiln.runner.protocol.trial import TrialSpec, base_result
from torchkiln.tune.search import Evidence, candidates
from torchkiln.variants import Backend, parse_variant, register_backend
from torchkiln.variants.base import backends, report_sections

CALLS: list[tuple] = []


def _own_arm(spec, variant, *, fp64, no_dropout):
    CALLS.append(("arm", variant.spec, fp64, no_dropout))
    return "its own arm"


def _own_protocol(spec, variant, baseline, result, phases):
    CALLS.append(("protocol", variant.spec, baseline.spec))
    result["status"] = "ok"


@dataclass(frozen=True)
class Apart(Backend):
    """A backend with everything of its own."""

    name = "apart-test"

    @property
    def arm_builder(self):
        return _own_arm

    @property
    def protocol(self):
        return _own_protocol

    @classmethod
    def tune_candidate(cls, evidence):
        return (cls.name, "its own candidate", 6.5, 1.0) if evidence.step == "infer" else None

    @classmethod
    def report_section(cls, doc):
        mine = [t for t in doc["trials"] if t["variant"] == cls.name]
        return ("Apart", [{"variant": t["variant"]} for t in mine]) if mine else None


@pytest.fixture
def apart():
    register_backend(Apart)
    CALLS.clear()
    yield
    backends().pop(Apart.name, None)


def test_a_plain_wrapper_backend_uses_the_runners_own_arm_and_protocol():
    for spec in ("eager", "inductor", "cudagraphs"):
        backend = parse_variant(spec).backend
        assert backend.arm_builder is None and backend.protocol is None
    assert parse_variant("cudagraphs").backend.uses_cudagraphs
    assert parse_variant("inductor:mode=reduce-overhead").backend.uses_cudagraphs
    assert not parse_variant("inductor").backend.uses_cudagraphs
    assert not parse_variant("eager").backend.uses_cudagraphs


def test_xla_supplies_its_arm_builder_and_protocol_through_the_registry():
    backend = parse_variant("xla").backend
    assert backend.arm_builder is build_xla_arm
    assert backend.protocol is measure_xla_trial


def test_build_arm_hands_a_backend_with_its_own_builder_to_it(apart):
    spec = TrialSpec("simple", "apart-test", preset="tiny")
    arm = build_arm(spec, parse_variant("apart-test+bf16"), no_dropout=True)
    assert arm == "its own arm"
    assert CALLS == [("arm", "apart-test+bf16", False, True)]


def test_measure_trial_hands_a_backend_with_its_own_protocol_to_it(apart):
    spec = TrialSpec("simple", "apart-test", preset="tiny", device="cpu")
    result = base_result(spec, "crashed", "")
    measure_trial(spec, result, lambda phase: None)
    assert CALLS == [("protocol", "apart-test", "eager")]
    assert result["status"] == "ok"
    assert result["variant"] == "apart-test"


def test_tune_plans_the_candidates_backends_offer(apart):
    infer = [c.spec for c in candidates(Evidence(device="cpu", step="infer"))]
    train = [c.spec for c in candidates(Evidence(device="cpu", step="train"))]
    assert "apart-test" in infer and "apart-test" not in train
    # The built-in offers: cudagraphs on CUDA only, xla when its extra is installed.
    assert "cudagraphs" not in infer
    assert "cudagraphs" in [c.spec for c in candidates(Evidence(device="cuda", step="infer"))]
    assert "xla" not in infer
    assert "xla" in [c.spec for c in candidates(Evidence("cpu", "infer", xla_available=True))]


def test_the_report_shows_the_sections_backends_offer(apart):
    doc = {"trials": [{"variant": "apart-test"}, {"variant": "eager"}]}
    assert report_sections(doc) == [("Apart", [{"variant": "apart-test"}])]
    assert report_sections({"trials": [{"variant": "eager"}]}) == []
