"""The recommendation as code to paste, one sentence of why per choice with its measured gain,
and `apply()` giving the ready-to-call module."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchkiln.repair.remedies import Remedies
from torchkiln.runner.protocol.arm_facts import ArmFacts, arm_facts
from torchkiln.variants import Variant, parse_variant


def _compile_args(v: Variant) -> str:
    b = v.backend
    if "backend" in b.compile_kwargs:  # a torch.compile backend of its own (cudagraphs)
        return f'backend="{b.compile_kwargs["backend"]}"'
    args = []
    if getattr(b, "mode", "default") != "default":
        args.append(f'mode="{b.mode}"')
    if getattr(b, "fullgraph", False):
        args.append("fullgraph=True")
    dyn = getattr(b, "dynamic", "auto")
    if dyn != "auto":
        args.append(f"dynamic={dyn == 'true'}")
    return ", ".join(args)


def _setup(f: ArmFacts) -> list[str]:
    """The steps the trial took before compiling, in its order (runner.executable)."""
    lines = [f'device = "{f.device}"', "model = model.to(device)"]
    if f.eval_mode:
        lines.append("model.eval()  # measured in inference mode: dropout off, batch norm frozen")
    else:
        lines.append("model.train()  # measured in training mode")
    lines.append("x = x.to(device)" + ("" if f.eval_mode else "\ny = y.to(device)"))
    if f.tf32:
        lines += [
            "torch.backends.cuda.matmul.allow_tf32 = True",
            "torch.backends.cudnn.allow_tf32 = True",
        ]
    elif f.device_type == "cuda":
        lines += [
            "# measured with TF32 off (full fp32):",
            "torch.backends.cuda.matmul.allow_tf32 = False",
            "torch.backends.cudnn.allow_tf32 = False",
        ]
    if f.channels_last:
        lines += [
            "model = model.to(memory_format=torch.channels_last)",
            "x = x.contiguous(memory_format=torch.channels_last)  # 4-D image inputs",
        ]
    return lines


def _update(f: ArmFacts, indent: str = "") -> list[str]:
    if f.grad_scaler:
        steps = ["scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()"]
    else:
        steps = ["loss.backward()", "optimizer.step()"]
    return [indent + s for s in [*steps, "optimizer.zero_grad(set_to_none=True)"]]


def code(spec: str, step: str, device: str) -> str:
    """Python that reproduces the variant outside kiln: every step the trial took (device move,
    eval or train mode, no_grad, precision, layout, the first eager step) and the compile."""
    v = parse_variant(spec)
    f = arm_facts(v, step, device)
    lines = ["import torch", "", *_setup(f)]
    scope = v.backend.scope
    args = _compile_args(v)
    if getattr(v.backend, "freezing", False):
        lines.insert(1, "import torch._inductor.config")
        lines.append("torch._inductor.config.freezing = True  # inference: weights as constants")
    autocast = (
        f'torch.autocast("{f.device_type}", dtype=torch.{f.autocast_dtype})'
        if f.autocast_dtype
        else None
    )
    if f.grad_scaler:
        lines.append(f'scaler = torch.amp.GradScaler("{f.device_type}")  # fp16 training')
    if v.backend.name == "eager":
        compiled = "run = model  # no compilation: it did not pay for itself here"
    elif scope == "regions":
        compiled = "\n".join(
            [
                "# compile each repeated block once; every instance reuses the code",
                "for block in blocks:  # e.g. model.bert.encoder.layer, or resnet's Bottlenecks",
                f"    block.compile({args})",
                "run = model",
            ]
        )
    elif scope == "step":
        compiled = f"train_step = torch.compile(train_step{', ' + args if args else ''})"
    else:
        compiled = f"run = torch.compile(model{', ' + args if args else ''})"
    if step == "infer":
        lines += [
            compiled,
            "",
            "with torch.no_grad():" if not autocast else f"with torch.no_grad(), {autocast}:",
            "    out = run(x)",
        ]
    elif f.whole_step:
        body = (
            ["    loss = loss_fn(model(x), y)"]
            if not autocast
            else [f"    with {autocast}:", "        loss = loss_fn(model(x), y)"]
        )
        lines += [
            "",
            "def train_step(x, y):",
            *body,
            *_update(f, "    "),
            "    return loss.detach()",
            "",
        ]
        if f.eager_first_step:
            lines += [
                "# The first step eagerly: the optimizer makes its state (momentum buffers, "
                "moments)",
                "# outside the compiled step, where CUDA graphs would overwrite it on the next "
                "replay.",
                "train_step(x, y)",
            ]
        lines.append(compiled)
    else:
        lines.append(compiled)
        if autocast:
            lines += ["", f"with {autocast}:", "    loss = loss_fn(run(x), y)"]
        else:
            lines += ["", "loss = loss_fn(run(x), y)"]
        lines += _update(f)
    return "\n".join(lines)


def _graphs_sentence(gb: dict[str, Any] | None) -> str:
    """What CUDA graphs replay, from the graph-break evidence: one launch for the whole step
    only where the model compiled to one graph with no break."""
    gb = gb or {}
    graphs, breaks = gb.get("graphs"), gb.get("breaks")
    if graphs == 1 and breaks == 0:
        return "CUDA graphs replay the whole step with one launch"
    if graphs is None or breaks is None:
        return (
            "CUDA graphs replay each captured graph with one launch (how many graphs the step "
            "makes was not measured)"
        )
    s = "" if breaks == 1 else "s"
    return (
        f"CUDA graphs replay each of the {graphs} captured graphs with one launch; the code "
        f"between them, at the {breaks} graph break{s}, runs eagerly"
    )


def reasons(
    best: dict[str, Any],
    baseline: dict[str, Any],
    graph_breaks: dict[str, Any] | None = None,
    others_passed: int | None = None,
) -> list[str]:
    """One sentence of why per choice, with the measured numbers. ``graph_breaks``: the tune's
    graph-break evidence (breaks, graphs), which says what CUDA graphs can replay;
    ``others_passed``: how many variants besides the pick passed (None: not known)."""
    v = parse_variant(best["variant"])
    sp = best["speedup"]
    out = []
    if v.backend.name == "eager":
        if others_passed == 0:
            out.append(
                "Stay in eager: no compiled variant finished and passed the check (the report "
                "gives each one's status and reason)."
            )
        else:
            out.append(
                "Stay in eager: no compiled variant was faster with an interval clear of "
                "eager's at a lower total cost."
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
            f" ({k:.0f} kernels per step replayed, against {bk:.0f} launched one by one in eager)"
            if (k is not None and bk is not None)
            else ""
        )
        out.append(_graphs_sentence(graph_breaks) + extra + ".")
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


def summary_lines(doc: dict[str, Any], out: str) -> list[str]:
    """What `kiln tune` prints when it ends: the pick and why, its code, where the report is.
    README's example output is this, from a real run (benchmarks/readme_example.py)."""
    sel = doc["selection"]
    rec = doc.get("recommendation")
    lines = [f"pick: {sel['best']}  ({sel['reason']})"]
    if rec:
        lines += [f"  - {w}" for w in rec["why"]]
        lines += ["", rec["code"], ""]
    lines.append(
        f"report: {out}/report.html, {out}/report.md, {out}/results.json "
        f"({doc['wall_s']:.0f} s of a {doc['budget_s']:.0f} s budget)"
    )
    return lines


class _Tuned:
    """Callable module: the model with the chosen variant applied, taking the trial's steps
    (runner.arm_facts): inference in eval mode under no_grad, autocast and flags inside."""

    def __init__(
        self,
        model: Any,
        spec: str,
        device: str,
        step: str | None = None,
        remedies: Remedies | None = None,
    ) -> None:
        import contextlib

        import torch

        from torchkiln.runner.protocol.settings import autocast, precision_flags

        v = parse_variant(spec)
        self.remedies = remedies or Remedies()
        self.remedies.prepare(model)
        facts = arm_facts(v, step, device) if step else None
        if facts is not None:
            # Before compiling: the compiled code specialises on the mode (dropout, batch norm).
            model.train(not facts.eval_mode)
        if v.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.variant = v
        self.device = device
        self._autocast = lambda: autocast(device, v.precision)
        self._flags = lambda: precision_flags(v.precision)
        self._grad = torch.no_grad if facts and facts.no_grad else contextlib.nullcontext
        backend = v.backend
        if backend.scope == "step":
            # The step is the caller's code; here the model alone is compiled.
            backend = dataclasses.replace(backend, scope="model")
        self._run = backend.wrap(model, compile_scope="model")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.variant.backend.before_step()
        with self._grad(), self._flags(), self._autocast():
            with self.remedies.around_call(args, kwargs):
                return self._run(*args, **kwargs)


def apply(
    model: Any,
    spec: str,
    device: str = "cuda",
    step: str | None = None,
    remedies: Remedies | None = None,
) -> Any:
    """The model with ``spec`` applied, ready to call like the model. With ``step`` (the tune's
    "infer" or "train"), the model is put in the mode the trial measured, and an inference call
    runs under no_grad as the trial's did. A whole-step variant is applied to the model alone
    here (the step is the caller's code: see the recommendation). ``remedies``: the pick's
    remedies for graph breaks other than a source patch (Dynamo settings around each call,
    helpers disabled), applied as its trial applied them."""
    return _Tuned(model, spec, device, step, remedies)


def _input_name(key: Any) -> str:
    return f"args[{key}]" if isinstance(key, int) else f'kwargs["{key}"]'


def stream_code(name: str, metrics: dict[str, Any], device: str) -> str:
    """Python for a pick made on a stream: a bucketed pick's ``BucketedModule(...)`` with its
    bucket sizes, warm-up and the stats to watch; otherwise the ``torch.compile`` call with the
    dynamic setting, the raised recompile limit or the ``mark_dynamic`` lines it was measured
    with."""
    from torchkiln.tune.stream_plan import parse_stream_candidate

    if name == "eager":
        return "\n".join(
            [f'model = model.to("{device}").eval()', "run = model  # no compilation paid off"]
        )
    c = parse_stream_candidate(name)
    v = parse_variant(c.variant)
    dims = metrics.get("varying_dims") or []
    lines = ["import torch", "", f'model = model.to("{device}").eval()']
    if c.bucket:
        by_input: dict[Any, dict[int, str]] = {}
        for key, dim, sym in dims:
            by_input.setdefault(key, {})[dim] = sym
        buckets = {k: tuple(b) for k, b in (metrics.get("buckets") or {}).items()}
        lines[1:1] = ["from torchkiln.serve import BucketedModule"]
        lines += [
            f"# inputs padded up to a bucket ({c.bucket}), one compiled graph per bucket",
            "served = BucketedModule(",
            "    model,",
            f"    dynamic_dims={by_input!r},",
            f"    buckets={buckets!r},",
            f'    variant="{v.spec}",',
            ")",
            "served.warmup(*example_inputs)  # compiles every bucket before traffic",
            "out = served(*args, **kwargs)  # per request; nothing compiles after warm-up",
            "# to watch in production, served.stats(): eager_fallbacks (requests no bucket",
            "# covers, run eagerly), recompiles_after_warmup (must stay 0), padding_waste",
        ]
        return "\n".join(lines)
    args = _compile_args(v)
    if c.recompile_limit:
        lines += [
            "# one graph per input shape: allow as many as the traffic has",
            'limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") '
            'else "cache_size_limit"',
            f"setattr(torch._dynamo.config, limit, {c.recompile_limit})",
        ]
    lines.append(f"run = torch.compile(model{', ' + args if args else ''})")
    f = arm_facts(v, "infer", device)
    autocast = (
        f'torch.autocast("{f.device_type}", dtype=torch.{f.autocast_dtype})'
        if f.autocast_dtype
        else None
    )
    body = []
    if c.mark_dynamic and dims:
        body.append("    # as measured: the varying sizes marked dynamic on each request's inputs,")
        body.append("    # so the first call compiles one dynamic graph and no shape recompiles")
        body += [
            f"    torch._dynamo.mark_dynamic({_input_name(k)}, {d})  # {sym}" for k, d, sym in dims
        ]
    elif getattr(v.backend, "dynamic", "auto") == "auto" and dims:
        body.append(
            "    # optional: the sizes that vary, marked dynamic up front (otherwise the first"
        )
        body.append("    # change of each recompiles once, then it is dynamic)")
        body += [
            f"    torch._dynamo.mark_dynamic({_input_name(k)}, {d})  # {sym}" for k, d, sym in dims
        ]
    lines += [
        "",
        "with torch.no_grad():" if not autocast else f"with torch.no_grad(), {autocast}:",
        *body,
        "    out = run(*args, **kwargs)  # per request",
    ]
    return "\n".join(lines)
