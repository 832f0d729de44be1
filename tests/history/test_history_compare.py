"""`kiln compare --against history[:N]`: exit 1 on a regression beyond the noise the past
showed, 0 on noise; and `kiln history` / `kiln import` listing what the store holds."""

from __future__ import annotations

import json

import pytest

from history_docs import bench_doc
from torchkiln.cli import main
from torchkiln.errors import KilnUserError
from torchkiln.history.compare import against_history, parse_against
from torchkiln.history.store import Store


def _store_with(path, medians):
    with Store(path) as store:
        for i, ms in enumerate(medians):
            store.append(bench_doc({"eager": ms}, created=f"2026-11-2{i}T10:00:00+0000"))


def _compare(tmp_path, store, new_doc, *extra):
    new = tmp_path / "new.json"
    new.write_text(json.dumps(new_doc))
    return main(["compare", "--against", "history:5", "--history", str(store), *extra, str(new)])


def test_a_slower_run_beyond_the_noise_exits_1_naming_the_run_it_compared_against(tmp_path, capsys):
    store = tmp_path / "h.sqlite"
    _store_with(store, [10.0, 10.1, 9.9, 10.05, 9.95])
    code = _compare(tmp_path, store, bench_doc({"eager": 13.0}, created="2026-12-01T10:00:00+0000"))
    out = capsys.readouterr().out
    assert code == 1, out
    assert "regression" in out
    assert "against run 1 of 2026-11-20T10:00:00+0000" in out  # the one at the median, 10.0


def test_noise_exits_0(tmp_path, capsys):
    store = tmp_path / "h.sqlite"
    _store_with(store, [10.0, 10.1, 9.9, 10.05, 9.95])
    assert _compare(tmp_path, store, bench_doc({"eager": 10.15})) == 0
    assert "no significant change" in capsys.readouterr().out


def test_the_spread_of_the_past_runs_is_the_noise_floor(tmp_path):
    # 25% slower than the median run, tight interval, but the past already spread by 30%.
    with Store(tmp_path / "h.sqlite") as store:
        for ms in [10.0, 12.0, 9.0, 11.0, 10.0]:
            store.append(bench_doc({"eager": ms}, halfwidth=0.001, tag=str(ms)))
        new = bench_doc({"eager": 12.5}, halfwidth=0.001, tag="new")
        rows, _ = against_history(new, store, 5, 0.05)
        assert rows[0]["noise_floor"] == pytest.approx(0.3)
        assert rows[0]["verdict"] == "no significant change"
        faster = bench_doc({"eager": 6.0}, halfwidth=0.001, tag="fast")
        assert against_history(faster, store, 5, 0.05)[0][0]["verdict"] == "improvement"


def test_a_run_compares_only_with_runs_before_it_and_like_it(tmp_path):
    with Store(tmp_path / "h.sqlite") as store:
        for i in range(6):
            store.append(bench_doc({"eager": 10.0}, tag=str(i)))
        other = bench_doc({"eager": 50.0}, env={"cpu": "arm64"}, tag="elsewhere")
        store.append(other)  # another device: not comparable
        new = bench_doc({"eager": 10.0, "inductor": 4.0}, tag="new")
        new_id = store.append(new)  # a bench appends before its compare runs
        store.append(bench_doc({"eager": 30.0}, tag="later"))
        rows, alone = against_history(new, store, 3, 0.05)
    assert alone == ["inductor"]  # nothing earlier to compare with: passes
    (row,) = rows
    assert row["runs"] == [6, 5, 4] and new_id not in row["runs"]
    assert row["verdict"] == "no significant change"


def test_no_store_yet_passes(tmp_path, capsys):
    assert _compare(tmp_path, tmp_path / "none.sqlite", bench_doc({"eager": 10.0})) == 0
    assert "nothing to compare" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["hist", "history:0", "history:x"])
def test_a_bad_against_is_refused(text):
    with pytest.raises(KilnUserError, match="history:N"):
        parse_against(text)


def test_history_lists_runs_newest_first_with_filters(tmp_path, capsys):
    store = tmp_path / "h.sqlite"
    with Store(store) as s:
        s.append(bench_doc({"eager": 10.0, "inductor": 5.0}, created="2026-11-01T10:00:00+0000"))
        s.append(bench_doc({"eager": 11.0}, created="2026-12-01T10:00:00+0000"))
        s.append(bench_doc({"eager": 3.0}, workload="other", created="2026-12-02T10:00:00+0000"))
    assert main(["history", "simple", "--history", str(store), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["variant"]) for r in rows] == [
        (2, "eager"), (1, "eager"), (1, "inductor")
    ]  # fmt: skip
    main(
        [
            "history",
            "--history",
            str(store),
            "--json",
            "--variant",
            "eager",
            "--since",
            "2026-11-15",
        ]
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in rows] == [3, 2]
    assert main(["history", "--history", str(store)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run", "created", "kind"]
    assert [line.split()[0] for line in table[2:]] == ["3", "2", "1", "1"]
    assert main(["history", "--history", str(store), "--since", "yesterday"]) == 2


def test_import_loads_run_directories_once(tmp_path, capsys):
    tune_dir = tmp_path / "tune"
    tune_dir.mkdir()
    doc = bench_doc({"eager": 10.0})
    doc["schema"] = "torchkiln.tune/1"
    (tune_dir / "results.json").write_text(json.dumps(doc))
    # A bench stopped before bench.json: its manifest and the finished trial's result.
    stopped = tmp_path / "stopped"
    (stopped / "trials" / "00-eager").mkdir(parents=True)
    trial = {**bench_doc({"eager": 7.0})["trials"][0], "environment": doc["environment"]}
    (stopped / "trials" / "00-eager" / "result.json").write_text(json.dumps(trial))
    manifest = {"schema": "torchkiln.run/1", "workload": "simple", "step": "infer",
                "device": "cpu", "preset": "tiny", "updated": "2026-11-30T10:00:00+0000",
                "trials": [{"id": "00-eager", "status": "ok"},
                           {"id": "01-x", "status": "pending"}]}  # fmt: skip
    (stopped / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    store = tmp_path / "h.sqlite"
    paths = [str(tune_dir), str(stopped), str(tmp_path / "other.json")]
    assert main(["import", "--history", str(store), *paths]) == 1  # other.json is not kiln's
    captured = capsys.readouterr()
    assert "imported as run 1" in captured.out and "imported as run 2" in captured.out
    assert "other.json: not imported: not a kiln" in captured.err
    assert main(["import", "--history", str(store), str(tune_dir)]) == 0
    assert "already in the history (run 1)" in capsys.readouterr().out
    with Store(store) as s:
        rows = s.measurements()
    assert [(r["kind"], r["median_ms"]) for r in rows] == [("bench", 7.0), ("tune", 10.0)]
