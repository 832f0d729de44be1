"""A parsed copy of one source file and text edits located by the AST's line/column spans.

Edits replace exact spans of the original text (ast gives 1-based lines and UTF-8 byte columns),
so everything outside the touched spans keeps its formatting byte for byte."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Edit:
    """Replace the text from (line, col) to (end_line, end_col) with ``text``; lines 1-based,
    columns as UTF-8 byte offsets (what ast reports)."""

    line: int
    col: int
    end_line: int
    end_col: int
    text: str

    def overlaps(self, other: Edit) -> bool:
        return (self.line, self.col) < (other.end_line, other.end_col) and (
            other.line,
            other.col,
        ) < (self.end_line, self.end_col)


@dataclass
class SourceFile:
    path: str
    text: str
    tree: ast.Module
    parents: dict[int, ast.AST] = field(default_factory=dict)

    @classmethod
    def parse(cls, path: str, text: str) -> SourceFile:
        tree = ast.parse(text, filename=path)
        parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
        return cls(path, text, tree, parents)

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines(keepends=True)

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def segment(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ""

    def indent_of(self, node: ast.stmt) -> str:
        line = self.lines[node.lineno - 1]
        return line[: len(line) - len(line.lstrip())]

    def module_name_for(self, module: str) -> str | None:
        """The local name a module-level `import module [as name]` binds, or None."""
        for node in self.tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == module:
                        return alias.asname or module
        return None

    def statement_at(self, line: int) -> ast.stmt | None:
        """The innermost statement whose span covers ``line`` (a compound statement's header
        line counts as the compound statement)."""
        best: ast.stmt | None = None
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.stmt):
                continue
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end:
                body_start = _body_start(node)
                if body_start is not None and line >= body_start:
                    continue  # the line is inside the body: an inner statement holds it
                if best is None or node.lineno >= best.lineno:
                    best = node
        return best

    def function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        cur = self.parent(node)
        while cur is not None and not isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef)):
            cur = self.parent(cur)
        return cur

    def is_module_level(self, fn: ast.AST) -> bool:
        return self.parent(fn) is self.tree

    def apply(self, edits: list[Edit]) -> str:
        """The text with every edit applied (edits must not overlap)."""
        raw = [ln.encode("utf-8") for ln in self.lines]
        starts = [0]
        for ln in raw:
            starts.append(starts[-1] + len(ln))
        data = self.text.encode("utf-8")

        def offset(line: int, col: int) -> int:
            return starts[line - 1] + col

        out = data
        for e in sorted(edits, key=lambda e: (e.line, e.col), reverse=True):
            a, b = offset(e.line, e.col), offset(e.end_line, e.end_col)
            out = out[:a] + e.text.encode("utf-8") + out[b:]
        return out.decode("utf-8")


def _body_start(node: ast.stmt) -> int | None:
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
        return body[0].lineno
    return None


def node_edit(node: ast.AST, text: str) -> Edit:
    return Edit(node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, text)


def statement_edit(src: SourceFile, stmt: ast.stmt, new_lines: list[str]) -> Edit:
    """Replace the whole lines of ``stmt`` with ``new_lines`` (each without its newline, the
    indentation included); the line ending of the last line is kept."""
    last = src.lines[(stmt.end_lineno or stmt.lineno) - 1]
    ending = last[len(last.rstrip("\r\n")) :]
    end_col = len(last.rstrip("\r\n").encode("utf-8"))
    return Edit(stmt.lineno, 0, stmt.end_lineno or stmt.lineno, end_col, _join(new_lines, ending))


def _join(lines: list[str], ending: str) -> str:
    nl = ending or "\n"
    return nl.join(lines)


def statement_text(src: SourceFile, stmt: ast.stmt) -> list[str]:
    """The whole lines of ``stmt``, without line endings."""
    lines = src.lines[stmt.lineno - 1 : stmt.end_lineno or stmt.lineno]
    return [ln.rstrip("\r\n") for ln in lines]


def spans_multiline_string(stmt: ast.stmt) -> bool:
    """Whether a string literal inside ``stmt`` spans lines (re-indenting would change it)."""
    for node in ast.walk(stmt):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and isinstance(
            getattr(node, "value", ""), (str, list)
        ):
            if (node.end_lineno or node.lineno) > node.lineno:
                return True
    return False
