"""Every bad command-line input: one line naming the argument,
exit 2, no traceback, nothing run; a run that fails or is wrong exits 1, never 0.

Each case runs `kvviz.cli.main(argv)` in-process. Cases that would start GPU work on a broken build use
tiny shapes so that the old behaviour (a silent run, exit 0) fails fast instead of hanging.

Unwritable paths: CI runs the tests as root, which passes every chmod-based permission check, so the
unwritable outputs here are paths under a regular file (tmp/file.txt/out.json: ENOTDIR for anyone)
and under /proc (no one can create entries there, root included).
"""
import json

import numpy as np
import pytest

from kvviz.cli import main

# Tiny shape for the report cases that, on a broken build, would compute instead of refusing.
TINY = ["--set", "num_heads=2", "--set", "num_kv_heads=1", "--set", "head_size=16", "--set", "timing_runs=1",
        "--set", "context_lens=[5]"]
TINY_BENCH = ["--runs", "1", "--warmup", "0", "--no-methods", "--frontends", "glslang"]
CUSTOM = ["--seqs", "1", "--ctx", "8", "--heads", "2", "--kv-heads", "1", "--head-size", "16"]


def run_cli(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse: its own one-line error (kvviz.cli._Parser)
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line(err: str, *names):
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for name in names:
        assert name in lines[0], (name, lines[0])


@pytest.fixture
def paths(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("not a folder")
    dump = tmp_path / "kv.npz"
    from kvviz.sources.kv_files import save_kv

    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 1, 6, 16)).astype(np.float32)
    save_kv(dump, k, k.copy(), None)
    cfg = {}
    for name, text in {"list": "[1, 2]", "eight": '{"num_heads": "eight"}', "syntax": '{"num_heads": 8,',
                       "nan": '{"softmax_scale": NaN}', "inf": '{"softmax_scale": Infinity}',
                       "block0": '{"block_size": 0}', "lens_str": '{"context_lens": "64"}',
                       "opt_type": '{"method": "kivi", "method_options": {"bits": "4"}}'}.items():
        p = tmp_path / f"{name}.json"
        p.write_text(text)
        cfg[name] = str(p)
    return {"tmp": tmp_path, "file": str(f), "dump": str(dump), "cfg": cfg, "out": str(tmp_path / "rep")}


# (id, argv builder, names the one line must contain)
REPORT_SET = [
    ("context_lens=0", ["--set", "context_lens=0"], ["context_lens"]),
    ("context_lens=-5", ["--set", "context_lens=-5"], ["context_lens"]),
    ("context_lens=a,b", ["--set", "context_lens=a,b"], ["context_lens"]),
    ("context_lens=12,abc,-3", ["--set", "context_lens=12,abc,-3"], ["context_lens", "abc"]),
    ("context_lens=\"64\"", ["--set", 'context_lens="64"'], ["context_lens", "string"]),
    ("context_lens=[]", ["--set", "context_lens=[]"], ["context_lens"]),
    ("num_heads=abc", ["--set", "num_heads=abc"], ["num_heads"]),
    ("head_size=1.5", ["--set", "head_size=1.5"], ["head_size"]),
    ("seed=-1", ["--set", "seed=-1"], ["seed"]),
    ("seed=1.5", ["--set", "seed=1.5"], ["seed"]),
    ("softmax_scale=abc", ["--set", "softmax_scale=abc"], ["softmax_scale"]),
    ("softmax_scale=NaN", ["--set", "softmax_scale=NaN"], ["softmax_scale"]),
    ("block_size=0", ["--set", "block_size=0"], ["block_size"]),
    ("method_options=5", ["--set", "method_options=5"], ["method_options"]),
    ("method_options=nope", ["--set", 'method_options={"nope":1}'], ["method_options", "nope"]),
    ("kivi option unknown", ["--set", "method=kivi", "--set", 'method_options={"nope":1}'], ["nope", "bits", "recent"]),
    ("kivi bits=3", ["--set", "method=kivi", "--set", 'method_options={"bits":3}'], ["bits"]),
    ("method=nope", ["--set", "method=nope"], ["nope"]),
    ("layer=abc synthetic", ["--set", "layer=abc"], ["layer"]),
    ("pre_rope_keys=yes", ["--set", "pre_rope_keys=yes"], ["pre_rope_keys"]),
    ("unknown setting", ["--set", "bogus=1"], ["bogus"]),
    ("no equals", ["--set", "num_heads"], ["--set"]),
]


@pytest.mark.parametrize("argv,names", [c[1:] for c in REPORT_SET], ids=[c[0] for c in REPORT_SET])
def test_report_bad_set(argv, names, paths, capsys):
    rc, out, err = run_cli(["report", "--out", paths["out"]] + TINY + argv, capsys)
    assert rc == 2, (rc, err[-2000:])
    assert_one_line(err, *names)


def test_report_layer_abc_with_dump(paths, capsys):
    rc, _, err = run_cli(["report", "--out", paths["out"], "--set", "source=kvfile", "--set", f"kv_file={paths['dump']}",
                          "--set", "layer=abc", "--set", "timing_runs=1"], capsys)
    assert rc == 2, err
    assert_one_line(err, "layer")


CONFIGS = [
    ("list", ["JSON object", "list"]),
    ("eight", ["num_heads", "eight"]),
    ("syntax", ["--config", "not valid JSON"]),
    ("nan", ["softmax_scale"]),
    ("inf", ["softmax_scale"]),
    ("block0", ["block_size"]),
    ("lens_str", ["context_lens", "string"]),
    ("opt_type", ["bits", "integer"]),
]


@pytest.mark.parametrize("name,names", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_report_bad_config(name, names, paths, capsys):
    rc, _, err = run_cli(["report", "--out", paths["out"], "--config", paths["cfg"][name]], capsys)
    assert rc == 2, err
    assert_one_line(err, *names)


def test_report_missing_config(paths, capsys):
    rc, _, err = run_cli(["report", "--out", paths["out"], "--config", str(paths["tmp"] / "nope.json")], capsys)
    assert rc == 2
    assert_one_line(err, "--config")


@pytest.mark.parametrize("which", ["a file", "under a file", "unwritable (/proc)", "empty"])
def test_report_bad_out(which, paths, capsys):
    out = {"a file": paths["file"], "under a file": paths["file"] + "/rep", "unwritable (/proc)": "/proc/kvviz-no-such-dir",
           "empty": ""}[which]
    rc, _, err = run_cli(["report", "--out", out] + TINY, capsys)
    assert rc == 2, err
    assert_one_line(err, "--out")


@pytest.mark.parametrize("which", ["under a file", "unwritable (/proc)", "not a dump suffix"])
def test_capture_bad_out(which, paths, capsys):
    """Refused before the model is loaded (today's code captured first, then failed with a traceback)."""
    out = {"under a file": paths["file"] + "/x.safetensors", "unwritable (/proc)": "/proc/kvviz-x.safetensors",
           "not a dump suffix": str(paths["tmp"] / "x.txt")}[which]
    rc, _, err = run_cli(["capture", "--prompt", "hi", "--out", out], capsys)
    assert rc == 2, err
    assert_one_line(err, "--out")


BENCH = [
    ("--ctx 0", ["--quick", "--ctx", "0"], ["--ctx"]),
    ("--seqs -2", ["--quick", "--seqs", "-2"], ["--seqs"]),
    ("--seqs 0", ["--quick", "--seqs", "0"], ["--seqs"]),
    ("--heads -4", ["--quick", "--heads", "-4"], ["--heads"]),
    ("--runs -3", ["--quick", "--runs", "-3"], ["--runs"]),
    ("--warmup -1", ["--quick", "--warmup", "-1"], ["--warmup"]),
    ("--head-size 0", CUSTOM[:-1] + ["0"], ["--head-size"]),
    ("--head-size 1", CUSTOM[:-1] + ["1"], ["--head-size"]),
    ("--head-size 1024", CUSTOM[:-1] + ["1024"], ["--head-size"]),
    ("kv heads not dividing", ["--seqs", "1", "--ctx", "8", "--heads", "3", "--kv-heads", "2", "--head-size", "16"],
     ["--heads", "--kv-heads"]),
    ("custom shape without --seqs", ["--quick", "--heads", "4"], ["--heads", "--seqs"]),
    # without --seqs a head size changes the quick shapes: refused here as those shapes at head 7, not ignored
    ("quick shapes at head 7", ["--quick", "--head-size", "7"], ["--head-size", "head_size 7"]),
    ("unknown prefill variant", ["--shape", "quick-prefill", "--prefill-variants", "rows,nope"],
     ["--prefill-variants", "nope"]),
    ("empty prefill variants", ["--shape", "quick-prefill", "--prefill-variants", ","], ["--prefill-variants"]),
]


@pytest.mark.parametrize("argv,names", [c[1:] for c in BENCH], ids=[c[0] for c in BENCH])
def test_bench_bad_args(argv, names, capsys):
    rc, _, err = run_cli(["bench"] + argv + TINY_BENCH, capsys)
    assert rc == 2, err[-2000:]
    assert_one_line(err, *names)


@pytest.mark.parametrize("where", ["under a file", "unwritable (/proc)"])
def test_bench_json_checked_before_the_work(where, paths, capsys, monkeypatch):
    import kvviz.bench

    def no_work(*a, **k):
        raise AssertionError("the benchmark ran before --json was checked")

    monkeypatch.setattr(kvviz.bench, "run_bench", no_work)
    out = {"under a file": paths["file"] + "/b.json", "unwritable (/proc)": "/proc/kvviz-b.json"}[where]
    rc, _, err = run_cli(["bench"] + CUSTOM + TINY_BENCH + ["--json", out], capsys)
    assert rc == 2, err
    assert_one_line(err, "--json")


def _fake_result(notes_and_verdicts):
    from kvviz.bench import BenchShape, _row

    shape = BenchShape("tiny", (8,), 2, 1, 16, 16)
    rows = [_row(f"k{i}", "v", shape, None, 0, 1.0, err, tol, {}, note) for i, (note, err, tol) in enumerate(notes_and_verdicts)]
    return {"adapter": {"name": "fake"}, "timestamp_period_ns": 1.0, "created": "", "runs": 1, "warmup": 0, "rows": rows}


@pytest.mark.parametrize("rows,rc", [
    ([("", 0.0, 1e-5)], 0),
    ([("", 0.0, 1e-5), ("FAILED: shader did not compile", None, None)], 1),
    ([("", 1.0, 1e-5)], 1),  # outside tolerance: a NO row must not exit 0
    ([("skipped: int4_group does not take head 16", None, None)], 0),
], ids=["ok", "FAILED row", "outside tolerance", "skipped method"])
def test_bench_exit_code_follows_the_rows(rows, rc, capsys, monkeypatch):
    import kvviz.bench

    monkeypatch.setattr(kvviz.bench, "run_bench", lambda *a, **k: _fake_result(rows))
    got, out, err = run_cli(["bench"] + CUSTOM + TINY_BENCH, capsys)
    assert got == rc, (out, err)
    assert "Traceback" not in err
    if rc:
        assert_one_line(err, "tolerance")


LIVE = [
    ("unknown method", ["--methods", "nope"], ["--methods", "nope"]),
    ("unknown option", ["--methods", "kivi:nope=1"], ["--methods", "nope"]),
    ("bad option value", ["--methods", "kivi:bits=3"], ["--methods", "bits"]),
    ("--n-new -1", ["--n-new", "-1"], ["--n-new"]),
    ("--n-new 0", ["--n-new", "0"], ["--n-new"]),
    ("empty prompt", ["--prompt", ""], ["--prompt"]),
    ("blank prompt", ["--prompt", "   "], ["--prompt"]),
    ("unknown policy", ["--policy", "nope"], ["--policy"]),
    ("--out under a file", ["--out", "FILE/runs.jsonl"], ["--out"]),
]


@pytest.mark.parametrize("argv,names", [c[1:] for c in LIVE], ids=[c[0] for c in LIVE])
def test_live_bad_args(argv, names, paths, capsys, monkeypatch):
    import kvviz.sources.gguf_llama as gg

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(gg, "load_gguf_llama", no_model)
    argv = [a.replace("FILE", paths["file"]) for a in argv]
    rc, _, err = run_cli(["live", "--model", "fake.gguf", "--n-new", "1"] + argv, capsys)
    assert rc == 2, err
    assert_one_line(err, *names)


class _FakeTok:
    def encode(self, text):
        return [1, 2, 3] if text.strip() else []


class _FakeModel:
    tokenizer = _FakeTok()

    class config:
        context_length = 64


@pytest.mark.parametrize("fail", [["int8_seed"], ["int8_seed", "f32"]], ids=["one fails", "all fail"])
def test_live_exits_1_when_a_method_fails(fail, capsys, monkeypatch):
    """Today a method's failure printed a 'failed' row and `kvviz live` still exited 0."""
    import kvviz.gpu.runtime
    import kvviz.live.decode
    import kvviz.methods.context
    import kvviz.sources.gguf_llama as gg
    from kvviz.errors import DeviceLostError

    class FakeCtx:
        class rt:
            class summary:
                is_software = True  # --forward auto: numpy, the model (a stand-in) is not looked at

                @staticmethod
                def line():
                    return "fake adapter"

    def fake_run_live(path, ids, n_new, key, *a, **k):
        if key in fail:
            raise DeviceLostError("device lost (simulated)")
        return {"kl_mean": 0.0, "kl_max": 0.0, "top1_agree_rate": 1.0, "free_first_divergence": None,
                "config": {"quant_cache_kind": "fake"}, "timings": {"step_s_mean": 0.0}}

    monkeypatch.setattr(gg, "load_gguf_llama", lambda *a, **k: _FakeModel())
    monkeypatch.setattr(kvviz.gpu.runtime, "GpuRuntime", lambda *a, **k: None)
    monkeypatch.setattr(kvviz.methods.context, "GpuContext", lambda *a, **k: FakeCtx())
    monkeypatch.setattr(kvviz.live.decode, "run_live", fake_run_live)
    rc, out, err = run_cli(["live", "--model", "fake.gguf", "--n-new", "1", "--methods", "f32,int8_seed"], capsys)
    assert rc == 1, (out, err)
    assert "failed" in out and "Traceback" not in err
    assert_one_line(err, "failed")
    monkeypatch.setattr(kvviz.live.decode, "run_live", lambda *a, **k: fake_run_live(None, None, 0, "ok"))
    rc, out, err = run_cli(["live", "--model", "fake.gguf", "--n-new", "1", "--methods", "f32,int8_seed"], capsys)
    assert rc == 0, (out, err)


def test_live_n_new_beyond_the_models_context(capsys, monkeypatch):
    import kvviz.sources.gguf_llama as gg

    monkeypatch.setattr(gg, "load_gguf_llama", lambda *a, **k: _FakeModel())
    rc, _, err = run_cli(["live", "--model", "fake.gguf", "--n-new", "100", "--methods", "f32"], capsys)
    assert rc == 2
    assert_one_line(err, "--n-new", "context")


# ------------------------------------------------------------------ the config schema itself (no GPU)
def test_settings_parse_to_their_declared_types():
    from kvviz.analysis.session import SessionConfig

    base = SessionConfig()
    # one number is one sequence (as `300,517` is two); a JSON list works too
    assert base.with_overrides(["context_lens=300"]).context_lens == (300,)
    assert base.with_overrides(["context_lens=12,5"]).context_lens == (12, 5)
    assert base.with_overrides(["context_lens=[3, 4]"]).context_lens == (3, 4)
    assert base.with_overrides(["prompt=123"]).prompt == "123"  # text fields keep the text
    assert base.with_overrides(['kv_file="a b.npz"']).kv_file == "a b.npz"
    assert base.with_overrides(["softmax_scale=0.125"]).softmax_scale == 0.125
    assert base.with_overrides(["softmax_scale=1"]).softmax_scale == 1.0
    cfg = base.with_overrides(["method=kivi", 'method_options={"bits": 4}'])
    assert cfg.method_options == {"bits": 4}
    cfg.validate()
    assert SessionConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


@pytest.mark.parametrize("kw,name", [
    ({"num_heads": 1.5}, "num_heads"), ({"num_heads": "8"}, "num_heads"), ({"num_heads": True}, "num_heads"),
    ({"context_lens": "64"}, "context_lens"), ({"context_lens": (3, 0)}, "context_lens"),
    ({"softmax_scale": float("nan")}, "softmax_scale"), ({"softmax_scale": -1.0}, "softmax_scale"),
    ({"layer": -1}, "layer"), ({"seed": -1}, "seed"), ({"method_options": {"bits": 4}}, "bits"),
    ({"method_options": []}, "method_options"),
])
def test_configs_built_in_code_are_checked_too(kw, name):
    """The window builds SessionConfig directly; validate() holds it to the same schema."""
    from kvviz.analysis.session import SessionConfig
    from kvviz.errors import InvalidInput

    with pytest.raises(InvalidInput, match=name):
        SessionConfig(**kw).validate()


def test_help_of_every_command_lists_every_option_with_its_default(capsys):
    """`kvviz CMD -h` describes every option, and says the default of each that has one."""
    import argparse

    from kvviz.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in sub.choices.items():
        with pytest.raises(SystemExit):
            main([name, "-h"])
        text = " ".join(capsys.readouterr().out.split())
        for a in sp._actions:
            if not a.option_strings or a.dest == "help":
                continue
            assert a.help, (name, a.option_strings)
            assert a.option_strings[-1] in text, (name, a.option_strings)
            d = a.default
            if d not in (None, "", [], argparse.SUPPRESS) and not isinstance(d, bool):
                assert "default" in a.help or f"(default: {d})" in text, (name, a.option_strings, d)
