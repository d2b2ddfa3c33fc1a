"""The run history (kvviz.history): SQLite on disk, across restarts and crashes; `kvviz runs`, `kvviz diff`
and the verdict from the samples; the window's History tab reading a history written before it opened.

Every test writes to a temporary folder (tests/conftest.py points KVVIZ_DATA_DIR at one per test).
"""
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kvviz.cli import main
from kvviz.errors import InvalidInput
from kvviz.history.db import SCHEMA_VERSION, HistoryDB, HistoryError, KernelRecord, data_dir, default_path
from kvviz.history.diff import FASTER, NOISE, SLOWER, compare_samples, mann_whitney, min_p_value
from kvviz.history.diff import TEST_NAME

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"name": "tiny", "num_seqs": 2, "context_lens": 64, "num_tokens": 128, "num_heads": 4, "num_kv_heads": 2,
         "head_size": 64, "block_size": 16}
ADAPTER = {"name": "test adapter", "driver": "test driver 1.0", "backend": "Vulkan", "is_software": True}


def _no_constants(name):
    raise ValueError(f"not strict JSON: {name}")


def strict(text: str):
    return json.loads(text, parse_constant=_no_constants)


def kernels(seed=0, n=12, scale=1.0):
    rng = np.random.default_rng(seed)
    return [KernelRecord("paged_attn_f32", "f32 baseline", tuple(rng.normal(100 * scale, 2, n)), "gpu-timestamps",
                         SHAPE, None, "decode", "baseline", "abc123", 4096, 3),
            KernelRecord("int8 writer", "int8 per token", tuple(rng.normal(40 * scale, 1, n)), "gpu-timestamps",
                         SHAPE, "int8", "writer", "fast", "def456", 1024, 3)]


def samples_of(run):
    return {k.key: k.samples_us for k in run.kernels}


# ------------------------------------------------------------------------------ where it lives
def test_data_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KVVIZ_DATA_DIR", str(tmp_path / "mine"))
    assert default_path() == tmp_path / "mine" / "runs.sqlite3"
    monkeypatch.delenv("KVVIZ_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "kvviz"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_dir() == tmp_path / "home" / ".local" / "share" / "kvviz"


def test_tests_never_use_the_user_data_dir():
    assert Path(os.environ["KVVIZ_DATA_DIR"]).resolve() != (Path.home() / ".local" / "share" / "kvviz").resolve()
    assert "kvviz-data" in os.environ["KVVIZ_DATA_DIR"]


# ------------------------------------------------------------------------------ restart and crash
def test_history_survives_a_restart_of_the_core(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with HistoryDB(path) as db:
        a = db.record("bench", ADAPTER, kernels(0), config={"runs": 12, "warmup": 3})
        b = db.record("window", ADAPTER, kernels(1), method="int8", config={"context_lens": [64, 64]})
        db.pin(a)
        want_a, want_b = samples_of(db.run(a)), samples_of(db.run(b))
    assert want_a == {k.key: k.samples_us for k in kernels(0)}  # stored exactly
    # a fresh interpreter: nothing shared with this process but the file
    script = textwrap.dedent(f"""
        import json
        from kvviz.history.db import HistoryDB
        with HistoryDB({str(path)!r}) as db:
            runs = db.runs()
            base = db.baseline()
            print(json.dumps({{"ids": [r.id for r in runs], "sources": [r.source for r in runs],
                              "baseline": base.id, "method": db.run({b}).method,
                              "a": {{k.key: list(k.samples_us) for k in db.run({a}).kernels}},
                              "b": {{k.key: list(k.samples_us) for k in db.run({b}).kernels}},
                              "hash": [k.source_hash for k in db.run({a}).kernels]}}))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["ids"] == [b, a] and got["sources"] == ["window", "bench"]
    assert got["baseline"] == a and got["method"] == "int8" and got["hash"] == ["abc123", "def456"]
    assert {k: tuple(v) for k, v in got["a"].items()} == want_a
    assert {k: tuple(v) for k, v in got["b"].items()} == want_b


CRASH = """
import os, sys
import numpy as np
from kvviz.history.db import HistoryDB, KernelRecord
path, marker = sys.argv[1], sys.argv[2]
shape = {"num_seqs": 1, "context_lens": 8, "num_heads": 2, "num_kv_heads": 1, "head_size": 16, "block_size": 16}
ks = [KernelRecord(f"k{i}", "v", tuple(float(x) for x in np.arange(1, 2001) + i), "gpu-timestamps", shape)
      for i in range(50)]
db = HistoryDB(path)
first = db.record("bench", {"name": "a"}, ks)
print(first, flush=True)
wal = path + "-wal"
wal_before = os.path.getsize(wal)
db._conn.execute("PRAGMA cache_size = 10")  # a small page cache: the open transaction spills to disk
inserts = [0]
def trace(sql):
    # the second run's transaction is open and has written kernel rows: the process dies right there
    if sql.startswith("INSERT INTO kernels"):
        inserts[0] += 1
        if inserts[0] == 20:
            open(marker, "w").write(f"{db._conn.in_transaction} {inserts[0] - 1} {os.path.getsize(wal) - wal_before}")
            os._exit(3)
db._conn.set_trace_callback(trace)
db.record("bench", {"name": "b"}, ks)
print("the second run was committed: the crash never happened", flush=True)
"""


def test_a_crash_mid_write_loses_nothing_committed(tmp_path):
    path, marker = tmp_path / "runs.sqlite3", tmp_path / "died"
    r = subprocess.run([sys.executable, "-c", CRASH, str(path), str(marker)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr  # died by os._exit inside the second transaction
    first = int(r.stdout.split()[0])
    in_tx, written, spilled = marker.read_text().split()
    assert in_tx == "True" and int(written) == 19  # it died inside the transaction, 19 kernel rows written
    assert int(spilled) > 100_000  # and uncommitted pages of them were on disk (the WAL) when it died
    with HistoryDB(path) as db:
        assert [x.id for x in db.runs()] == [first]  # the half-written run is gone
        run = db.run(first)
        assert len(run.kernels) == 50
        assert run.kernels[7].samples_us == tuple(float(x) for x in np.arange(1, 2001) + 7)
        assert db._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db._conn.execute("SELECT COUNT(*) FROM kernels").fetchone()[0] == 50
        second = db.record("bench", {"name": "c"}, kernels(2))  # and it takes new runs
        assert second != first and len(db.runs()) == 2


def test_a_failed_record_is_rolled_back(tmp_path):
    with HistoryDB(tmp_path / "h.sqlite3") as db:
        bad = kernels(0) + [KernelRecord("nan kernel", "v", (1.0, float("nan")), "gpu-timestamps", SHAPE)]
        with pytest.raises(InvalidInput, match="finite"):
            db.record("bench", ADAPTER, bad)
        assert db.runs() == [] and db._conn.execute("SELECT COUNT(*) FROM kernels").fetchone()[0] == 0


# ------------------------------------------------------------------------------ schema
def test_schema_is_versioned_and_a_newer_one_refused(tmp_path, capsys, monkeypatch):
    path = tmp_path / "runs.sqlite3"
    with HistoryDB(path) as db:
        db.record("bench", ADAPTER, kernels(0))
    c = sqlite3.connect(path)
    assert c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    c.commit()
    c.close()
    before = path.read_bytes()
    with pytest.raises(HistoryError, match="newer than this kvviz"):
        HistoryDB(path)
    assert path.read_bytes() == before  # refused, not altered
    monkeypatch.setenv("KVVIZ_DATA_DIR", str(tmp_path))
    assert main(["runs", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "schema version" in err and "KVVIZ_DATA_DIR" in err


def test_an_empty_sqlite_file_is_migrated_and_a_foreign_one_refused(tmp_path):
    empty = tmp_path / "empty.sqlite3"
    sqlite3.connect(empty).close()
    with HistoryDB(empty) as db:
        assert db.schema_version() == SCHEMA_VERSION and db.runs() == []
    other = tmp_path / "other.sqlite3"
    c = sqlite3.connect(other)
    c.execute("CREATE TABLE photos (x)")
    c.commit()
    c.close()
    with pytest.raises(HistoryError, match="photos"):
        HistoryDB(other)
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(HistoryError, match="not a kvviz run history"):
        HistoryDB(junk)


def test_the_pin_stays_pinned_and_is_unique(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with HistoryDB(path) as db:
        ids = [db.record("bench", ADAPTER, kernels(i)) for i in range(3)]
        db.pin(ids[0])
        db.pin(ids[2])
        with pytest.raises(HistoryError, match="no run 99"):
            db.pin(99)
    with HistoryDB(path) as db:
        assert db.baseline().id == ids[2]
        assert [r.id for r in db.runs() if r.baseline] == [ids[2]]
        db.unpin()
    with HistoryDB(path) as db:
        assert db.baseline() is None


# ------------------------------------------------------------------------------ the verdict
def test_mann_whitney_exact_and_approximate():
    a = np.arange(10.0)
    u, p = mann_whitney(a, a + 100)  # every B above every A
    assert u == 0 and p == pytest.approx(min_p_value(10, 10)) and p == pytest.approx(2 / 184756)
    u, p = mann_whitney(a + 100, a)
    assert u == 100 and p == pytest.approx(2 / 184756)
    # with ties: the normal approximation; identical samples are no evidence at all
    assert mann_whitney([5.0] * 8, [5.0] * 8)[1] == 1.0
    # a large sample of the same distribution against itself: p near 1; a shifted one: tiny
    rng = np.random.default_rng(3)
    x = rng.normal(100, 5, 60)
    assert mann_whitney(x, x)[1] > 0.9
    assert mann_whitney(x, x - 10)[1] < 1e-10


@pytest.mark.parametrize("shift,want", [(-0.2, FASTER), (0.2, SLOWER), (0.0, NOISE)])
def test_verdicts_on_synthetic_samples(shift, want):
    rng = np.random.default_rng(11)
    a = rng.lognormal(np.log(100), 0.05, 30)
    b = rng.lognormal(np.log(100 * (1 + shift)), 0.05, 30)
    assert compare_samples(a, b).verdict == want


def test_the_verdict_follows_the_spread_not_a_fixed_percentage():
    rng = np.random.default_rng(5)
    tight_a, tight_b = rng.normal(100, 0.1, 30), rng.normal(99, 0.1, 30)  # 1% faster, tight: real
    wide_a, wide_b = rng.normal(100, 40, 30), rng.normal(85, 40, 30)  # 15% faster, wide: could be noise
    assert compare_samples(tight_a, tight_b).verdict == FASTER
    assert compare_samples(wide_a, wide_b).verdict == NOISE
    few = compare_samples([1.0, 2.0, 3.0], [10.0, 11.0, 12.0])
    assert few.verdict == NOISE and "too few samples" in few.note


# ------------------------------------------------------------------------------ kvviz diff
def bench_file(path, rows):
    """A bench JSON as `kvviz bench --json` writes it."""
    data = {"adapter": ADAPTER, "timestamp_period_ns": 1.0, "created": "2026-11-30T00:00:00", "runs": 30,
            "warmup": 3, "rows": rows}
    path.write_text(json.dumps(data, allow_nan=False))
    return str(path)


def row(name, samples, shape=SHAPE, variant="v"):
    s = [float(x) for x in samples]
    return {"kernel": name, "variant": variant, "method": "int8", "role": "decode", "impl": "fast", "shape": shape,
            "gpu_us_min": min(s), "gpu_us_median": float(np.median(s)), "gpu_us_p90": float(np.percentile(s, 90)),
            "timing_method": "gpu-timestamps", "samples_us": s, "source_hash": "aa11", "bytes_moved": 1000,
            "gbps": 1.0, "pct_of_copy": None, "max_abs_err_vs_oracle": None, "tolerance": None,
            "within_tolerance": None, "adapter": ADAPTER, "note": ""}


@pytest.fixture
def two_bench_files(tmp_path):
    rng = np.random.default_rng(7)
    same = lambda: rng.normal(50, 2, 30)  # noqa: E731
    a = bench_file(tmp_path / "a.json", [
        row("gets_faster", rng.normal(100, 3, 30)), row("gets_slower", rng.normal(100, 3, 30)),
        row("stays", same()), row("only_in_a", same()),
        {**row("untimed", [1.0]), "samples_us": None, "gpu_us_median": None}])
    b = bench_file(tmp_path / "b.json", [
        row("gets_faster", rng.normal(70, 3, 30)), row("gets_slower", rng.normal(130, 3, 30)),
        row("stays", same()), row("only_in_b", same())])
    return a, b


def test_kvviz_diff_on_two_bench_files(two_bench_files, tmp_path, capsys):
    a, b = two_bench_files
    out = tmp_path / "diff.json"
    assert main(["diff", a, b, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    d = strict(out.read_text())
    verdicts = {r["kernel"]: r["verdict"] for r in d["rows"]}
    assert verdicts == {"gets_faster": FASTER, "gets_slower": SLOWER, "stays": NOISE}
    assert [x["kernel"] for x in d["only_in_a"]] == ["only_in_a"] and [x["kernel"] for x in d["only_in_b"]] == ["only_in_b"]
    assert d["counts"] == {FASTER: 1, SLOWER: 1, NOISE: 1}
    r = next(r for r in d["rows"] if r["kernel"] == "gets_faster")
    assert r["change_pct"] == pytest.approx(100 * (r["b"]["median_us"] - r["a"]["median_us"]) / r["a"]["median_us"])
    assert r["a"]["p10_us"] < r["a"]["median_us"] < r["a"]["p90_us"]
    assert "Mann-Whitney" in d["test"] and "Mann-Whitney" in text
    for line in text.splitlines():
        if line.startswith(("gets_faster", "gets_slower", "stays")):
            assert line.rstrip().endswith({"gets_faster": FASTER, "gets_slower": SLOWER, "stays": NOISE}[line.split()[0]])
    # to stdout: JSON only
    assert main(["diff", a, b, "--json", "-"]) == 0
    assert strict(capsys.readouterr().out)["counts"] == d["counts"]


def test_diff_says_which_test_in_its_help(capsys):
    with pytest.raises(SystemExit):
        main(["diff", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Mann-Whitney U test at alpha 0.01" in text and "within noise" in text


@pytest.mark.parametrize("what", ["missing", "not json", "no rows", "no samples"])
def test_diff_bad_inputs_exit_2_with_one_line(what, tmp_path, capsys, two_bench_files):
    a, _ = two_bench_files
    bad = tmp_path / "bad.json"
    if what == "not json":
        bad.write_text("{nope")
    elif what == "no rows":
        bad.write_text('{"adapter": {}}')
    elif what == "no samples":
        bad.write_text(json.dumps({"rows": [{"kernel": "k", "samples_us": None}]}))
    arg = str(tmp_path / "absent.json") if what == "missing" else str(bad)
    assert main(["diff", a, arg]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("kvviz: ")
    assert main(["diff", a, "12345"]) == 2  # no such run in the (empty) history
    assert "no run 12345" in capsys.readouterr().err


def test_runs_list_show_and_diff_by_id(capsys, tmp_path):
    with HistoryDB() as db:  # the test's KVVIZ_DATA_DIR
        a = db.record("bench", ADAPTER, kernels(0, n=20))
        b = db.record("bench", ADAPTER, kernels(1, n=20, scale=0.5))  # everything twice as fast
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{b:>4}" in out and "test adapter" in out and "tiny" in out
    assert main(["runs", "pin", str(a)]) == 0
    capsys.readouterr()
    listing = tmp_path / "runs.json"
    assert main(["runs", "list", "--json", str(listing)]) == 0
    runs = strict(listing.read_text())["runs"]
    assert [(r["id"], r["baseline"]) for r in runs] == [(b, False), (a, True)]
    assert main(["runs", "show", str(a), "--json", "-"]) == 0
    shown = strict(capsys.readouterr().out)
    assert [k["samples_us"] for k in shown["kernels"]] == [list(k.samples_us) for k in kernels(0, n=20)]
    assert shown["kernels"][0]["source_hash"] == "abc123"
    assert main(["runs", "show", str(a)]) == 0
    assert "abc123" in capsys.readouterr().out
    assert main(["diff", str(a), str(b), "--json", "-"]) == 0
    d = strict(capsys.readouterr().out)
    assert [r["verdict"] for r in d["rows"]] == [FASTER, FASTER]
    assert main(["runs", "show", "999"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no run 999" in err


def test_kvviz_bench_is_recorded(tmp_path, capsys):
    """A real (tiny) bench on the adapter: recorded with its samples and source hashes; its JSON names the run."""
    out = tmp_path / "b.json"
    assert main(["bench", "--shape", "quick-d64-mha", "--runs", "3", "--warmup", "1", "--no-methods",
                 "--frontends", "glslang", "--json", str(out)]) == 0
    data = strict(out.read_text())
    run_id = data["history_run_id"]
    assert f"recorded as run {run_id}" in capsys.readouterr().out
    with HistoryDB() as db:
        run = db.run(run_id)
    timed = [r for r in data["rows"] if r["samples_us"]]
    assert [(k.name, k.variant, k.samples_us) for k in run.kernels] == [
        (r["kernel"], r["variant"], tuple(r["samples_us"])) for r in timed]
    assert run.source == "bench" and run.adapter["name"] == data["adapter"]["name"]
    hashes = {k.name: k.source_hash for k in run.kernels}
    assert hashes["paged_attn_f32"] and hashes["paged_attn_q8"] and hashes["paged_attn_f32"] != hashes["paged_attn_q8"]
    assert hashes["copy_shader"] and hashes["copy_buffer"] is None  # a recorded copy has no shader
    # a run against its own JSON: the same samples, nothing but noise
    assert main(["diff", str(run_id), str(out), "--json", "-"]) == 0
    d = strict(capsys.readouterr().out)
    assert d["rows"] and all(r["verdict"] == NOISE and r["p_value"] == 1.0 for r in d["rows"])


# ------------------------------------------------------------------------------ the window's History tab
@pytest.mark.gpu
def test_history_tab_reads_a_history_written_before_the_window_opened(qtbot, tmp_path, session):
    from PySide6.QtCore import QSettings

    sys.path.insert(0, str(Path(__file__).parent))
    from ui_windows import WAIT, open_window

    # before any window: a bench run in the history (the test's KVVIZ_DATA_DIR)
    with HistoryDB() as db:
        bench_id = db.record("bench", ADAPTER, kernels(0))
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)
    w1 = open_window(qtbot, settings, session)
    assert w1.timing.run_id is None  # the first compute at start is not a run the user asked to keep
    w1.timing.pin_current()  # pinning it keeps it, pinned in the database
    first = w1.timing.run_id
    assert first == bench_id + 1
    first_medians = {f"{t.kernel} [{t.variant}]": t.timing.median_us for t in w1.results.timings}
    w1.close()
    w1.timing.history_view.close_db()

    # a new window (a restart of the app): the history and the pin are read back from disk
    w2 = open_window(qtbot, settings, session)
    hv, t = w2.timing.history_view, w2.timing
    with qtbot.waitSignal(w2.results_ready, timeout=WAIT):
        w2.run_now()  # a Run: kept
    second = t.run_id
    assert [r.id for r in hv.run_list] == [second, first, bench_id]
    assert hv.runs_table.rowCount() == 3
    cols = hv.RUN_COLUMNS
    assert [hv.runs_table.item(i, 0).text() for i in range(3)] == [str(second), str(first), str(bench_id)]
    assert hv.runs_table.item(1, cols.index("baseline")).text() == "pinned"
    assert hv.runs_table.item(2, cols.index("kind")).text() == "bench"
    assert t.pinned_run == first and t.pinned == pytest.approx(first_medians)
    for i, row in enumerate(w2.results.timings):  # the Kernels tab's "vs pin" column against the stored run
        ref = first_medians[f"{row.kernel} [{row.variant}]"]
        assert t.table.item(i, 2).text() == f"{100.0 * (row.timing.median_us - ref) / ref:+.1f}%"
        assert t.table.item(i, 2).toolTip().startswith(("faster", "slower", "within noise"))
    assert str(first) in t.info.text()
    # the compare view defaults to the baseline against the newest run, and says each kernel's verdict
    assert (hv.a_box.currentData(), hv.b_box.currentData()) == (first, second)
    hv.compare_button.click()
    d = hv.comparison
    assert len(d["rows"]) == len(w2.results.timings) == hv.compare_table.rowCount()
    assert {hv.compare_table.item(i, 2).text() for i in range(hv.compare_table.rowCount())} <= {FASTER, SLOWER, NOISE}
    assert d["test"] == TEST_NAME and sum(d["counts"].values()) == len(d["rows"])  # what the summary line reports
    # the bench run (one other shape): matched by kernel and variant, and the shape difference said
    d = hv.compare(bench_id, second)
    assert [r["kernel"] for r in d["rows"]] == ["paged_attn_f32"] and len(d["only_in_a"]) == 1
    assert len(d["only_in_b"]) == len(w2.results.timings) - 1
    assert [n.split(":")[0] for n in d["notes"]] == ["the shapes differ", "the adapters differ"]  # ADAPTER is made up
    # the timeline tab holds the last run's passes
    assert len(w2.timing.timeline.timed_bars.opts["x0"]) == sum(len(r.timing.samples_us) for r in w2.results.timings)
    # unpinned in the window: unpinned on disk
    t.unpin()
    with HistoryDB() as db:
        assert db.baseline() is None
    w2.close()


def test_history_tab_says_when_the_history_cannot_be_opened(qtbot, tmp_path):
    from kvviz.ui.panels.history import HistoryView

    junk = tmp_path / "runs.sqlite3"
    junk.write_bytes(b"not a database" * 300)
    hv = HistoryView()
    qtbot.addWidget(hv)
    assert hv.open(junk) is False
    assert "not available" in hv.status.text() and "not a kvviz run history" in hv.status.text()
    assert not hv.pin_button.isEnabled() and hv.record(object()) is None


def test_a_locked_history_is_a_clear_error_and_the_bench_still_reports(tmp_path, capsys, monkeypatch):
    path = tmp_path / "runs.sqlite3"
    with HistoryDB(path) as db:
        db.record("bench", ADAPTER, kernels(0))
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    db = HistoryDB(path)
    db._conn.execute("PRAGMA busy_timeout = 50")
    with pytest.raises(HistoryError, match="cannot write the run history"):
        db.record("bench", ADAPTER, kernels(1))
    assert len(db.runs()) == 1  # reading still works
    db.close()
    # kvviz bench: the measurements are printed and written, the history failure said on one line
    import kvviz.bench
    import kvviz.history.db as hdb

    monkeypatch.setenv("KVVIZ_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(kvviz.bench, "run_bench", lambda *a, **k: json.loads(Path(bench_file(
        tmp_path / "fake.json", [row("k", [1.0, 2.0, 3.0])])).read_text()))
    real = hdb.HistoryDB.__init__

    def quick(self, p=None):
        real(self, p)
        self._conn.execute("PRAGMA busy_timeout = 50")

    monkeypatch.setattr(hdb.HistoryDB, "__init__", quick)
    out = tmp_path / "b.json"
    assert main(["bench", "--seqs", "1", "--ctx", "8", "--heads", "2", "--kv-heads", "1", "--head-size", "64",
                 "--json", str(out)]) == 0
    o, err = capsys.readouterr()
    assert "not recorded in the run history" in err and len(err.strip().splitlines()) == 1
    assert "history_run_id" not in strict(out.read_text())
    other.execute("ROLLBACK")
    other.close()


# ------------------------------------------------------------------------------ runs worth keeping
def _v1_history(path):
    """A history as schema 1 wrote it: one bench run and two window runs (every recompute was recorded)."""
    from kvviz.history.db import MIGRATIONS

    c = sqlite3.connect(path, isolation_level=None)
    c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    MIGRATIONS[1](c)
    c.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    for source, method in (("bench", None), ("window", "int8_seed"), ("window", "kivi")):
        c.execute("INSERT INTO runs(created, source, adapter, adapter_json, method) VALUES "
                  "('2026-01-01T00:00:00Z', ?, 'a', '{}', ?)", (source, method))
    c.close()


def test_schema_1_window_runs_become_hidden_auto_runs(tmp_path, capsys, monkeypatch):
    path = tmp_path / "runs.sqlite3"
    _v1_history(path)
    with HistoryDB(path) as db:
        assert db.schema_version() == SCHEMA_VERSION == 2
        assert [(r.id, r.kind) for r in db.runs(hidden=True)] == [(3, "auto"), (2, "auto"), (1, "bench")]
        assert [r.id for r in db.runs()] == [1]  # the automatic recomputes are hidden by default
    monkeypatch.setenv("KVVIZ_DATA_DIR", str(tmp_path))
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert "1 run(s)" in out and "auto runs hidden (--all shows them)" in out
    assert main(["runs", "list", "--all", "--json", "-"]) == 0
    assert [r["kind"] for r in strict(capsys.readouterr().out)["runs"]] == ["auto", "auto", "bench"]
    assert main(["runs", "delete", "--kind", "auto"]) == 0
    assert "deleted 2 run(s): 2, 3" in capsys.readouterr().out
    with HistoryDB(path) as db:
        assert [r.id for r in db.runs(hidden=True)] == [1]


def test_runs_are_named_filtered_and_deleted(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVVIZ_DATA_DIR", str(tmp_path))
    with HistoryDB() as db:
        a = db.record("bench", ADAPTER, kernels(0))
        b = db.record("window", ADAPTER, kernels(1), method="kivi", kind="run")
        c = db.record("window", ADAPTER, kernels(2), method="int8_seed", kind="sweep")
    assert main(["runs", "name", str(b), "kivi  before the fix"]) == 0
    assert capsys.readouterr().out.strip() == f"run {b} is named 'kivi before the fix'"
    assert main(["runs", "list", "--filter", "BEFORE", "--json", "-"]) == 0
    assert [(r["id"], r["name"]) for r in strict(capsys.readouterr().out)["runs"]] == [(b, "kivi before the fix")]
    assert main(["runs", "list", "--filter", "int8", "--json", "-"]) == 0  # the method matches too
    assert [r["id"] for r in strict(capsys.readouterr().out)["runs"]] == [c]
    assert main(["runs", "list", "--kind", "bench,sweep", "--json", "-"]) == 0
    assert [r["id"] for r in strict(capsys.readouterr().out)["runs"]] == [c, a]
    assert main(["runs", "list", "--kind", "nightly"]) == 2
    assert "unknown kind" in capsys.readouterr().err
    assert main(["runs", "show", str(b)]) == 0
    assert "'kivi before the fix'" in capsys.readouterr().out
    # a missing id refuses the whole delete; then two at once
    assert main(["runs", "delete", str(a), "99"]) == 2
    assert "no run 99" in capsys.readouterr().err
    assert main(["runs", "delete", str(a), str(c)]) == 0
    with HistoryDB() as db:
        assert [r.id for r in db.runs(hidden=True)] == [b]
        assert db._conn.execute("SELECT COUNT(*) FROM kernels WHERE run_id != ?", (b,)).fetchone()[0] == 0
    assert main(["runs", "delete"]) == 2 and "run ids or --kind" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_window_run_keeps_its_results_and_numbers_and_deleting_it_removes_them(tmp_path, session):
    from kvviz.history.numbers import headline_numbers
    from ui_windows import small_config

    res = session.compute(small_config(method="int8_token"))
    with HistoryDB(tmp_path / "runs.sqlite3") as db:
        rid = db.record_results(res, "mine")
        run = db.run(rid)
        assert run.kind == "run" and run.label == "mine" and run.numbers == pytest.approx(headline_numbers(res))
        back, extra = db.load_results(rid)
        assert back.stored_as == "run 1 'mine'" and extra["numbers"] == run.numbers
        np.testing.assert_array_equal(back.w_q, res.w_q)
        np.testing.assert_array_equal(back.qkv.k_codes, res.qkv.k_codes)
        assert back.summary_json() == res.summary_json()
        assert [t.timing.samples_us for t in back.timings] == [t.timing.samples_us for t in res.timings]
        snap = db.snapshot_path(run)
        assert snap.is_file()
        db.delete([rid])
        assert not snap.exists()
        with pytest.raises(HistoryError, match="no run"):
            db.load_results(rid)
        bench = db.record("bench", ADAPTER, kernels(0))
        with pytest.raises(HistoryError, match="no stored results"):
            db.load_results(bench)


def test_a_results_file_that_is_not_one_is_refused(tmp_path):
    from kvviz.analysis.snapshot import SnapshotError, load_results

    p = tmp_path / "results.npz"
    np.savez(p, meta=np.frombuffer(b'{"format": "something else"}', np.uint8))
    with pytest.raises(SnapshotError, match="not a kvviz results file"):
        load_results(p)
    p.write_bytes(b"junk" * 10)
    with pytest.raises(SnapshotError, match="not a readable results file"):
        load_results(p)
    with pytest.raises(SnapshotError, match="no stored results"):
        load_results(tmp_path / "missing.npz")
