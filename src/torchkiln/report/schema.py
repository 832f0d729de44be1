"""The JSON Schemas of kiln's result files, and a validator that resolves their references."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SCHEMAS = {"torchkiln.bench/1": "bench.schema.json", "torchkiln.tune/1": "tune.schema.json"}


def load(name: str) -> dict[str, Any]:
    return json.loads((HERE / SCHEMAS[name]).read_text())


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``doc`` does not match its own `schema` key."""
    import jsonschema
    from referencing import Registry, Resource

    schemas = [load(n) for n in SCHEMAS]
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas)
    schema = load(doc["schema"])
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)
