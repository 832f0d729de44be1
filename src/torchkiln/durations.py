"""Durations as users write them (`--budget 15m`), parsed in one place for the CLI and the API."""

from __future__ import annotations

import re

from torchkiln.errors import KilnUserError


def parse_budget(text: str | float | int) -> float:
    """'15m', '90s', '1h', '1h30m' or a number of seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    parts = re.fullmatch(
        r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text
    )
    if not text.strip() or parts is None or not any(parts.groups()):
        raise KilnUserError(f"budget {text!r}: write it like 15m, 90s, 1h30m or 600")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    return h * 3600 + m * 60 + s
