"""The evidence a tune gathers before its search: a quick environment check, the eager step's
profile verdict (`kiln profile`) and its graph breaks (`kiln explain`), and two facts about the
model (convolutions, repeated blocks). A stage that fails is reported and the search goes on
without its evidence."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.report.evidence import distinct_breaks
from torchkiln.runner.protocol.trial import TrialSpec


def environment_check(device: str) -> dict[str, Any]:
    """A quick check (the full one is `kiln doctor`): can this machine compile at all?"""
    import torch

    problems = []
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise KilnUserError("--device cuda was asked for, but no CUDA GPU is visible")
        if importlib.util.find_spec("triton") is None:
            problems.append("triton is not installed: Inductor cannot generate GPU kernels")
    elif shutil.which("g++") is None and shutil.which("c++") is None:
        problems.append("no C++ compiler on PATH: Inductor cannot compile for the CPU")
    return {"ok": not problems, "problems": problems, "torch": torch.__version__}


def profile_verdict(
    spec: TrialSpec, timeout_s: float, host_lock: str | None = None
) -> dict[str, Any]:
    """The eager step's verdict. ``host_lock``: the search's lock file, when the profile runs
    beside its trials; the worker's timed steps take an exclusive turn on it, and the record
    says when they ran (``timed_at``, wall-clock seconds) and how long the turns took."""
    try:
        profile = importlib.import_module("torchkiln.diagnose.profile")
    except ImportError as exc:
        return {"status": "skipped", "reason": f"kiln profile is not available ({exc})"}
    doc = profile.run_profile(
        spec.workload,
        variant="eager",
        step=spec.step,
        device=spec.device,
        preset=spec.preset,
        batch_size=spec.batch_size,
        timeout_s=timeout_s,
        host_lock=host_lock,
    )
    verdict = doc.get("verdict") or {}
    out = {"status": doc.get("status", "ok"), "verdict": verdict.get("kind"), "detail": verdict}
    timed = [p for p in doc.get("phase_at") or [] if p[0] in profile.TIMED_PHASES]
    if timed:
        out["timed_at"] = [timed[0][1], timed[-1][2]]
    if (doc.get("phase_s") or {}).get("host_wait"):
        out["host_wait_s"] = doc["phase_s"]["host_wait"]
    return out


def graph_breaks(spec: TrialSpec, timeout_s: float) -> dict[str, Any]:
    from torchkiln.diagnose.explain import explain

    report = explain(
        spec.workload,
        preset=spec.preset,
        variant="inductor",
        recompiles=False,
        device=spec.device,
        timeout=timeout_s,
    )
    if report.get("status") not in ("ok", "phase-error"):
        return {"status": report.get("status"), "breaks": None}
    capture = (report.get("phases") or {}).get("capture") or {}
    if report.get("status") == "phase-error" and capture.get("status") != "ok":
        # The capture found nothing because it failed, not because nothing broke: an unknown
        # count, so the search does not take `fullgraph=true` on a model that may break.
        return {"status": "phase-error", "breaks": None, "reason": report.get("error")}
    breaks = report.get("breaks") or []
    return {
        "status": report.get("status"),
        "breaks": len(breaks),
        "graphs": (report.get("graphs") or {}).get("count"),
        "captured_share": (report.get("graphs") or {}).get("captured_share"),
        # The same line found again (a loop body breaks once per iteration) is one entry with
        # its count, so the five shown are five places.
        "first_breaks": distinct_breaks(
            [{k: b.get(k) for k in ("file", "line", "source", "category", "fix")} for b in breaks]
        )[:5],
        "records": breaks,  # every break in full: the repair plan reads them
    }


def repair_plan(
    spec: TrialSpec, found: dict[str, Any], fix: str, out_dir: Any
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the repair stage's record, the plan) from the graph-break stage's findings: remedies
    to measure for each break (torchkiln.repair), none when `fix` is none or nothing broke."""
    from torchkiln.repair.plan import build_plan

    records = found.pop("records", None)
    if fix == "none":
        return {"status": "skipped", "reason": "--fix none"}, None
    if records is None:
        return {"status": "skipped", "reason": "no graph-break findings to act on"}, None
    try:
        plan = build_plan(spec.workload, records, out_dir, fix)
    except KilnUserError:
        raise  # a file that vanished or cannot be read: the user's to fix (exit 2)
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:2000]}, None
    stage = {
        "status": "ok",
        "mode": fix,
        "plan": plan["path"],
        "fixes": plan["fixes"],
        "config": {k: v["title"] for k, v in plan["config"].items()},
        "code": {k: [a["rewrite"] for a in v["applied"]] for k, v in plan["code"].items()},
        "left_alone": plan["skipped"],
        "source_note": plan["source_note"],
    }
    return stage, plan


def stage(fn: Any, spec: TrialSpec, timeout_s: float) -> dict[str, Any]:
    """An evidence stage that fails is reported and the search goes on without its evidence."""
    try:
        return fn(spec, timeout_s)
    except KilnUserError:
        raise
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:2000]}


def model_facts(spec: TrialSpec, eager: dict[str, Any] | None = None) -> tuple[bool, bool]:
    """(has convolutions, has repeated blocks for scope=regions): as the eager baseline's trial
    read them, else from a build of the workload in this process. The build here cost the
    tune's critical path a model build, and the libraries it imported into kiln's own process
    could change variables read at import (a warm-start server of their own, 15 s before the
    first search trials of a GPT-2 tune on an H200 could start)."""
    facts = (eager or {}).get("model_facts")
    if facts:
        return bool(facts["convolutional"]), bool(facts["repeated_blocks"])
    from torchkiln.variants.regions import model_facts as facts_of
    from torchkiln.workloads import load_workload

    w = load_workload(spec.workload, preset=spec.preset, batch_size=spec.batch_size)
    facts = facts_of(w)
    return facts["convolutional"], facts["repeated_blocks"]
