"""Errors that are the user's to fix: the CLI prints them without a traceback and exits 2."""

from __future__ import annotations


class KilnUserError(Exception):
    """Bad input: an unknown name, a missing file, a spec that does not parse, no GPU for cuda."""


class UnsupportedVariant(KilnUserError):
    """The variant cannot apply to this model or device; a trial reports `unsupported`."""


class MissingExtraError(KilnUserError):
    """An optional engine is not installed; the message names the extra that brings it."""

    def __init__(self, module: str, extra: str, what: str):
        super().__init__(
            f"{what} needs the '{module}' package, which is not installed. "
            f"Install it with: pip install 'torchkiln[{extra}]'"
        )
        self.module = module
        self.extra = extra


def require(module: str, extra: str, what: str):
    """Import an optional engine, or raise MissingExtraError naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(module, extra, what) from exc
