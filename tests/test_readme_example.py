"""README's example output has the format the current code prints: its lines are what
`recommend.summary_lines` makes of the pick they show, its last line what
`time_spent.console_line` prints, and its code is what `recommend.code` emits for that pick
today. `benchmarks/readme_example.py` regenerates the block from a run."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from torchkiln.tune.recommend import code, summary_lines
from torchkiln.tune.time_spent import console_line

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "readme_example", ROOT / "benchmarks/readme_example.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time_spent(line: str) -> dict:
    """The ``time_spent`` a console line was printed from (the shown stages and phases)."""
    found = re.fullmatch(r"time spent: (\d+)s \((.*?)(?:; beside the search: (.*))?\)"
                         r"(?:; over (\d+) trials: (.*))?", line)  # fmt: skip
    assert found, line

    def pairs(text: str | None) -> dict:
        return {k: float(v) for k, v in re.findall(r"(.+?) (\d+)s(?:, |$)", text or "")}

    spent = {"wall_s": float(found[1]), "stages_s": pairs(found[2]), "phases_s": pairs(found[5])}
    spent["trials"] = int(found[4] or 0)
    if found[3]:
        spent["beside_s"] = pairs(found[3])
    return spent


def _parse(output: str) -> dict:
    """The pieces of a printed summary: pick, reason, why lines, code, out dir, wall, budget,
    and the closing line on where the time went."""
    lines = output.splitlines()
    spent = _time_spent(lines.pop()) if lines[-1].startswith("time spent: ") else None
    pick = re.fullmatch(r"pick: (\S+)  \((.*)\)", lines[0])
    assert pick, lines[0]
    why = []
    i = 1
    while lines[i].startswith("  - "):
        why.append(lines[i][4:])
        i += 1
    assert lines[i] == "", "a blank line after the reasons"
    report = re.fullmatch(
        r"report: (\S+)/report\.html, \1/report\.md, \1/results\.json "
        r"\((\d+) s of a (\d+) s budget\)",
        lines[-1],
    )
    assert report, lines[-1]
    assert lines[-2] == "", "a blank line before the report line"
    return {
        "best": pick[1],
        "reason": pick[2],
        "why": why,
        "code": "\n".join(lines[i + 1 : -2]),
        "out": report[1],
        "wall_s": float(report[2]),
        "budget_s": float(report[3]),
        "time_spent": spent,
    }


def test_the_readme_example_has_the_current_pick_format():
    script = _script()
    output = script.example_output(script.README.read_text())
    got = _parse(output)
    # The same code that prints the summary reprints the README's block line for line.
    doc = {
        "selection": {"best": got["best"], "reason": got["reason"]},
        "recommendation": {"variant": got["best"], "code": got["code"], "why": got["why"]},
        "wall_s": got["wall_s"],
        "budget_s": got["budget_s"],
    }
    printed = summary_lines(doc, got["out"])
    # The closing line is the tune's time_spent as console_line prints it.
    assert got["time_spent"] is not None, "the example ends with where the time went"
    printed.append(console_line(got["time_spent"]))
    assert "\n".join(printed) == output
    # Its code is what the recommendation emits for that pick now (the README's command runs
    # the default workload's inference step on the CPU).
    assert got["code"] == code(got["best"], "infer", "cpu")
    assert got["why"] and got["why"][0].split(":")[0]
    assert got["out"] == "kiln-runs/tune-simple-infer"


def test_the_script_rewrites_only_the_marked_block(tmp_path, monkeypatch):
    script = _script()
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{script.START}\nold\n{script.END}\nafter\n")
    monkeypatch.setattr(script, "README", readme)
    monkeypatch.setattr(script, "run_readme_command", lambda: ("pick: eager  (x)", 75.0, 1.5))
    monkeypatch.setattr(script, "kiln_sha", lambda: "abc1234")
    monkeypatch.setattr("sys.argv", ["readme_example.py"])
    assert script.main() == 0
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith(f"{script.END}\nafter\n")
    assert "kiln abc1234) the command above, at a load average of 1.5" in text.replace("\n", " ")
    assert "took 1 min 15 s" in text.replace("\n", " ")
    assert script.example_output(text) == "pick: eager  (x)"
