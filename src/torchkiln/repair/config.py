"""Configuration remedies: the user's code unchanged, Dynamo told how to treat what breaks.

Each remedy names the torch settings it needs; whether this torch has them is asked with
hasattr at run time (torch 2.11-2.14 differ: `recompile_limit` was `cache_size_limit`, the
logging lists came later), never assumed. A remedy is applied around each compiled call with
`torch._dynamo.config.patch`, so it does not leak into another arm of the same process."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

_LOGGER_METHODS = ("debug", "info", "warning", "error", "critical", "exception", "log")
RAISED_RECOMPILE_LIMIT = 64


@dataclass(frozen=True)
class ConfigRemedy:
    name: str
    title: str
    categories: tuple[str, ...]  # explain categories (or "recompiles") it answers
    behaviour: str
    needs: tuple[tuple[str, ...], ...]  # alternatives: the config attributes it sets

    def attrs(self) -> tuple[str, ...] | None:
        """The first alternative this torch has, or None where it has none."""
        import torch._dynamo.config as cfg

        for option in self.needs:
            if all(hasattr(cfg, a) for a in option):
                return option
        return None

    def available(self) -> bool:
        return self.attrs() is not None or not self.needs


def _logging_settings(cfg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if hasattr(cfg, "reorderable_logging_functions"):
        out["reorderable_logging_functions"] = set(cfg.reorderable_logging_functions) | {print}
    if hasattr(cfg, "ignore_logger_methods"):
        methods = {getattr(logging.Logger, m) for m in _LOGGER_METHODS}
        out["ignore_logger_methods"] = set(cfg.ignore_logger_methods) | methods
    return out


def _recompile_settings(cfg: Any) -> dict[str, Any]:
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    return {name: max(RAISED_RECOMPILE_LIMIT, int(getattr(cfg, name)))}


# name -> the settings to patch (given torch._dynamo.config) and the lines to ship.
_SETTINGS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "capture_scalar_outputs": lambda cfg: {"capture_scalar_outputs": True},
    "capture_dynamic_output_shape_ops": lambda cfg: {"capture_dynamic_output_shape_ops": True},
    "ignore_logging": _logging_settings,
    "recompile_limit": _recompile_settings,
    "dynamic": lambda cfg: {},
    "disable": lambda cfg: {},
}

CONFIG_REMEDIES: dict[str, ConfigRemedy] = {
    r.name: r
    for r in (
        ConfigRemedy(
            "capture_scalar_outputs",
            "torch._dynamo.config.capture_scalar_outputs = True",
            ("tensor-to-scalar",),
            "`.item()` becomes a symbolic number inside the graph instead of a break",
            (("capture_scalar_outputs",),),
        ),
        ConfigRemedy(
            "capture_dynamic_output_shape_ops",
            "torch._dynamo.config.capture_dynamic_output_shape_ops = True",
            ("data-dependent-branch", "other"),
            "ops whose output shape depends on data (nonzero, unique) are captured with "
            "symbolic sizes",
            (("capture_dynamic_output_shape_ops",),),
        ),
        ConfigRemedy(
            "ignore_logging",
            "print reordered after the graph, logger calls ignored by Dynamo",
            ("print-logging",),
            "under torch.compile print runs after the graph (not in order) and logger calls "
            "inside the model are skipped",
            (("reorderable_logging_functions",), ("ignore_logger_methods",)),
        ),
        ConfigRemedy(
            "recompile_limit",
            f"recompile limit raised to {RAISED_RECOMPILE_LIMIT}",
            ("recompiles",),
            "more shapes get their own compiled graph before Dynamo falls back to eager",
            (("recompile_limit",), ("cache_size_limit",)),
        ),
        ConfigRemedy(
            "dynamic",
            "torch._dynamo.mark_dynamic on the batch dimension of the inputs",
            ("recompiles",),
            "one graph with a symbolic batch size serves every batch size",
            (),
        ),
        ConfigRemedy(
            "disable",
            "torch.compiler.disable on the untraceable helper",
            ("third-party-call", "custom-op", "python-construct", "other"),
            "the helper runs in eager and the rest compiles around it",
            (),
        ),
    )
}


def settings(names: list[str]) -> dict[str, Any]:
    """The torch._dynamo.config values the named remedies set, on this torch."""
    import torch._dynamo.config as cfg

    out: dict[str, Any] = {}
    for name in names:
        if CONFIG_REMEDIES[name].available():
            for key, value in _SETTINGS[name](cfg).items():
                if hasattr(cfg, key):
                    out[key] = value
    return out


@contextlib.contextmanager
def patched(names: list[str]) -> Iterator[None]:
    values = settings(names)
    if not values:
        yield
        return
    import torch._dynamo.config as cfg

    with cfg.patch(**values):
        yield


def code_lines(names: list[str], helpers: list[str] | None = None) -> list[str]:
    """The configuration to ship, as Python lines to run before the first compiled call."""
    import torch._dynamo.config as cfg

    lines: list[str] = []
    for name in names:
        if name == "dynamic":
            lines.append("torch._dynamo.mark_dynamic(x, 0)  # each input, before the first call")
        elif name == "disable":
            for h in helpers or []:
                lines.append(f"{h} = torch.compiler.disable({h})")
        elif name == "ignore_logging":
            if hasattr(cfg, "reorderable_logging_functions"):
                lines.append("torch._dynamo.config.reorderable_logging_functions.add(print)")
            if hasattr(cfg, "ignore_logger_methods"):
                methods = ", ".join(f"logging.Logger.{m}" for m in _LOGGER_METHODS)
                lines.append("import logging")
                lines.append(f"torch._dynamo.config.ignore_logger_methods.update({{{methods}}})")
        else:
            for key, value in _SETTINGS[name](cfg).items():
                lines.append(f"torch._dynamo.config.{key} = {value!r}")
    return lines


def offered_for(categories: set[str], has_helpers: bool) -> list[str]:
    """The configuration remedies that answer some of these categories, on this torch."""
    out = []
    for r in CONFIG_REMEDIES.values():
        if not r.available() or not categories & set(r.categories):
            continue
        if r.name == "disable" and not has_helpers:
            continue
        if r.name == "capture_dynamic_output_shape_ops" and "dynamic-shape" not in categories:
            continue  # only where a break names an op with a data-dependent output shape
        out.append(r.name)
    return out
