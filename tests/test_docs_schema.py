"""docs/schema.md documents every result file kiln writes, by the schema name the file carries,
and every top-level key of a tune's results.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "schema.md").read_text()


def _written_schema_names() -> set[str]:
    names = set()
    for path in (ROOT / "src" / "torchkiln").rglob("*.py"):
        names |= set(re.findall(r'"((?:torchkiln|kiln)\.[a-z_]+/\d+)"', path.read_text()))
    return names


def test_every_schema_name_kiln_writes_is_in_the_names_table():
    names = _written_schema_names()
    assert {"torchkiln.tune/1", "kiln.doctor/1"} <= names
    table = DOC.split("## Schema names", 1)[1].split("\n## ", 1)[0]
    assert {n for n in names if f"| `{n}` |" not in table} == set()


def test_the_tune_results_have_their_own_section_with_every_top_level_key():
    section = DOC.split("## `torchkiln.tune/1`", 1)[1].split("\n## ", 1)[0]
    schema = json.loads((ROOT / "src/torchkiln/report/tune.schema.json").read_text())
    keys = set(schema["required"]) | set(schema["properties"]) | {"baseline_drift"}
    missing = {k for k in keys - {"schema"} if f"`{k}" not in section}
    assert missing == set()
    stages = schema["properties"]["stages"]["required"]
    assert all(f"`stages.{s}`" in section for s in stages)
