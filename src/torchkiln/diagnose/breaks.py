"""Collect graph breaks from Dynamo while it runs, and turn each into a located, explained record.

Two sources, merged by location:
- the `graph_breaks` log records: one per break, including breaks before which Dynamo captured no
  op (those compile no graph, so `torch._dynamo.explain` never sees them). The message starts with
  "Graph break ... in user code at FILE:LINE", a string PyTorch's own tests pin.
- each compiled graph's `compile_subgraph_reason` (what `explain` reads), with the user stack as
  FrameSummary objects: a fallback if a torch version words the log differently.
"""

from __future__ import annotations

import json
import linecache
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from torchkiln.diagnose.categories import classify

_LOCATION = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)\s*$", re.M)
_FRAME = re.compile(r'^\s*File "(?P<file>.+?)", line (?P<line>\d+), in (?P<func>.+?)\s*$', re.M)
_DOC_URL = re.compile(r"(?P<url>https?://\S+?/gb/gb(?P<id>\d+)\.html)")
# Prefix Dynamo adds before the real reason when a break interrupts an instruction.
_WRAPPER = re.compile(r"^Encountered graph break when attempting to trace [^\n]*\n+", re.S)
# The worker's own frames (kiln's built-in workloads elsewhere in the package are user code).
_DIAGNOSE_DIR = os.path.dirname(os.path.abspath(__file__))


@lru_cache(maxsize=1)
def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__))


def is_user_frame(path: str) -> bool:
    """Frames in torch or in the explain worker are not where a user can fix anything."""
    if not path or path.startswith("<"):
        return False
    full = os.path.abspath(path)
    return not (full.startswith(_torch_dir() + os.sep) or full.startswith(_DIAGNOSE_DIR + os.sep))


@dataclass
class Frame:
    file: str
    line: int
    function: str


@dataclass
class GraphBreak:
    file: str | None
    line: int | None
    function: str
    source: str
    reason: str
    gb_type: str
    gb_id: str | None
    doc_url: str | None
    hints: list[str]
    category: str = "other"
    category_title: str = ""
    fix: str = ""
    count: int = 1
    stack: list[Frame] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@lru_cache(maxsize=1)
def _registry() -> dict[str, str]:
    """gb_type -> "GBnnnn" from the registry torch ships (2.8+), for reasons without a link."""
    import torch._dynamo

    path = os.path.join(os.path.dirname(torch._dynamo.__file__), "graph_break_registry.json")
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return {}
    table: dict[str, str] = {}
    for gb_id, entries in raw.items():
        for entry in entries if isinstance(entries, list) else [entries]:
            if isinstance(entry, dict) and entry.get("Gb_type"):
                table.setdefault(entry["Gb_type"], gb_id)
    return table


def split_reason(text: str) -> tuple[str, str, list[str], str | None, str | None]:
    """(clean reason, gb_type, hints, gb_id, doc_url) from one Dynamo reason string."""
    reason = _WRAPPER.sub("", text.strip()).strip()
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    gb_type = lines[0] if lines else reason
    hints = [ln[len("Hint:") :].strip() for ln in lines if ln.startswith("Hint:")]
    gb_id = doc_url = None
    if m := _DOC_URL.search(reason):
        doc_url, gb_id = m.group("url"), f"GB{m.group('id')}"
    elif gb_type in _registry():
        gb_id = _registry()[gb_type]
        num = gb_id[2:]
        doc_url = f"https://meta-pytorch.github.io/compile-graph-break-site/gb/gb{num}.html"
    # Keep the reason readable: drop the developer context and the link (reported separately).
    keep = [
        ln
        for ln in lines
        if not ln.startswith(("Developer debug context", "For more details about this graph"))
    ]
    return "\n".join(keep), gb_type, hints, gb_id, doc_url


def parse_log_message(message: str) -> GraphBreak | None:
    """One `graph_breaks` log message -> a GraphBreak, or None if it is not a break record."""
    loc = _LOCATION.search(message.split("\n", 1)[0])
    if loc is None:
        return None
    head, _, trace = message.partition("User code traceback:")
    reason_text = head.split("Graph Break Reason:", 1)[1] if "Graph Break Reason:" in head else ""
    # The suppressed-duplicate form carries no traceback; its reason is the rest of the message.
    reason, gb_type, hints, gb_id, doc_url = split_reason(reason_text)
    stack = [
        Frame(m.group("file"), int(m.group("line")), m.group("func"))
        for m in _FRAME.finditer(trace)
    ]
    if not stack:
        stack = [Frame(loc.group("file"), int(loc.group("line")), "?")]
    return _finish(stack, reason, gb_type, hints, gb_id, doc_url)


def from_compile_reason(reason_obj: Any) -> GraphBreak | None:
    """A graph's `compile_subgraph_reason` (GraphCompileReason) -> a GraphBreak."""
    if not getattr(reason_obj, "graph_break", False):
        return None
    stack = [
        Frame(fs.filename, int(fs.lineno or 0), fs.name)
        for fs in getattr(reason_obj, "user_stack", []) or []
    ]
    reason, gb_type, hints, gb_id, doc_url = split_reason(str(reason_obj.reason))
    return _finish(stack, reason, gb_type, hints, gb_id, doc_url)


def _finish(
    stack: list[Frame],
    reason: str,
    gb_type: str,
    hints: list[str],
    gb_id: str | None,
    doc_url: str | None,
) -> GraphBreak:
    user = [f for f in stack if is_user_frame(f.file)]
    where = user[-1] if user else (stack[-1] if stack else None)
    source = linecache.getline(where.file, where.line).strip() if where else ""
    found = classify(where.file if where else None, where.line if where else None, reason, hints)
    return GraphBreak(
        file=where.file if where else None,
        line=where.line if where else None,
        function=where.function if where else "?",
        source=source,
        reason=reason,
        gb_type=gb_type,
        gb_id=gb_id,
        doc_url=doc_url,
        hints=hints,
        category=found.category,
        category_title=found.title,
        fix=found.fix,
        stack=user or stack,
    )


class BreakCollector(logging.Handler):
    """A logging handler that keeps Dynamo's graph-break records and recompile-limit warnings."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []
        self.limit_warnings: list[str] = []
        self.cudagraph_skips: list[str] = []
        self._attached: list[logging.Logger] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except (TypeError, ValueError) as exc:  # a malformed record must not break the run
            msg = f"<unformattable log record {record.msg!r}: {exc}>"
        if "in user code at" in msg.split("\n", 1)[0]:
            self.messages.append(msg)
        elif "hit config." in msg:  # "torch._dynamo hit config.recompile_limit (8)"
            self.limit_warnings.append(msg)
        elif "skipping cudagraphs" in msg:
            self.cudagraph_skips.append(msg)

    def attach(self) -> None:
        """Enable the artifacts and listen on Dynamo's and Inductor's top loggers.

        torch's registered loggers do not propagate to the root, and `set_logs` clears their
        handlers, so this attaches after enabling."""
        import inspect

        import torch._logging

        wanted = {"graph_breaks": True, "cudagraphs": True}
        accepted = inspect.signature(torch._logging.set_logs).parameters
        torch._logging.set_logs(**{k: v for k, v in wanted.items() if k in accepted})
        for name in ("torch._dynamo", "torch._inductor"):
            logger = logging.getLogger(name)
            logger.addHandler(self)
            self._attached.append(logger)

    def detach(self) -> None:
        for logger in self._attached:
            logger.removeHandler(self)
        self._attached.clear()

    def breaks(self, compile_reasons: list[Any]) -> list[GraphBreak]:
        """Every distinct break (by location and type), with how many times it was hit."""
        merged: dict[tuple[Any, ...], GraphBreak] = {}
        for gb in filter(None, (parse_log_message(m) for m in self.messages)):
            key = (gb.file, gb.line, gb.gb_type)
            if key in merged:
                merged[key].count += 1
            else:
                merged[key] = gb
        seen_lines = {(gb.file, gb.line) for gb in merged.values()}
        for obj in compile_reasons:
            gb = from_compile_reason(obj)
            if gb is not None and (gb.file, gb.line) not in seen_lines:
                seen_lines.add((gb.file, gb.line))
                merged[(gb.file, gb.line, gb.gb_type)] = gb
        return sorted(merged.values(), key=lambda b: (b.file or "", b.line or 0))
