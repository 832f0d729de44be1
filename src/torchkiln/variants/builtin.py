"""The built-in backends: eager, inductor (torch.compile) and cudagraphs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchkiln.variants.base import (
    INDUCTOR_SCOPES,
    SCOPES,
    Backend,
    PrecompileUnsupported,
    _choice,
    register_backend,
)
from torchkiln.variants.regions import repeated_blocks

INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DYNAMIC = ("auto", "true", "false")
# Modes under which Inductor records CUDA graphs (cudagraph trees) on a CUDA device.
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


@register_backend
@dataclass(frozen=True)
class Eager(Backend):
    """Plain PyTorch, no compilation."""

    name = "eager"

    def wrap(self, fn: Callable[..., Any], *, compile_scope: str) -> Callable[..., Any]:
        return fn


def _mark_cudagraph_step() -> None:
    import torch

    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
    if mark is not None:
        mark()


@register_backend
@dataclass(frozen=True)
class Inductor(Backend):
    """torch.compile with the Inductor backend."""

    name = "inductor"
    compiles_in_pool = True
    mode: str = "default"
    fullgraph: bool = False
    dynamic: str = "auto"
    scope: str = "model"
    # Inference only: Inductor folds the weights into the graph as constants (a convolution's
    # batch norm folded into its weights, weights laid out ahead of time). Passed per compile,
    # as the `options` of the mode plus {"freezing": True}, so two arms in one process do not
    # share it; the code to ship sets torch._inductor.config.freezing.
    freezing: bool = False

    def __post_init__(self) -> None:
        _choice(self.mode, INDUCTOR_MODES, "inductor: mode")
        _choice(self.dynamic, DYNAMIC, "inductor: dynamic")
        _choice(self.scope, INDUCTOR_SCOPES, "inductor: scope")

    def step_unsupported_reason(self, step: str) -> str | None:
        if self.freezing and step != "infer":
            return (
                f"{self.name}: freezing=true applies to inference only (it folds the weights "
                "into the graph as constants; a training step changes them)"
            )
        return None

    @property
    def uses_cudagraphs(self) -> bool:
        return self.mode in CUDAGRAPH_MODES

    @property
    def embeds_weights(self) -> bool:
        return self.freezing

    @property
    def compile_kwargs(self) -> dict[str, Any]:
        """What torch.compile is given for the mode (explain compiles the model the same way)."""
        return {"mode": self.mode}

    def _how(self) -> tuple[dict[str, Any], bool | None]:
        """torch.compile's mode or options, and its ``dynamic``."""
        dynamic = {"auto": None, "true": True, "false": False}[self.dynamic]
        mode = None if self.mode == "default" else self.mode
        how: dict[str, Any] = {"mode": mode}
        if self.freezing:
            # torch.compile takes a mode or options, not both: the mode's own options, plus one.
            from torch._inductor import list_mode_options

            how = {"options": {**(list_mode_options(mode) if mode else {}), "freezing": True}}
        return how, dynamic

    def precompile_config(self) -> dict[str, Any]:
        """Inductor's options for this mode: the precompile's, and those its functions are read
        under (torch reads `triton.cudagraphs` from the loading process's config: read without
        it, reduce-overhead's functions ran without CUDA graphs, resnet50 bf16 on an H200 at
        2.89 ms a step against 1.84 ms compiled cold, torch 2.11)."""
        from torch._inductor import list_mode_options

        how, dynamic = self._how()
        mode = how.get("mode")
        return dict(how.get("options") or (list_mode_options(mode, dynamic) if mode else {}))

    def precompile(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # torch.compile(...).aot_compile: Dynamo's trace, AOT autograd and Inductor's code, kept
        # whole, so that a loading process skips the tracing a compile cache cannot (on an H200,
        # resnet50 reduce-overhead + bf16: 2.1 s of Dynamo and 1.4 s of AOT autograd of a 7.4 s
        # first fast output from the compile cache, torch 2.11).
        import torch

        if self.scope != "model":
            raise PrecompileUnsupported(
                f"scope={self.scope}: only a whole-model compile is precompiled"
            )
        if not hasattr(torch.compiler, "load_compiled_function"):
            raise PrecompileUnsupported(
                f"torch {torch.__version__} cannot load an ahead-of-time compiled function"
            )
        config = torch._dynamo.config
        patch = (
            config.patch(enable_aot_compile=True)
            if hasattr(config, "enable_aot_compile")
            else contextlib.nullcontext()
        )
        from torchkiln.variants import aot_entry

        _, dynamic = self._how()
        # The guards it keeps are given as an option, and torch.compile takes a mode or options:
        # the mode's own options, then.
        options = {**self.precompile_config(), "guard_filter_fn": aot_entry.serializable_guards}
        with patch:
            # A call of the module, which is its first argument: the parameters are then the
            # call's inputs, read from whichever module a loading process passes.
            fn = torch.compile(
                aot_entry.call_module, options=options, fullgraph=True, dynamic=dynamic
            )
            aot = getattr(fn, "aot_compile", None)
            if aot is None:
                raise PrecompileUnsupported(
                    f"torch {torch.__version__}'s torch.compile has no aot_compile"
                )
            return aot(((module, *args), dict(kwargs)))

    def wrap(self, fn: Callable[..., Any], *, compile_scope: str) -> Callable[..., Any]:
        import torch

        how, dynamic = self._how()
        if self.scope == "regions":
            # Each repeated block is compiled on its own; Dynamo reuses one compiled graph for
            # every instance with the same structure, so compile time is roughly one block's.
            blocks = repeated_blocks(fn)
            for block in blocks:
                block.compile(**how, fullgraph=self.fullgraph, dynamic=dynamic)
            return fn
        return torch.compile(fn, **how, fullgraph=self.fullgraph, dynamic=dynamic)

    def before_step(self) -> None:
        # Cudagraph trees reuse output buffers across replays; marking each step's start tells
        # them the previous step's outputs are dead, as a training or serving loop would.
        if self.uses_cudagraphs:
            _mark_cudagraph_step()


@register_backend
@dataclass(frozen=True)
class CudaGraphs(Backend):
    """torch.compile(backend="cudagraphs"): CUDA graphs over AOTAutograd, no Inductor codegen."""

    name = "cudagraphs"
    needs_cuda = True
    scope: str = "model"

    def __post_init__(self) -> None:
        _choice(self.scope, SCOPES, "cudagraphs: scope")

    @property
    def uses_cudagraphs(self) -> bool:
        return True

    @property
    def compile_kwargs(self) -> dict[str, Any]:
        """What torch.compile is given (explain compiles the model the same way)."""
        return {"backend": "cudagraphs"}

    @classmethod
    def tune_candidate(cls, evidence: Any) -> tuple[str, str, float, float] | None:
        if not evidence.device.startswith("cuda"):
            return None
        return (cls.name, "CUDA graphs over eager kernels, no code generation", 6.0, 0.5)

    def wrap(self, fn: Callable[..., Any], *, compile_scope: str) -> Callable[..., Any]:
        import torch

        return torch.compile(fn, backend="cudagraphs")

    def before_step(self) -> None:
        _mark_cudagraph_step()
