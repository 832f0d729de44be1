"""Rewrite a copy of the user's files: locate each break's statement, apply the rewrites, write
the copy into the run directory and the unified diff that turns the original into it.

The user's files are only read. A file that vanished or cannot be read is a user error (one
line, exit 2); a break whose line no longer holds the code explain saw is skipped."""

from __future__ import annotations

import difflib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.repair.rewrites import REWRITES, rewrite_at
from torchkiln.repair.source import Edit, SourceFile

# Directories never copied: environments, caches, version control.
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "venv", ".venv", "build", "dist"}
MAX_COPIED_FILES = 2000


@dataclass
class Applied:
    rewrite: str
    file: str  # relative to the diff root
    line: int
    source: str
    behaviour: str


@dataclass
class Skipped:
    file: str | None
    line: int | None
    category: str
    reason: str


@dataclass
class RewriteSet:
    """What one set of rewrites did: the new texts by absolute path, applied, skipped."""

    texts: dict[str, str] = field(default_factory=dict)
    originals: dict[str, str] = field(default_factory=dict)
    applied: list[Applied] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "applied": [asdict(a) for a in self.applied],
            "skipped": [asdict(s) for s in self.skipped],
            "files": sorted(self.texts),
        }


def git_root(path: Path) -> Path | None:
    for parent in [path, *path.parents]:
        if (parent / ".git").exists():
            return parent
    return None


def diff_root(entry: Path) -> Path:
    """Where the patch's paths start: the git root holding the workload file, else its dir."""
    entry = entry.resolve()
    return git_root(entry.parent) or entry.parent


def read_source(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise KilnUserError(
            f"{path}: the file vanished after explain ran; nothing rewritten"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise KilnUserError(
            f"{path}: cannot be read ({type(exc).__name__}): nothing rewritten"
        ) from exc


def _rel(path: str, root: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), root)).as_posix()


def rewrite(
    breaks: list[dict[str, Any]], copy_root: Path, root: Path, only: str = "all"
) -> RewriteSet:
    """Apply the rewrites (``only``: one rewrite's name, or all) at ``breaks`` to the files
    under ``copy_root``, in memory."""
    out = RewriteSet()
    edits: dict[str, list[Edit]] = {}
    sources: dict[str, SourceFile] = {}
    for brk in breaks:
        path, line, cat = brk.get("file"), brk.get("line"), brk.get("category", "other")
        if not path or not line:
            out.skipped.append(Skipped(path, line, cat, "the break has no user source line"))
            continue
        full = str(Path(path).resolve())
        if not full.startswith(str(copy_root.resolve()) + os.sep):
            why = f"outside the workload's directory {copy_root}"
            out.skipped.append(Skipped(path, line, cat, why))
            continue
        if full not in sources:
            text = read_source(full)
            try:
                sources[full] = SourceFile.parse(full, text)
            except SyntaxError as exc:
                raise KilnUserError(
                    f"{path}: does not parse ({exc.msg}); nothing rewritten"
                ) from exc
            out.originals[full] = text
        src = sources[full]
        rel = _rel(full, root)
        seen = (brk.get("source") or "").strip()
        lines = src.lines
        now = lines[line - 1].strip() if line <= len(lines) else ""
        if seen and now != seen:
            out.skipped.append(Skipped(rel, line, cat, "the line changed since explain ran"))
            continue
        stmt = src.statement_at(line)
        if stmt is None:
            out.skipped.append(Skipped(rel, line, cat, "no statement at that line"))
            continue
        got = rewrite_at(src, stmt, brk) if only == "all" else _one(only, src, stmt, brk)
        if isinstance(got, str):
            out.skipped.append(Skipped(rel, line, cat, got))
            continue
        name, new = got
        mine = edits.setdefault(full, [])
        if all(e in mine for e in new):
            continue  # a second break at a statement already rewritten
        if any(e.overlaps(m) for e in new for m in mine):
            out.skipped.append(Skipped(rel, line, cat, "overlaps another rewrite at that code"))
            continue
        mine.extend(new)
        out.applied.append(Applied(name, rel, line, now, REWRITES[name].behaviour))
    for full, file_edits in edits.items():
        if file_edits:
            out.texts[full] = sources[full].apply(file_edits)
    return out


def _one(name: str, src: SourceFile, stmt: Any, brk: dict[str, Any]) -> tuple[str, list] | str:
    from torchkiln.repair.rewrites import CannotRewrite

    rw = REWRITES[name]
    if brk.get("category") not in rw.categories:
        return f"{name} does not answer a break of category {brk.get('category')!r}"
    try:
        got = rw.fn(src, stmt, brk)
    except CannotRewrite as exc:
        return f"{name}: {exc}"
    return (name, got) if isinstance(got, list) else f"{name}: {got}"


def unified_diff(rs: RewriteSet, root: Path) -> str:
    """A patch for `patch -p1` / `git apply` in ``root``: a/<rel> and b/<rel> headers."""
    chunks = []
    for full in sorted(rs.texts):
        rel = _rel(full, root)
        old, new = rs.originals[full], rs.texts[full]
        lines = list(
            difflib.unified_diff(
                _lines(old), _lines(new), fromfile=f"a/{rel}", tofile=f"b/{rel}", n=3
            )
        )
        if lines:
            chunks.append(f"diff --git a/{rel} b/{rel}\n" + "".join(lines))
    return "".join(chunks)


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def write_copy(rs: RewriteSet, copy_root: Path, dest: Path) -> Path:
    """Copy the .py files under ``copy_root`` into ``dest`` (rewritten ones with their new
    text); returns ``dest``. Other files are left out: the copy is for importing."""
    copy_root = copy_root.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    for dirpath, dirnames, filenames in os.walk(copy_root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS]
        for fname in filenames:
            if not fname.endswith(".py"):
                continue
            count += 1
            if count > MAX_COPIED_FILES:
                raise KilnUserError(
                    f"{copy_root} holds more than {MAX_COPIED_FILES} Python files: "
                    "put the workload file in its own directory to rewrite it"
                )
            src = Path(dirpath) / fname
            target = dest / src.relative_to(copy_root)
            target.parent.mkdir(parents=True, exist_ok=True)
            text = rs.texts.get(str(src)) or read_source(str(src))
            target.write_text(text, encoding="utf-8")
    return dest
