"""Fixtures of the kernels' tests: the Triton kernels under Triton's CPU interpreter."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import kernels_interp_worker
import pytest
import torch


@pytest.fixture(scope="session")
def interpreted() -> Iterator[Callable[..., Any]]:
    """run(module, fn, *args, **kwargs): a launcher of torchkiln.kernels.<module>, executed with
    TRITON_INTERPRET=1 in one spawned worker process (see kernels_interp_worker for why)."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the compiled kernels are tested instead (-m gpu)")
    pytest.importorskip("triton", reason="needs the triton extra")
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context, initializer=kernels_interp_worker.init) as pool:
        problem = pool.submit(kernels_interp_worker.loop_bounds_problem).result(timeout=600)
        if problem is not None:
            pytest.skip(problem)

        def run(module: str, fn: str, *args: Any, **kwargs: Any) -> Any:
            job = pool.submit(kernels_interp_worker.call, module, fn, *args, **kwargs)
            return job.result(timeout=600)

        yield run
