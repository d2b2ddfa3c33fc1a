"""Bad files a user can hand kvviz: each is refused (or handled) with one clear line, exit 2 from the CLI for
bad input, never a Python traceback or a numpy RuntimeWarning, and nothing is lost or written over.

  GGUF metadata   head counts of 0, a head count not a multiple of the KV heads, an embedding length not a
                  multiple of the head count (kvviz/sources/gguf_llama.py)
  run history     SQLite pages damaged past the header, stored JSON that does not parse, a history in a
                  read-only folder or file (kvviz/history/db.py)
  K/V dumps       float64 values beyond float32's range, big-endian float32 .npz (kvviz/sources/kv_files.py),
                  all-zero keys in the QJL bias estimate (kvviz/families/turboquant/bias.py)
  capture         a model whose weights hold NaN (kvviz/sources/llama_numpy.py)

The read-only cases run the CLI in a child process; when the tests run as root (CI does), that process drops
the capabilities that let root pass every permission check (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH,
CAP_FOWNER), so a chmod binds it as it binds a user.
"""
import ctypes
import json
import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from kvviz.cli import main
from kvviz.errors import InvalidInput
from kvviz.families.turboquant.bias import inner_product_bias
from kvviz.history.db import HistoryDB, HistoryError, KernelRecord, default_path
from kvviz.sources.gguf_llama import load_gguf_llama
from kvviz.sources.kv_files import load_kv, save_kv
from tiny_llama import N_HEADS, N_KV, write_tiny_gguf

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"name": "tiny", "num_seqs": 1, "context_lens": 8, "num_tokens": 8, "num_heads": 2, "num_kv_heads": 1,
         "head_size": 16, "block_size": 16}
ADAPTER = {"name": "test adapter", "driver": "test driver 1.0", "backend": "Vulkan", "is_software": True}


def run_cli(argv, capsys):
    """main(argv) in-process: (exit code, stdout, stderr, numpy RuntimeWarnings raised meanwhile)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def refused(rc, err, runtime_warnings, *words):
    """Exit 2, no traceback, no RuntimeWarning, and the error is one `kvviz: ...` line (the last one: `kvviz
    report` says what it computes first) holding every word."""
    assert rc == 2, (rc, err[-2000:])
    assert "Traceback" not in err and not runtime_warnings, (err[-2000:], runtime_warnings)
    line = err.strip().splitlines()[-1]
    assert line.startswith("kvviz: "), err[-2000:]
    for w in words:
        assert w in line, (w, line)
    return line


# ------------------------------------------------------------------------------------------ GGUF metadata
GGUF_CASES = [
    ("head_count 0", {"head_count": 0}, ["'llama.attention.head_count' = 0", "positive"]),
    ("head_count_kv 0", {"head_count_kv": 0}, ["'llama.attention.head_count_kv' = 0", "positive"]),
    ("heads not a multiple of kv heads", {"head_count_kv": N_KV + 1},
     [f"'llama.attention.head_count' = {N_HEADS}", f"'llama.attention.head_count_kv' = {N_KV + 1}", "not a multiple"]),
    ("embedding not a multiple of heads", {"embedding_length": N_HEADS * 16 + 2},
     [f"'llama.embedding_length' = {N_HEADS * 16 + 2}", "not a multiple", "'llama.attention.head_count'"]),
]


@pytest.mark.parametrize("meta,words", [c[1:] for c in GGUF_CASES], ids=[c[0] for c in GGUF_CASES])
def test_gguf_with_impossible_head_counts_is_refused_on_load(tmp_path, meta, words):
    path = tmp_path / "bad.gguf"
    write_tiny_gguf(path, **meta)
    with pytest.raises(InvalidInput) as exc:
        load_gguf_llama(path)
    line = exc.value.one_line()
    assert "bad.gguf" in line and all(w in line for w in words), line


def test_gguf_with_zero_heads_from_capture_and_report(tmp_path, capsys):
    path = tmp_path / "zero-heads.gguf"
    write_tiny_gguf(path, head_count=0)
    rc, _, err, rw = run_cli(["capture", "--model", str(path), "--prompt", "the", "--out", str(tmp_path / "c.npz")],
                             capsys)
    refused(rc, err, rw, "zero-heads.gguf", "'llama.attention.head_count' = 0")
    assert not (tmp_path / "c.npz").exists()
    rc, _, err, rw = run_cli(["report", "--out", str(tmp_path / "rep"), "--set", "source=model",
                              "--set", f"model_path={path}", "--set", "timing_runs=1"], capsys)
    refused(rc, err, rw, "zero-heads.gguf", "'llama.attention.head_count' = 0")


# ------------------------------------------------------------------------------------------ the run history
def kernels(seed, n=6):
    rng = np.random.default_rng(seed)
    return [KernelRecord("paged_attn_f32", "f32 baseline", tuple(rng.normal(100, 2, n)), "gpu-timestamps", SHAPE),
            KernelRecord("int8 writer", "int8 per token", tuple(rng.normal(40, 1, n)), "gpu-timestamps", SHAPE,
                         "int8")]


def write_history(path, n_runs=4) -> list[int]:
    with HistoryDB(path) as db:
        return [db.record("bench", ADAPTER, kernels(i)) for i in range(n_runs)]


def corrupt_past_the_header(path: Path) -> None:
    """Garbage over every page from the runs table's on: the header, the schema and the meta table stay intact,
    so the file opens, and the first read of the runs finds the damage."""
    c = sqlite3.connect(path)
    page = c.execute("PRAGMA page_size").fetchone()[0]
    first = c.execute("SELECT rootpage FROM sqlite_master WHERE name='runs'").fetchone()[0]
    meta = c.execute("SELECT MAX(rootpage) FROM sqlite_master WHERE tbl_name='meta'").fetchone()[0]
    c.close()
    assert first > meta and not Path(str(path) + "-wal").exists()  # everything is in the main file
    data = bytearray(path.read_bytes())
    junk = bytes([0xDE, 0xAD, 0xBE, 0xEF]) * (page // 4)
    for p in range(first - 1, len(data) // page):
        data[p * page:(p + 1) * page] = junk
    path.write_bytes(bytes(data))


def test_a_history_damaged_past_its_header_is_refused_and_left_alone(capsys):
    path = default_path()  # the test's KVVIZ_DATA_DIR
    ids = write_history(path)
    corrupt_past_the_header(path)
    before = path.read_bytes()
    for argv in (["runs", "list"], ["runs", "show", str(ids[0])], ["diff", str(ids[0]), str(ids[1])],
                 ["runs", "pin", str(ids[0])], ["runs", "unpin"]):
        rc, _, err, rw = run_cli(argv, capsys)
        line = refused(rc, err, rw, str(path), "damaged", "Move it aside", ".recover")
        assert len(err.strip().splitlines()) == 1, err
        assert "not a kvviz run history" not in line
    with pytest.raises(HistoryError, match="damaged.*did not write"):  # what `kvviz bench` and the window record
        with HistoryDB(path) as db:
            db.record("bench", ADAPTER, kernels(9))
    assert path.read_bytes() == before  # nothing was written to it
    assert not Path(str(path) + "-wal").exists() or Path(str(path) + "-wal").stat().st_size == 0


def test_runs_with_unreadable_stored_json_are_named_and_skipped(capsys, tmp_path):
    path = default_path()
    ids = write_history(path)  # 1..4
    c = sqlite3.connect(path)
    c.execute("UPDATE kernels SET samples_json='[101.5, 99.' WHERE run_id=? AND position=1", (ids[1],))
    c.execute("UPDATE kernels SET shape_json='{\"num_seqs\": 1,' WHERE run_id=?", (ids[2],))
    c.commit()
    c.close()
    before = path.read_bytes()

    rc, out, err, rw = run_cli(["runs", "list"], capsys)
    assert rc == 0 and "Traceback" not in err and not rw, err
    listed = [int(line.split()[0].rstrip("*")) for line in out.splitlines()[2:]]
    assert listed == [ids[3], ids[0]]  # the intact runs, newest first
    warning = err.strip()
    assert len(warning.splitlines()) == 1 and warning.startswith("kvviz: warning:")
    assert f"run {ids[1]} (a kernel's samples_json" in warning and f"run {ids[2]} (a kernel's shape_json" in warning
    listing = tmp_path / "runs.json"
    rc, _, err, _ = run_cli(["runs", "list", "--json", str(listing)], capsys)
    data = json.loads(listing.read_text())
    assert rc == 0 and [r["id"] for r in data["runs"]] == [ids[3], ids[0]]
    assert sorted(d["id"] for d in data["damaged"]) == [ids[1], ids[2]]

    rc, _, err, rw = run_cli(["runs", "show", str(ids[1])], capsys)
    refused(rc, err, rw, f"run {ids[1]}", "is damaged", "samples_json", "not valid JSON")
    rc, _, err, rw = run_cli(["runs", "show", str(ids[2])], capsys)
    refused(rc, err, rw, f"run {ids[2]}", "is damaged", "shape_json")
    rc, _, err, rw = run_cli(["diff", str(ids[0]), str(ids[1])], capsys)
    refused(rc, err, rw, f"run {ids[1]}", "is damaged")
    rc, _, err, rw = run_cli(["runs", "pin", str(ids[2])], capsys)
    refused(rc, err, rw, f"run {ids[2]}", "is damaged")
    assert path.read_bytes() == before
    # the intact runs still show and compare
    assert run_cli(["runs", "show", str(ids[3])], capsys)[0] == 0
    assert run_cli(["diff", str(ids[0]), str(ids[3]), "--json", "-"], capsys)[0] == 0


def test_listing_a_history_that_does_not_exist_creates_nothing(capsys):
    path = default_path()
    rc, out, err, _ = run_cli(["runs", "list"], capsys)
    assert rc == 0 and out.startswith("no runs in") and not path.exists(), (out, err)


READONLY_SCRIPT = r"""
import contextlib, io, json, sys, traceback
from kvviz.cli import main
from kvviz.history.db import HistoryDB, HistoryError

res = {}
for name, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
        except BaseException:
            traceback.print_exc()
            rc = "raised"
    res[name] = [rc, out.getvalue(), err.getvalue()]
try:  # what `kvviz bench` and the window do after a run
    with HistoryDB() as db:
        db.record("bench", {"name": "a"}, [])
    res["record"] = [0, "", ""]
except HistoryError as exc:
    res["record"] = [2, "", "kvviz: " + exc.one_line()]
print(json.dumps(res))
"""


def _bound_by_permissions():
    """In the child, before exec: drop the capabilities that let root ignore file permissions from the bounding
    set (prctl PR_CAPBSET_DROP), so the program it runs has none of them."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.parametrize("what", ["read-only folder", "read-only file"])
def test_a_read_only_history_is_read_and_writes_to_it_say_read_only(what, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    path = data / "runs.sqlite3"
    ids = write_history(path)
    assert sorted(p.name for p in data.iterdir()) == ["runs.sqlite3"]
    before = path.read_bytes()
    path.chmod(0o444)
    data.chmod(0o555 if what == "read-only folder" else 0o777)
    as_user = {"preexec_fn": _bound_by_permissions} if os.geteuid() == 0 else {}
    argvs = {"list": ["runs", "list"], "show": ["runs", "show", str(ids[0])],
             "diff": ["diff", str(ids[0]), str(ids[1])], "pin": ["runs", "pin", str(ids[0])]}
    env = {**os.environ, "KVVIZ_DATA_DIR": str(data)}
    try:
        r = subprocess.run([sys.executable, "-c", READONLY_SCRIPT, json.dumps(argvs)], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=300, **as_user)
    finally:
        data.chmod(0o755)  # pytest can clean up
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for name in ("list", "show", "diff"):  # reads work
        rc, out, err = res[name]
        assert rc == 0 and "Traceback" not in err, (name, err)
    assert all(f"{i:>4}" in res["list"][1] for i in ids) and "paged_attn_f32" in res["show"][1]
    assert "within noise" in res["diff"][1] or "faster" in res["diff"][1] or "slower" in res["diff"][1]
    for name in ("pin", "record"):  # writes are refused, saying why
        rc, _, err = res[name]
        assert rc == 2 and "Traceback" not in err, (name, err)
        line = err.strip().splitlines()[-1]
        assert "is read-only" in line and str(path) in line and "nothing was written" in line, (name, line)
        assert "not a kvviz run history" not in line
    assert path.read_bytes() == before
    if what == "read-only folder":
        assert sorted(p.name for p in data.iterdir()) == ["runs.sqlite3"]


# ------------------------------------------------------------------------------------------ K/V dumps
def kv(dtype=np.float32, scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, 1, 6, 16)) * scale).astype(dtype)


def test_float64_beyond_float32_range_is_refused_naming_the_tensor(tmp_path, capsys):
    path = tmp_path / "huge.npz"
    v = kv(np.float64)
    v[1, 0, 3, 5] = 3e300
    np.savez(path, k=kv(np.float64), v=v)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overflow encountered in cast"
        with pytest.raises(InvalidInput) as exc:
            load_kv(path)
    line = exc.value.one_line()
    assert "huge.npz" in line and "'v'" in line and "float32's range" in line and "3e+300" in line, line
    rc, _, err, rw = run_cli(["report", "--out", str(tmp_path / "rep"), "--set", "source=kvfile",
                              "--set", f"kv_file={path}", "--set", "timing_runs=1"], capsys)
    refused(rc, err, rw, "huge.npz", "'v'", "float32's range")
    # finite float64 within range still loads, rounded to float32
    np.savez(path, k=kv(np.float64), v=kv(np.float64, seed=1))
    assert load_kv(path).source_dtype == "float64"


def test_big_endian_float32_npz_is_read(tmp_path):
    path = tmp_path / "be.npz"
    k, v = kv(), kv(seed=1)
    np.savez(path, k=k.astype(">f4"), v=v.astype(">f4"), q=np.concatenate([k, k], 1).astype(">f2"))
    dump = load_kv(path)
    assert dump.k.dtype == np.float32 and dump.k.dtype.isnative
    np.testing.assert_array_equal(dump.k, k)
    np.testing.assert_array_equal(dump.v, v)
    assert dump.source_dtype == "float16/float32"
    np.savez(path, k=k.astype(np.longdouble), v=v)  # a float kvviz does not read: said as such
    with pytest.raises(InvalidInput, match="'k' has dtype float128, a floating-point type kvviz does not read"):
        load_kv(path)


def test_qjl_bias_of_all_zero_keys_is_refused_without_warnings(tmp_path, rt):
    path = tmp_path / "zero.npz"
    save_kv(path, np.zeros((1, 1, 20, 64), np.float32), np.zeros((1, 1, 20, 64), np.float32))
    K = load_kv(path).k[0, 0]
    q = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered in scalar divide"
        with pytest.raises(InvalidInput, match="the keys are all zero .*every true q.k is 0.*slope"):
            inner_product_bias(q, K, rt=rt)
        with pytest.raises(InvalidInput, match="the keys are all zero"):  # the general compressor's setting too
            inner_product_bias(q, K, rt=rt, bits=3)
    res = inner_product_bias(q, K + np.float32(0.5), rt=rt)  # keys that are not all zero: a slope
    assert all(np.isfinite(v) for v in res.slopes.values())


# ------------------------------------------------------------------------------------------ capture
def test_capture_from_a_model_with_nan_weights_names_the_model(tmp_path, capsys):
    model = tmp_path / "nan-weights.gguf"
    write_tiny_gguf(model, nan=("blk.0.attn_k.weight",))
    out = tmp_path / "capture.npz"
    rc, _, err, rw = run_cli(["capture", "--model", str(model), "--prompt", "the cat", "--out", str(out)], capsys)
    line = refused(rc, err, rw, "nan-weights.gguf", "blk.0.attn_k.weight", "NaN")
    assert "capture.npz" not in line and not out.exists()
