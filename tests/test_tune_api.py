"""torchkiln.tune on an in-memory model: handed to trial processes, result applied."""

from __future__ import annotations

import pytest
import torch

import torchkiln
from torchkiln.tune import inmemory


@pytest.mark.slow
def test_tune_an_in_memory_model_and_apply_the_pick(tmp_path):
    from fixtures.workloads import TinyNet

    torch.manual_seed(0)
    model, x = TinyNet().eval(), torch.randn(4, 8)
    result = torchkiln.tune(model, (x,), device="cpu", budget="3m", out=tmp_path, reps=3)
    assert result.report_path.exists()
    assert result.doc["workload"] == inmemory.SPEC  # it went through trial processes
    assert result.best is not None
    fast = result.apply(model)
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), rtol=1e-4, atol=1e-5)

    # The same model into the same directory: every trial is reused, none measured again.
    first = {t["id"]: t for t in result.doc["trials"] + result.doc["head_to_head_trials"]}
    again = torchkiln.tune(model, (x,), device="cpu", budget="3m", out=tmp_path, reps=3)
    trials = again.doc["trials"] + again.doc["head_to_head_trials"]
    assert {t["id"] for t in trials} == set(first)
    for t in trials:
        assert t.get("reused") is True, t["id"]
        assert t["steady_ms"] == first[t["id"]]["steady_ms"]
    assert again.best == result.best

    # Another model (other weights, same class and spec) is measured again, and says why.
    torch.manual_seed(1)
    other = torchkiln.tune(TinyNet().eval(), (x,), device="cpu", budget="1m", out=tmp_path, reps=3)
    eager = other.doc["trials"][0]
    assert eager["variant"] == "eager" and not eager.get("reused")
    assert any("not reused" in n and "extra" in n for n in eager.get("notes", [])), eager["notes"]


def test_a_class_defined_in_main_cannot_reach_a_trial_process(tmp_path):
    Local = type("Local", (torch.nn.Linear,), {"__module__": "__main__"})
    why = inmemory.save(Local(2, 2), (torch.randn(1, 2),), tmp_path / "m.pt")
    assert why is not None and "__main__" in why


@pytest.mark.slow
def test_an_in_process_tune_never_reuses_a_trial(tmp_path):
    """A model that cannot reach a trial process runs in this one, where nothing tells it from
    another model tuned into the same directory: nothing of an earlier run is reused (its
    results are not written to the run directory at all)."""
    local = type("Local", (torch.nn.Linear,), {"__module__": "__main__"})
    x = torch.randn(4, 8)
    runs = []
    for seed in (0, 0):
        torch.manual_seed(seed)
        with pytest.warns(UserWarning, match="running trials in this process"):
            runs.append(
                torchkiln.tune(local(8, 4), (x,), device="cpu", budget="1m", out=tmp_path, reps=3)
            )
    first, again = (r.doc["trials"] for r in runs)
    assert first[0]["variant"] == "eager" and first[0]["status"] == "ok"
    assert [t["variant"] for t in again][:1] == ["eager"]
    assert not any(t.get("reused") for t in again)
    assert all("ran in the calling process" in " ".join(t["notes"]) for t in again)
    from torchkiln.workloads import available_workloads

    assert "__kiln_in_process__" not in available_workloads()  # the caller's registry as it was
