"""What a saved ahead-of-time compile starts from: a module-level function that calls the module,
and the guards that can be saved with it.

Compiling ``call_module`` rather than ``type(model).forward`` keeps the saved function
nameable in another process when the class's forward is decorated (transformers wraps GPT-2's:
pickling the inner function failed, "not the same object as GPT2LMHeadModel.forward"), and runs
the module's hooks as a call does. Dynamo installs the globals the compiled code reads into
this module's namespace, which a loading process passes back as ``f_globals``.

The builtins are bound here by name too: torch 2.11 checks, when it compiles, that every global
the rewritten code reads is in the function's own namespace, builtins included, and refused
GPT-2 for its ``type`` ("Missing required external references: ['type']")."""

from __future__ import annotations

from builtins import *  # noqa: F403, UP029  (see the docstring)
from typing import Any


def call_module(module: Any, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


def serializable_guards(entries: Any) -> list[bool]:
    """The guards a saved function keeps: torch's own rule for saving (no global guard, none of
    the guard types it cannot save), applied to the guard types each guard derives from too.
    An identity guard (ID_MATCH) on a decorator's closure, as transformers' forward wrappers
    make, can only hold in the process that compiled it; the manifest's model hash and the
    model's package versions stand in for it where the functions load."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = set(getattr(CheckFunctionManager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", ()))
    return [
        not (
            e.is_global
            or e.guard_type in unsupported
            or unsupported & set(getattr(e, "derived_guard_types", ()) or ())
        )
        for e in entries
    ]


def module_refs(fn: Any) -> dict[str, str]:
    """The modules the compiled code reads through names Dynamo installed here (a
    ``collections`` that a ModelOutput's rebuild reads, say): {name: module name}, to install
    again where the function is loaded."""
    import types

    env = getattr(getattr(fn, "_artifacts", None), "runtime_env", None)
    here = globals()
    return {
        name: here[name].__name__
        for name in sorted(getattr(env, "external_refs", ()) or ())
        if isinstance(here.get(name), types.ModuleType)
    }


def load_globals(refs: dict[str, str]) -> dict[str, Any]:
    """``f_globals`` for loading: this module's namespace with the recorded modules, and the
    builtins by name: torch 2.11's loader wants every name the compiled code reads in
    ``f_globals`` itself, builtins too (GPT-2 on an H200: "Missing required external
    references: ['type']"), where a call would have found them among the builtins."""
    import builtins
    import importlib

    mods = {name: importlib.import_module(mod) for name, mod in refs.items()}
    return {**vars(builtins), **globals(), **mods}
