"""Which variants to try, in which order, and which to skip: ordered and pruned by evidence
(the profile verdict, the graph-break count, the kind of model) and by the time budget."""

from __future__ import annotations

from dataclasses import dataclass, field

from torchkiln.variants import parse_variant

# Relative compile cost of a candidate, in units of the default mode's compile time. Measured
# on an H200 (torch 2.11, benchmarks/results/zoo-h200, first call of max-autotune-no-cudagraphs
# over default's): simple train fp32 4.9; bert-base infer bf16 3.4, fp32 10.4, train bf16 6.1,
# fp32 17; resnet50 infer bf16 18, train bf16 10.5, infer fp32 > 33 and train fp32 > 15 (both
# still compiling when stopped). Median about 10; reduce-overhead costs about what default does.
COMPILE_FACTOR = {
    "default": 1.0,
    "reduce-overhead": 1.1,
    "max-autotune-no-cudagraphs": 10.0,
    "max-autotune": 11.0,
}
REGIONS_FACTOR = 0.4  # one block compiled and reused: a fraction of the whole model's compile


@dataclass
class Candidate:
    spec: str
    why: str
    priority: float  # lower runs earlier
    compile_factor: float


@dataclass
class Evidence:
    """What tune knows before searching; every field is optional (a stage may be skipped)."""

    device: str
    step: str
    convolutional: bool = False
    has_repeated_blocks: bool = False
    graph_breaks: int | None = None
    verdict: str | None = None  # the profile verdict kind
    allow_precision: set[str] = field(default_factory=set)
    xla_available: bool = False  # jax and torchax importable (the `xla` extra)


def _with(spec: str, **params: str) -> str:
    base, _, args = spec.partition(":")
    items = dict(a.split("=", 1) for a in args.split(",") if a)
    items.update(params)
    return base + (":" + ",".join(f"{k}={v}" for k, v in items.items()) if items else "")


def candidates(ev: Evidence) -> list[Candidate]:
    """Every variant worth measuring for this evidence, best-first. Precision changes appear
    only when allowed; CUDA-graph modes only on CUDA; fullgraph only with zero breaks."""
    cuda = ev.device.startswith("cuda")
    modes = ["default", "max-autotune-no-cudagraphs"]
    if cuda:
        modes = ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
    else:
        # On the CPU autotuning has few templates to choose from and CUDA graphs do not exist:
        # default mode is the one that matters (max-autotune is tried last, if budget allows).
        modes = ["default", "max-autotune-no-cudagraphs"]
    launch_bound = ev.verdict == "host/launch-bound"
    compute_bound = ev.verdict == "gpu-compute-bound"
    out: list[Candidate] = []

    def add(spec: str, why: str, priority: float, factor: float) -> None:
        spec = parse_variant(spec).spec  # canonical, and validated
        if all(c.spec != spec for c in out):
            out.append(Candidate(spec, why, priority, factor))

    for i, mode in enumerate(modes):
        graphs = mode in ("reduce-overhead", "max-autotune")
        prio = float(i)
        if launch_bound and graphs:
            prio -= 10  # the profile says launches dominate: CUDA graphs first
        if compute_bound and mode.startswith("max-autotune") and not ev.allow_precision:
            # Autotuned fp32 kernels gain percent; an allowed 16-bit precision, on a
            # compute-bound step, gains a multiple (resnet50 train on an H200: fp32
            # reduce-overhead 38.7 ms, bf16 reduce-overhead 7.2 ms): the precision goes first.
            prio -= 5
        params = {"mode": mode} if mode != "default" else {}
        if ev.graph_breaks == 0:
            params["fullgraph"] = "true"
        params["dynamic"] = "false"  # the workload's shapes are fixed
        spec = _with("inductor", **params)
        why = f"torch.compile mode={mode}"
        if graphs:
            why += " (CUDA graphs: removes per-kernel launch cost)"
        add(spec, why, prio, COMPILE_FACTOR[mode])
        if ev.step == "train" and mode in ("default", "reduce-overhead"):
            # Never fullgraph: the step calls loss.backward(), which Dynamo does not trace by
            # default ("Unsupported Tensor.backward() call"), so fullgraph=true always fails.
            add(
                _with(spec, scope="step", fullgraph="false"),
                why + ", whole step with the optimizer compiled",
                prio + 0.5,
                COMPILE_FACTOR[mode] * 1.3,
            )
        if ev.has_repeated_blocks and mode in ("default", "reduce-overhead"):
            add(
                _with(spec, scope="regions"),
                why + ", each repeated block compiled once",
                prio + 0.3,
                COMPILE_FACTOR[mode] * REGIONS_FACTOR,
            )
    if ev.convolutional:
        best_mode = "reduce-overhead" if (cuda and launch_bound) else "default"
        params = {"mode": best_mode} if best_mode != "default" else {}
        spec = _with("inductor", **params, dynamic="false") + "+channels_last"
        add(
            spec,
            "channels_last: convolutions without layout transposes",
            1.5,
            COMPILE_FACTOR[best_mode],
        )
    if cuda:
        add("cudagraphs", "CUDA graphs over eager kernels, no code generation", 6.0, 0.5)
    if ev.xla_available:
        add("xla", "XLA through torchax + jax.jit: the other whole-graph compiler", 7.0, 1.5)
    for precision in ("bf16", "tf32", "fp16"):
        if precision not in ev.allow_precision:
            continue
        bonus = -6 if compute_bound else -2
        for i, mode in enumerate(modes[:2] if not cuda else ["default", "reduce-overhead"]):
            params = {"mode": mode} if mode != "default" else {}
            spec = _with("inductor", **params, dynamic="false") + f"+{precision}"
            add(
                spec,
                f"{precision}: the matrix units' faster precision",
                2.0 + i + bonus,
                COMPILE_FACTOR[mode],
            )
        add(f"eager+{precision}", f"{precision} without compilation", 8.0, 0.0)
    out.sort(key=lambda c: c.priority)
    return out


def estimate_trial_s(c: Candidate, overhead_s: float, default_compile_s: float) -> float:
    """Seconds a trial should take: process and measurement overhead plus its compile."""
    return overhead_s + c.compile_factor * default_compile_s


def _add_knob(spec: str, **params: str) -> str:
    """``spec`` with backend parameters set, its policies (``+bf16``...) kept."""
    head, *policies = spec.split("+")
    return _with(head, **params) + "".join(f"+{p}" for p in policies)


def refinements(leader_spec: str, ev: Evidence) -> list[Candidate]:
    """The knobs the search measured only on their own, stacked on the current leader: with
    bf16 allowed the plan has `reduce-overhead+bf16` and `reduce-overhead+channels_last` but not
    both, and a mode with bf16 is only as fast as that mode with bf16 by itself (issue 5's goal
    is a pick faster than the best plain mode). In the order to try them, cheapest first; the
    pipeline runs one at a time ahead of the rest of the plan, and a refinement that takes the
    lead is refined in turn, so the knobs stack."""
    v = parse_variant(leader_spec)
    if v.name != "inductor":
        return []
    out = []
    factor = COMPILE_FACTOR.get(v.backend.mode, 1.0)
    if ev.convolutional and not v.channels_last:
        spec = parse_variant(leader_spec + "+channels_last").spec
        out.append(Candidate(spec, "the leader with channels_last", -100.0, factor))
    if (
        ev.step == "train"
        and v.backend.scope == "model"
        and v.backend.mode
        in (
            "default",
            "reduce-overhead",
        )
    ):
        spec = parse_variant(_add_knob(leader_spec, scope="step", fullgraph="false")).spec
        out.append(Candidate(spec, "the leader with the whole step compiled", -100.0, factor * 1.3))
    upgrade = AUTOTUNED.get(v.backend.mode)
    if upgrade and v.precision != "fp32":
        # The plan autotunes fp32 only; at a 16-bit precision an autotuned mode is a
        # refinement (bert-base train bf16 on an H200: max-autotune-no-cudagraphs 1.40x over
        # eager, default 1.32x, in separate trials). The dearest knob, so the last tried.
        spec = parse_variant(_add_knob(leader_spec, mode=upgrade)).spec
        scale = 1.3 if v.backend.scope == "step" else 1.0
        factor = COMPILE_FACTOR[upgrade] * scale
        out.append(Candidate(spec, f"the leader autotuned ({upgrade})", -100.0, factor))
    return out


AUTOTUNED = {"default": "max-autotune-no-cudagraphs", "reduce-overhead": "max-autotune"}
