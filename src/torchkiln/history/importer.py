"""`kiln import DIR...`: load results kiln wrote before (or without) the history into the store.

A DIR is a tune's output (results.json), a bench's run directory (bench.json; where a bench
was stopped before writing it, its manifest.json and the trials' result.json files), or a
JSON file kiln wrote (bench --json, serve-bench --out, kernels bench --json). A result already
in the store (the same document) is not stored twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchkiln.history.records import kind_of
from torchkiln.history.store import Store


def load(path: str | Path) -> dict[str, Any]:
    """The result document at ``path``; ValueError saying why there is none."""
    p = Path(path)
    if p.is_dir():
        for name in ("results.json", "bench.json"):
            if (p / name).is_file():
                return _read(p / name)
        if (p / "manifest.json").is_file():
            return _from_trials(p)
        raise ValueError("no results.json, bench.json or manifest.json in it")
    if not p.is_file():
        raise ValueError("does not exist")
    return _read(p)


def _read(p: Path) -> dict[str, Any]:
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p.name} cannot be read as JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"{p.name} is not a kiln result")
    kind_of(doc)  # raises for what kiln did not write
    return doc


def _from_trials(run: Path) -> dict[str, Any]:
    """A bench document from a run directory whose bench ended before writing bench.json."""
    from torchkiln.api import BENCH_SCHEMA
    from torchkiln.runner.store.rundir import RunDir

    rd = RunDir(run)
    manifest = rd.manifest() or {}
    trials = [r for t in manifest.get("trials") or [] if (r := rd.load_result(t["id"]))]
    if not trials:
        raise ValueError("its manifest.json lists no finished trial")
    keep = ("kiln_version", "command", "workload", "step", "device", "preset", "baseline")
    return {
        "schema": BENCH_SCHEMA,
        **{k: manifest.get(k) for k in keep},
        "created": manifest.get("updated"),
        "run_dir": str(run),
        "environment": next((t["environment"] for t in trials if t.get("environment")), None),
        "trials": trials,
    }


def import_paths(store: Store, paths: list[str]) -> list[dict[str, Any]]:
    """One line of outcome per path: {"path", "run_id", "status": imported|already|refused}."""
    out = []
    for path in paths:
        try:
            doc = load(path)
        except ValueError as exc:
            out.append({"path": path, "status": "refused", "why": str(exc)})
            continue
        found = store.find(doc)
        if found is not None:
            out.append({"path": path, "status": "already", "run_id": found})
        else:
            out.append({"path": path, "status": "imported", "run_id": store.append(doc)})
    return out
