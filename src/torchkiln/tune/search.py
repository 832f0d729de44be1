"""Which variants to try, in which order, and which to skip: ordered and pruned by evidence
(the profile verdict, the graph-break count, the kind of model) and by the time budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchkiln.variants import parse_variant
from torchkiln.variants.base import backends

# Relative compile cost of a candidate, in units of the default mode's compile time. Measured
# on an H200 (torch 2.11, benchmarks/results/zoo/h200, first call of max-autotune-no-cudagraphs
# over default's): at bf16 bert-base infer 3.4, train 6.1, resnet50 infer 18, train 10.5 (median
# about 8); at fp32 simple train 4.9, bert-base infer 10.4, train 17, resnet50 infer > 33 and
# train > 15 (both still compiling when stopped; at 50de622 bert-base train fp32 max-autotune
# was still autotuning at 315 s, > 12x). fp32 kernels autotune slower: Triton's fp32 templates
# take longer to benchmark. reduce-overhead costs about what default does.
COMPILE_FACTOR = {
    "default": 1.0,
    "reduce-overhead": 1.1,
    "max-autotune-no-cudagraphs": 15.0,
    "max-autotune": 16.5,
}
AUTOTUNE_16BIT_FACTOR = 8.0  # max-autotune at bf16/fp16, without CUDA graphs (median above)
REGIONS_FACTOR = 0.4  # one block compiled and reused: a fraction of the whole model's compile
# With a 16-bit precision allowed on a GPU, its variants run first and the fp32 (exact) ones
# after all of them: a bert-base train tune (H200, 50de622) ran four fp32 candidates (one a
# max-autotune compile stopped at 315 s) and spent its 10-minute budget before any bf16 one,
# while the zoo measured reduce-overhead+bf16 at 7.24 ms against fp32 reduce-overhead's 30.5.
EXACT_AFTER = 20.0


def compile_factor(mode: str, precision: str = "fp32") -> float:
    """A mode's compile cost in units of the default mode's, at a precision."""
    if mode.startswith("max-autotune") and precision in ("bf16", "fp16"):
        return AUTOTUNE_16BIT_FACTOR * (1.1 if mode == "max-autotune" else 1.0)
    return COMPILE_FACTOR[mode]


def lead_precision(ev: Evidence) -> str | None:
    """The allowed precision the search leads with on a GPU: bf16 (fp32's range, no loss
    scaling), else fp16, else TF32 (fp32 storage, TF32 matrix units). None on the CPU, where
    16-bit autocast is often slower and each precision is tried as a variant of its own."""
    if not ev.device.startswith("cuda"):
        return None
    return next((p for p in ("bf16", "fp16", "tf32") if p in ev.allow_precision), None)


@dataclass
class Candidate:
    spec: str
    why: str
    priority: float  # lower runs earlier
    compile_factor: float
    # A yardstick: the cheap modes (default, reduce-overhead) over the whole model at the
    # precision the search leads with. Refinements wait until these are measured.
    primary: bool = False


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
    # The repair plan's fix policies (torchkiln.repair.plan.fix_tokens), combinations first.
    fixes: list[str] = field(default_factory=list)


def _with(spec: str, **params: str) -> str:
    base, _, args = spec.partition(":")
    items = dict(a.split("=", 1) for a in args.split(",") if a)
    items.update(params)
    return base + (":" + ",".join(f"{k}={v}" for k, v in items.items()) if items else "")


def candidates(ev: Evidence) -> list[Candidate]:
    """Every variant worth measuring for this evidence, best-first. Precision changes appear
    only when allowed; CUDA-graph modes only on CUDA; fullgraph only with zero breaks."""
    cuda = ev.device.startswith("cuda")
    if cuda:
        modes = ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
    else:
        # On the CPU autotuning has few templates to choose from and CUDA graphs do not exist:
        # default mode is the one that matters (max-autotune is tried last, if budget allows).
        modes = ["default", "max-autotune-no-cudagraphs"]
    launch_bound = ev.verdict == "host/launch-bound"
    compute_bound = ev.verdict == "gpu-compute-bound"
    lead = lead_precision(ev)
    out: list[Candidate] = []

    def add(spec: str, why: str, priority: float, factor: float, primary: bool = False) -> None:
        spec = parse_variant(spec).spec  # canonical, and validated
        if all(c.spec != spec for c in out):
            out.append(Candidate(spec, why, priority, factor, primary))

    def add_both(
        spec: str, why: str, priority: float, mode: str, scale: float = 1.0, primary: bool = False
    ) -> None:
        """At the lead precision, and at fp32 after every lead-precision candidate."""
        if lead is None:
            add(spec, why, priority, compile_factor(mode) * scale, primary)
            return
        factor = compile_factor(mode, lead) * scale
        add(f"{spec}+{lead}", f"{why}, {lead}", priority, factor, primary)
        add(spec, f"{why}, fp32 (exact)", priority + EXACT_AFTER, compile_factor(mode) * scale)

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
        add_both(spec, why, prio, mode, primary=mode in ("default", "reduce-overhead"))
        if ev.step == "train" and mode == "default":
            # Never fullgraph: the step calls loss.backward(), which Dynamo does not trace by
            # default ("Unsupported Tensor.backward() call"), so fullgraph=true always fails.
            # Under CUDA graphs the whole step is a refinement of a reduce-overhead leader
            # (it gains what compiling the optimizer saves: 3-5% on the H200 for resnet50 and
            # bert-base training at bf16, commit c137b97), not a candidate of its own.
            add_both(
                _with(spec, scope="step", fullgraph="false"),
                why + ", whole step with the optimizer compiled",
                prio + 0.5,
                mode,
                1.3,
            )
        if ev.has_repeated_blocks and mode in ("default", "reduce-overhead"):
            add_both(
                _with(spec, scope="regions"),
                why + ", each repeated block compiled once",
                prio + 0.3,
                mode,
                REGIONS_FACTOR,
            )
    add_remedies(ev, out, add)
    if ev.convolutional:
        best_mode = "reduce-overhead" if (cuda and launch_bound) else "default"
        params = {"mode": best_mode} if best_mode != "default" else {}
        spec = _with("inductor", **params, dynamic="false") + "+channels_last"
        add_both(spec, "channels_last: convolutions without layout transposes", 1.5, best_mode)
    # Other backends' own candidates (Backend.tune_candidate: cudagraphs on CUDA, xla when
    # its extra is installed), in name order.
    for _, backend in sorted(backends().items()):
        other = backend.tune_candidate(ev)
        if other is not None:
            spec, why, priority, scale = other
            add_both(spec, why, priority, "default", scale)
    for precision in ("bf16", "tf32", "fp16"):
        if precision not in ev.allow_precision:
            continue
        if precision != lead:
            bonus = -6 if compute_bound else -2
            if lead is not None:
                bonus = 7  # another allowed precision: after the lead precision's modes
            for i, mode in enumerate(modes[:2] if not cuda else ["default", "reduce-overhead"]):
                params = {"mode": mode} if mode != "default" else {}
                spec = _with("inductor", **params, dynamic="false") + f"+{precision}"
                add(
                    spec,
                    f"{precision}: the matrix units' faster precision",
                    2.0 + i + bonus,
                    compile_factor(mode, precision),
                )
        add(f"eager+{precision}", f"{precision} without compilation", 8.0, 0.0)
    # The primaries (default and reduce-overhead over the whole model, at the lead precision)
    # before anything else, in the verdict's order: they are the plain modes a pick must not be
    # slower than. A bert-base train tune (H200, 65f0de3; verdict balanced) ran default's regional
    # and whole-step variants first (149 s for the latter) and then had no time for
    # reduce-overhead+bf16, twice as fast as its pick.
    out.sort(key=lambda c: (not c.primary, c.priority))
    return out


def early_plan(ev: Evidence) -> list[Candidate]:
    """What the search starts beside the diagnosis, before the profile verdict and the graph
    breaks are in: the primaries, and on a GPU the autotuned modes over the whole model at the
    lead precision. Neither depends on the diagnosis (with no break a `fullgraph=true` twin
    planned later is stood for by the one measured: after_diagnosis), and the autotuned ones
    are the search's longest compiles: in an 8-minute resnet50 training tune (H100, kiln b8486a3)
    the diagnosis took 55 s with two places of the six in flight in use, and max-autotune, planned
    after it and behind the plain compiles, was stopped still autotuning at the search's end
    (`tune_speed/h100/tune8-resnet50-results.json`)."""
    lead = lead_precision(ev)

    def autotuned_at_lead(c: Candidate) -> bool:
        v = parse_variant(c.spec)
        mode = getattr(v.backend, "mode", None) or ""
        whole = getattr(v.backend, "scope", "model") == "model"
        plain = whole and not v.channels_last and not v.fixes
        return (
            v.name == "inductor"
            and mode.startswith("max-autotune")
            and plain
            and (lead is not None and v.precision == lead)
        )

    return [c for c in candidates(ev) if c.primary or autotuned_at_lead(c)]


# Remedies right after the plain modes they repair: an encoder with a NaN guard, an .item() and
# a log call per block ran 0.56 ms per step with the three fixed against 2.46 ms for the best
# plain mode (H200, torch 2.11, bf16, batch 16 x 128, reduce-overhead). Each single remedy
# after the combinations, on the first mode only (the per-break cost), before the autotuned
# modes.
REMEDY_COMBO_AFTER = 0.2
REMEDY_SINGLE_PRIORITY = 1.5


def add_remedies(ev: Evidence, out: list[Candidate], add) -> None:  # noqa: ANN001
    """`+fix=` candidates: the first (combined) remedy on each primary, the single ones on the
    first primary."""
    if not ev.fixes:
        return
    primaries = [c for c in out if c.primary]
    for c in primaries:
        # A primary too: a short budget must reach the likely winner.
        add(f"{c.spec}+fix={ev.fixes[0]}", f"{c.why}, with the remedies for its graph breaks",
            c.priority + REMEDY_COMBO_AFTER, c.compile_factor, True)  # fmt: skip
    if primaries:
        first = primaries[0]
        for j, token in enumerate(ev.fixes[1:]):
            add(f"{first.spec}+fix={token}", f"{first.why}, remedy {token} alone (its cost)",
                REMEDY_SINGLE_PRIORITY + 0.01 * j, first.compile_factor)  # fmt: skip


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
    both, and a mode with bf16 is only as fast as that mode with bf16 by itself (the goal
    is a pick faster than the best plain mode). In the order to try them, cheapest first; the
    pipeline runs one at a time ahead of the rest of the plan, and a refinement that takes the
    lead is refined in turn, so the knobs stack."""
    v = parse_variant(leader_spec)
    if v.name != "inductor":
        return []
    out = []
    factor = compile_factor(v.backend.mode, v.precision) if v.backend.mode else 1.0
    if ev.fixes and not v.fixes:
        spec = parse_variant(f"{leader_spec}+fix={ev.fixes[0]}").spec
        out.append(Candidate(spec, "the leader with the remedies for its breaks", -100.0, factor))
    if ev.convolutional and not v.channels_last:
        spec = parse_variant(leader_spec + "+channels_last").spec
        out.append(Candidate(spec, "the leader with channels_last", -100.0, factor))
    if ev.step == "infer" and not v.backend.freezing and v.backend.scope != "step":
        # Weights folded as constants: a convolution's batch norm disappears into it. Inference
        # only; a recompile, so it costs what the leader's compile did.
        spec = parse_variant(_add_knob(leader_spec, freezing="true")).spec
        out.append(Candidate(spec, "the leader with its weights frozen (freezing)", -100.0, factor))
    # Under CUDA graphs too, now that the optimizer's state is made before the step is
    # compiled (runner.protocol.optim_state): without it reduce-overhead over the whole step failed.
    if (
        ev.step == "train"
        and v.backend.scope == "model"
        and v.backend.mode in ("default", "reduce-overhead")
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
        factor = compile_factor(upgrade, v.precision) * scale
        out.append(Candidate(spec, f"the leader autotuned ({upgrade})", -100.0, factor))
    return out


AUTOTUNED = {"default": "max-autotune-no-cudagraphs", "reduce-overhead": "max-autotune"}


def after_diagnosis(
    started: list[str], plan: list[Candidate], ev: Evidence
) -> tuple[list[Candidate], dict[str, str]]:
    """The plan made from the diagnosis, less what the search measured before it came in
    (``started``: the primaries planned without it). With no graph break the plan's primaries
    carry `fullgraph=true`, which changes nothing a zero-break model compiles to (it only turns
    a break into an error), so the one measured without it stands for it. Returns (the rest
    of the plan, {planned spec: the measured spec standing for it})."""
    done = set(started)
    rest, stand_for = [], {}
    for c in plan:
        if c.spec in done:
            continue
        twin = without_fullgraph(c.spec) if ev.graph_breaks == 0 else None
        if twin is not None and twin in done:
            stand_for[c.spec] = twin
            continue
        rest.append(c)
    return rest, stand_for


def without_fullgraph(spec: str) -> str | None:
    """``spec`` without `fullgraph=true`, or None when it has none."""
    v = parse_variant(spec)
    if getattr(v.backend, "fullgraph", None) is not True:
        return None
    return parse_variant(_add_knob(spec, fullgraph="false")).spec


GIVEN_WHY = "given (variants=)"


def fixed_cost_pairs(
    device: str, allow_precision: set[str], given: list[Candidate] | None = None
) -> list[list[Any]]:
    """The [precision, channels_last] pairs the search's candidates are judged and counted at
    (the tune's baseline trial pays their fixed costs ahead: runner.protocol.references.prepay):
    a given plan's own; else every allowed precision, and channels-last at fp32 and the lead
    precision (what `candidates` plans for a convolutional model; the trial drops them for
    another). fp32 contiguous is the baseline's own."""
    if given is not None:
        pairs = {(v.precision, v.channels_last) for v in (parse_variant(c.spec) for c in given)}
    else:
        ev = Evidence(device=device, step="infer", allow_precision=set(allow_precision))
        lead = lead_precision(ev)
        pairs = {(p, False) for p in ("bf16", "tf32", "fp16") if p in allow_precision}
        pairs |= {("fp32", True)} | ({(lead, True)} if lead else set())
    pairs.discard(("fp32", False))
    return [[p, cl] for p, cl in sorted(pairs)]


def given_plan(specs: list[str]) -> list[Candidate]:
    """A plan given by its caller (`kiln tune --variants`): exactly these specs in this order,
    canonical and validated (a bad one raises here, before anything runs). ``eager`` is dropped
    (the baseline measures it anyway), and so is a repeat. Its compile factors are the search's
    own, so the budget's estimates hold as for a planned candidate."""
    out: list[Candidate] = []
    for i, text in enumerate(specs):
        v = parse_variant(text)
        if v.spec == "eager" or any(c.spec == v.spec for c in out):
            continue
        if v.name == "eager":
            factor = 0.0
        else:
            factor = compile_factor(getattr(v.backend, "mode", "default"), v.precision)
        out.append(Candidate(v.spec, GIVEN_WHY, float(i), factor))
    return out
