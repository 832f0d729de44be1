"""The pick's remedies where the pick runs outside a trial: `TuneResult.apply`, a ship directory's
build, and `torchkiln.load` in production.

A remedy of the model's source (a rewrite, shipped as fixes.patch) is the user's to apply to
their code; what runs here is the rest: the Dynamo settings around each compiled call, the
inputs marked dynamic, the untraceable helpers wrapped in torch.compiler.disable (in the
model's modules, in memory: as the configuration lines the tune prints tell the user to)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torchkiln.repair import arm


@dataclass(frozen=True)
class Remedies:
    config: tuple[str, ...] = ()  # configuration remedies (torchkiln.repair.config)
    helpers: tuple[str, ...] = ()  # the functions the "disable" remedy wraps
    patch: str | None = None  # the source patch the model must carry, where there is one

    @classmethod
    def of(cls, fixes: dict[str, Any] | None) -> Remedies:
        """From the pick's remedies as the tune wrote them (`repair.judge.shipped`)."""
        if not fixes:
            return cls()
        conf = fixes.get("config") or {}
        code = fixes.get("code") or {}
        return cls(
            tuple(conf.get("remedies") or ()),
            tuple(conf.get("helpers") or ()),
            code.get("patch_file") or None,
        )

    def __bool__(self) -> bool:
        return bool(self.config or self.patch)

    def prepare(self, model: Any) -> int:
        """Before the first compiled call: the helpers disabled where the model's forwards see
        them. Returns how many were wrapped (none twice)."""
        if "disable" not in self.config:
            return 0
        return arm.disable_helpers(model, list(self.helpers))

    @contextlib.contextmanager
    def around_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[None]:
        """Around one call: the inputs marked dynamic, the Dynamo settings patched."""
        arm.mark_inputs_dynamic(args, list(self.config))
        arm.mark_inputs_dynamic(kwargs, list(self.config))
        with arm.around_calls(list(self.config)):
            yield
