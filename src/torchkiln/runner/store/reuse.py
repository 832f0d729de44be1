"""When a finished trial found in a run directory may stand for the trial about to run.

A run directory keeps each trial's result so that a stopped run loses nothing, and a second
run into the same directory (`--resume DIR`, `--out DIR`, and `kiln tune`'s default directory,
which is the same for every tune of one workload and step) skips what is done. A result is
reused only when it was measured the same way: the same trial spec (workload, variant,
baseline, device, preset, batch size, reps, ...; an in-memory model's saved bytes travel in
it), the same kiln and PyTorch, and for a `file.py:factory` or `pkg.module:factory` workload
the same contents of the file the factory is in (not of what that file imports). Anything
else is measured again: a tune on the GPU must not read the CPU tune's eager baseline, nor one
from before a PyTorch upgrade.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torchkiln
from torchkiln.measure.environment import git_sha
from torchkiln.runner.protocol.trial import PREPAY, TrialSpec


@functools.lru_cache(maxsize=1)
def _installed() -> dict[str, str]:
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "not installed"
    return {"kiln": torchkiln.__version__, "kiln_git_sha": git_sha(), "torch": torch}


UNKNOWN = "unknown"  # a workload whose code kiln cannot find: its results are never reused


def workload_digest(workload: str) -> str | None:
    """sha256 of the file a `file.py:factory` or `pkg.module:factory` workload's code is in
    (found on sys.path without importing it: the user's code runs in trial processes only);
    None for kiln's registered workloads (kiln's version covers them); UNKNOWN where the file
    cannot be found."""
    target, colon, _ = workload.rpartition(":")
    if not colon or not target:  # a registered name
        return None
    if target.endswith(".py") or "/" in target:
        path: Path | None = Path(target)
    else:
        path = _module_file(target)
    if path is None or not path.is_file():
        return UNKNOWN
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    for root in sys.path:
        base = Path(root or ".").joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


# Environment variables a trial process inherits that change what it measures. Read at each
# trial (a caller may set them between runs), not cached.
SETTING_PREFIXES = ("TORCHINDUCTOR_", "TORCH_", "TRITON_", "OMP_", "MKL_", "CUDA_", "KILN_")
# Covered otherwise: kiln's sha is in the record, an in-memory model's bytes in the spec; where
# results are also stored (the history) changes nothing measured, nor where the compile caches
# are: each trial gets caches of its own (trial_process.trial_env), and Inductor writes its
# default cache directory into this process's environment the first time it compiles here (a
# tune's pick applied in the caller's process then kept the next tune from reusing its trials).
NOT_SETTINGS = (
    "KILN_GIT_SHA",
    "KILN_INMEMORY_PATH",
    "KILN_HISTORY",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
)


def settings_env() -> dict[str, str]:
    """The environment variables (SETTING_PREFIXES, less NOT_SETTINGS) set in this process."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(SETTING_PREFIXES) and k not in NOT_SETTINGS
    }


def fingerprint(spec: TrialSpec) -> dict[str, Any]:
    """What a result must have been measured with to be reused for ``spec``. The fixed costs a
    baseline pays ahead for the search (PREPAY) are not part of what it measures: a baseline
    reused by a tune that allows other precisions leaves those to the trials that need them."""
    data = asdict(spec)
    data["extra"] = {k: v for k, v in data["extra"].items() if k != PREPAY}
    return {
        "spec": data,
        **_installed(),
        "host": platform.node(),
        "env": settings_env(),
        "workload_file": workload_digest(spec.workload),
    }


# Outcomes that say more about the run that ended them than about the variant: a timeout set
# by that run's budget (a later run may give it more), a crash or an out-of-memory beside
# what else held the machine then. They are measured again; every other outcome stands.
RETRIED = {"timeout": "timed out", "crashed": "crashed", "oom": "ran out of memory"}


def retried(result: dict[str, Any]) -> str | None:
    """Why a finished result is measured again whatever its record says, or None."""
    how = RETRIED.get(result.get("status", ""))
    return None if how is None else f"it {how} there, which a new run may not"


def difference(stored: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """None when the two match; else what differs, in a few words, for the user."""
    if stored is None:
        return "it has no record of how it was measured (written by an older kiln)"
    if current.get("workload_file") == UNKNOWN:
        return "kiln cannot find the workload's source file to tell whether it changed"
    if stored == current:
        return None
    old, new = _flat(stored), _flat(current)
    changed = [k for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
    shown = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:3])
    if len(changed) > 3:
        shown += f", and {len(changed) - 3} more"
    return f"it was measured with other settings ({shown or 'its record differs'})"


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    """The spec's fields and the environment variables as top-level keys, so a difference
    names the one field or variable that changed."""
    flat = {k: v for k, v in record.items() if k not in ("spec", "env")}
    flat.update(record.get("spec") or {})
    flat.update({f"${k}": v for k, v in (record.get("env") or {}).items()})
    return flat
