"""Bad files a user can hand kvviz: each is refused (or handled) with one clear line, exit 2 from the CLI for
bad input, never a Python traceback or a numpy RuntimeWarning, and nothing is lost or written over.

  GGUF metadata   head counts of 0, a head count not a multiple of the KV heads, an embedding length not a
                  multiple of the head count (kvviz/sources/gguf_llama.py)
"""
import warnings

import pytest

from kvviz.cli import main
from kvviz.errors import InvalidInput
from kvviz.sources.gguf_llama import load_gguf_llama
from tiny_llama import N_HEADS, N_KV, write_tiny_gguf


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
