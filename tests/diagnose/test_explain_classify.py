"""The break classifier and the log parser, without running Dynamo (fast)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchkiln.diagnose.breaks import parse_log_message, split_reason
from torchkiln.diagnose.categories import CATEGORIES, _is_extension, classify, classify_source

FIXTURES = Path(__file__).parent / "fixtures"


def _cases(path: Path) -> list[tuple[int, str]]:
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"# CASE ([\w-]+)", line)
        if m:
            out.append((i, m.group(1)))
    return out


@pytest.mark.parametrize("line,category", _cases(FIXTURES / "constructs.py"))
def test_each_construct_gets_its_category_from_the_source(line: int, category: str) -> None:
    found = classify_source(str(FIXTURES / "constructs.py"), line)
    assert found is not None
    assert found.category == category
    assert found.fix and "{detail}" not in found.fix


def test_every_category_in_the_table_has_a_title_and_fix() -> None:
    for key, cat in CATEGORIES.items():
        assert cat.key == key and cat.title and cat.fix


def test_reason_wording_is_only_a_fallback() -> None:
    # No readable source: the reason decides; a readable source wins over the reason's words.
    assert classify(None, None, "Unsupported Tensor.item() call", []).category == "tensor-to-scalar"
    assert classify(None, None, "something new in torch 2.15", ["do X"]).fix == "do X"
    path = str(FIXTURES / "constructs.py")
    line = _cases(FIXTURES / "constructs.py")[0][0]  # the logger.info line
    assert classify(path, line, "Unsupported Tensor.item() call", []).category == "print-logging"


def test_compiled_extension_detection() -> None:
    assert _is_extension("numpy.random.mtrand")  # a Cython extension in numpy 1.x and 2.x
    assert not _is_extension("numpy")
    assert not _is_extension("no_such_module_kiln.sub")


SAMPLE = """Graph break in user code at {file}:{line}
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call:

Unsupported Tensor.item() call with capture_scalar_outputs=False
  Explanation: Dynamo does not support tracing `Tensor.item()`.
  Hint: Set `torch._dynamo.config.capture_scalar_outputs = True`.

  Developer debug context: call_method TensorVariable() item () {{}}

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0124.html

User code traceback:
  File "/somewhere/torch/nn/modules/module.py", line 1794, in _call_impl
    return forward_call(*args, **kwargs)
  File "{file}", line {line}, in forward
    if x.sum().item() > 0:
"""


def test_log_message_parses_location_reason_id_and_link() -> None:
    path = FIXTURES / "four_breaks.py"
    line = next(
        i for i, t in enumerate(path.read_text().splitlines(), 1) if "BREAK tensor-to-scalar" in t
    )
    gb = parse_log_message(SAMPLE.format(file=path, line=line))
    assert gb is not None
    assert (gb.file, gb.line, gb.function) == (str(path), line, "forward")
    assert gb.gb_type == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert gb.gb_id == "GB0124"
    assert gb.doc_url.endswith("/gb/gb0124.html")
    assert gb.category == "tensor-to-scalar"
    assert "x.sum().item()" in gb.source
    assert "Developer debug context" not in gb.reason


def test_duplicate_form_without_traceback_still_locates_the_break() -> None:
    msg = (
        "Graph break (user stack suppressed due to duplicate graph break) in user code at "
        "/nowhere/model.py:12\nGraph Break Reason: Failed to trace builtin operator"
    )
    gb = parse_log_message(msg)
    assert gb is not None and (gb.file, gb.line) == ("/nowhere/model.py", 12)
    assert gb.category == "python-construct"  # reason fallback: the file does not exist
    assert parse_log_message("Recompiling function forward in x.py:3") is None


def test_reason_without_link_has_no_invented_id() -> None:
    reason, gb_type, hints, gb_id, url = split_reason(
        "Some reason torch never registered\n  Hint: a"
    )
    assert gb_type == "Some reason torch never registered"
    assert hints == ["a"] and gb_id is None and url is None
