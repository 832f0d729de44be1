"""Warm-up inputs are laid out exactly as padded requests are, so a request after warm-up
finds the graph warm-up compiled (compiled code guards on strides, size-1 dims included)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchkiln.serve import BucketedModule
from torchkiln.serve.shapes import dense
from torchkiln.variants.base import Backend, Variant


@dataclass(frozen=True)
class DynamoEagerStrides(Backend):
    """torch.compile(backend="eager"): dynamo's guards and recompiles, no codegen."""

    name = "dynamo-eager-strides-test"

    def wrap(self, fn, *, compile_scope):
        return torch.compile(fn, backend="eager")


class Mix(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))  # per position: padding leaves real rows alone


def test_a_batch_1_request_after_warm_up_runs_compiled():
    model = Mix().eval()
    served = BucketedModule(
        model, {0: {0: "batch", 1: "seq"}}, {"batch": [1, 2], "seq": [8, 16]},
        Variant(DynamoEagerStrides()),
    )  # fmt: skip
    # An example longer than the smallest bucket: warm-up crops it, a narrowed view.
    info = served.warmup(torch.randn(2, 10, 16))
    assert info["unstable_buckets"] == {}
    x = torch.randn(1, 5, 16)
    torch.testing.assert_close(served(x), model(x).detach())
    stats = served.stats()
    assert stats["fallback_reasons"] == {} and stats["hits"] == {"batch=1,seq=8": 1}
    served.close()


def test_dense_gives_a_size_1_dim_its_contiguous_stride_too():
    view = torch.randn(1, 10, 16).narrow(1, 0, 8)
    assert view.is_contiguous() and view.stride() == (160, 16, 1)  # torch ignores size-1 dims
    assert dense(view).stride() == (128, 16, 1)
    kept = torch.randn(2, 3)
    assert dense(kept) is kept
