"""Graph-break categories and their fixes, decided from the user's source at the break.

Dynamo's reason strings changed wording across torch 2.11..2.14 (and gained graph-break ids), so a
break is classified from the user's code at the innermost user frame: the statement's AST and the
imports of its file. The reason text is only consulted when the source cannot be read or says
nothing specific.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Category:
    key: str
    title: str
    fix: str  # may contain {detail}, filled with the construct found at the break


CATEGORIES: dict[str, Category] = {
    c.key: c
    for c in (
        Category(
            "tensor-to-scalar",
            ".item() / tensor to Python scalar",
            "Keep `{detail}` on the device: compare and select with tensors "
            "(`torch.where(t > 0, a, b)`) or branch with `torch.cond`; if you really need the "
            "number, set `torch._dynamo.config.capture_scalar_outputs = True`.",
        ),
        Category(
            "data-dependent-branch",
            "Python control flow on a tensor value",
            "Replace the Python branch on `{detail}` with `torch.where(cond, a, b)` (computes "
            "both sides) or `torch.cond(cond, true_fn, false_fn, operands)`.",
        ),
        Category(
            "print-logging",
            "print / logging",
            "Move `{detail}` out of the compiled region (log the returned tensors after the "
            "call), or guard it with `if not torch.compiler.is_compiling():`.",
        ),
        Category(
            "third-party-call",
            "call into numpy or another library",
            "Rewrite `{detail}` with torch ops, or register it as an opaque op with "
            "`@torch.library.custom_op` plus a `register_fake` shape function.",
        ),
        Category(
            "tensor-assert",
            "assert on a tensor",
            "Replace the assert with `torch._check(...)` for conditions on sizes or Python "
            "numbers; for a tensor value use `torch._assert_async({detail})` (an assert with a "
            "constant message string is rewritten to it, an f-string message is not).",
        ),
        Category(
            "custom-op",
            "custom autograd.Function or C++ extension",
            "Register `{detail}` with `torch.library.custom_op` and give it a fake implementation "
            "(`register_fake`, plus `register_autograd` for its backward) so Dynamo traces "
            "through it.",
        ),
        Category(
            "python-construct",
            "unsupported builtin / generator / dynamic attribute access",
            "{detail}",
        ),
        Category(
            "explicit",
            "explicit torch._dynamo.graph_break()",
            "Remove the `torch._dynamo.graph_break()` call if the split is no longer needed.",
        ),
        Category(
            "other",
            "other",
            "{detail}",
        ),
    )
}

_LOG_ROOTS = {"logging", "logger", "log", "_logger", "_log", "LOGGER", "LOG", "warnings"}
_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}
_SCALAR_METHODS = {"item", "tolist"}
_SCALAR_BUILTINS = {"int", "float", "bool", "complex"}
_CONSTRUCT_FIXES = {
    "getattr": "Resolve the attribute by a constant name, or keep the candidates in a dict / "
    "nn.ModuleDict indexed by a constant key, instead of `getattr` with a computed name.",
    "setattr": "Return the value instead of setting an attribute with `setattr` inside the "
    "compiled region.",
    "hasattr": "Decide `hasattr` once outside the compiled region (e.g. in `__init__`).",
    "generator": "Build a list or tuple instead of a generator (`[f(x) for x in xs]`), or move "
    "the generator out of the compiled region.",
}
_TORCH_FAMILY = {"torch"}


@dataclass(frozen=True)
class Classification:
    category: str
    detail: str

    @property
    def title(self) -> str:
        return CATEGORIES[self.category].title

    @property
    def fix(self) -> str:
        return CATEGORIES[self.category].fix.format(detail=self.detail)


@functools.lru_cache(maxsize=256)
def _parse(path: str) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None  # generated code or a file that moved: the caller falls back to the reason


@functools.lru_cache(maxsize=256)
def _imports(path: str) -> dict[str, str]:
    """Local name -> the module (or module attribute) it was imported as, anywhere in the file."""
    tree = _parse(path)
    table: dict[str, str] = {}
    if tree is None:
        return table
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    table[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    table[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                table[a.asname or a.name] = f"{node.module}.{a.name}"
    return table


def _statement_at(tree: ast.Module, line: int) -> tuple[ast.stmt | None, list[ast.AST], bool]:
    """The innermost statement covering ``line``, the expressions to inspect, and whether the
    line is a branch header (`if`/`while`), where a tensor makes a data-dependent jump."""
    best: ast.stmt | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if (
                best is None
                or (node.end_lineno or 0) - node.lineno <= (best.end_lineno or 0) - best.lineno
            ):
                best = node
    if best is None:
        return None, [], False
    header: list[ast.AST] = []
    is_branch = False
    if isinstance(best, (ast.If, ast.While)):
        header, is_branch = [best.test], True
    elif isinstance(best, (ast.For, ast.AsyncFor)):
        header = [best.iter]
    elif isinstance(best, (ast.With, ast.AsyncWith)):
        header = [item.context_expr for item in best.items]
    elif isinstance(best, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Try)):
        header = []
    else:
        header = [best]
    return best, header, is_branch


def _dotted(node: ast.AST) -> str:
    """`np.interp` for Attribute(Name), `.item` when the base is not a plain name chain."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base and not base.startswith(".") else f".{node.attr}"
    return ""


def _is_extension(module: str) -> bool:
    """Whether ``module`` (or its longest importable prefix) is a compiled extension."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            continue  # `name` is an attribute, not a module: try the shorter prefix
        if spec is not None:
            origin = spec.origin or ""
            return any(origin.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES)
    return False


def _enclosing_function(tree: ast.Module, line: int) -> ast.AST | None:
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                if best is None or node.lineno >= best.lineno:
                    best = node
    return best


def _source_segment(path: str, node: ast.AST) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            text = ast.get_source_segment(fh.read(), node)
    except OSError:
        text = None
    return (text or "").strip()


def classify_source(path: str, line: int) -> Classification | None:
    """Classify the break at ``path:line`` from the code there; None when the code says nothing."""
    tree = _parse(path)
    if tree is None:
        return None
    stmt, exprs, is_branch = _statement_at(tree, line)
    if stmt is None:
        return None
    if isinstance(stmt, ast.Assert):
        return Classification("tensor-assert", _source_segment(path, stmt.test) or "cond")
    nodes = [n for e in exprs for n in ast.walk(e)]
    calls = [(n, _dotted(n.func)) for n in nodes if isinstance(n, ast.Call)]
    imports = _imports(path)

    for call, name in calls:
        root, _, _ = name.partition(".")
        last = name.rsplit(".", 1)[-1]
        resolved = imports.get(root, "")
        if name == "print" or resolved.split(".")[0] in ("logging", "warnings"):
            return Classification("print-logging", _source_segment(path, call) or name)
        if root in _LOG_ROOTS or (last in _LOG_METHODS and "log" in name.lower()):
            return Classification("print-logging", _source_segment(path, call) or name)
    for _call, name in calls:
        if name.endswith("_dynamo.graph_break") or name == "graph_break":
            return Classification("explicit", name)
    for call, name in calls:
        if "." in name and name.rsplit(".", 1)[-1] in _SCALAR_METHODS:
            return Classification("tensor-to-scalar", _source_segment(path, call) or name)
    for call, name in calls:
        root = name.split(".")[0]
        if not root or root not in imports:
            continue
        target = imports[root] + name[len(root) :]
        top = target.split(".")[0]
        if top in _TORCH_FAMILY:
            if target.startswith("torch.ops.") and target.split(".")[2] not in ("aten", "prims"):
                return Classification("custom-op", name)
            continue
        if _is_extension(target):
            return Classification("custom-op", f"{name} (a compiled extension)")
        return Classification("third-party-call", _source_segment(path, call) or name)
    for _call, name in calls:
        if name.endswith(".apply") and name.split(".")[0] not in ("self",):
            return Classification("custom-op", f"{name.rsplit('.', 1)[0]} (autograd.Function)")
    for _call, name in calls:
        if name in ("getattr", "setattr", "hasattr", "delattr"):
            return Classification("python-construct", _CONSTRUCT_FIXES.get(name, name))
    fn = _enclosing_function(tree, line)
    has_gen = any(isinstance(n, (ast.GeneratorExp, ast.Yield, ast.YieldFrom)) for n in nodes)
    if has_gen or (
        fn is not None and any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(fn))
    ):
        return Classification("python-construct", _CONSTRUCT_FIXES["generator"])
    if is_branch or any(isinstance(n, (ast.IfExp, ast.BoolOp)) for n in nodes):
        test = (
            exprs[0]
            if is_branch
            else next(n for n in nodes if isinstance(n, (ast.IfExp, ast.BoolOp)))
        )
        if isinstance(test, ast.IfExp):
            test = test.test
        return Classification("data-dependent-branch", _source_segment(path, test) or "cond")
    for call, name in calls:
        if name in _SCALAR_BUILTINS:
            return Classification("tensor-to-scalar", _source_segment(path, call) or name)
    return None


# Used only when the source cannot decide: keyword -> category, checked in order.
_REASON_KEYWORDS = (
    ("item()", "tensor-to-scalar"),
    ("capture_scalar_outputs", "tensor-to-scalar"),
    ("tolist", "tensor-to-scalar"),
    ("graph_break()", "explicit"),
    ("numpy", "third-party-call"),
    ("print", "print-logging"),
    ("logging", "print-logging"),
    ("autograd.Function", "custom-op"),
    ("custom op", "custom-op"),
    ("fake tensor", "custom-op"),
    ("Data-dependent", "data-dependent-branch"),
    ("data dependent", "data-dependent-branch"),
    ("generic_jump", "data-dependent-branch"),
    ("generator", "python-construct"),
    ("builtin", "python-construct"),
    ("getattr", "python-construct"),
)


def classify(path: str | None, line: int | None, reason: str, hints: list[str]) -> Classification:
    """Category and fix for one break: from the source first, from the reason as a fallback."""
    if path and line:
        found = classify_source(path, line)
        if found is not None:
            return found
    lowered = reason.lower()
    for keyword, key in _REASON_KEYWORDS:
        if keyword.lower() in lowered:
            detail = {
                "python-construct": "Rewrite the construct Dynamo names in the reason with "
                "plain tensor code or move it out of the compiled region.",
            }.get(key, "the value")
            return Classification(key, detail)
    hint = hints[0] if hints else "Read Dynamo's reason and the linked documentation."
    return Classification("other", hint)
