"""Shape-bucketed compiled inference: pad requests to a few precompiled shapes, slice back.

from torchkiln.serve import BucketedModule, powers_of_two

served = BucketedModule(
    model.eval(),
    dynamic_dims={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
    buckets={"batch": powers_of_two(32), "seq": powers_of_two(512, min_size=16)},
    variant="inductor:mode=reduce-overhead+bf16",
)
served.warmup(**example)      # compiles every bucket; no compilation after this
out = served(**request)       # thread-safe
served.stats()
"""

from torchkiln.serve.bucketed import BucketedModule, padding_hazards
from torchkiln.serve.buckets import (
    BucketError,
    BucketGrid,
    explicit,
    learn_buckets,
    learned,
    padding_waste,
    powers_of_two,
)
from torchkiln.serve.shapes import ServeConfigError
from torchkiln.serve.trace import generate_trace, read_trace, write_trace

__all__ = [
    "BucketError",
    "BucketGrid",
    "BucketedModule",
    "ServeConfigError",
    "explicit",
    "generate_trace",
    "learn_buckets",
    "learned",
    "padding_hazards",
    "padding_waste",
    "powers_of_two",
    "read_trace",
    "write_trace",
]
