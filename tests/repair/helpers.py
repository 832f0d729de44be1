"""Shared by the repair tests: a zoo model copied into a temporary project, its breaks as
`kiln explain` records them (the explain worker's capture phase, in this process), Dynamo's
own break count, and a check that a patch applies to a pristine copy."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from torchkiln.workloads import real

ZOO_DIR = Path(real.__file__).resolve().parent


def project(tmp: Path, *files: str) -> Path:
    """The named zoo files copied into ``tmp/proj`` (a user's project, outside any git tree)."""
    proj = tmp / "proj"
    proj.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(ZOO_DIR / f, proj / f)
    return proj


def sha256s(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.py"))
    }


def kiln_breaks(model, inputs) -> list[dict]:
    from torchkiln.diagnose.explain_worker import _capture_phase

    return _capture_phase(model, inputs, "infer", None)["breaks"]


def dynamo_breaks(model, inputs) -> tuple[int, int]:
    """(graph breaks, graphs) by Dynamo's own counters over one compiled call (backend eager).
    A data-dependent jump shows as a graph more, not always as a counted break."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        torch.compile(model, backend="eager")(*inputs)
    return sum(counters["graph_break"].values()), int(counters["stats"]["unique_graphs"])


def patch_applies(patch_file: Path, pristine_files: dict[str, Path], tmp: Path) -> None:
    """`git apply --check` and `patch -p1 --dry-run` both accept the patch in a fresh tree."""
    tree = tmp / "pristine"
    tree.mkdir()
    for rel, src in pristine_files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, tree / rel)
    git = subprocess.run(
        ["git", "apply", "--check", str(patch_file)], cwd=tree, capture_output=True, text=True
    )
    assert git.returncode == 0, git.stderr
    if shutil.which("patch"):
        p = subprocess.run(
            ["patch", "-p1", "--dry-run", "-i", str(patch_file)],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0, p.stdout + p.stderr


def compiles_whole(model, inputs) -> bool:
    """Whether Dynamo captures the model in one graph (torch.compile(fullgraph=True))."""
    import torch

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend="eager", fullgraph=True)(*inputs)
    except torch._dynamo.exc.Unsupported:
        return False
    return True
