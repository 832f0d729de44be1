"""Models as people write them, each with the graph breaks of one kind (and one without), as
real files: their source is what `kiln tune --fix code` rewrites. Each file defines
`build(preset, batch_size, step)`; it is imported with its directory first on sys.path, so the
second files it imports come from the same directory (the original's or a rewritten copy's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchkiln.workloads.base import Workload, call_factory, register_workload

HERE = Path(__file__).resolve().parent

# name -> (file, the breaks it carries)
ZOO = {
    "zoo-encoder": ("encoder.py", "6-block encoder: NaN guard, .item(), log.info per block"),
    "zoo-gated-mlp": ("gated_mlp.py", "MLP with a Python branch on a tensor per layer"),
    "zoo-checked-mlp": ("checked_mlp.py", "MLP with an assert on a tensor per layer"),
    "zoo-bucket-embed": ("bucket_embed.py", "numpy.digitize buckets, embedding, MLP"),
    "zoo-smooth-net": ("smooth_net.py", "MLP around an untraceable numpy helper (2nd file)"),
    "zoo-printing-cnn": ("printing_cnn.py", "small CNN with a print in forward"),
    "zoo-scaled-head": ("scaled_head.py", "classifier head scaled by .item()"),
    "zoo-clean-mlp": ("clean_mlp.py", "residual MLP, no graph break (the control)"),
}


def _factory(name: str, fname: str):
    path = HERE / fname

    def factory(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Any:
        from torchkiln.repair.loader import import_file

        module = import_file(path)
        return call_factory(module.build, preset=preset, batch_size=batch_size, step=step)

    factory.__name__ = name.replace("-", "_")
    factory.__kiln_source__ = (str(path), "build")  # type: ignore[attr-defined]
    return factory


for _name, (_file, _desc) in ZOO.items():
    register_workload(_name, description=_desc)(_factory(_name, _file))

__all__ = ["ZOO", "Workload"]
