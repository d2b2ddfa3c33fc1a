"""The run history: every `kvviz bench` and every window run, kept in SQLite across sessions.

Qt-free. The database is `runs.sqlite3` in the user's data directory: `$KVVIZ_DATA_DIR` when set (the
tests point it at a temporary folder), else `$XDG_DATA_HOME/kvviz`, else `~/.local/share/kvviz`.

Schema (version `SCHEMA_VERSION`, kept in the `meta` table):
  runs     one row per run: when, where from (bench / window), adapter, driver, the method of a window
           run, its config, the shapes, whether it is the pinned baseline (at most one run is)
  kernels  one row per timed kernel of a run: shape, name, variant, method, role, impl, the hash of its
           shader source as compiled, timing method, bytes moved, the samples (a JSON array, us)
A run is written in one transaction (BEGIN IMMEDIATE ... COMMIT) with synchronous=FULL in WAL mode:
a crash part-way loses that run only, never one already committed. A database written by a newer
kvviz (a higher schema version) is refused with a message, never altered; older versions are
migrated in place, in a transaction, by the steps in `MIGRATIONS`.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvviz.errors import InvalidInput
from kvviz.tables import clean

SCHEMA_VERSION = 1
DB_NAME = "runs.sqlite3"
ENV_DIR = "KVVIZ_DATA_DIR"


class HistoryError(InvalidInput):
    """The run history cannot be opened or read (a newer schema, not a database, no such run)."""

    hint = f"Point {ENV_DIR} at another folder to keep a separate history."


def data_dir() -> Path:
    """Where kvviz keeps its data: $KVVIZ_DATA_DIR, else $XDG_DATA_HOME/kvviz, else ~/.local/share/kvviz."""
    d = os.environ.get(ENV_DIR)
    if d:
        return Path(d).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".local" / "share"
    return base / "kvviz"


def default_path() -> Path:
    return data_dir() / DB_NAME


def _v1(conn: sqlite3.Connection) -> None:
    conn.execute("""
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            created TEXT NOT NULL,            -- UTC, ISO 8601
            source TEXT NOT NULL,             -- 'bench' | 'window'
            label TEXT NOT NULL DEFAULT '',
            adapter TEXT NOT NULL,            -- adapter name
            driver TEXT NOT NULL DEFAULT '',
            is_software INTEGER NOT NULL DEFAULT 0,
            adapter_json TEXT NOT NULL,
            method TEXT,                      -- the method of a window run (bench: NULL, every method)
            config_json TEXT,                 -- the window's SessionConfig / the bench's runs and warm-up
            timestamp_period_ns REAL,
            baseline INTEGER NOT NULL DEFAULT 0
        )""")
    conn.execute("CREATE UNIQUE INDEX runs_one_baseline ON runs(baseline) WHERE baseline = 1")
    conn.execute("""
        CREATE TABLE kernels (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            shape_key TEXT NOT NULL,          -- canonical JSON of the shape's dimensions (no name)
            shape_json TEXT NOT NULL,
            name TEXT NOT NULL,
            variant TEXT NOT NULL DEFAULT '',
            method TEXT,
            role TEXT,
            impl TEXT,
            source_hash TEXT,
            timing_method TEXT NOT NULL,
            bytes INTEGER NOT NULL DEFAULT 0,
            runs INTEGER NOT NULL,
            median_us REAL NOT NULL,
            p10_us REAL NOT NULL,
            p90_us REAL NOT NULL,
            min_us REAL NOT NULL,
            samples_json TEXT NOT NULL,
            warmup_runs INTEGER NOT NULL DEFAULT 0
        )""")
    conn.execute("CREATE INDEX kernels_run ON kernels(run_id, position)")
    conn.execute("CREATE INDEX kernels_series ON kernels(name, variant, shape_key, run_id)")


# version reached -> step from the version below; a new schema appends a step, never edits one
MIGRATIONS = {1: _v1}


def shape_key(shape: dict) -> str:
    return json.dumps({k: v for k, v in sorted((shape or {}).items()) if k != "name"}, sort_keys=True, allow_nan=False)


def shape_label(shape: dict) -> str:
    """'quick-ragged: 4 seqs 37..300 tok, 8/2 heads, d128, blk16' (the name only when there is one)."""
    s = shape or {}
    lens = s.get("context_lens")
    if isinstance(lens, list):
        ctx = f"{min(lens)}..{max(lens)}" if len(set(lens)) > 1 else str(lens[0]) if lens else "?"
    else:
        ctx = str(lens)
    dims = (f"{s.get('num_seqs', '?')} seqs x {ctx} tok, {s.get('num_heads', '?')}/{s.get('num_kv_heads', '?')} heads, "
            f"d{s.get('head_size', '?')}, blk{s.get('block_size', '?')}")
    return f"{s['name']}: {dims}" if s.get("name") else dims


@dataclass(frozen=True)
class KernelRecord:
    """One timed kernel of a run, with its samples."""

    name: str
    variant: str
    samples_us: tuple
    timing_method: str
    shape: dict = field(default_factory=dict)
    method: str | None = None
    role: str | None = None
    impl: str | None = None
    source_hash: str | None = None
    bytes: int = 0
    warmup_runs: int = 0

    @property
    def key(self) -> str:
        return f"{self.name} [{self.variant}]"

    @property
    def shape_key(self) -> str:
        return shape_key(self.shape)

    def stat(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.samples_us, np.float64), q)) if self.samples_us else math.nan

    @property
    def median_us(self) -> float:
        return float(np.median(np.asarray(self.samples_us, np.float64))) if self.samples_us else math.nan

    @property
    def p10_us(self) -> float:
        return self.stat(10)

    @property
    def p90_us(self) -> float:
        return self.stat(90)

    @property
    def min_us(self) -> float:
        return float(min(self.samples_us)) if self.samples_us else math.nan

    def to_json(self) -> dict:
        return {
            "kernel": self.name, "variant": self.variant, "method": self.method, "role": self.role,
            "impl": self.impl, "source_hash": self.source_hash, "shape": self.shape, "timing_method": self.timing_method,
            "bytes_moved": self.bytes, "runs": len(self.samples_us), "warmup_runs": self.warmup_runs,
            "gpu_us_min": self.min_us, "gpu_us_p10": self.p10_us, "gpu_us_median": self.median_us,
            "gpu_us_p90": self.p90_us, "samples_us": list(self.samples_us),
        }


@dataclass(frozen=True)
class Run:
    """A run as stored (kernels empty in listings)."""

    id: int
    created: str
    source: str
    label: str
    adapter: dict
    method: str | None
    config: dict | None
    baseline: bool
    kernels: tuple = ()
    kernel_count: int = 0
    shapes: tuple = ()  # shape labels, in order of first appearance

    @property
    def adapter_name(self) -> str:
        return str(self.adapter.get("name", ""))

    def describe(self) -> str:
        what = self.method or ", ".join(self.shapes[:2]) + (" ..." if len(self.shapes) > 2 else "")
        return f"run {self.id} ({self.source}, {self.created}, {self.adapter_name}{', ' + what if what else ''})"

    def medians(self) -> dict:
        """{"kernel [variant]": median us} of the kernels (the window's pin)."""
        return {k.key: k.median_us for k in self.kernels}

    def to_json(self, samples: bool = True) -> dict:
        d = {
            "id": self.id, "created": self.created, "source": self.source, "label": self.label,
            "adapter": self.adapter, "method": self.method, "config": self.config, "baseline": self.baseline,
            "kernel_count": self.kernel_count, "shapes": list(self.shapes),
        }
        if samples:
            d["kernels"] = [k.to_json() for k in self.kernels]
        return d


def _finite_samples(samples) -> tuple:
    out = tuple(float(x) for x in samples)
    if not out or not all(math.isfinite(x) for x in out):
        raise InvalidInput(f"a timed kernel needs finite samples, got {list(out)[:5]}")
    return out


class HistoryDB:
    """The run history in one SQLite file. Use from one thread (each thread opens its own)."""

    def __init__(self, path=None):
        self.path = Path(path) if path is not None else default_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryError(f"cannot create the history folder {self.path.parent}: {exc.strerror or exc}") from None
        try:
            self._conn = sqlite3.connect(str(self.path), timeout=10.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot open the run history {self.path}: {exc}") from None
        try:
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise HistoryError(f"{self.path} is not a kvviz run history ({exc})") from None
        except HistoryError:
            self._conn.close()
            raise

    # ------------------------------------------------------------------ schema
    def schema_version(self) -> int:
        has_meta = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
        if not has_meta:
            others = self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
            if others:
                raise HistoryError(f"{self.path} is an SQLite file of something else (tables: "
                                   f"{', '.join(r[0] for r in others)}), not a kvviz run history")
            return 0
        row = self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        try:
            return int(row[0])
        except (TypeError, ValueError):
            raise HistoryError(f"{self.path}: its meta table has no valid schema_version ({row and row[0]!r})") from None

    def _migrate(self) -> None:
        have = self.schema_version()
        if have > SCHEMA_VERSION:
            raise HistoryError(
                f"the run history {self.path} has schema version {have}, newer than this kvviz understands "
                f"({SCHEMA_VERSION}); it was not changed",
                f"Use the newer kvviz with it, or point {ENV_DIR} at another folder.")
        if have == SCHEMA_VERSION:
            return
        with self._write():
            have = self.schema_version()  # another process may have migrated meanwhile
            if have == 0:
                self._conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            for v in range(have + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[v](self._conn)
            self._conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                               (str(SCHEMA_VERSION),))

    class _Tx:
        def __init__(self, conn, path):
            self.conn, self.path = conn, path

        def __enter__(self):
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # locked by another writer past the timeout, read-only
                raise HistoryError(f"cannot write the run history {self.path}: {exc}") from None
            return self.conn

        def __exit__(self, et, ev, tb):
            if et is None:
                try:
                    self.conn.execute("COMMIT")
                    return False
                except sqlite3.Error as exc:
                    et, ev = type(exc), exc
            if self.conn.in_transaction:  # SQLite may have rolled back already (interrupt, disk full)
                self.conn.execute("ROLLBACK")
            if issubclass(et, sqlite3.Error):
                raise HistoryError(f"writing the run history {self.path} failed, nothing of it was kept: {ev}") from None
            return False

    def _write(self):
        """A write transaction: committed as a whole when the block ends, rolled back on an error (an
        SQLite error comes out as HistoryError)."""
        return HistoryDB._Tx(self._conn, self.path)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ writing
    def record(self, source: str, adapter: dict, kernels, *, method: str | None = None, config: dict | None = None,
               label: str = "", timestamp_period_ns: float | None = None) -> int:
        """Store one run and its kernels in one transaction; returns the run id."""
        if source not in ("bench", "window"):
            raise InvalidInput(f"a run's source is 'bench' or 'window', got {source!r}")
        kernels = [k for k in kernels]
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._write() as c:
            cur = c.execute(
                "INSERT INTO runs(created, source, label, adapter, driver, is_software, adapter_json, method, "
                "config_json, timestamp_period_ns) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (created, source, label, str(adapter.get("name", "")), str(adapter.get("driver", "")),
                 int(bool(adapter.get("is_software"))), _dumps(adapter), method,
                 None if config is None else _dumps(config), timestamp_period_ns))
            run_id = int(cur.lastrowid)
            for pos, k in enumerate(kernels):
                s = _finite_samples(k.samples_us)
                a = np.asarray(s, np.float64)
                c.execute(
                    "INSERT INTO kernels(run_id, position, shape_key, shape_json, name, variant, method, role, impl, "
                    "source_hash, timing_method, bytes, runs, median_us, p10_us, p90_us, min_us, samples_json, "
                    "warmup_runs) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, pos, shape_key(k.shape), _dumps(k.shape), k.name, k.variant or "", k.method, k.role,
                     k.impl, k.source_hash, k.timing_method, int(k.bytes), len(s), float(np.median(a)),
                     float(np.percentile(a, 10)), float(np.percentile(a, 90)), float(a.min()), _dumps(list(s)),
                     int(k.warmup_runs)))
        return run_id

    def record_bench(self, result: dict, label: str = "") -> int:
        """A `kvviz bench` result (run_bench's dict): every row that was timed."""
        kernels = [kernel_from_row(r) for r in result.get("rows", []) if r.get("samples_us")]
        config = {k: result.get(k) for k in ("runs", "warmup") if k in result}
        return self.record("bench", result.get("adapter") or {}, kernels, config=config, label=label,
                           timestamp_period_ns=result.get("timestamp_period_ns"))

    def record_results(self, res, label: str = "") -> int:
        """A window run (kvviz.analysis.session.Results): every timed kernel with its samples."""
        cfg = res.config
        lens = [int(x) for x in res.batch.context_lens]
        shape = {"num_seqs": len(lens), "context_lens": lens if len(set(lens)) > 1 else lens[0],
                 "num_tokens": int(sum(lens)), "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads,
                 "head_size": cfg.head_size, "block_size": cfg.block_size}
        kernels = []
        for t in res.timings:
            tm = t.timing
            kernels.append(KernelRecord(
                name=t.kernel, variant=t.variant, samples_us=tuple(tm.samples_us), timing_method=tm.method,
                shape=shape, method=res.method.id if t.variant == res.method.label else None,
                role=getattr(t, "role", None), impl=getattr(t, "impl", None), source_hash=tm.source_hash,
                bytes=int(t.bytes_moved), warmup_runs=int(getattr(tm, "warmup_runs", 0))))
        return self.record("window", res.adapter.to_json(), kernels, method=res.method.id, config=cfg.to_json(),
                           label=label)

    def pin(self, run_id: int) -> None:
        """Make `run_id` the baseline (the previous one is unpinned in the same transaction)."""
        with self._write() as c:
            if not c.execute("SELECT 1 FROM runs WHERE id=?", (int(run_id),)).fetchone():
                raise HistoryError(f"no run {run_id} in {self.path}", "See `kvviz runs list`.")
            c.execute("UPDATE runs SET baseline=0 WHERE baseline=1")
            c.execute("UPDATE runs SET baseline=1 WHERE id=?", (int(run_id),))

    def unpin(self) -> None:
        with self._write() as c:
            c.execute("UPDATE runs SET baseline=0 WHERE baseline=1")

    # ------------------------------------------------------------------ reading
    def runs(self, limit: int | None = None, source: str | None = None) -> list[Run]:
        """The runs, newest first, without their samples."""
        q = ("SELECT r.id, r.created, r.source, r.label, r.adapter_json, r.method, r.config_json, r.baseline, "
             "(SELECT COUNT(*) FROM kernels k WHERE k.run_id = r.id) FROM runs r")
        args: list = []
        if source:
            q += " WHERE r.source = ?"
            args.append(source)
        q += " ORDER BY r.id DESC"
        if limit is not None:
            q += " LIMIT ?"
            args.append(int(limit))
        rows = self._conn.execute(q, args).fetchall()
        shapes: dict = {}
        if rows:
            lo, hi = min(r[0] for r in rows), max(r[0] for r in rows)
            for rid, sj in self._conn.execute(
                    "SELECT run_id, shape_json FROM kernels WHERE run_id BETWEEN ? AND ? GROUP BY run_id, shape_key "
                    "ORDER BY run_id, MIN(position)", (lo, hi)):
                shapes.setdefault(rid, []).append(shape_label(json.loads(sj)))
        return [Run(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5], json.loads(row[6]) if row[6] else None,
                    bool(row[7]), (), int(row[8]), tuple(shapes.get(row[0], ()))) for row in rows]

    def run(self, run_id: int) -> Run:
        """One run with every kernel and its samples; HistoryError when there is no such run."""
        row = self._conn.execute(
            "SELECT id, created, source, label, adapter_json, method, config_json, baseline FROM runs WHERE id=?",
            (int(run_id),)).fetchone()
        if row is None:
            ids = self._conn.execute("SELECT MIN(id), MAX(id), COUNT(*) FROM runs").fetchone()
            have = f"runs {ids[0]}..{ids[1]}" if ids[2] else "no runs yet"
            raise HistoryError(f"no run {run_id} in {self.path} ({have})", "See `kvviz runs list`.")
        kernels = []
        for k in self._conn.execute(
                "SELECT name, variant, samples_json, timing_method, shape_json, method, role, impl, source_hash, "
                "bytes, warmup_runs FROM kernels WHERE run_id=? ORDER BY position", (row[0],)):
            kernels.append(KernelRecord(k[0], k[1], tuple(json.loads(k[2])), k[3], json.loads(k[4]), k[5], k[6], k[7],
                                        k[8], int(k[9]), int(k[10])))
        shapes = tuple(dict.fromkeys(shape_label(k.shape) for k in kernels))
        return Run(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5], json.loads(row[6]) if row[6] else None,
                   bool(row[7]), tuple(kernels), len(kernels), shapes)

    def baseline(self) -> Run | None:
        row = self._conn.execute("SELECT id FROM runs WHERE baseline=1").fetchone()
        return self.run(row[0]) if row else None

    def kernel_series(self, name: str, variant: str, key: str, limit: int = 200) -> list[tuple[int, float, float, float]]:
        """(run id, p10, median, p90) of one kernel on one shape over the runs, oldest first."""
        rows = self._conn.execute(
            "SELECT run_id, p10_us, median_us, p90_us FROM kernels WHERE name=? AND variant=? AND shape_key=? "
            "ORDER BY run_id DESC LIMIT ?", (name, variant, key, int(limit))).fetchall()
        return [(int(a), float(b), float(c), float(d)) for a, b, c, d in reversed(rows)]


def kernel_from_row(r: dict) -> KernelRecord:
    """A bench JSON row (kvviz.bench._row) as a KernelRecord."""
    return KernelRecord(
        name=str(r["kernel"]), variant=str(r.get("variant") or ""), samples_us=_finite_samples(r["samples_us"]),
        timing_method=str(r.get("timing_method") or ""), shape=dict(r.get("shape") or {}), method=r.get("method"),
        role=r.get("role"), impl=r.get("impl"), source_hash=r.get("source_hash"), bytes=int(r.get("bytes_moved") or 0),
        warmup_runs=int(r.get("warmup_runs") or 0))


def _dumps(v) -> str:
    return json.dumps(clean(v), allow_nan=False, sort_keys=True)


def record_bench_result(result: dict, path=None) -> tuple[int, Path]:
    """Record a bench result in the history at `path` (default: the user's); (run id, db path)."""
    with HistoryDB(path) as db:
        return db.record_bench(result), db.path
