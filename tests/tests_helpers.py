"""Synthetic documents for report tests (conftest puts tests/ on the import path)."""

from __future__ import annotations


def _trial(variant, ms, speedup, first_s, status="ok"):
    return {
        "schema": "torchkiln.trial/1",
        "id": f"00-{variant}",
        "workload": "w",
        "variant": variant,
        "baseline": "eager",
        "step": "infer",
        "device": "cpu",
        "status": status,
        "reason": None if status == "ok" else "Unsupported: if x.sum() < 0: <script>",
        "steady_ms": {"median": ms, "ci95": [ms * 0.98, ms * 1.02]},
        "baseline_ms": {"median": 10.0, "ci95": [9.8, 10.2]},
        "speedup": {
            "median": speedup,
            "ci95": [speedup * 0.98, speedup * 1.02],
            "significant": speedup > 1.05,
        },
        "first_call_s": first_s,
        "memory": {"peak_rss_bytes": 2**30, "peak_reserved_bytes": None},
        "kernels_per_step": None,
        "correctness": {"passed": True, "worst_error_over_threshold": 0.5},
    }


def synthetic_tune_doc() -> dict:
    return {
        "schema": "torchkiln.tune/1",
        "workload": "user.py:<script>model",
        "step": "infer",
        "device": "cpu",
        "budget_s": 300,
        "wall_s": 100,
        "steps": None,
        "allow_precision": [],
        "environment": {"torch": "2.x", "cpu": "x86_64", "kiln_git_sha": "abc"},
        "stages": {
            "profile": {"verdict": "balanced"},
            "graph_breaks": {
                "breaks": 1,
                "graphs": 2,
                "captured_share": 0.9,
                "first_breaks": [
                    {
                        "file": "model.py",
                        "line": 12,
                        "source": "if x.sum() < 0:",
                        "category": "data-dependent control flow",
                        "fix": "use torch.where",
                    }
                ],
            },
            "search": {"skipped": {"inductor:mode=max-autotune": "would not fit <budget>"}},
        },
        "selection": {
            "best": "inductor",
            "reason": "fastest",
            "tied": [],
            "break_even_steps": {"inductor": 2000.0},
            "best_numerics_changing": None,
        },
        "recommendation": {
            "variant": "inductor",
            "code": "import torch\nrun = torch.compile(m)",
            "why": ["because x < y"],
        },
        "trials": [
            _trial("eager", 10.0, 1.0, 0.1),
            _trial("inductor", 5.0, 2.0, 20.0),
            _trial("inductor:fullgraph=true", 0, 0, 0, status="compile_error"),
        ],
    }


def assert_stream_pick(sel, streams):
    """A stream tune's pick (``sel``: results.json's selection; ``streams``: each measured
    candidate's stream metrics) is the fastest after warm-up or, where candidates could not be
    told apart from it, the one of them with the least compile and warm-up seconds."""
    from torchkiln.tune.stream_ties import one_off_s

    fastest = min(sel["steady_s_per_item"], key=sel["steady_s_per_item"].get)
    assert sel["ranking"][0] == fastest
    for v, r in sel["steady_vs_fastest"].items():
        assert (v in sel["tied"]) == (r["ci95"][0] <= 1.0)
    if not sel["tied"]:
        assert sel["best"] == fastest
        return
    assert sel["tied"][0] == fastest and sel["best"] in sel["tied"]
    assert sel["best"] == min(sel["tied"], key=lambda v: one_off_s(streams[v]))
    assert sel["best"] == fastest or sel["reason"].startswith("tie: ")


def fake_tune_trials(monkeypatch, run_trial, gpus=(None,)) -> None:
    """A tune whose trials are ``run_trial`` (no process is started), on ``gpus``, with a
    balanced profile verdict, no graph break, passing preflight and no warm trial start."""
    from torchkiln.tune import evidence, pipeline

    monkeypatch.setattr(pipeline, "run_trial", run_trial)
    monkeypatch.setattr(pipeline, "visible_gpus", lambda device: list(gpus))
    monkeypatch.setattr(pipeline, "preflight", lambda *a, **k: {"ok": True})
    monkeypatch.setattr(evidence, "profile_verdict", lambda spec, t, **kw: {"verdict": "balanced"})
    monkeypatch.setattr(evidence, "graph_breaks", lambda spec, t: {"breaks": 0})
    monkeypatch.setenv("KILN_WARM_START", "0")
