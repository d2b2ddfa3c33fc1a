"""The run history: every `kvviz bench` and every window run, kept in SQLite across sessions.

Qt-free. The database is `runs.sqlite3` in the user's data directory: `$KVVIZ_DATA_DIR` when set (the
tests point it at a temporary folder), else `$XDG_DATA_HOME/kvviz`, else `~/.local/share/kvviz`.

Schema (version `SCHEMA_VERSION`, kept in the `meta` table):
  runs     one row per run: when, where from (bench / window), what kind of run (`KINDS`), its name
           (`label`), adapter, driver, the method of a window run, its config, whether it is the pinned
           baseline (at most one run is), the headline numbers of a window run and what else it showed
           (`extra_json`: compare rows, sweep points), the file of its stored results (`snapshot`)
  kernels  one row per timed kernel of a run: shape, name, variant, method, role, impl, the hash of its
           shader source as compiled, timing method, bytes moved, the samples (a JSON array, us)
  quality  (version 2) one row per method and part of a `kvviz eval` run (source 'eval'): its headline
           statistics as columns and the whole row as JSON; the run's config_json holds the model, text,
           chunking and baseline, so a stored eval is shown again without computing
Only runs worth keeping are recorded: `kvviz bench` (kind "bench", its sweeps "sweep"), and in the window a
Run (F5), a pin, a sweep and a method comparison, and `kvviz eval` (kind "eval"). Window runs recorded before kinds existed (every automatic
recompute was) are kind "auto" and hidden from listings unless asked for. A window run's results are kept
beside the database (snapshots/run-<id>.npz, kvviz.analysis.snapshot) so it reopens without a recompute;
deleting the run deletes the file.

A run is written in one transaction (BEGIN IMMEDIATE ... COMMIT) with synchronous=FULL in WAL mode:
a crash part-way loses that run only, never one already committed. A database written by a newer
kvviz (a higher schema version) is refused with a message, never altered; older versions are
migrated in place, in a transaction, by the steps in `MIGRATIONS`.

Damage is refused, never written over: a file SQLite finds malformed is a HistoryError naming it and
what to do, and a connection's first write is preceded by `PRAGMA quick_check`. A run whose stored
JSON (samples, shape, adapter, config) does not parse is skipped by `runs()` (named in `damaged`)
and refused by `run()`. `HistoryDB(readonly=True)` (what `kvviz runs list|show` and `kvviz diff`
use) opens the file with SQLite's mode=ro and writes nothing, not even a missing file; a history
whose file or folder cannot be written is opened read-only too, and a write to it says so.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvviz.analysis.snapshot import load_results, save_results
from kvviz.errors import InvalidInput
from kvviz.history.numbers import headline_numbers
from kvviz.tables import clean

SCHEMA_VERSION = 2
SOURCES = ("bench", "window", "eval")
DB_NAME = "runs.sqlite3"
SNAPSHOT_DIR = "snapshots"
# what a run is: a window Run (or a pin of the results shown), a timing sweep, a method comparison, a bench; "auto":
# a window recompute recorded before kinds existed (hidden unless asked for)
KINDS = ("run", "sweep", "compare", "bench", "eval", "auto")
HIDDEN_KINDS = ("auto",)
ENV_DIR = "KVVIZ_DATA_DIR"


class HistoryError(InvalidInput):
    """The run history cannot be opened, read or written (a newer schema, not a database, damaged, read-only,
    no such run)."""

    hint = f"Point {ENV_DIR} at another folder to keep a separate history."


def _error_kind(exc: sqlite3.Error) -> str:
    """'damaged', 'not a database', 'read-only' or '' for an SQLite error (by its code where Python gives it)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc).lower()
    if name.startswith("SQLITE_CORRUPT") or "malformed" in text:
        return "damaged"
    if name.startswith("SQLITE_NOTADB") or "not a database" in text:
        return "not a database"
    if name.startswith("SQLITE_READONLY") or "readonly" in text:
        return "read-only"
    return ""


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


def _v2(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT ''")
    # every window run of version 1 was recorded by a compute, explicit or not: tagged auto (hidden by default)
    conn.execute("UPDATE runs SET kind = CASE source WHEN 'bench' THEN 'bench' ELSE 'auto' END")
    conn.execute("ALTER TABLE runs ADD COLUMN extra_json TEXT")
    conn.execute("ALTER TABLE runs ADD COLUMN snapshot TEXT")
    conn.execute("""
        CREATE TABLE quality (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            spec TEXT NOT NULL,               -- the method as given (`kvviz eval --methods` item)
            part TEXT NOT NULL,               -- 'kv' | 'k' | 'v'
            layer INTEGER,                    -- the one layer quantised (NULL: every layer)
            scored INTEGER,                   -- scored positions (NULL: the pass failed)
            bits_per_element REAL,
            ppl REAL,
            kld_mean REAL,
            kld_err REAL,
            same_top REAL,
            same_top_err REAL,
            row_json TEXT NOT NULL
        )""")
    conn.execute("CREATE INDEX quality_run ON quality(run_id, position)")


# version reached -> step from the version below; a new schema appends a step, never edits one
MIGRATIONS = {1: _v1, 2: _v2}


def _create(conn: sqlite3.Connection, have: int) -> None:
    """Bring the tables from schema version `have` (0: none) to SCHEMA_VERSION (inside the caller's transaction)."""
    if have == 0:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for v in range(have + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[v](conn)
    conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))


def _empty_history() -> sqlite3.Connection:
    """An empty history in memory: what a read-only open of a missing or empty file reads."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    _create(conn, 0)
    return conn


def shape_key(shape: dict) -> str:
    return json.dumps({k: v for k, v in sorted((shape or {}).items()) if k != "name"}, sort_keys=True, allow_nan=False)


def shape_label(shape: dict) -> str:
    """'quick-ragged: 4 seqs 37..300 tok, 8/2 heads, d128, blk16' (the name only when there is one)."""
    s = shape or {}
    if "m" in s and "k" in s:  # a GEMM row of kvviz bench --gemm
        dims = f"{s.get('m')} x {s.get('n')} x {s.get('k')} (M x N x K)"
        return f"{s['name']}: {dims}" if s.get("name") else dims
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
    kind: str = ""  # KINDS
    extra: dict | None = None  # the headline numbers of a window run ("numbers"), compare rows, sweep points
    snapshot: str | None = None  # the stored results' file, relative to the history's folder

    @property
    def adapter_name(self) -> str:
        return str(self.adapter.get("name", ""))

    @property
    def name(self) -> str:
        return self.label

    @property
    def numbers(self) -> dict:
        """The headline numbers of a window run (kvviz.history.db.headline_numbers), {} for others."""
        return dict((self.extra or {}).get("numbers") or {})

    def describe(self) -> str:
        what = self.method or ", ".join(self.shapes[:2]) + (" ..." if len(self.shapes) > 2 else "")
        named = f" '{self.label}'" if self.label else ""
        return (f"run {self.id}{named} ({self.kind or self.source}, {self.created}, {self.adapter_name}"
                f"{', ' + what if what else ''})")

    def medians(self) -> dict:
        """{"kernel [variant]": median us} of the kernels (the window's pin)."""
        return {k.key: k.median_us for k in self.kernels}

    def to_json(self, samples: bool = True) -> dict:
        d = {
            "id": self.id, "created": self.created, "source": self.source, "label": self.label,
            "adapter": self.adapter, "method": self.method, "config": self.config, "baseline": self.baseline,
            "kernel_count": self.kernel_count, "shapes": list(self.shapes), "kind": self.kind, "name": self.label,
            "numbers": self.numbers, "stored_results": bool(self.snapshot),
        }
        if samples:
            d["kernels"] = [k.to_json() for k in self.kernels]
        return d


class _Damaged(ValueError):
    """A stored value of a run that does not parse (what is damaged, and why)."""


def _stored(text, what: str, kind: type):
    """The JSON value of a stored column (`what` names it), of type `kind`, or _Damaged saying what is wrong."""
    try:
        v = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise _Damaged(f"{what} is not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(v, kind):
        raise _Damaged(f"{what} is not a JSON {'array' if kind is list else 'object'}")
    return v


def _stored_samples(text) -> tuple:
    v = _stored(text, "a kernel's samples_json", list)
    if not v or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v):
        raise _Damaged("a kernel's samples_json is not an array of finite numbers")
    return tuple(float(x) for x in v)


def _finite_samples(samples) -> tuple:
    out = tuple(float(x) for x in samples)
    if not out or not all(math.isfinite(x) for x in out):
        raise InvalidInput(f"a timed kernel needs finite samples, got {list(out)[:5]}")
    return out


class HistoryDB:
    """The run history in one SQLite file. Use from one thread (each thread opens its own).

    readonly=True opens it for reading only (SQLite mode=ro): nothing is created or written, a missing
    file reads as an empty history. Opened for writing, a history whose file or folder cannot be written
    is opened read-only as well (`readonly` is then True and `readonly_why` says why); its writes raise
    HistoryError saying so."""

    def __init__(self, path=None, *, readonly: bool = False):
        self.path = Path(path) if path is not None else default_path()
        self.readonly = bool(readonly)
        self.readonly_why = "opened for reading only" if readonly else ""
        self.damaged: dict[int, str] = {}  # run id -> what is damaged, of the runs the last runs() skipped
        self._intact = False  # passed PRAGMA quick_check on this connection (done before its first write)
        self._conn = None
        if readonly:
            self._open_readonly()
            return
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
            self._conn.execute("PRAGMA synchronous = FULL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            if _error_kind(exc) != "read-only":
                raise self._error(exc) from None
            # the file or its folder cannot be written (a WAL file needs its folder for the -shm file): read it,
            # and say so when a write is asked
            self.readonly, self.readonly_why = True, str(exc)
            self._open_readonly()
        except HistoryError:
            self._conn.close()
            raise

    def _open_readonly(self) -> None:
        """Open the file with SQLite's mode=ro; where the folder cannot be written (a WAL file's readers need
        its -shm file), as immutable (no locks, no -shm), unless a write-ahead log waits there to be read."""
        if not self.path.exists():
            self._conn = _empty_history()
            return
        uri = self.path.absolute().as_uri()
        for mode in ("?mode=ro", "?mode=ro&immutable=1"):
            try:
                self._conn = sqlite3.connect(uri + mode, uri=True, timeout=10.0, isolation_level=None)
            except sqlite3.Error as exc:
                raise HistoryError(f"cannot open the run history {self.path}: {exc}") from None
            try:
                self._conn.execute("PRAGMA foreign_keys = ON")
                self._migrate()
                return
            except sqlite3.DatabaseError as exc:
                self._conn.close()
                wal = Path(str(self.path) + "-wal")
                if _error_kind(exc) != "read-only" or "immutable" in mode:
                    raise self._error(exc) from None
                if wal.exists() and wal.stat().st_size:
                    raise HistoryError(
                        f"cannot read the run history {self.path}: its folder cannot be written ({exc}), and its "
                        f"write-ahead log {wal.name} holds runs that SQLite reads only with the folder writable",
                        f"Make {self.path.parent} writable for a moment, or point {ENV_DIR} at another folder.",
                    ) from None
            except HistoryError:
                self._conn.close()
                raise

    def _error(self, exc: sqlite3.Error, doing: str = "read") -> HistoryError:
        """An SQLite error as a HistoryError that says what is wrong with the file and what to do."""
        kind = _error_kind(exc)
        p = self.path
        if kind == "damaged":
            return self._damaged_error(str(exc))
        if kind == "not a database":
            return HistoryError(f"{p} is not a kvviz run history ({exc})")
        if kind == "read-only" and doing != "read":
            return self._readonly_error(doing, str(exc))
        return HistoryError(f"cannot {'read' if doing == 'read' else 'write'} the run history {p}: {exc}")

    def _damaged_error(self, why: str) -> HistoryError:
        p = self.path
        return HistoryError(f"the run history {p} is damaged ({why}); kvviz did not write to it",
                            f"Move it aside with its -wal and -shm files (mv {p} {p}.damaged): kvviz then starts a new "
                            f"history there; `sqlite3 {p} .recover` may save the runs it still holds.")

    def _readonly_error(self, doing: str, why: str) -> HistoryError:
        return HistoryError(f"cannot {doing}: the run history {self.path} is read-only ({why}); nothing was written",
                            f"Make {self.path.name} and its folder {self.path.parent} writable, or point {ENV_DIR} "
                            "at a writable folder.")

    @contextlib.contextmanager
    def _reading(self):
        """Reads: an SQLite error (a damaged file, a lock held too long) comes out as HistoryError."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

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
        if self.readonly:
            if have == 0:  # an empty SQLite file: an empty history, read from memory
                self._conn.close()
                self._conn = _empty_history()
                return
            raise self._readonly_error(f"migrate it from schema version {have} to {SCHEMA_VERSION}", self.readonly_why)
        with self._write("create the history's tables"):
            have = self.schema_version()  # another process may have migrated meanwhile
            _create(self._conn, have)

    class _Tx:
        def __init__(self, db, doing):
            self.db, self.conn, self.doing = db, db._conn, doing

        def __enter__(self):
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # locked by another writer past the timeout, read-only
                raise self.db._error(exc, self.doing) from None
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
                if _error_kind(ev):
                    raise self.db._error(ev, self.doing) from None
                raise HistoryError(
                    f"writing the run history {self.db.path} failed, nothing of it was kept: {ev}") from None
            return False

    def _write(self, doing: str):
        """A write transaction: committed as a whole when the block ends, rolled back on an error (an
        SQLite error comes out as HistoryError). Refused on a read-only history, and on a damaged one: the
        file is checked (PRAGMA quick_check) before the connection's first write, and WAL mode is set."""
        if self.readonly:
            raise self._readonly_error(doing, self.readonly_why)
        if not self._intact:
            try:
                problems = [r[0] for r in self._conn.execute("PRAGMA quick_check").fetchall()]
                if problems != ["ok"]:
                    raise self._damaged_error(problems[0])
                if self._conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    self._conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.DatabaseError as exc:
                raise self._error(exc, doing) from None
            self._intact = True
        return HistoryDB._Tx(self, doing)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ writing
    def record(self, source: str, adapter: dict, kernels, *, method: str | None = None, config: dict | None = None,
               label: str = "", timestamp_period_ns: float | None = None, kind: str | None = None,
               extra: dict | None = None, results=None) -> int:
        """Store one run and its kernels in one transaction; returns the run id. `kind` (KINDS) defaults to
        "bench" for a bench and "run" for the window; `results` (a Results) are kept beside the database
        (kvviz.analysis.snapshot) so the run reopens without a recompute."""
        if source not in SOURCES:
            raise InvalidInput(f"a run's source is one of {', '.join(SOURCES)}, got {source!r}")
        kind = kind or ("bench" if source == "bench" else "run")
        if kind not in KINDS:
            raise InvalidInput(f"a run's kind is one of {', '.join(KINDS)}, got {kind!r}")
        kernels = [k for k in kernels]
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._write("record the run") as c:
            cur = c.execute(
                "INSERT INTO runs(created, source, label, adapter, driver, is_software, adapter_json, method, "
                "config_json, timestamp_period_ns, kind, extra_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (created, source, label, str(adapter.get("name", "")), str(adapter.get("driver", "")),
                 int(bool(adapter.get("is_software"))), _dumps(adapter), method,
                 None if config is None else _dumps(config), timestamp_period_ns, kind,
                 None if extra is None else _dumps(extra)))
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
            if results is not None:  # written inside the transaction: a run never points at a file that is not there
                snap = self.path.parent / f"{SNAPSHOT_DIR}/run-{run_id}.npz"
                try:
                    save_results(results, snap)
                except OSError as exc:
                    raise HistoryError(f"cannot keep the results of the run in {snap.parent}: {exc.strerror or exc}; "
                                       "nothing was recorded") from None
                c.execute("UPDATE runs SET snapshot=? WHERE id=?", (f"{SNAPSHOT_DIR}/{snap.name}", run_id))
        return run_id

    def record_bench(self, result: dict, label: str = "", kind: str = "bench") -> int:
        """A `kvviz bench` result (run_bench's dict, or a sweep's rows as "rows"): every row that was timed."""
        kernels = [kernel_from_row(r) for r in result.get("rows", []) if r.get("samples_us")]
        config = {k: result.get(k) for k in ("runs", "warmup", "param", "values") if k in result}
        return self.record("bench", result.get("adapter") or {}, kernels, config=config, label=label,
                           timestamp_period_ns=result.get("timestamp_period_ns"), kind=kind)

    def record_results(self, res, label: str = "", kind: str = "run", extra: dict | None = None,
                       keep_results: bool = True) -> int:
        """A window run (kvviz.analysis.session.Results): every timed kernel with its samples (not for a
        comparison: its kernels are those of the run it compared on), its headline numbers
        (kvviz.history.numbers) and, with keep_results, its results (to reopen it)."""
        cfg = res.config
        shape = results_shape(res)
        kernels = []
        for t in (res.timings if kind != "compare" else ()):
            tm = t.timing
            kernels.append(KernelRecord(
                name=t.kernel, variant=t.variant, samples_us=tuple(tm.samples_us), timing_method=tm.method,
                shape=shape, method=res.method.id if t.variant == res.method.label else None,
                role=getattr(t, "role", None), impl=getattr(t, "impl", None), source_hash=tm.source_hash,
                bytes=int(t.bytes_moved), warmup_runs=int(getattr(tm, "warmup_runs", 0))))
        extra = dict(extra or {})
        extra["numbers"] = headline_numbers(res)
        return self.record("window", res.adapter.to_json(), kernels, method=res.method.id, config=cfg.to_json(),
                           label=label, kind=kind, extra=extra, results=res if keep_results else None)

    def record_sweep(self, res_like, points: list, label: str = "") -> int:
        """A window timing sweep (Session.sweep's points) of the config of `res_like` (a Results): every point's
        baseline and method kernels with their samples, on the point's shape; the points are kept to redraw it."""
        cfg = res_like.config
        kernels = []
        for p in points:
            lens = [int(p["value"])] * len(cfg.context_lens) if p["param"] == "context" else \
                [int(cfg.context_lens[0])] * int(p["value"])
            shape = {"num_seqs": len(lens), "context_lens": lens[0], "num_tokens": int(sum(lens)),
                     "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_size": cfg.head_size,
                     "block_size": cfg.block_size, "name": f"{p['param']}={p['value']}"}
            if p.get("baseline_samples_us"):
                kernels.append(KernelRecord("paged_attn_f32", "f32 baseline", tuple(p["baseline_samples_us"]),
                                            p.get("baseline_timing_method") or "", shape, None, "decode", "baseline",
                                            bytes=int(p.get("baseline_bytes") or 0)))
            for name, k in p.get("method_kernels", {}).items():
                if k.get("samples_us"):
                    kernels.append(KernelRecord(name, res_like.method.label, tuple(k["samples_us"]),
                                                k.get("timing_method") or "", shape, cfg.method,
                                                k.get("role"), k.get("impl"), bytes=int(k.get("bytes") or 0)))
        return self.record("window", res_like.adapter.to_json(), kernels, method=res_like.method.id,
                           config=cfg.to_json(), label=label, kind="sweep", extra={"sweep_points": points})

    def rename(self, run_id: int, name: str) -> None:
        """Name a run ("" takes its name away)."""
        name = " ".join(str(name).split())
        if len(name) > 200:
            raise InvalidInput(f"a run's name has at most 200 characters, got {len(name)}")
        with self._write(f"name run {run_id}") as c:
            if not c.execute("SELECT 1 FROM runs WHERE id=?", (int(run_id),)).fetchone():
                raise HistoryError(f"no run {run_id} in {self.path}", "See `kvviz runs list`.")
            c.execute("UPDATE runs SET label=? WHERE id=?", (name, int(run_id)))

    def delete(self, run_ids) -> list[int]:
        """Delete runs (their kernels and stored results too); the ids deleted. An id that is not there is refused
        before anything is deleted."""
        ids = sorted({int(i) for i in run_ids})
        if not ids:
            return []
        with self._write(f"delete run(s) {', '.join(map(str, ids))}") as c:
            q = ",".join("?" * len(ids))
            have = {r[0]: r[1] for r in c.execute(f"SELECT id, snapshot FROM runs WHERE id IN ({q})", ids)}
            missing = [i for i in ids if i not in have]
            if missing:
                raise HistoryError(f"no run {', '.join(map(str, missing))} in {self.path}; nothing was deleted",
                                   "See `kvviz runs list --all`.")
            c.execute(f"DELETE FROM kernels WHERE run_id IN ({q})", ids)
            c.execute(f"DELETE FROM quality WHERE run_id IN ({q})", ids)
            c.execute(f"DELETE FROM runs WHERE id IN ({q})", ids)
        for snap in have.values():  # after the commit: a file left by a failed unlink is only disk space
            if snap:
                with contextlib.suppress(OSError):
                    (self.path.parent / snap).unlink()
        return ids

    def delete_kind(self, kind: str) -> list[int]:
        """Delete every run of a kind (e.g. the hidden "auto" runs of an older kvviz)."""
        if kind not in KINDS:
            raise InvalidInput(f"a run's kind is one of {', '.join(KINDS)}, got {kind!r}")
        with self._reading():
            ids = [r[0] for r in self._conn.execute("SELECT id FROM runs WHERE kind=?", (kind,))]
        return self.delete(ids)

    def snapshot_path(self, run: "Run") -> Path | None:
        return self.path.parent / run.snapshot if run.snapshot else None

    def load_results(self, run_id: int):
        """(Results, extra) of a run as it was computed (its stored results); HistoryError when it has none."""
        run = self.run(run_id)
        p = self.snapshot_path(run)
        if p is None:
            raise HistoryError(f"run {run_id} has no stored results ({run.kind or run.source} run)",
                               "Window runs (Run, a pin, a comparison) keep their results; bench runs keep timings "
                               "only, shown in the History tab.")
        res, _ = load_results(p, stored_as=f"run {run.id}" + (f" '{run.label}'" if run.label else ""))
        return res, dict(run.extra or {})

    def record_eval(self, result: dict, label: str = "") -> int:
        """A `kvviz eval` result (kvviz.quality.evaluate): a run of source 'eval' whose config holds everything
        but the rows, and one quality row per method row and per single-layer row, in one transaction."""
        rows = [dict(r) for r in result.get("rows", [])] + [dict(r, part="kv") for r in result.get("layers", [])]
        config = {k: v for k, v in result.items() if k not in ("rows", "layers")}
        adapter = {"name": str(result.get("adapter", ""))}
        method = ",".join(dict.fromkeys(r["spec"] for r in result.get("rows", [])))
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._write("record the eval") as c:
            cur = c.execute(
                "INSERT INTO runs(created, source, kind, label, adapter, driver, is_software, adapter_json, method, "
                "config_json) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (created, "eval", "eval", label, adapter["name"], "", 0, _dumps(adapter), method or None, _dumps(config)))
            run_id = int(cur.lastrowid)
            for pos, r in enumerate(rows):
                c.execute(
                    "INSERT INTO quality(run_id, position, spec, part, layer, scored, bits_per_element, ppl, kld_mean, "
                    "kld_err, same_top, same_top_err, row_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, pos, str(r.get("spec", "")), str(r.get("part", "kv")), r.get("layer"),
                     r.get("scored_positions"), *(clean(r.get(k)) for k in ("bits_per_element", "ppl", "kld_mean",
                                                                              "kld_err", "same_top", "same_top_err")),
                     _dumps(r)))
        return run_id

    def eval_result(self, run_id: int) -> dict:
        """A stored eval as the dict `kvviz eval` wrote (rows and single-layer rows back in their places);
        HistoryError when the run is not an eval or its stored JSON does not parse."""
        run = self.run(run_id)
        if run.source != "eval":
            raise HistoryError(f"run {run_id} is a {run.source} run, not an eval", "`kvviz runs list` shows the source.")
        with self._reading():
            stored = self._conn.execute("SELECT row_json, layer FROM quality WHERE run_id=? ORDER BY position",
                                        (int(run_id),)).fetchall()
        result = dict(run.config or {}, rows=[], layers=[], history_run_id=run.id, created=run.created)
        try:
            for text, layer in stored:
                r = _stored(text, "a quality row_json", dict)
                (result["rows"] if layer is None else result["layers"]).append(r)
        except _Damaged as exc:
            raise HistoryError(f"run {run_id} in {self.path} is damaged: {exc}; it cannot be shown") from None
        return result

    def pin(self, run_id: int) -> None:
        """Make `run_id` the baseline (the previous one is unpinned in the same transaction); a damaged run
        (its stored JSON unreadable) is refused."""
        run = self.run(run_id)  # HistoryError when there is no such run or it is damaged
        if run.source == "eval":
            raise HistoryError(f"run {run_id} is an eval: it has no kernel timings to compare runs with",
                               "Pin a bench or window run.")
        with self._write(f"pin run {run_id}") as c:
            if not c.execute("SELECT 1 FROM runs WHERE id=?", (int(run_id),)).fetchone():
                raise HistoryError(f"no run {run_id} in {self.path}", "See `kvviz runs list`.")
            c.execute("UPDATE runs SET baseline=0 WHERE baseline=1")
            c.execute("UPDATE runs SET baseline=1 WHERE id=?", (int(run_id),))

    def unpin(self) -> None:
        with self._write("unpin the baseline") as c:
            c.execute("UPDATE runs SET baseline=0 WHERE baseline=1")

    # ------------------------------------------------------------------ reading
    def runs(self, limit: int | None = None, source: str | None = None, kinds=None, text: str = "",
             hidden: bool = False) -> list[Run]:
        """The runs, newest first, without their samples: of `source`, of `kinds` (default: every kind but
        HIDDEN_KINDS unless `hidden`), whose name or method contains `text` (any case). A run whose stored JSON
        does not parse (its adapter, config, a kernel's shape or samples) is skipped and named in `self.damaged`."""
        q = ("SELECT r.id, r.created, r.source, r.label, r.adapter_json, r.method, r.config_json, r.baseline, "
             "(SELECT COUNT(*) FROM kernels k WHERE k.run_id = r.id), r.kind, r.extra_json, r.snapshot FROM runs r")
        where, args = [], []
        if source:
            where.append("r.source = ?")
            args.append(source)
        if kinds:
            kinds = list(kinds)
            where.append(f"r.kind IN ({','.join('?' * len(kinds))})")
            args += kinds
        elif not hidden:
            where.append(f"r.kind NOT IN ({','.join('?' * len(HIDDEN_KINDS))})")
            args += list(HIDDEN_KINDS)
        if text:
            where.append("(instr(lower(r.label), ?) > 0 OR instr(lower(COALESCE(r.method, '')), ?) > 0)")
            args += [text.lower(), text.lower()]
        if where:
            q += " WHERE " + " AND ".join(where)
        q += " ORDER BY r.id DESC"
        if limit is not None:
            q += " LIMIT ?"
            args.append(int(limit))
        damaged: dict[int, str] = {}
        shapes: dict = {}
        with self._reading():
            rows = self._conn.execute(q, args).fetchall()
            if rows:
                lo, hi = min(r[0] for r in rows), max(r[0] for r in rows)
                for rid, sj in self._conn.execute(
                        "SELECT run_id, shape_json FROM kernels WHERE run_id BETWEEN ? AND ? GROUP BY run_id, "
                        "shape_key ORDER BY run_id, MIN(position)", (lo, hi)):
                    try:
                        shapes.setdefault(rid, []).append(shape_label(_stored(sj, "a kernel's shape_json", dict)))
                    except _Damaged as exc:
                        damaged.setdefault(rid, str(exc))
                damaged = {**self._damaged_kernels(lo, hi), **damaged}
        out = []
        for row in rows:
            try:
                adapter = _stored(row[4], "its adapter_json", dict)
                config = _stored(row[6], "its config_json", dict) if row[6] else None
                extra = _stored(row[10], "its extra_json", dict) if row[10] else None
            except _Damaged as exc:
                damaged.setdefault(row[0], str(exc))
                continue
            if row[0] not in damaged:
                out.append(Run(row[0], row[1], row[2], row[3], adapter, row[5], config, bool(row[7]), (), int(row[8]),
                               tuple(shapes.get(row[0], ())), row[9], extra, row[11]))
        self.damaged = dict(sorted(damaged.items(), reverse=True))
        return out

    def _damaged_kernels(self, lo: int, hi: int) -> dict[int, str]:
        """{run id: why} of the runs lo..hi with a kernel whose samples are not a JSON array or whose shape is not
        a JSON object (checked by SQLite's JSON functions, the samples are not parsed in Python to list the runs;
        an SQLite without them checks nothing here, and `run()` still refuses a damaged run)."""
        try:
            bad = self._conn.execute(
                "SELECT run_id, MAX(CASE WHEN json_valid(samples_json) THEN json_type(samples_json) != 'array' "
                "ELSE 1 END) AS s, MAX(CASE WHEN json_valid(shape_json) THEN json_type(shape_json) != 'object' "
                "ELSE 1 END) AS h FROM kernels WHERE run_id BETWEEN ? AND ? GROUP BY run_id HAVING s OR h",
                (lo, hi)).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such function" in str(exc):
                return {}
            raise
        why = ("a kernel's shape_json is not a valid JSON object", "a kernel's samples_json is not a valid JSON array")
        return {int(rid): why[bool(s)] for rid, s, _h in bad}

    def run(self, run_id: int) -> Run:
        """One run with every kernel and its samples; HistoryError when there is no such run, or when its stored
        JSON does not parse (the run is damaged)."""
        with self._reading():
            row = self._conn.execute(
                "SELECT id, created, source, label, adapter_json, method, config_json, baseline, kind, extra_json, "
                "snapshot FROM runs WHERE id=?", (int(run_id),)).fetchone()
            if row is None:
                ids = self._conn.execute("SELECT MIN(id), MAX(id), COUNT(*) FROM runs").fetchone()
                have = f"runs {ids[0]}..{ids[1]}" if ids[2] else "no runs yet"
                raise HistoryError(f"no run {run_id} in {self.path} ({have})", "See `kvviz runs list`.")
            stored = self._conn.execute(
                "SELECT name, variant, samples_json, timing_method, shape_json, method, role, impl, source_hash, "
                "bytes, warmup_runs FROM kernels WHERE run_id=? ORDER BY position", (row[0],)).fetchall()
        try:
            adapter = _stored(row[4], "its adapter_json", dict)
            config = _stored(row[6], "its config_json", dict) if row[6] else None
            extra = _stored(row[9], "its extra_json", dict) if row[9] else None
            kernels = []
            for k in stored:
                shape = _stored(k[4], "a kernel's shape_json", dict)
                kernels.append(KernelRecord(k[0], k[1], _stored_samples(k[2]), k[3], shape, k[5], k[6], k[7], k[8],
                                            int(k[9]), int(k[10])))
        except _Damaged as exc:
            raise HistoryError(f"run {run_id} in {self.path} is damaged: {exc}; it cannot be shown, compared or pinned",
                               "The other runs are intact: `kvviz runs list` lists them.") from None
        shapes = tuple(dict.fromkeys(shape_label(k.shape) for k in kernels))
        return Run(row[0], row[1], row[2], row[3], adapter, row[5], config, bool(row[7]), tuple(kernels), len(kernels),
                   shapes, row[8], extra, row[10])

    def baseline_id(self) -> int | None:
        with self._reading():
            row = self._conn.execute("SELECT id FROM runs WHERE baseline=1").fetchone()
        return int(row[0]) if row else None

    def baseline(self) -> Run | None:
        rid = self.baseline_id()
        return self.run(rid) if rid is not None else None

    def kernel_series(self, name: str, variant: str, key: str, limit: int = 200) -> list[tuple[int, float, float, float]]:
        """(run id, p10, median, p90) of one kernel on one shape over the runs, oldest first."""
        with self._reading():
            rows = self._conn.execute(
                "SELECT run_id, p10_us, median_us, p90_us FROM kernels WHERE name=? AND variant=? AND shape_key=? "
                "ORDER BY run_id DESC LIMIT ?", (name, variant, key, int(limit))).fetchall()
        return [(int(a), float(b), float(c), float(d)) for a, b, c, d in reversed(rows)]


def results_shape(res) -> dict:
    """The shape a window run's kernels were timed on (the history's shape key)."""
    cfg = res.config
    lens = [int(x) for x in res.batch.context_lens]
    return {"num_seqs": len(lens), "context_lens": lens if len(set(lens)) > 1 else lens[0],
            "num_tokens": int(sum(lens)), "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads,
            "head_size": cfg.head_size, "block_size": cfg.block_size}


def kernel_from_row(r: dict) -> KernelRecord:
    """A bench JSON row (kvviz.bench._row) as a KernelRecord."""
    return KernelRecord(
        name=str(r["kernel"]), variant=str(r.get("variant") or ""), samples_us=_finite_samples(r["samples_us"]),
        timing_method=str(r.get("timing_method") or ""), shape=dict(r.get("shape") or {}), method=r.get("method"),
        role=r.get("role"), impl=r.get("impl"), source_hash=r.get("source_hash"), bytes=int(r.get("bytes_moved") or 0),
        warmup_runs=int(r.get("warmup_runs") or 0))


def _dumps(v) -> str:
    return json.dumps(clean(v), allow_nan=False, sort_keys=True)


def record_eval_result(result: dict, path=None) -> tuple[int, Path]:
    """Record a `kvviz eval` result in the history at `path` (default: the user's); (run id, db path)."""
    with HistoryDB(path) as db:
        return db.record_eval(result), db.path


def record_bench_result(result: dict, path=None, kind: str = "bench") -> tuple[int, Path]:
    """Record a bench result (kind "bench", or "sweep" for `kvviz bench --sweep`) in the history at `path`
    (default: the user's); (run id, db path)."""
    with HistoryDB(path) as db:
        return db.record_bench(result, kind=kind), db.path
