"""The history store: every measurement kiln makes, appended to one SQLite file.

One file per user by default ($XDG_CACHE_HOME/torchkiln/history.sqlite), chosen otherwise with
``--history PATH`` or KILN_HISTORY. Several kiln processes append at once (a pool of trials, CI
jobs sharing a runner): the file is in WAL mode, every write is one ``BEGIN IMMEDIATE``
transaction, and a busy database is waited for and retried. A file that is not kiln's history
(another program's database, a corrupt or truncated file) is refused and never written: it is
checked through a read-only connection before any writable one is opened.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from torchkiln.errors import KilnUserError
from torchkiln.history import records

FORMAT = "torchkiln.history"
SCHEMA_VERSION = 2
SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 10.0  # sqlite's own wait on a locked database, per attempt
RETRIES = 8  # attempts on "database is locked" after the busy timeout, with growing pauses

T = TypeVar("T")


class HistoryError(KilnUserError):
    """The store cannot be used: refused (foreign, corrupt, newer) or not writable."""


def default_path() -> Path:
    """KILN_HISTORY, else the user's cache directory (XDG_CACHE_HOME or ~/.cache)."""
    if os.environ.get("KILN_HISTORY"):
        return Path(os.environ["KILN_HISTORY"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "torchkiln" / "history.sqlite"


def resolve(history: str | Path | bool | None) -> Path | None:
    """The store a command writes to: None or True = the default, False = none, else a path."""
    if history is False:
        return None
    if history is None or history is True:
        return default_path()
    return Path(history).expanduser()


# Version 1, the first schema: runs and their measurements.
SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created TEXT NOT NULL,
    kind TEXT NOT NULL,
    workload TEXT NOT NULL,
    step TEXT,
    preset TEXT,
    device_name TEXT,
    torch TEXT,
    triton TEXT,
    kiln TEXT,
    kiln_git_sha TEXT,
    source_hash TEXT,
    document TEXT NOT NULL
);
CREATE TABLE measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    variant TEXT NOT NULL,
    precision TEXT NOT NULL,
    status TEXT NOT NULL,
    median_ms REAL,
    lo_ms REAL,
    hi_ms REAL
);
"""


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Version 2 adds each run's digest (so an import or a compare finds the run a file came
    from: the same result is never stored twice), its host, and the indexes a lookup of
    comparable runs uses. The digest of every stored run is computed from its document."""
    conn.execute("ALTER TABLE runs ADD COLUMN digest TEXT")
    conn.execute("ALTER TABLE runs ADD COLUMN host TEXT")
    rows = conn.execute("SELECT id, document FROM runs").fetchall()
    for run_id, document in rows:
        conn.execute(
            "UPDATE runs SET digest = ? WHERE id = ?",
            (records.digest(json.loads(document)), run_id),
        )
    conn.execute("CREATE INDEX runs_digest ON runs(digest)")
    conn.execute("CREATE INDEX runs_lookup ON runs(workload, step, device_name)")
    conn.execute("CREATE INDEX measurements_run ON measurements(run_id, variant)")


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _migrate_1_to_2}


def _retrying(what: Callable[[], T]) -> T:
    """Run ``what``, again after a pause while another process holds the database."""
    for attempt in range(RETRIES):
        try:
            return what()
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or attempt == RETRIES - 1:
                raise
            time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def _refuse(path: Path, why: str) -> HistoryError:
    return HistoryError(
        f"history store {str(path)!r} {why}; kiln leaves it as it is. Pass --history with "
        "another path (or --no-history), or move the file away"
    )


def _inspect(path: Path) -> int | None:
    """The schema version of the kiln store at ``path``, None when there is no store yet
    (no file, an empty file, or an SQLite file with no tables). Raises HistoryError for
    anything else. Reads only: the file is opened read-only."""
    if path.is_dir():
        raise _refuse(path, "is a directory")
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_HEADER))
    if head != SQLITE_HEADER:
        raise _refuse(path, "is not an SQLite database (its first bytes are not SQLite's)")
    # Without a -wal file beside it, everything is in the file itself: read it as immutable,
    # so that no -wal or -shm file is created beside a file that may not be kiln's.
    wal = path.with_name(path.name + "-wal").exists()
    uri = f"{path.resolve().as_uri()}?mode=ro" + ("" if wal else "&immutable=1")
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5)
    except sqlite3.Error as exc:
        raise _refuse(path, f"cannot be opened ({exc})") from exc
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return None
        if "meta" not in tables:
            raise _refuse(path, f"is another program's database (tables: {sorted(tables)})")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("format") != FORMAT:
            raise _refuse(path, "is another program's database (its meta table is not kiln's)")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.execute("SELECT count(*) FROM runs").fetchone()
        conn.execute("SELECT count(*) FROM measurements").fetchone()
    except sqlite3.DatabaseError as exc:
        raise _refuse(path, f"is corrupt or unreadable (sqlite: {exc})") from exc
    finally:
        conn.close()
    if version > SCHEMA_VERSION:
        raise _refuse(
            path, f"has schema version {version}, newer than this kiln's ({SCHEMA_VERSION})"
        )
    if version < 1:
        raise _refuse(path, f"has no schema version kiln knows ({version})")
    return version


def statements(script: str) -> list[str]:
    """The statements of a schema script, to run one by one inside a transaction
    (``executescript`` would commit the transaction first)."""
    return [s.strip() for s in script.split(";") if s.strip()]


class Store:
    """An open history store. Use as a context manager, or call ``close``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        version = _inspect(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(f"history store {str(self.path)!r} cannot be opened: {exc}") from exc
        try:
            _retrying(lambda: self.conn.execute("PRAGMA journal_mode=WAL").fetchone())
            self.conn.execute("PRAGMA foreign_keys=ON")
            if version != SCHEMA_VERSION:  # a current store is opened without a write lock
                self._prepare(version)
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise _refuse(self.path, f"could not be prepared (sqlite: {exc})") from exc

    def _prepare(self, seen: int | None) -> None:
        """Create the schema or migrate it, in one write transaction: two processes opening a
        new store at once create it once."""

        def step() -> None:
            with self.transaction() as conn:
                tables = {
                    r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
                }
                if not tables:
                    for statement in statements(SCHEMA_V1):
                        conn.execute(statement)
                    conn.execute("INSERT INTO meta VALUES ('format', ?)", (FORMAT,))
                    conn.execute("INSERT INTO meta VALUES ('created', ?)", (records.now(),))
                    conn.execute("PRAGMA user_version = 1")
                elif seen is None and "meta" not in tables:
                    raise _refuse(self.path, "became another program's database")
                version = int(conn.execute("PRAGMA user_version").fetchone()[0])
                while version < SCHEMA_VERSION:
                    MIGRATIONS[version](conn)
                    version += 1
                    conn.execute(f"PRAGMA user_version = {version}")

        _retrying(step)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def find(self, doc: dict[str, Any]) -> int | None:
        """The id of the run stored from ``doc`` (the same result), or None."""
        row = self.conn.execute(
            "SELECT id FROM runs WHERE digest = ? ORDER BY id LIMIT 1", (records.digest(doc),)
        ).fetchone()
        return None if row is None else int(row[0])

    def append(self, doc: dict[str, Any], kind: str | None = None) -> int:
        """Store ``doc`` (a bench, tune, serve-bench or kernels bench result) as one run with
        one measurement per variant; returns the run's id. One transaction: all or nothing."""
        run = records.run_row(doc, kind)
        rows = records.measurement_rows(doc, run["kind"])

        def write() -> int:
            with self.transaction() as conn:
                cur = conn.execute(
                    f"INSERT INTO runs ({', '.join(run)}) VALUES ({', '.join('?' * len(run))})",
                    tuple(run.values()),
                )
                run_id = int(cur.lastrowid)
                conn.executemany(
                    "INSERT INTO measurements (run_id, variant, precision, status, median_ms, "
                    "lo_ms, hi_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (run_id, m["variant"], m["precision"], m["status"], m["median_ms"],
                         m["lo_ms"], m["hi_ms"])
                        for m in rows
                    ],
                )  # fmt: skip
                return run_id

        return _retrying(write)

    def document(self, run_id: int) -> dict[str, Any]:
        row = self.conn.execute("SELECT document FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise HistoryError(f"no run {run_id} in {str(self.path)!r}")
        return json.loads(row[0])

    def measurements(
        self,
        workload: str | None = None,
        *,
        variant: str | None = None,
        since: str | None = None,
        step: str | None = None,
        device_name: str | None = None,
        precision: str | None = None,
        preset: str | None = None,
        before: int | None = None,
        exclude: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """One dict per (run, variant), newest first, filtered by whichever are given."""
        where, args = [], []
        for col, val in (
            ("r.workload", workload),
            ("m.variant", variant),
            ("r.step", step),
            ("r.device_name", device_name),
            ("m.precision", precision),
            ("r.preset", preset),
        ):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        if since is not None:
            where.append("r.created >= ?")
            args.append(since)
        if before is not None:
            where.append("r.id < ?")
            args.append(before)
        if exclude is not None:
            where.append("r.id != ?")
            args.append(exclude)
        sql = (
            "SELECT r.id, r.created, r.kind, r.workload, r.step, r.preset, r.device_name, "
            "r.host, r.torch, r.triton, r.kiln, r.kiln_git_sha, r.source_hash, m.variant, "
            "m.precision, m.status, m.median_ms, m.lo_ms, m.hi_ms "
            "FROM measurements m JOIN runs r ON r.id = m.run_id"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY r.id DESC, m.id"
            + (f" LIMIT {int(limit)}" if limit else "")
        )
        cols = [
            "run_id", "created", "kind", "workload", "step", "preset", "device_name", "host",
            "torch", "triton", "kiln", "kiln_git_sha", "source_hash", "variant", "precision",
            "status", "median_ms", "lo_ms", "hi_ms",
        ]  # fmt: skip
        return [dict(zip(cols, r, strict=True)) for r in self.conn.execute(sql, args)]

    def earlier_comparable(
        self, run: dict[str, Any], m: dict[str, Any], own: int | None
    ) -> list[dict[str, Any]]:
        """The runs before ``own`` that measured ``m`` (a measurement row of ``run``, a run row)
        comparably: same workload, variant, step, device, precision and preset, status ok with a
        median; newest first."""
        return [
            r
            for r in self.measurements(
                run["workload"],
                variant=m["variant"],
                step=run["step"],
                device_name=run["device_name"],
                precision=m["precision"],
                preset=run["preset"],
                before=own,
            )
            if r["status"] == "ok" and r["median_ms"] is not None and r["run_id"] != own
        ]

    def count_runs(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM runs").fetchone()[0])


def open_store(history: str | Path | bool | None = None) -> Store | None:
    """The store ``history`` names (see ``resolve``), or None when history is off."""
    path = resolve(history)
    return None if path is None else Store(path)


def record(doc: dict[str, Any], kind: str, history: str | Path | bool | None = None) -> dict:
    """Append ``doc`` to the store, never failing the measurement: returns what happened,
    {"path", "run_id"} or {"path", "warning"} with the reason (or {"off": True})."""
    path = resolve(history)
    if path is None:
        return {"off": True}
    try:
        with Store(path) as store:
            return {"path": str(path), "run_id": store.append(doc, kind)}
    except (
        HistoryError, sqlite3.Error, OSError, ValueError, KeyError, TypeError, AttributeError
    ) as exc:  # fmt: skip
        why = str(exc) if isinstance(exc, HistoryError) else f"{type(exc).__name__}: {exc}"
        return {"path": str(path), "warning": f"history not written: {why}"}


def status_line(status: dict[str, Any]) -> str | None:
    """One line for the console about a ``record``, or None when history is off."""
    if status.get("off"):
        return None
    if "warning" in status:
        return f"kiln: warning: {status['warning']}"
    return f"history: run {status['run_id']} appended to {status['path']}"
