"""What the history keeps of a result: the run's key (workload, step, device, versions, the
workload's source hash) and one measurement per variant, from each kind of kiln document."""

from __future__ import annotations

import hashlib
import json
import platform
import time
from typing import Any

KINDS = ("bench", "tune", "serve-bench", "kernels-bench", "pytest")
# Keys that change after a document is first written (tune rewrites its wall time after the
# report) or that say where it was stored: left out of the digest that identifies a result.
VOLATILE = ("history", "wall_s")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def digest(doc: dict[str, Any]) -> str:
    """Identifies one result: the same document, wherever its file went, has the same digest."""
    kept = {k: v for k, v in doc.items() if k not in VOLATILE}
    # Through JSON first: the document in memory (tuples, int keys, paths) and the same one read
    # back from its file give one text.
    text = json.dumps(json.loads(json.dumps(kept, default=str)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def kind_of(doc: dict[str, Any]) -> str:
    """Which command wrote ``doc``; ValueError for a document kiln did not write."""
    schema = str(doc.get("schema") or "")
    if schema.startswith("torchkiln.bench"):
        return "bench"
    if schema.startswith("torchkiln.tune"):
        return "tune"
    if schema.startswith("torchkiln.pytest"):
        return "pytest"
    if "arms" in doc and "trace" in doc:
        return "serve-bench"
    if "results" in doc and "copy" in doc:
        return "kernels-bench"
    raise ValueError("not a kiln bench, tune, serve-bench or kernels bench result")


def device_name(env: dict[str, Any] | None, device: str | None) -> str:
    """The GPU's name, or on the CPU the processor and its core count."""
    env = env or {}
    gpu = (env.get("gpu") or {}).get("name")
    if gpu:
        return str(gpu)
    if str(device or env.get("device") or "cpu").startswith("cuda"):
        return "cuda"
    cpu = env.get("cpu") or platform.machine()
    return f"{cpu} ({env['cpu_count']} cpus)" if env.get("cpu_count") else str(cpu)


def _precision(spec: str) -> str:
    from torchkiln.errors import KilnUserError
    from torchkiln.variants import parse_variant

    try:
        return parse_variant(spec).precision
    except (KilnUserError, ValueError):
        # A label of the user's (the pytest plugin) or a spec this kiln no longer parses.
        return "fp32"


def _environment(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    env = doc.get("environment")
    if env:
        return env
    trial = next((t for t in doc.get("trials") or [] if t.get("environment")), None)
    if trial:
        return trial["environment"]
    from torchkiln.measure.environment import collect

    # serve-bench and kernels bench documents: this process measured them, on this machine.
    device = "cuda" if kind == "kernels-bench" else str(doc.get("device") or "cpu")
    return collect(device.split(":")[0] if device.startswith("cuda") else "cpu")


def run_row(doc: dict[str, Any], kind: str | None = None) -> dict[str, Any]:
    """The runs-table row of ``doc``."""
    kind = kind or kind_of(doc)
    env = _environment(doc, kind)
    if kind == "kernels-bench" and not doc.get("environment"):
        doc["environment"] = env  # the stored document says where it was measured
    workload = doc.get("workload") or ("kernels" if kind == "kernels-bench" else "?")
    from torchkiln.runner.store.reuse import workload_digest

    return {
        "created": doc.get("created") or now(),
        "kind": kind,
        "workload": str(workload),
        "step": doc.get("step") or ("infer" if kind == "serve-bench" else None),
        "preset": doc.get("preset"),
        "device_name": device_name(env, doc.get("device")),
        "torch": env.get("torch"),
        "triton": env.get("triton"),
        "kiln": env.get("kiln_version") or doc.get("kiln_version"),
        "kiln_git_sha": env.get("kiln_git_sha"),
        "source_hash": doc.get("source_hash") or workload_digest(str(workload)),
        "document": json.dumps(doc, default=str),
        "digest": digest(doc),
        "host": doc.get("host") or platform.node(),
    }


def _interval(stats: dict[str, Any] | None) -> tuple[float | None, float | None, float | None]:
    if not stats or stats.get("median") is None:
        return None, None, None
    lo, hi = stats.get("ci95") or (stats["median"], stats["median"])
    return float(stats["median"]), float(lo), float(hi)


def measurement_rows(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """One row per variant: its status and median step time (ms) with its 95% interval."""
    rows = []
    if kind in ("bench", "tune", "pytest"):
        for t in doc.get("trials") or []:
            median, lo, hi = _interval(t.get("steady_ms"))
            row = _row(t["variant"], _precision(t["variant"]), t, median, lo, hi)
            if t.get("reused"):
                # A tune's trial taken from an earlier run into its directory: not measured
                # again, so no new point of its trend nor a run of its noise floor.
                row["status"] = "reused"
            rows.append(row)
    elif kind == "serve-bench":
        # Per arm, the median request latency; the trace's requests differ in size, so there
        # is no interval of one median step.
        precision = _precision(str(doc.get("variant") or "eager"))
        for arm in doc.get("arms") or []:
            p50 = (arm.get("latency_ms") or {}).get("p50")
            rows.append(_row(f"{arm['arm']}:{arm.get('spec')}", precision, arm, p50, p50, p50))
    elif kind == "kernels-bench":
        # do_bench's median with its 20th and 80th percentiles, per kernel, size and arm.
        for r in doc.get("results") or []:
            for arm, m in (r.get("arms") or {}).items():
                name = f"{r['kernel']}.{r['direction']}.{r['rows']}x{r['cols']}:{arm}"
                ms = m.get("ms")
                rows.append(_row(name, r["dtype"], m, ms, m.get("ms_p20", ms), m.get("ms_p80", ms)))
    return rows


def _row(variant: str, precision: str, src: dict[str, Any], median, lo, hi) -> dict[str, Any]:
    status = src.get("status") or ("ok" if median is not None else "failed")
    if status not in ("ok", "accuracy_fail") and not str(status).startswith("ok"):
        status = str(status).split(":")[0]
    return {
        "variant": variant,
        "precision": precision,
        "status": str(status),
        "median_ms": median,
        "lo_ms": lo,
        "hi_ms": hi,
    }
