"""The recommendation as code to paste, one sentence of why per choice with its measured gain,
and `apply()` giving the ready-to-call module."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchkiln.variants import Variant, parse_variant


def _compile_args(v: Variant) -> str:
    b = v.backend
    if b.name == "cudagraphs":
        return 'backend="cudagraphs"'
    args = []
    if getattr(b, "mode", "default") != "default":
        args.append(f'mode="{b.mode}"')
    if getattr(b, "fullgraph", False):
        args.append("fullgraph=True")
    dyn = getattr(b, "dynamic", "auto")
    if dyn != "auto":
        args.append(f"dynamic={dyn == 'true'}")
    return ", ".join(args)


def code(spec: str, step: str, device: str) -> str:
    """Python that reproduces the variant outside kiln."""
    v = parse_variant(spec)
    dev = device.split(":")[0]
    lines = ["import torch", ""]
    if v.precision == "tf32":
        lines += [
            "torch.backends.cuda.matmul.allow_tf32 = True",
            "torch.backends.cudnn.allow_tf32 = True",
        ]
    elif v.precision in ("fp32",) and dev == "cuda":
        lines += [
            "# measured with TF32 off (full fp32):",
            "torch.backends.cuda.matmul.allow_tf32 = False",
            "torch.backends.cudnn.allow_tf32 = False",
        ]
    if v.channels_last:
        lines += [
            "model = model.to(memory_format=torch.channels_last)",
            "x = x.contiguous(memory_format=torch.channels_last)  # 4-D image inputs",
        ]
    name = v.backend.name
    scope = v.backend.scope
    args = _compile_args(v)
    if getattr(v.backend, "freezing", False):
        lines.insert(1, "import torch._inductor.config")
        lines.append("torch._inductor.config.freezing = True  # inference: weights as constants")
    autocast = (
        f'torch.autocast("{dev}", dtype=torch.{"bfloat16" if v.precision == "bf16" else "float16"})'
        if v.precision in ("bf16", "fp16")
        else None
    )
    if name == "eager":
        lines.append("run = model  # no compilation: it did not pay for itself here")
    elif scope == "regions":
        lines += [
            "# compile each repeated block once; every instance reuses the code",
            "for block in blocks:  # e.g. model.bert.encoder.layer, or resnet's Bottlenecks",
            f"    block.compile({args})",
            "run = model",
        ]
    elif scope == "step":
        lines.append(f"train_step = torch.compile(train_step{', ' + args if args else ''})")
    else:
        lines.append(f"run = torch.compile(model{', ' + args if args else ''})")
    if step == "infer":
        lines += [
            "",
            "with torch.no_grad():" if not autocast else f"with torch.no_grad(), {autocast}:",
            "    out = run(x)",
        ]
    elif scope == "step":
        body = (
            "    loss = loss_fn(model(x), y)"
            if not autocast
            else (f"    with {autocast}:\n        loss = loss_fn(model(x), y)")
        )
        lines = lines[:-1] + [
            "",
            "def train_step(x, y):",
            body,
            "    loss.backward()",
            "    optimizer.step()",
            "    optimizer.zero_grad(set_to_none=True)",
            "    return loss.detach()",
            "",
            "# The first step eagerly: the optimizer makes its state (momentum buffers, moments)",
            "# outside the compiled step, where CUDA graphs would overwrite it on the next replay.",
            "train_step(x, y)",
            lines[-1],
        ]
    else:
        if autocast:
            lines += ["", f"with {autocast}:", "    loss = loss_fn(run(x), y)"]
        else:
            lines += ["", "loss = loss_fn(run(x), y)"]
        lines += ["loss.backward()", "optimizer.step()", "optimizer.zero_grad(set_to_none=True)"]
    if v.precision == "fp16" and step == "train":
        lines.append("# fp16 training: scale the loss with torch.amp.GradScaler")
    return "\n".join(lines)


def reasons(best: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """One sentence of why per choice, with the measured numbers."""
    v = parse_variant(best["variant"])
    sp = best["speedup"]
    out = []
    if v.backend.name == "eager":
        out.append(
            "Stay in eager: no compiled variant was faster with an interval clear of eager's "
            "at a lower total cost."
        )
        return out
    out.append(
        f"{v.backend.name} ({_compile_args(v) or 'default settings'}): "
        f"{sp['median']:.2f}x [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}] over eager, "
        f"{best['steady_ms']['median']:.3f} ms vs {best['baseline_ms']['median']:.3f} ms per "
        f"step, for {best['first_call_s']:.1f} s of compilation on the first call."
    )
    if v.backend.uses_cudagraphs:
        k, bk = best.get("kernels_per_step"), best.get("baseline_kernels_per_step")
        extra = (
            f" ({k:.0f} kernels per step replayed as one graph vs {bk:.0f} launches)"
            if (k is not None and bk is not None)
            else ""
        )
        out.append("CUDA graphs replay the whole step with one launch" + extra + ".")
    if v.backend.scope == "regions":
        out.append("Regional compilation compiles one repeated block and reuses it.")
    if v.backend.scope == "step":
        out.append("The whole training step, optimizer included, is compiled.")
    if v.channels_last:
        out.append("channels_last lets convolutions run without layout transposes.")
    if getattr(v.backend, "freezing", False):
        out.append(
            "Freezing compiles the weights in as constants (a convolution's batch norm folded into "
            "it); the model must not change after compilation."
        )
    if v.changes_numerics:
        c = best.get("correctness") or {}
        out.append(
            f"{v.precision} changes numerics; its error was "
            f"{c.get('worst_error_over_threshold', float('nan')):.2f} of the allowed limit."
        )
    return out


class _Tuned:
    """Callable module: the model with the chosen variant applied (autocast and flags inside)."""

    def __init__(self, model: Any, spec: str, device: str) -> None:
        import torch

        from torchkiln.runner.protocol.settings import autocast, precision_flags

        v = parse_variant(spec)
        if v.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.variant = v
        self.device = device
        self._autocast = lambda: autocast(device, v.precision)
        self._flags = lambda: precision_flags(v.precision)
        backend = v.backend
        if backend.scope == "step":
            # The step is the caller's code; here the model alone is compiled.
            backend = dataclasses.replace(backend, scope="model")
        self._run = backend.wrap(model, compile_scope="model")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.variant.backend.before_step()
        with self._flags(), self._autocast():
            return self._run(*args, **kwargs)


def apply(model: Any, spec: str, device: str = "cuda") -> Any:
    """The model with ``spec`` applied, ready to call like the model. A whole-step variant is
    applied to the model alone here (the step is the caller's code: see the recommendation)."""
    return _Tuned(model, spec, device)
