"""From explain's breaks to the remedies a tune measures: which configuration remedies apply,
which rewrites apply (each alone and all together, each a rewritten copy and a patch), which
breaks are left alone and why. Written as plan.json into the run directory; trial processes
read it to build a remedied arm."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.repair import config as cfg
from torchkiln.repair.workspace import diff_root, rewrite, unified_diff, write_copy

FIX_MODES = ("none", "config", "code")
PLAN_FILE = "plan.json"
_DYNAMIC_SHAPE = re.compile(r"dynamic shape|data-dependent output shape|nonzero|unique", re.I)


@dataclass(frozen=True)
class WorkloadSource:
    entry: Path  # the file that defines the factory
    factory: str
    copy_root: Path  # copied (the .py files) for each rewritten arm
    diff_root: Path  # the patch's paths are relative to this


def check_mode(mode: str) -> str:
    if mode not in FIX_MODES:
        raise KilnUserError(f"--fix {mode!r}; choose from {list(FIX_MODES)}")
    return mode


def workload_source(spec: str) -> WorkloadSource | str:
    """Where the workload's code lives, or why it cannot be rewritten."""
    from torchkiln.workloads.base import registry

    if spec.startswith("torchkiln.tune.inmemory"):
        return "an in-memory model has no source file to rewrite"
    entries = registry()
    if spec in entries:
        found = getattr(entries[spec].factory, "__kiln_source__", None)
        if found is None:
            return f"{spec!r} is defined inside kiln's own modules, not in a file of its own"
        path, factory = found
    elif ":" in spec:
        target, _, factory = spec.rpartition(":")
        if target.endswith(".py") or "/" in target:
            path = target
        else:
            try:
                found_spec = importlib.util.find_spec(target)
            except (ImportError, ValueError):
                found_spec = None
            if found_spec is None or not (found_spec.origin or "").endswith(".py"):
                return f"module {target!r} has no Python source file"
            path = found_spec.origin
    else:
        return f"{spec!r} names no file"
    entry = Path(path).resolve()
    if not entry.is_file():
        raise KilnUserError(f"{path}: the workload file vanished; nothing rewritten")
    return WorkloadSource(entry, factory, entry.parent, diff_root(entry))


def _helpers(breaks: list[dict[str, Any]], copy_root: Path | None) -> list[dict[str, str]]:
    """Module-level functions holding an untraceable call: torch.compiler.disable targets."""
    import ast

    out: dict[tuple[str, str], dict[str, str]] = {}
    for b in breaks:
        if b.get("category") not in ("third-party-call", "custom-op", "python-construct"):
            continue
        fn, path = b.get("function") or "", b.get("file") or ""
        if not fn or fn in ("forward", "?", "<module>") or not path.endswith(".py"):
            continue
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        if any(isinstance(n, ast.FunctionDef) and n.name == fn for n in tree.body):
            out[(path, fn)] = {"file": path, "function": fn}
    return list(out.values())


def categories_of(breaks: list[dict[str, Any]]) -> set[str]:
    cats = {b.get("category", "other") for b in breaks}
    if any(_DYNAMIC_SHAPE.search(b.get("reason") or "") for b in breaks):
        cats.add("dynamic-shape")
    return cats


def build_plan(
    workload: str, breaks: list[dict[str, Any]], out_dir: Path, mode: str = "code"
) -> dict[str, Any]:
    """The remedies for ``breaks`` (explain's records), their copies and patches in
    ``out_dir``; writes and returns plan.json's content. ``mode`` none offers nothing."""
    check_mode(mode)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan: dict[str, Any] = {
        "mode": mode,
        "workload": workload,
        "breaks": [
            {k: b.get(k) for k in ("file", "line", "function", "source", "category", "reason")}
            for b in breaks
        ],
        "source": None,
        "source_note": None,
        "config": {},
        "helpers": [],
        "code": {},
        "skipped": [],
        "fixes": [],
    }
    if mode == "none" or not breaks:
        return _save(plan, out_dir)
    source = workload_source(workload)
    if isinstance(source, str):
        plan["source_note"] = f"configuration remedies only: {source}"
    plan["helpers"] = _helpers(breaks, None if isinstance(source, str) else source.copy_root)
    names = cfg.offered_for(categories_of(breaks), bool(plan["helpers"]))
    for name in names:
        r = cfg.CONFIG_REMEDIES[name]
        plan["config"][name] = {
            "title": r.title,
            "behaviour": r.behaviour,
            "lines": cfg.code_lines([name], [h["function"] for h in plan["helpers"]]),
            "breaks": [i for i, b in enumerate(breaks) if b.get("category") in r.categories],
        }
    left_cats: set[str] = set()
    if mode == "code" and not isinstance(source, str):
        plan["source"] = {k: str(v) for k, v in source.__dict__.items()}
        full = rewrite(breaks, source.copy_root, source.diff_root, "all")
        plan["skipped"] = full.to_json()["skipped"]
        left_cats = {s["category"] for s in plan["skipped"]}
        if full.applied:
            plan["code"]["all"] = _materialise("all", full, source, out_dir)
            used = sorted({a.rewrite for a in full.applied})
            for name in used if len(used) > 1 else []:
                one = rewrite(breaks, source.copy_root, source.diff_root, name)
                plan["code"][name] = _materialise(name, one, source, out_dir)
    plan["config_left"] = [n for n in names if set(cfg.CONFIG_REMEDIES[n].categories) & left_cats]
    plan["fixes"] = fix_tokens(plan)
    return _save(plan, out_dir)


def fix_tokens(plan: dict[str, Any]) -> list[str]:
    """The fix policies to measure, combinations first: all rewrites (plus the configuration
    for the breaks they leave), then each remedy alone (the per-break cost)."""
    tokens = []
    if "all" in plan["code"]:
        tokens.append("all" if plan.get("config_left") else "code:all")
    if len(plan["config"]) > 1:
        tokens.append("config:all")
    tokens += [f"code:{k}" for k in plan["code"] if k != "all"]
    tokens += [f"config:{k}" for k in plan["config"]]
    return list(dict.fromkeys(tokens))


def _materialise(key: str, rs: Any, source: WorkloadSource, out_dir: Path) -> dict[str, Any]:
    dest = write_copy(rs, source.copy_root, out_dir / f"code-{key}")
    patch = unified_diff(rs, source.diff_root)
    (out_dir / f"code-{key}.patch").write_text(patch, encoding="utf-8")
    return {
        "dir": str(dest),
        "entry": str(dest / source.entry.relative_to(source.copy_root)),
        "factory": source.factory,
        "patch": patch,
        **rs.to_json(),
    }


def _save(plan: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    (out_dir / PLAN_FILE).write_text(json.dumps(plan, indent=2, default=str), encoding="utf-8")
    plan["path"] = str(out_dir / PLAN_FILE)
    return plan


def load_plan(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def resolve(plan: dict[str, Any], fixes: tuple[str, ...]) -> tuple[str | None, list[str]]:
    """(the rewritten copy to load, or None; the configuration remedies to apply)."""
    code: str | None = None
    names: list[str] = []
    for token in fixes:
        kind, _, name = token.partition(":")
        if token == "all":
            code, names = "all", names + list(plan.get("config_left", []))
        elif kind == "code":
            code = name
        elif kind == "config":
            names += list(plan["config"]) if name == "all" else [name]
    if code is not None and code not in plan["code"]:
        if code == next(iter(plan["code"]), None) or (
            "all" in plan["code"] and len(plan["code"]) == 1
        ):
            code = "all"  # the only rewrite kind: the all-copy is its copy
        else:
            raise KilnUserError(f"fix=code:{code}: no such rewrite applies to this workload")
    unknown = [n for n in names if n not in plan["config"]]
    if unknown:
        raise KilnUserError(f"fix=config:{unknown[0]}: does not apply to this workload")
    return code, list(dict.fromkeys(names))
