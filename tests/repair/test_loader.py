"""A workload file's sibling modules: kept apart per copy, and findable by what they define."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from torchkiln.repair.loader import import_file


def _project(root: Path, scale: int) -> Path:
    root.mkdir()
    (root / "layers.py").write_text(
        textwrap.dedent(
            f"""
            class Block:
                def forward(self, x):
                    return x * {scale}

                @staticmethod
                def helper(x):
                    return x
            """
        )
    )
    (root / "model.py").write_text("from layers import Block\n\ndef build():\n    return Block()\n")
    return root / "model.py"


def test_sibling_modules_stay_findable_under_their_definitions_module(tmp_path):
    block = import_file(_project(tmp_path / "a", 2)).build()
    cls = type(block)
    # The compiler resolves a class or a method through sys.modules[obj.__module__].
    assert sys.modules[cls.__module__].Block is cls
    assert cls.forward.__module__ == cls.__module__
    assert cls.helper.__module__ == cls.__module__
    assert "layers" not in sys.modules


def test_an_original_and_its_copy_keep_their_own_siblings(tmp_path):
    one = import_file(_project(tmp_path / "orig", 2)).build()
    two = import_file(_project(tmp_path / "copy", 3)).build()
    assert one.forward(1) == 2 and two.forward(1) == 3
    assert type(one).__module__ != type(two).__module__
