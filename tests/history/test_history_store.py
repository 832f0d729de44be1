"""The history store: appends from many processes at once, refusal of files that are not a
kiln store (left byte for byte as they were), and the migration from the first schema."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from history_docs import bench_doc
from torchkiln.history import records
from torchkiln.history.store import (
    FORMAT,
    SCHEMA_VERSION,
    HistoryError,
    Store,
    default_path,
    record,
    resolve,
)


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_default_store_is_in_the_user_cache_unless_kiln_history_says(monkeypatch, tmp_path):
    monkeypatch.delenv("KILN_HISTORY", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_path() == tmp_path / "cache" / "torchkiln" / "history.sqlite"
    monkeypatch.setenv("KILN_HISTORY", str(tmp_path / "h.sqlite"))
    assert resolve(None) == tmp_path / "h.sqlite"
    assert resolve(tmp_path / "other.sqlite") == tmp_path / "other.sqlite"
    assert resolve(False) is None


def test_an_append_keeps_the_key_and_the_whole_document(tmp_path):
    doc = bench_doc({"eager": 10.0, "inductor:mode=default+bf16": 5.0})
    with Store(tmp_path / "h.sqlite") as store:
        run_id = store.append(doc)
        assert store.version() == SCHEMA_VERSION
        assert store.document(run_id) == doc
        assert store.find(doc) == run_id
        rows = store.measurements("simple")
    assert [(r["variant"], r["precision"], r["median_ms"]) for r in rows] == [
        ("eager", "fp32", 10.0),
        ("inductor:mode=default+bf16", "bf16", 5.0),
    ]
    r = rows[0]
    assert (r["kind"], r["step"], r["preset"], r["torch"], r["kiln_git_sha"]) == (
        "bench", "infer", "tiny", "2.14.1", "abc123"
    )  # fmt: skip
    assert r["device_name"] == "x86_64 (2 cpus)"
    assert (r["lo_ms"], r["hi_ms"]) == pytest.approx((9.9, 10.1))


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from history_docs import bench_doc
    from torchkiln.history.store import Store

    writer = int(sys.argv[1])
    for i in range({per}):
        # A fresh connection per append, as separate kiln commands make.
        with Store(sys.argv[2]) as store:
            store.append(bench_doc({{"eager": 10.0 + writer, "inductor": 5.0}},
                                   tag=f"-{{writer}}-{{i}}"))
    """
)


def test_eight_processes_appending_at_once_lose_no_row(tmp_path):
    from pathlib import Path

    path, per = tmp_path / "h.sqlite", 5
    code = WRITER.format(tests=str(Path(__file__).parents[1]), per=per)
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(w), str(path)], stderr=subprocess.PIPE)
        for w in range(8)
    ]
    errors = [p.communicate(timeout=300)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, errors
    with Store(path) as store:
        assert store.count_runs() == 8 * per
        rows = store.measurements()
    assert len(rows) == 8 * per * 2
    eager = sorted(r["median_ms"] for r in rows if r["variant"] == "eager")
    assert eager == sorted(10.0 + w for w in range(8) for _ in range(per))
    # Every run has both of its measurements: each append is one transaction.
    by_run: dict[int, int] = {}
    for r in rows:
        by_run[r["run_id"]] = by_run.get(r["run_id"], 0) + 1
    assert set(by_run.values()) == {2}


def _foreign_db(path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    conn.execute("INSERT INTO notes (text) VALUES ('mine')")
    conn.commit()
    conn.close()


def _truncated_store(path) -> None:
    with Store(path) as store:
        for i in range(40):
            store.append(bench_doc({"eager": 10.0}, tag=f"-{i}"))
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes()
    path.write_bytes(data[:4096] + b"\x00" * 64 + data[4096 + 64 : len(data) // 2])
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda p: p.write_bytes(b"not a database at all\n" * 50), "is not an SQLite database"),
        (_foreign_db, "another program's database"),
        (_truncated_store, "corrupt"),
    ],
    ids=["garbage", "foreign", "truncated"],
)
def test_a_file_that_is_not_a_kiln_store_is_refused_and_left_as_it_was(tmp_path, make, says):
    path = tmp_path / "h.sqlite"
    make(path)
    before = sha(path)
    with pytest.raises(HistoryError, match=says):
        Store(path)
    # Recording into it never fails the measurement: a warning with the reason.
    status = record(bench_doc({"eager": 10.0}), "bench", path)
    assert "history not written" in status["warning"] and says in status["warning"]
    assert sha(path) == before
    assert not path.with_name(path.name + "-wal").exists()


def test_a_store_from_a_newer_kiln_is_refused(tmp_path):
    path = tmp_path / "h.sqlite"
    with Store(path) as store:
        store.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = sha(path)
    with pytest.raises(HistoryError, match="newer than this kiln"):
        Store(path)
    assert sha(path) == before


def test_a_store_that_cannot_be_created_is_a_warning(tmp_path):
    (tmp_path / "file").write_text("a file, not a folder")
    status = record(bench_doc({"eager": 10.0}), "bench", tmp_path / "file" / "h.sqlite")
    assert status["warning"].startswith("history not written:")


# The first schema, written out by hand as kiln 0.1's first history stores have it.
V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT NOT NULL,
    kind TEXT NOT NULL, workload TEXT NOT NULL, step TEXT, preset TEXT, device_name TEXT,
    torch TEXT, triton TEXT, kiln TEXT, kiln_git_sha TEXT, source_hash TEXT,
    document TEXT NOT NULL);
CREATE TABLE measurements (id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL REFERENCES runs(id), variant TEXT NOT NULL,
    precision TEXT NOT NULL, status TEXT NOT NULL, median_ms REAL, lo_ms REAL, hi_ms REAL);
"""


def test_a_first_version_store_is_migrated_keeping_every_row(tmp_path):
    path = tmp_path / "h.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(V1)
    conn.execute("INSERT INTO meta VALUES ('format', ?)", (FORMAT,))
    docs = [bench_doc({"eager": 10.0 + i, "inductor": 5.0 + i}, tag=f"-{i}") for i in range(3)]
    for i, doc in enumerate(docs, start=1):
        conn.execute(
            "INSERT INTO runs (created, kind, workload, step, preset, device_name, torch, "
            "kiln_git_sha, document) VALUES (?, 'bench', 'simple', 'infer', 'tiny', "
            "'x86_64 (2 cpus)', '2.14.1', 'abc123', ?)",
            (doc["created"], json.dumps(doc)),
        )
        for t in doc["trials"]:
            ms = t["steady_ms"]
            conn.execute(
                "INSERT INTO measurements (run_id, variant, precision, status, median_ms, "
                "lo_ms, hi_ms) VALUES (?, ?, 'fp32', 'ok', ?, ?, ?)",
                (i, t["variant"], ms["median"], *ms["ci95"]),
            )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()

    with Store(path) as store:
        assert store.version() == SCHEMA_VERSION
        assert store.count_runs() == 3
        rows = store.measurements()
        assert sorted(r["median_ms"] for r in rows) == [5.0, 6.0, 7.0, 10.0, 11.0, 12.0]
        # The digest the migration computed finds each stored result again.
        assert [store.find(d) for d in docs] == [1, 2, 3]
        assert all(store.document(i) == d for i, d in enumerate(docs, start=1))
        assert store.append(bench_doc({"eager": 9.0}, tag="-new")) == 4
        assert (
            records.digest(docs[0])
            == store.conn.execute("SELECT digest FROM runs WHERE id = 1").fetchone()[0]
        )


def test_a_reused_tune_trial_is_stored_as_reused():
    doc = bench_doc({"eager": 10.0, "inductor": 5.0})
    doc["schema"] = "torchkiln.tune/1"
    doc["trials"][0]["reused"] = True
    rows = records.measurement_rows(doc, records.kind_of(doc))
    assert [(r["variant"], r["status"]) for r in rows] == [("eager", "reused"), ("inductor", "ok")]


def test_serve_bench_and_kernels_bench_results_are_stored_per_arm():
    serve = {
        "variant": "inductor+bf16",
        "device": "cpu",
        "workload": "simple",
        "trace": {"requests": 10},
        "environment": bench_doc({})["environment"],
        "arms": [
            {"arm": "eager", "spec": "eager", "status": "ok", "latency_ms": {"p50": 2.0}},
            {"arm": "bucketed", "spec": "inductor+bf16", "status": "error", "error": "boom"},
        ],
    }
    rows = records.measurement_rows(serve, records.kind_of(serve))
    assert [(r["variant"], r["precision"], r["status"], r["median_ms"]) for r in rows] == [
        ("eager:eager", "bf16", "ok", 2.0),
        ("bucketed:inductor+bf16", "bf16", "error", None),
    ]
    kernels = {
        "results": [
            {"kernel": "softmax", "direction": "fwd", "dtype": "bf16", "rows": 4096,
             "cols": 1024, "arms": {"kiln": {"ms": 0.5, "ms_p20": 0.49, "ms_p80": 0.52},
                                    "compile": {"status": "compile error: X"}}},
        ],
        "copy": {},
        "environment": {**bench_doc({})["environment"], "gpu": {"name": "NVIDIA H200"}},
    }  # fmt: skip
    assert records.kind_of(kernels) == "kernels-bench"
    rows = records.measurement_rows(kernels, "kernels-bench")
    assert [(r["variant"], r["precision"], r["status"], r["lo_ms"]) for r in rows] == [
        ("softmax.fwd.4096x1024:kiln", "bf16", "ok", 0.49),
        ("softmax.fwd.4096x1024:compile", "bf16", "compile error", None),
    ]
    assert records.run_row(kernels)["device_name"] == "NVIDIA H200"
    with pytest.raises(ValueError, match="not a kiln"):
        records.kind_of({"hello": 1})


def test_a_document_in_memory_and_read_back_from_its_file_have_one_digest():
    doc = bench_doc({"eager": 10.0})
    doc["baseline_drift"] = {"baseline_median_ms": {10: 1.0, 2: 2.0}, "span": (1, 2)}
    doc["wall_s"], doc["history"] = 12.0, {"path": "x"}
    back = json.loads(json.dumps(doc))
    back["wall_s"] = 30.0  # a tune rewrites its wall time after the first write
    del back["history"]
    assert records.digest(doc) == records.digest(back)
    assert records.digest(doc) != records.digest(bench_doc({"eager": 10.5}))
