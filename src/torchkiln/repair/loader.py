"""Import a workload file with its directory first on sys.path, so that the files it imports by
name (`from layers import Block`) come from the same directory: the original's from the
original's, a rewritten copy's from the copy. Each directory's modules are kept apart: the
names of its own top-level modules are taken out of sys.modules before the import and put back
after, and the loaded module is cached per file for the rest of the process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import FunctionType, ModuleType

from torchkiln.errors import KilnUserError

_LOADED: dict[str, ModuleType] = {}


def _local_names(root: Path) -> set[str]:
    names = {p.stem for p in root.glob("*.py")}
    names |= {p.parent.name for p in root.glob("*/__init__.py")}
    return names


def import_file(path: str | Path, root: str | Path | None = None) -> ModuleType:
    """The module of ``path``, its sibling modules resolved from ``root`` (default its dir)."""
    path = Path(path).resolve()
    key = str(path)
    if key in _LOADED:
        return _LOADED[key]
    if not path.is_file():
        raise KilnUserError(f"workload file {str(path)!r} does not exist")
    root = Path(root).resolve() if root else path.parent
    names = _local_names(root)
    saved = {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] in names}
    sys.path.insert(0, str(root))
    mod_name = f"kiln_file_{abs(hash(key))}"
    try:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise KilnUserError(f"cannot import {str(path)!r} as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module  # dataclasses and pickling look the module up here
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(root))
        for n in [n for n in sys.modules if n.split(".")[0] in names]:
            _keep_apart(sys.modules.pop(n), f"{mod_name}__{n.replace('.', '__')}")
        sys.modules.update(saved)
    _LOADED[key] = module
    return module


def _keep_apart(module: ModuleType, unique: str) -> None:
    """A sibling module under a name of its own, in sys.modules and on what it defines: the
    compiler looks a function's or class's module up by its `__module__` (Dynamo on torch 2.11
    raised ModuleNotFoundError for a sibling taken out of sys.modules, on an H200), and another
    copy's sibling of the same name must not answer for it."""
    old = module.__name__
    module.__name__ = unique
    defined = [v for v in vars(module).values() if getattr(v, "__module__", None) == old]
    for cls in [v for v in defined if isinstance(v, type)]:
        defined += [getattr(m, "__func__", m) for m in vars(cls).values()]
    for value in defined:
        if isinstance(value, type | FunctionType) and value.__module__ == old:
            value.__module__ = unique
    sys.modules[unique] = module


def loaded_modules(module: ModuleType) -> list[ModuleType]:
    """``module`` and the modules its globals refer to that live in its directory."""
    root = Path(module.__file__ or ".").resolve().parent
    out = [module]
    for value in vars(module).values():
        f = getattr(value, "__file__", None)
        if isinstance(value, ModuleType) and f and Path(f).resolve().parent == root:
            out.append(value)
    return out
