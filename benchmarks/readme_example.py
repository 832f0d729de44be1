"""Regenerate README's example output: run the README's command (`kiln tune`, the default
workload) on the CPU and write what it printed between the README's marker comments.

    PYTHONPATH=src python benchmarks/readme_example.py     # run, then rewrite README.md

tests/test_readme_example.py checks that the block has the format the current code prints.

It runs in a temporary directory so the printed paths are the default ones a user sees
(`kiln-runs/tune-simple-infer/...`), with CUDA hidden so a GPU machine runs the CPU example too.
Takes about 3 minutes on a 2-core CPU (the default 4-minute CPU budget)."""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- kiln-tune-output:start -->", "<!-- kiln-tune-output:end -->"


def block(text: str) -> str:
    """The README's text between the markers."""
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} block")
    return text.split(START, 1)[1].split(END, 1)[0]


def example_output(text: str) -> str:
    """The fenced output inside the README's block (what `kiln tune` printed)."""
    found = re.search(r"\n```\n(.*?)\n```\n", block(text), re.S)
    if not found:
        raise SystemExit("the README's kiln-tune-output block has no fenced output")
    return found[1]


def run_readme_command() -> tuple[str, float, float]:
    """What the command printed, how long it took, and the host's highest 1-minute load
    average seen (at its start and end): on a busy host compiled trials can run out of time."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="kiln-readme-") as cwd:
        t0 = time.monotonic()
        load = os.getloadavg()[0]
        proc = subprocess.run(
            [sys.executable, "-m", "torchkiln.cli", "tune"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        took = time.monotonic() - t0
        load = max(load, os.getloadavg()[0])
    if proc.returncode != 0:
        raise SystemExit(f"kiln tune failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout.rstrip("\n"), took, load


def kiln_sha() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def render_block(output: str, took_s: float, load: float) -> str:
    import torch

    minutes, seconds = divmod(round(took_s), 60)
    cores = os.cpu_count()
    sentence = (
        f"On this repository's CPU machine ({cores} cores, {platform.machine()}, torch "
        f"{torch.__version__}, the `tiny` preset: batch 4 at 32x32; kiln {kiln_sha()}) the "
        f"command above, at a load average of {load:.1f} on its {cores} cores, took {minutes} min "
        f"{seconds:02d} s and printed:"
    )
    return f"\n{textwrap.fill(sentence, 100)}\n\n```\n{output}\n```\n"


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    text = README.read_text()
    output, took, load = run_readme_command()
    old = block(text)
    new = START + render_block(output, took, load) + END
    README.write_text(text.replace(START + old + END, new))
    print(f"README.md: example output rewritten ({took:.0f} s run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
