"""The rich console kiln prints through. On a terminal rich fits its width; piped or captured
(CI logs, `| tee`), rich would fold every line at 80 columns mid-phrase, so there lines are
not wrapped (tables take their natural width) unless COLUMNS says otherwise."""

from __future__ import annotations

import os
from typing import Any

UNWRAPPED_WIDTH = 1000


def make_console(stderr: bool = False, **kwargs: Any) -> Any:
    from rich.console import Console

    console = Console(stderr=stderr, **kwargs)
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True, **kwargs)
