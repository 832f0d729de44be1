"""The environment every result carries, so it can be reproduced and compared later."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torchkiln


def git_sha() -> str:
    """kiln's own commit: KILN_GIT_SHA when set (copies of the tree without .git), else git."""
    if os.environ.get("KILN_GIT_SHA"):
        return os.environ["KILN_GIT_SHA"]
    return _git_head()


# What cannot change while kiln runs (its commit, the driver, the packages' versions, the
# processor's name) is asked once a process, and once for every trial forked from the warm-start
# server, which asks before it forks (`warm`): four subprocesses and three package lookups of a
# trial's `environment` phase, which took 0.3 s of a GPT-2 trial on an H100 host alone and
# 0.7-1.1 s beside seven other trials (CUDA's initialisation included).
@functools.cache
def _git_head() -> str:
    repo = Path(torchkiln.__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({type(exc).__name__})"
    if out.returncode != 0:
        return "unknown (not a git checkout)"
    sha = out.stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=5,
    )
    return sha + ("-dirty" if dirty.stdout.strip() else "")


@functools.cache
def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


@functools.cache
def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


def warm() -> None:
    """Ask what cannot change once, ahead: a process that forks trials (the warm-start server)
    calls this before it forks, and they inherit the answers. Touches no CUDA (the driver's
    version comes from nvidia-smi, a process of its own)."""
    _git_head()
    platform.platform(), platform.processor()  # the processor's name runs `uname -p`, once
    for module in ("triton", "torchvision", "transformers"):
        _version(module)
    _driver_version()


def collect(device: str = "cpu") -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "kiln_version": torchkiln.__version__,
        "kiln_git_sha": git_sha(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _version("triton"),
        "torchvision": _version("torchvision"),
        "transformers": _version("transformers"),
        "threads": torch.get_num_threads(),
        "device": device,
        "gpu": None,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = {
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_bytes": int(props.total_memory),
            "multiprocessors": props.multi_processor_count,
            "driver": _driver_version(),
            "cudnn": torch.backends.cudnn.version(),
        }
    return env
