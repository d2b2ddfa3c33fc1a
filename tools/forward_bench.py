"""Time the GPU forward (kvviz/forward) on a GGUF model: a prefill pass and a decode step, by GPU timestamps.

    python tools/forward_bench.py MODEL.gguf [--tokens 2048] [--runs 3] [--weights exact|f16|f32] [--numpy]
                                  [--scale-layers N] [--json OUT]

Prints, after the adapter, the model and its weights on the device:
  prefill  --tokens random token ids at position 0 through the whole pass (the embedding, every layer with the
           forward's own causal attention, the final norm, the last token's logits) in one compute pass: the median
           of --runs GPU-timestamp runs after a warm-up; then the wall time of GpuRunner.prefill on the same ids
           (uploads, the pass, the read-back of the logits)
  layer 0  the layer's pass alone, then each of its kernels alone (each in its own pass): where a layer's time goes
  decode   one token after the prefill (position --tokens), its pass timed the same way; the wall time of
           GpuRunner.step
  numpy    (--numpy) the numpy forward's wall times on the same ids, and the largest KL between the two forwards'
           next-token distributions over the prompt
--scale-layers N, for a model written with fewer layers than the one it stands for (tools/random_gguf.py --layers):
the prefill pass's estimate for N layers, pass + (N - layers) x the layer's pass, printed as an estimate.
Models for it: tools/random_gguf.py (Llama-3-8B's shapes by default).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from kvviz.forward.model import GpuForward, GpuRunner
from kvviz.gpu.runtime import GpuRuntime
from kvviz.live.metrics import kl_logits
from kvviz.sources.gguf_llama import load_gguf_llama
from kvviz.sources.llama_numpy import LlamaRunner
from kvviz.tables import clean


def _label(d) -> str:
    """A dispatch as a name: its shader and, for a product, its weight matrix."""
    kernel = d.kernel.name.split(":")[0].replace("forward/", "").replace(".wgsl", "")
    for b in d.buffers:
        lab = getattr(b[0] if isinstance(b, tuple) else b, "label", "") or ""
        if lab.startswith("blk.") or lab.startswith(("output", "token_embd")):
            return f"{kernel} {lab.split('[')[0]}"
    return kernel


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--weights", choices=("exact", "f16", "f32"), default="exact")
    ap.add_argument("--numpy", action="store_true", help="also time the numpy forward and compare the logits")
    ap.add_argument("--scale-layers", type=int, default=0)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    rt = GpuRuntime()
    out = {"adapter": rt.summary.to_json(), "model": os.path.basename(a.model), "tokens": a.tokens, "runs": a.runs}
    print(f"adapter: {rt.summary.line()}")
    t0 = time.perf_counter()
    model = load_gguf_llama(a.model)
    c = model.config
    out["load_s"] = time.perf_counter() - t0
    print(f"model: {c.name}: {c.n_layers} layers, hidden {c.hidden}, {c.n_heads}/{c.n_kv_heads} heads of "
          f"{c.head_size}, ffn {c.ffn}, vocab {c.vocab} (read in {out['load_s']:.1f} s)")
    t0 = time.perf_counter()
    fwd = GpuForward(model, rt, weights=a.weights, chunk=max(a.tokens, 1))
    out["upload_s"] = time.perf_counter() - t0
    out["weights"] = fwd.describe()
    print(f"{fwd.describe()} (placed in {out['upload_s']:.1f} s)")
    if fwd.chunk < a.tokens:
        print(f"note: --tokens {a.tokens} pass a storage binding here; one pass takes {fwd.chunk}")
    ids = [int(i) for i in np.random.default_rng(0).integers(0, c.vocab, a.tokens)]
    g = GpuRunner(model, forward=fwd)
    ds = g.pass_dispatches(ids[:fwd.chunk])
    tp = rt.time(ds, runs=a.runs, warmup=1)
    layer = g.layer_dispatches(0, min(a.tokens, fwd.chunk), 0)
    tl = rt.time(layer, runs=a.runs, warmup=1)
    out["prefill_pass_us"], out["layer_pass_us"] = tp.median_us, tl.median_us
    out["timing"] = tp.method
    print(f"prefill of {min(a.tokens, fwd.chunk)} tokens, one pass: {tp.median_us / 1e3:.1f} ms median of {a.runs} "
          f"({tp.method}); layer 0 alone: {tl.median_us / 1e3:.2f} ms")
    kernels = []
    for d in layer:
        t = rt.time([d], runs=a.runs, warmup=1)
        kernels.append((_label(d), t.median_us))
    for name, us in kernels:
        print(f"  {name:<40} {us / 1e3:9.3f} ms")
    out["layer_kernels_us"] = kernels
    if a.scale_layers:
        est = tp.median_us + (a.scale_layers - c.n_layers) * tl.median_us
        out["estimate_layers"], out["estimate_prefill_us"] = a.scale_layers, est
        print(f"estimate for {a.scale_layers} layers (measured pass + {a.scale_layers - c.n_layers} x layer 0's pass): "
              f"{est / 1e3:.1f} ms")
    t0 = time.perf_counter()
    logits = g.prefill(ids)
    out["prefill_wall_s"] = time.perf_counter() - t0
    tok = int(np.argmax(logits))
    dd = g.pass_dispatches([tok])
    td = rt.time(dd, runs=max(a.runs, 10), warmup=3)
    t0 = time.perf_counter()
    g.step(tok)
    out["decode_pass_us"], out["decode_wall_s"] = td.median_us, time.perf_counter() - t0
    print(f"prefill wall time (GpuRunner.prefill of {a.tokens}): {out['prefill_wall_s']:.2f} s; decode step at "
          f"position {a.tokens}: pass {td.median_us / 1e3:.2f} ms, wall {out['decode_wall_s'] * 1e3:.1f} ms")
    if a.numpy:
        n = LlamaRunner(model, record=False)
        t0 = time.perf_counter()
        ref = n.prefill(ids, all_logits=True)
        out["numpy_prefill_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        n.step(tok)
        out["numpy_step_s"] = time.perf_counter() - t0
        g2 = GpuRunner(model, forward=fwd)
        got = g2.prefill(ids, all_logits=True)
        out["kl_max"] = max(kl_logits(x, y) for x, y in zip(ref, got))
        out["argmax_equal"] = bool((ref.argmax(-1) == got.argmax(-1)).all())
        print(f"numpy forward: prefill {out['numpy_prefill_s']:.2f} s, step {out['numpy_step_s'] * 1e3:.0f} ms; "
              f"GPU vs numpy: KL up to {out['kl_max']:.2g}, argmax equal at every position: {out['argmax_equal']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(clean(out), f, indent=1, allow_nan=False)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
