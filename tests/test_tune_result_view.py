"""A tune's result in a notebook: a short repr, an HTML view, and an in-process workload named
after the model's class."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchkiln.tune.pipeline as pipeline
from tests_helpers import synthetic_tune_doc
from torchkiln.tune.api import TuneResult, tune


def test_a_result_has_a_short_repr_and_an_html_view(tmp_path):
    doc = synthetic_tune_doc()
    doc["trials"] *= 200  # a long tune: the repr stays one line
    r = TuneResult(doc, tmp_path)
    text = repr(r)
    assert len(text) < 300 and "\n" not in text
    assert "best 'inductor' 2.00x [1.96, 2.04] over eager" in text
    assert str(tmp_path / "report.html") in text
    page = r._repr_html_()
    assert "<pre>import torch" in page and "&lt;script&gt;" in page and "<script>" not in page
    assert len(page) < 5000
    doc["selection"]["best"] = "eager"  # eager's speedup over itself is not shown as a gain
    assert "over eager" not in repr(TuneResult(doc, tmp_path))


def test_an_in_process_model_is_named_after_its_class(tmp_path, monkeypatch):
    seen = {}

    def fake_pipeline(workload, **kwargs):
        from torchkiln.workloads import load_workload

        seen["name"] = workload
        seen["model"] = type(load_workload(workload).model).__name__
        return {**synthetic_tune_doc(), "workload": workload}

    monkeypatch.setattr(pipeline, "tune", fake_pipeline)
    TinyNet = type("TinyNet", (torch.nn.Linear,), {"__module__": "__main__"})
    with pytest.warns(UserWarning, match="running trials in this process"):
        r = tune(TinyNet(2, 2), (torch.randn(1, 2),), device="cpu", out=tmp_path)
    assert seen == {"name": "TinyNet", "model": "TinyNet"}
    assert r.doc["workload"] == "TinyNet"
    # A class named like a registered workload does not take that name over.
    Simple = type("simple", (torch.nn.Linear,), {"__module__": "__main__"})
    with pytest.warns(UserWarning):
        tune(Simple(2, 2), (torch.randn(1, 2),), device="cpu", out=Path(tmp_path) / "b")
    assert seen["name"] == "simple-in-process"
    from torchkiln.workloads import available_workloads

    assert "TinyNet" not in available_workloads() and "simple" in available_workloads()
