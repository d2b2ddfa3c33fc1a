"""`kvviz live --methods all` (kvviz/live/measure.py): every registered method at each setting example on one
prompt, a saved table (markdown + strict JSON) with bits per element, KL, top-1 agreement and GPU-timestamp
decode times; --reuse keeps what was measured. On the tiny random GGUF of tests/tiny_llama.py."""
from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import pytest

from kvviz.errors import InvalidInput
from kvviz.live import measure as M
from kvviz.families.registry import parse_options, registry
from kvviz.sources.gguf_llama import load_gguf_llama

from tiny_llama import write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.gpu


def args(*argv):
    ap = argparse.ArgumentParser()
    M.add_arguments(ap)
    return ap.parse_args(list(argv))


def test_all_specs_cover_every_method_and_setting():
    specs = M.all_specs()
    assert specs[0] == "f32" and specs[1] == "int8_seed" and len(set(specs)) == len(specs)
    keys = {M.split_method(s)[0] for s in specs}
    assert keys == {"f32"} | set(registry())
    for key, cls in registry().items():
        got = [parse_options(*M.parse_method(s)) for s in specs if M.split_method(s)[0] == key]
        for ex in cls.examples():
            assert parse_options(key, ex) in got, (key, ex)
    assert "turboquant:outlier_share=0.5" in specs and "turboquant:bits=3;v_bits=3;outlier_share=0.5" in specs


def test_all_arguments_are_checked(tmp_path):
    with pytest.raises(InvalidInput, match="--save needs --methods all"):
        M.check_args(args("--methods", "int8_seed", "--save", str(tmp_path / "t")))
    with pytest.raises(InvalidInput, match="--reuse needs --save"):
        M.check_args(args("--methods", "all", "--reuse"))
    assert [s for s, _ in M.check_args(args("--methods", "all"))] == M.all_specs()


@pytest.mark.slow
def test_run_all_saves_the_table_and_reuses_it(tmp_path, monkeypatch, ctx):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, head_size=32)
    model = load_gguf_llama(path)
    prefix = str(tmp_path / "table")
    a = args("--methods", "all", "--n-new", "2", "--block-size", "4", "--save", prefix, "--model", str(path),
             "--prompt", "the cat sat on the mat and")
    keep = ("f32", "int8_token", "vllm_fp8_e4m3:calib_tokens=8", "turboquant:bits=1;v_bits=1")
    methods = [m for m in M.check_args(a) if m[0] in keep]
    ids = model.tokenizer.encode(a.prompt)
    assert M.run_all(a, methods, model, str(path), ids, ctx) == 0
    with open(prefix + ".json") as f:
        doc = json.load(f, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    rows = {r["spec"]: r for r in doc["rows"]}
    assert set(rows) == set(keep) and doc["tokens"] == ids and doc["prompt"] == a.prompt
    assert rows["f32"]["kl_max"] == 0 and rows["f32"]["bits_per_element"] == 32
    for r in rows.values():
        assert r["kl_mean"] >= 0 and 0 <= r["top1_agree_rate"] <= 1 and r["decode_us"] > 0 and r["decode_kernels"]
    assert rows["turboquant:bits=1;v_bits=1"]["bits_per_element"] < rows["int8_token"]["bits_per_element"]
    md = open(prefix + ".md").read()
    assert "kvviz live --methods all" in md and "`int8_token`" in md and "Tokens (" in md
    # --reuse: nothing runs again (run_live would fail), every row comes back
    import kvviz.live.decode

    real_run_live = kvviz.live.decode.run_live
    with open(prefix + ".json") as f:  # drop one row: --reuse measures it again and keeps every other row
        doc = json.load(f)
    doc["rows"] = [r for r in doc["rows"] if r["spec"] != "int8_token"]
    with open(prefix + ".json", "w") as f:
        json.dump(doc, f)
    ran = []

    def only_int8(path, ids_, n_new, key, *x, **k):
        ran.append(key)
        if key != "int8_token":
            pytest.fail("re-ran a measured setting")
        return real_run_live(path, ids_, n_new, key, *x, **k)

    monkeypatch.setattr(kvviz.live.decode, "run_live", only_int8)
    a2 = args("--methods", "all", "--n-new", "2", "--block-size", "4", "--save", prefix, "--reuse", "--model", str(path),
              "--prompt", "the cat sat on the mat and")
    assert M.run_all(a2, methods, model, str(path), ids, ctx) == 0
    assert ran == ["int8_token"]
    with open(prefix + ".json") as f:
        assert [r["spec"] for r in json.load(f)["rows"]] == [s for s, _ in methods]  # every row, in order


def test_pareto_front():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "pareto_chart.py"
    spec = importlib.util.spec_from_file_location("pareto_chart", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pts = [(8.5, 1e-3, "a"), (4.0, 0.05, "b"), (6.0, 0.06, "c"), (6.0, 0.02, "d"), (3.0, 0.5, "e"), (16, 1e-3, "f")]
    assert [p[2] for p in mod.pareto_front(pts)] == ["e", "b", "d", "a"]  # c and f are dominated (ties: not better)
