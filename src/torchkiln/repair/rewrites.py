"""Source rewrites for the graph breaks explain finds, one function per pattern.

Each takes the parsed file and the statement at a break and returns the edits (exact spans of
that statement only) or the reason it cannot rewrite the pattern safely. The one-sentence
`behaviour` of each says what the rewrite changes in what the code does."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass

from torchkiln.repair.source import (
    Edit,
    SourceFile,
    node_edit,
    spans_multiline_string,
    statement_edit,
    statement_text,
)


@dataclass(frozen=True)
class Rewrite:
    name: str
    title: str
    categories: tuple[str, ...]  # the explain categories it answers
    behaviour: str
    fn: Callable[[SourceFile, ast.stmt, dict], list[Edit] | str]


class CannotRewrite(Exception):
    pass


def _torch(src: SourceFile) -> str:
    name = src.module_name_for("torch")
    if name is None:
        raise CannotRewrite("the file does not `import torch` at module level")
    return name


_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult)
_LOG_ROOTS = {"logging", "logger", "log", "_logger", "_log", "LOGGER", "LOG"}
_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _quote(text: str) -> str:
    """A double-quoted Python string literal (what most code style uses)."""
    return json.dumps(text)


def _message(src: SourceFile, exc: ast.AST | None, default: str) -> str:
    """A constant string message of a raise or an assert, else ``default``."""
    if isinstance(exc, ast.Call) and exc.args:
        exc = exc.args[0]
    if isinstance(exc, ast.Constant) and isinstance(exc.value, str):
        return exc.value
    return default


# --- a data-dependent `if <tensor>: raise` guard ---------------------------------------------
def rewrite_guard(src: SourceFile, stmt: ast.stmt, brk: dict) -> list[Edit] | str:
    if not isinstance(stmt, ast.If) or stmt.orelse:
        return "not an `if` without `else`"
    if not all(isinstance(s, ast.Raise) for s in stmt.body):
        return "the `if` body does more than raise"
    torch = _torch(src)
    cond = src.segment(stmt.test)
    msg = _message(src, stmt.body[0].exc, f"check failed: {cond}")
    line = f"{src.indent_of(stmt)}{torch}._assert_async({torch}.logical_not({cond}), {_quote(msg)})"
    return [statement_edit(src, stmt, [line])]


# --- `.item()` used in arithmetic -------------------------------------------------------------
def rewrite_item(src: SourceFile, stmt: ast.stmt, brk: dict) -> list[Edit] | str:
    calls = [
        n
        for n in ast.walk(stmt)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "item"
        and not n.args
        and not n.keywords
    ]
    if not calls:
        return "no `.item()` call in the statement"
    edits = []
    for call in calls:
        parent = src.parent(call)
        if not (isinstance(parent, ast.BinOp) and isinstance(parent.op, _ARITH)):
            where = type(parent).__name__ if parent is not None else "statement"
            return (
                f"`{src.segment(call)}` is used as a Python number ({where}), not as an "
                "operand of arithmetic: keeping the tensor could change its meaning"
            )
        edits.append(node_edit(call, src.segment(call.func.value)))
    return edits


# --- print / logging in forward ---------------------------------------------------------------
def _is_log_call(src: SourceFile, call: ast.Call) -> bool:
    name = _dotted(call.func)
    root, _, _ = name.partition(".")
    last = name.rsplit(".", 1)[-1]
    if name == "print" or root in ("logging", "warnings") or root in _LOG_ROOTS:
        return True
    return last in _LOG_METHODS and "log" in name.lower()


def rewrite_logging(src: SourceFile, stmt: ast.stmt, brk: dict) -> list[Edit] | str:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return "the print or log call is part of a larger statement"
    if not _is_log_call(src, stmt.value):
        return "the statement is not a print or logging call"
    if spans_multiline_string(stmt):
        return "the call holds a multi-line string literal (re-indenting would change it)"
    torch = _torch(src)
    indent = src.indent_of(stmt)
    body = [f"    {ln}" if ln.strip() else ln for ln in statement_text(src, stmt)]
    return [statement_edit(src, stmt, [f"{indent}if not {torch}.compiler.is_compiling():", *body])]


# --- a Python branch on a tensor -> torch.where -------------------------------------------------
def _single_assign(body: list[ast.stmt]) -> tuple[str, ast.expr] | None:
    if len(body) != 1 or not isinstance(body[0], ast.Assign) or len(body[0].targets) != 1:
        return None
    target = body[0].targets[0]
    return (target.id, body[0].value) if isinstance(target, ast.Name) else None


def rewrite_where(src: SourceFile, stmt: ast.stmt, brk: dict) -> list[Edit] | str:
    torch = _torch(src)
    if isinstance(stmt, ast.If):
        then = _single_assign(stmt.body)
        if then is None:
            return (
                "the branch does more than assign one name: torch.cond could express it, "
                "not rewritten automatically"
            )
        name, a = then
        if stmt.orelse:
            other = _single_assign(stmt.orelse)
            if other is None or other[0] != name:
                return "the `else` branch does not assign the same single name"
            b = src.segment(other[1])
        else:
            b = name
        cond, a_text = src.segment(stmt.test), src.segment(a)
        line = f"{src.indent_of(stmt)}{name} = {torch}.where({cond}, {a_text}, {b})"
        return [statement_edit(src, stmt, [line])]
    exps = [n for n in ast.walk(stmt) if isinstance(n, ast.IfExp)]
    if len(exps) != 1:
        return "no single `a if cond else b` expression at the break"
    e = exps[0]
    text = f"{torch}.where({src.segment(e.test)}, {src.segment(e.body)}, {src.segment(e.orelse)})"
    return [node_edit(e, text)]


# --- assert on a tensor -> torch._assert_async ------------------------------------------------
def rewrite_assert(src: SourceFile, stmt: ast.stmt, brk: dict) -> list[Edit] | str:
    if not isinstance(stmt, ast.Assert):
        return "not an assert statement"
    if isinstance(stmt.test, ast.BoolOp):
        return "the assert combines conditions with and/or: rewrite each part as a tensor op"
    if stmt.msg is not None and not isinstance(stmt.msg, (ast.Constant, ast.JoinedStr)):
        return "the assert's message is computed by an expression"
    torch = _torch(src)
    cond = src.segment(stmt.test)
    msg = _template(src, stmt.msg) if isinstance(stmt.msg, ast.JoinedStr) else None
    msg = msg or _message(src, stmt.msg, f"assert {cond}")
    line = f"{src.indent_of(stmt)}{torch}._assert_async({torch}.as_tensor({cond}), {_quote(msg)})"
    return [statement_edit(src, stmt, [line])]


def _template(src: SourceFile, node: ast.JoinedStr) -> str:
    """An f-string's text with its fields unevaluated: `f"layer {i}"` -> "layer {i}"."""
    parts = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            parts.append(str(v.value))
        elif isinstance(v, ast.FormattedValue):
            parts.append("{" + src.segment(v.value) + "}")
    return "".join(parts)


# --- a numpy call with a torch equivalent -------------------------------------------------------
def _tensor_of(node: ast.AST) -> ast.AST | None:
    """`E` of `E.numpy()`, `E.cpu().numpy()`, `E.detach().cpu().numpy()`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    if node.func.attr != "numpy" or node.args:
        return None
    inner = node.func.value
    while (
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr in ("cpu", "detach")
        and not inner.args
    ):
        inner = inner.func.value
    return inner


def _numpy_call(src: SourceFile, stmt: ast.stmt) -> tuple[ast.Call, str, ast.AST] | None:
    np_names = {n for n in (src.module_name_for("numpy"),) if n}
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = node.func.value
            if isinstance(base, ast.Name) and base.id in np_names and node.args:
                tensor = _tensor_of(node.args[0])
                if tensor is not None:
                    return node, node.func.attr, tensor
    return None


# numpy function -> how to write it in torch: (template, what changes). `{x}` is the tensor,
# `{a1}` the next positional argument, `{t}` the torch module's local name.
NUMPY_TO_TORCH = {
    "digitize": "{t}.bucketize({x}, {t}.as_tensor({a1}, dtype={x}.dtype, device={x}.device), "
    "right=True)",
    "searchsorted": None,  # (sorted, values): the tensor is the values, not the first argument
    "clip": "{t}.clamp({x}, {a1}, {a2})",
    "tanh": "{t}.tanh({x})",
    "exp": "{t}.exp({x})",
    "log": "{t}.log({x})",
    "sqrt": "{t}.sqrt({x})",
    "abs": "{t}.abs({x})",
}
_FROM_NUMPY = {"from_numpy", "as_tensor", "tensor", "asarray"}


def rewrite_numpy(src: SourceFile, stmt: ast.stmt, brk: dict) -> list[Edit] | str:
    found = _numpy_call(src, stmt)
    if found is None:
        return "no numpy call on a tensor's `.numpy()` at the break"
    call, fname, tensor = found
    template = NUMPY_TO_TORCH.get(fname)
    if template is None:
        return f"no torch equivalent known for numpy.{fname}"
    if call.keywords:
        return f"numpy.{fname} is called with keyword arguments"
    extra = [src.segment(a) for a in call.args[1:]]
    need = template.count("{a")
    if len(extra) != need:
        return f"numpy.{fname} is called with {len(extra)} extra arguments, not {need}"
    torch = _torch(src)
    text = template.format(
        t=torch, x=src.segment(tensor), **{f"a{i + 1}": a for i, a in enumerate(extra)}
    )
    wrapper = src.parent(call)
    if (
        isinstance(wrapper, ast.Call)
        and _dotted(wrapper.func).rsplit(".", 1)[-1] in _FROM_NUMPY
        and _dotted(wrapper.func).split(".")[0] == torch
        and len(wrapper.args) == 1
        and not wrapper.keywords
    ):
        return [node_edit(wrapper, text)]
    return "the numpy result is used as an array, not turned back into a tensor at once"


# --- an untraceable helper -> torch.library.custom_op ------------------------------------------
def _is_tensor_annotation(node: ast.AST | None) -> bool:
    return node is not None and _dotted(node).rsplit(".", 1)[-1] == "Tensor"


def rewrite_custom_op(src: SourceFile, stmt: ast.stmt, brk: dict) -> list[Edit] | str:
    fn = src.function_of(stmt)
    if fn is None or not src.is_module_level(fn):
        return "the break is not inside a module-level function"
    if fn.decorator_list:
        return f"`{fn.name}` already has decorators"
    args = fn.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or not args.args:
        return f"`{fn.name}` takes *args, **kwargs, keyword-only or no arguments"
    if not all(_is_tensor_annotation(a.annotation) for a in args.args):
        return f"`{fn.name}`'s arguments are not all annotated as torch.Tensor"
    if not _is_tensor_annotation(fn.returns):
        return f"`{fn.name}` is not annotated to return a torch.Tensor"
    torch = _torch(src)
    stem = src.path.rsplit("/", 1)[-1].removesuffix(".py").replace("-", "_")
    indent = src.indent_of(fn)
    first = args.args[0].arg
    deco = f'{indent}@{torch}.library.custom_op("kiln_{stem}::{fn.name}", mutates_args=())'
    header = src.lines[fn.lineno - 1].rstrip("\r\n")
    last = src.lines[(fn.end_lineno or fn.lineno) - 1].rstrip("\r\n")
    fake = [
        "",
        "",
        f"{indent}@{fn.name}.register_fake",
        f"{indent}def _{fn.name}_fake(*args, **kwargs):",
        f"{indent}    return {torch}.empty_like(args[0])  # the output is shaped like `{first}`",
    ]
    end_col = len(last.encode("utf-8"))
    return [
        Edit(fn.lineno, 0, fn.lineno, len(header.encode("utf-8")), f"{deco}\n{header}"),
        Edit(fn.end_lineno or fn.lineno, 0, fn.end_lineno or fn.lineno, end_col,
             "\n".join([last, *fake])),
    ]  # fmt: skip


REWRITES: dict[str, Rewrite] = {
    r.name: r
    for r in (
        Rewrite(
            "guard",
            "`if <tensor>: raise` guard -> torch._assert_async",
            ("data-dependent-branch",),
            "the check runs on the device without stopping the host, so a failure surfaces "
            "as an error at the next synchronisation instead of the raise at that line",
            rewrite_guard,
        ),
        Rewrite(
            "item",
            "`.item()` in arithmetic -> the tensor itself",
            ("tensor-to-scalar",),
            "the value stays a 0-dim tensor on the device instead of a Python float (type "
            "promotion keeps the other operand's dtype)",
            rewrite_item,
        ),
        Rewrite(
            "logging",
            "print / logging -> skipped while compiling",
            ("print-logging",),
            "under torch.compile the message is no longer printed or logged from inside the "
            "model; eager runs still print it",
            rewrite_logging,
        ),
        Rewrite(
            "where",
            "Python branch on a tensor -> torch.where",
            ("data-dependent-branch",),
            "both sides of the branch are computed and one is selected on the device (the same "
            "result for a single-element condition)",
            rewrite_where,
        ),
        Rewrite(
            "assert",
            "assert on a tensor -> torch._assert_async",
            ("tensor-assert",),
            "the assertion runs on the device without stopping the host; a failure surfaces "
            "at the next synchronisation with the message's template (f-string fields are not "
            "filled in), and `python -O` no longer removes it",
            rewrite_assert,
        ),
        Rewrite(
            "numpy",
            "numpy call -> its torch equivalent",
            ("third-party-call",),
            "the op runs in torch on the tensor's own device and dtype instead of in numpy on "
            "the host",
            rewrite_numpy,
        ),
        Rewrite(
            "custom_op",
            "untraceable helper -> torch.library.custom_op",
            ("third-party-call", "custom-op", "python-construct", "other"),
            "the helper becomes one opaque op that Dynamo does not trace into; the compiler "
            "assumes its output has its first argument's shape and dtype",
            rewrite_custom_op,
        ),
    )
}


def rewrite_at(src: SourceFile, stmt: ast.stmt, brk: dict) -> tuple[str, list[Edit]] | str:
    """The first rewrite for the break's category that applies: (its name, its edits), or the
    reasons none did."""
    category = brk.get("category", "other")
    why = []
    for rw in REWRITES.values():
        if category not in rw.categories:
            continue
        try:
            got = rw.fn(src, stmt, brk)
        except CannotRewrite as exc:
            got = str(exc)
        if isinstance(got, list):
            return rw.name, got
        why.append(f"{rw.name}: {got}")
    if not why:
        return f"no rewrite for a break of category {category!r}"
    return "; ".join(why)
