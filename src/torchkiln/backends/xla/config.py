"""The `xla` backend: the model run as JAX functions (torchax) compiled whole by XLA (jax.jit).

Its registry entry: trials build its arm in `arm.py` and measure it by `protocol.py`'s order;
jax and torchax are imported only there, inside a trial process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchkiln.errors import UnsupportedVariant
from torchkiln.variants.base import Backend, register_backend

# Devices JAX can run kiln's trials on: its CPU client (CI) and its CUDA plugin.
XLA_DEVICES = ("cpu", "cuda")


@register_backend
@dataclass(frozen=True)
class Xla(Backend):
    """torchax + jax.jit: inference is the extracted forward jitted; training jits the whole step
    (forward, loss, backward, the optax twin of the workload's optimizer).

    ``donate``: donate the training state (weights, buffers, optimizer state) to each step, so
    XLA updates it in place instead of holding two copies (ignored on the CPU client)."""

    name = "xla"
    donate: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.donate, bool):
            raise ValueError(f"xla: donate={self.donate!r}; choose from [True, False]")

    @property
    def scope(self) -> str:
        # XLA always compiles the whole step it is given: the forward, or the full train step.
        return "step"

    def unsupported_reason(self, device: str) -> str | None:
        if device.split(":")[0] not in XLA_DEVICES:
            return f"the xla backend runs on {list(XLA_DEVICES)}, not {device!r}"
        return None

    @property
    def arm_builder(self) -> Callable[..., Any]:
        # Its arm is a JAX function (torchax + jax.jit), not a wrapped PyTorch callable.
        from torchkiln.backends.xla.arm import build_xla_arm

        return build_xla_arm

    @property
    def protocol(self) -> Callable[..., None]:
        from torchkiln.backends.xla.protocol import measure_xla_trial

        return measure_xla_trial

    @classmethod
    def tune_candidate(cls, evidence: Any) -> tuple[str, str, float, float] | None:
        if not evidence.xla_available:
            return None
        return ("xla", "XLA through torchax + jax.jit: the other whole-graph compiler", 7.0, 1.5)

    @classmethod
    def report_section(cls, doc: dict[str, Any]) -> tuple[str, list[dict[str, str]]] | None:
        from torchkiln.backends.xla.compare import rows

        versus = rows(doc)
        return ("Inductor vs XLA (measured in this run)", versus) if versus else None

    def wrap(self, fn: Callable[..., Any], *, compile_scope: str) -> Callable[..., Any]:
        # Importing torchax breaks torch.compile in the importing process, so the xla route
        # runs only inside a trial process (backends/xla/arm.py), never in the caller's.
        raise UnsupportedVariant(
            "xla runs only inside kiln's trial processes (torchax's import breaks "
            "torch.compile in the process that imports it); use `kiln bench --variants xla`"
        )
