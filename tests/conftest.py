"""Shared pytest set-up: GPU-only tests are marked `gpu` and skipped where no CUDA device is."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Trial workers are fresh processes: make sure they import this checkout's package.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "src"), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
)
# Every bench and tune appends to the history store: the suite's go to a store of its own (trial
# and CLI subprocesses inherit it), never into the user's cache. A test about the history sets
# its own path.
os.environ["KILN_HISTORY"] = str(
    Path(tempfile.mkdtemp(prefix="kiln-test-history-")) / "history.sqlite"
)
for path in (ROOT / "src", ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
