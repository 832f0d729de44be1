"""The `fix=` policy of a variant spec: `+fix=code:all`, `+fix=config:capture_scalar_outputs`,
`+fix=all`. Validated against the registries of rewrites and configuration remedies."""

from __future__ import annotations

from torchkiln.errors import KilnUserError

PREFIX = "fix="


def choices() -> list[str]:
    from torchkiln.repair.config import CONFIG_REMEDIES
    from torchkiln.repair.rewrites import REWRITES

    return (
        ["all", "code:all", "config:all"]
        + [f"code:{n}" for n in REWRITES]
        + [f"config:{n}" for n in CONFIG_REMEDIES]
    )


def parse_fix(policy: str) -> str:
    """``fix=<token>`` -> the token; a token that names no remedy lists the choices."""
    token = policy[len(PREFIX) :]
    if token not in choices():
        raise KilnUserError(f"unknown remedy {policy!r}; choose from fix={{{','.join(choices())}}}")
    return token


def canonical(tokens: list[str]) -> tuple[str, ...]:
    code = [t for t in tokens if t.startswith("code:") or t == "all"]
    if len(code) > 1:
        raise KilnUserError(f"fix={code[0]} and fix={code[1]}: a variant loads one rewritten copy")
    return tuple(sorted(set(tokens)))


def changes_code(tokens: tuple[str, ...]) -> bool:
    return any(t == "all" or t.startswith("code:") for t in tokens)
