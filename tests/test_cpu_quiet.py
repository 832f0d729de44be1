"""A compile pauses for neighbours' reps only once its own workers are quiet (cpu_quiet.py)."""

from __future__ import annotations

import subprocess
import sys

from torchkiln.runner.protocol.cpu_quiet import tree_cpu_s, wait_quiet

SPIN = "import time\nt = time.time()\nwhile time.time() - t < 3.0:\n    pass\n"


def test_a_busy_child_keeps_the_tree_from_being_quiet_until_it_ends():
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        before = tree_cpu_s(spinner.pid)
        assert not wait_quiet(0.6)  # this process's tree holds the spinning child
        assert tree_cpu_s(spinner.pid) > before  # the child's own seconds grew
    finally:
        spinner.wait(timeout=30)
    assert wait_quiet(10.0)


def test_the_waiting_threads_own_scans_do_not_count():
    # Nothing else runs: the scans of /proc alone never make the tree look busy.
    assert wait_quiet(2.0)
