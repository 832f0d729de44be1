"""torchkiln.kernels as an optional extra: a cheap import, and a working CPU path without triton."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _python(code: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_import_loads_neither_torch_nor_triton():
    done = _python(
        """
        import sys
        import torchkiln.kernels as k
        assert "softmax" in dir(k) and "BiasActScale" in k.__all__
        print(sorted(m for m in ("torch", "triton") if m in sys.modules))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_triton_cpu_works_and_cuda_path_names_the_extra():
    done = _python(
        """
        import sys
        sys.modules["triton"] = None  # `import triton` now fails as if it were not installed
        import torch
        from torchkiln.errors import MissingExtraError
        from torchkiln.kernels import HAS_TRITON, masked_softmax, ops, softmax

        assert HAS_TRITON is False
        x = torch.randn(3, 5, requires_grad=True)
        torch.testing.assert_close(softmax(x), torch.softmax(x, -1))
        masked_softmax(x, x.detach() > 0).sum().backward()
        assert x.grad is not None
        results = torch.library.opcheck(ops.bias_act_scale, (x, torch.randn(5), "gelu", 2.0))
        assert set(results.values()) == {"SUCCESS"}, results
        try:
            ops.launchers()  # what every op's CUDA branch calls first
        except MissingExtraError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'torchkiln[triton]'" in done.stdout
