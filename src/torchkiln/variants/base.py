"""Variant = a backend (how the model is run) + policies (precision, layout). Spec strings."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from torchkiln.errors import KilnUserError

# fp32 means full fp32: TF32 off for matmuls and convolutions (the honest baseline on Ampere+).
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
LAYOUTS = ("channels_last",)
SCOPES = ("model", "step")
# Inductor can also compile each repeated block (e.g. every transformer layer) on its own.
INDUCTOR_SCOPES = ("model", "step", "regions")
NUMERICS_CHANGING = {"tf32", "bf16", "fp16"}


class VariantSpecError(KilnUserError):
    pass


class PrecompileUnsupported(RuntimeError):
    """An ahead-of-time compile is not possible here; the message says why in plain words."""


@dataclass(frozen=True)
class Backend:
    """Base class of a backend. Subclasses are frozen dataclasses whose fields are the spec's
    parameters; they validate themselves in ``__post_init__`` and list the allowed values."""

    name: ClassVar[str] = ""
    # Whether the backend needs a CUDA device; on another device the trial is `unsupported`.
    needs_cuda: ClassVar[bool] = False
    # Whether it compiles through Inductor's pool of compile workers, which a trial may start
    # below its own priority (runner.protocol.compile_pool, KILN_COMPILE_NICE).
    compiles_in_pool: ClassVar[bool] = False

    def wrap(self, fn: Callable[..., Any], *, compile_scope: str) -> Callable[..., Any]:
        """Return the callable that runs ``fn`` (a module or a whole step function)."""
        raise NotImplementedError

    @property
    def scope(self) -> str:
        """What is compiled: the model (`model`) or the whole step, optimizer included (`step`).
        Backends that compile declare a `scope` field, which shadows this property."""
        return "model"

    def unsupported_reason(self, device: str) -> str | None:
        if self.needs_cuda and not device.startswith("cuda"):
            return f"the {self.name} backend needs a CUDA device, not {device!r}"
        return None

    def step_unsupported_reason(self, step: str) -> str | None:
        """Why this backend cannot run a `step` ("infer" or "train") step, or None."""
        return None

    def before_step(self) -> None:
        """Called before each step (e.g. to mark a CUDA-graph step boundary)."""

    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    # Hooks through which the runner, tune and the report reach a backend's own code, so that
    # none of them tests a backend's name. The defaults are those of a backend that is a
    # wrapper around a PyTorch callable; a backend with a folder in backends/ overrides them.

    @property
    def uses_cudagraphs(self) -> bool:
        """Whether the backend records CUDA graphs (a compiled step's optimizer state must
        exist before the capture)."""
        return False

    @property
    def embeds_weights(self) -> bool:
        """Whether what it compiles holds the model's weights as constants (a shipped artifact
        of it then fits only those weights)."""
        return False

    @property
    def compile_kwargs(self) -> dict[str, Any]:
        """The torch.compile arguments that reproduce this backend (explain compiles with them
        when the backend records CUDA graphs)."""
        return {}

    def precompile(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The module's forward compiled ahead of time on these inputs, as an object with
        ``save_compiled_function(path)`` (torch's AOT-compiled function, called as
        ``fn(module, *args, **kwargs)``). Raises PrecompileUnsupported with the reason where the
        backend or this torch cannot."""
        raise PrecompileUnsupported(f"the {self.name} backend has no ahead-of-time compile")

    def precompile_config(self) -> dict[str, Any]:
        """The compiler settings ``precompile``'s functions are read back under in a loading
        process (settings torch takes from that process, not from the saved function)."""
        return {}

    @property
    def arm_builder(self) -> Callable[..., Any] | None:
        """The backend's own arm builder, ``(spec, variant, *, fp64, no_dropout) -> Arm``, for
        an arm that is not `wrap` around the model or step; None: the runner's own."""
        return None

    @property
    def protocol(self) -> Callable[..., None] | None:
        """The backend's own order of measurement, ``(spec, variant, baseline, result,
        phases)``, for a backend that cannot share a process with its baseline the usual way;
        None: the runner's paired, interleaved protocol."""
        return None

    @classmethod
    def tune_candidate(cls, evidence: Any) -> tuple[str, str, float, float] | None:
        """What tune's search tries of this backend, beyond Inductor's modes, given its
        evidence: (spec, why, priority, compile factor over default's); None: nothing."""
        return None

    @classmethod
    def report_section(cls, doc: dict[str, Any]) -> tuple[str, list[dict[str, str]]] | None:
        """A section of the run's report that sets this backend's trials beside others: its
        title and rows; None when the run has nothing for it."""
        return None


def _choice(value: Any, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise VariantSpecError(f"{what}={value!r}; choose from {list(allowed)}")


@dataclass(frozen=True)
class Variant:
    backend: Backend
    precision: str = "fp32"
    channels_last: bool = False
    # Remedies for graph breaks (torchkiln.repair): `+fix=code:all`, `+fix=config:NAME`.
    fixes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _choice(self.precision, PRECISIONS, "precision")

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def changes_numerics(self) -> bool:
        return self.precision in NUMERICS_CHANGING

    @property
    def spec(self) -> str:
        return format_variant(self)

    def __str__(self) -> str:
        return self.spec


_BACKENDS: dict[str, type[Backend]] = {}
_plugins_loaded = False


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Class decorator: register a Backend subclass under its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a class attribute `name`")
    _BACKENDS[cls.name] = cls
    return cls


def load_plugins(spec: str | None = None) -> None:
    """Import the modules or files named in KILN_PLUGINS (comma separated), which may register
    backends or workloads. Trial workers inherit the variable, so plugins work in both."""
    spec = os.environ.get("KILN_PLUGINS", "") if spec is None else spec
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item.endswith(".py"):
            path = Path(item)
            mod_spec = importlib.util.spec_from_file_location(f"kiln_plugin_{path.stem}", path)
            if mod_spec is None or mod_spec.loader is None:
                raise KilnUserError(f"cannot load plugin file {item!r}")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_spec.name] = module  # dataclasses look their module up here
            mod_spec.loader.exec_module(module)
        else:
            importlib.import_module(item)


def backends() -> dict[str, type[Backend]]:
    global _plugins_loaded
    # The package torchkiln.variants registered eager, inductor and cudagraphs on its import;
    # the backends with a folder of their own register on their package's.
    import torchkiln.backends  # noqa: F401

    if not _plugins_loaded:
        _plugins_loaded = True
        load_plugins()
    return _BACKENDS


def report_sections(doc: dict[str, Any]) -> list[tuple[str, list[dict[str, str]]]]:
    """Every registered backend's report section for this run (Backend.report_section)."""
    return [s for _, cls in sorted(backends().items()) if (s := cls.report_section(doc))]


def available_backends() -> list[str]:
    return sorted(backends())


def _coerce(raw: str, default: Any, key: str, backend: str) -> Any:
    if isinstance(default, bool):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise VariantSpecError(f"{backend}: {key}={raw!r}; choose from ['true', 'false']")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError as exc:
            raise VariantSpecError(f"{backend}: {key}={raw!r} is not an integer") from exc
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError as exc:
            raise VariantSpecError(f"{backend}: {key}={raw!r} is not a number") from exc
    return raw


def parse_variant(spec: str) -> Variant:
    """Parse ``backend[:k=v,...][+policy...]``; errors list the allowed values."""
    spec = spec.strip()
    if not spec:
        raise VariantSpecError("empty variant spec")
    head, *policies = spec.split("+")
    name, _, arg_text = head.partition(":")
    table = backends()
    if name not in table:
        raise VariantSpecError(f"unknown backend {name!r}; choose from {sorted(table)}")
    cls = table[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for item in filter(None, arg_text.split(",")):
        key, eq, raw = item.partition("=")
        if not eq:
            raise VariantSpecError(f"{name}: {item!r} must be key=value")
        if key not in fields:
            raise VariantSpecError(
                f"{name}: unknown parameter {key!r}; choose from {sorted(fields)}"
            )
        kwargs[key] = _coerce(raw, fields[key].default, key, name)
    backend = cls(**kwargs)
    from torchkiln.repair import policy as fix_policy

    precision, channels_last = "fp32", False
    fixes: list[str] = []
    seen_precision = False
    for pol in policies:
        if pol in PRECISIONS:
            if seen_precision:
                raise VariantSpecError(f"{spec!r} names more than one precision")
            precision, seen_precision = pol, True
        elif pol in LAYOUTS:
            channels_last = True
        elif pol.startswith(fix_policy.PREFIX):
            try:
                fixes.append(fix_policy.parse_fix(pol))
            except KilnUserError as exc:
                raise VariantSpecError(str(exc)) from exc
        else:
            raise VariantSpecError(
                f"unknown policy {pol!r}; choose from "
                f"{list(PRECISIONS) + list(LAYOUTS) + ['fix=...']}"
            )
    return Variant(
        backend=backend,
        precision=precision,
        channels_last=channels_last,
        fixes=_canonical_fixes(fixes),
    )


def _canonical_fixes(fixes: list[str]) -> tuple[str, ...]:
    from torchkiln.repair.policy import canonical

    try:
        return canonical(fixes)
    except KilnUserError as exc:
        raise VariantSpecError(str(exc)) from exc


def split_variants(text: str) -> list[str]:
    """A comma-separated list of specs, where specs may hold commas of their own:
    ``eager,inductor:mode=max-autotune,dynamic=false+bf16`` is two specs. A comma starts a new
    spec only where a registered backend name follows it; otherwise it separates parameters."""
    names = backends()
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        head = piece.split("+", 1)[0].split(":", 1)[0]
        if specs and head not in names:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def format_variant(v: Variant) -> str:
    """The canonical spec: parameters that differ from their default, in field order."""
    parts = []
    for f in dataclasses.fields(v.backend):
        value = getattr(v.backend, f.name)
        if value != f.default:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            parts.append(f"{f.name}={text}")
    out = v.backend.name + (":" + ",".join(parts) if parts else "")
    if v.precision != "fp32":
        out += "+" + v.precision
    if v.channels_last:
        out += "+channels_last"
    for token in v.fixes:
        out += "+fix=" + token
    return out


def backend_choices() -> dict[str, dict[str, Any]]:
    """For --help and `kiln variants`: each backend's parameters and their defaults."""
    return {
        name: {f.name: f.default for f in dataclasses.fields(cls)}
        for name, cls in sorted(backends().items())
    }


def allowed_values(cls: type) -> dict[str, list[str] | str]:
    """For `kiln variants`: each parameter's allowed values, read from the backend's own check
    (its __post_init__ refuses a value, listing the allowed ones), so no second list is kept.
    Booleans are true/false; a parameter the check does not limit shows its type."""
    import ast

    out: dict[str, list[str] | str] = {}
    for f in dataclasses.fields(cls):
        if isinstance(f.default, bool):
            out[f.name] = ["false", "true"]
            continue
        if not isinstance(f.default, str):
            out[f.name] = type(f.default).__name__
            continue
        try:
            cls(**{f.name: "\0"})
        except VariantSpecError as exc:
            _, found, listed = str(exc).partition("choose from ")
            if found:
                out[f.name] = [str(v) for v in ast.literal_eval(listed)]
                continue
        out[f.name] = "text"
    return out
