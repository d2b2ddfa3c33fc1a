"""Compare quantisation methods against the f32 paged baseline on the same KV (Qt-free).

`compare_methods` writes the batch into the f32 paged cache (ctx.paged f32 writer), runs the f32
decode and attention-weights kernels, then quantises the same KV with each method and runs its own
attention path on the GPU. Every number comes from GPU outputs; nothing is recomputed in numpy.

Per method (dict keys):
  method, name, label, options   name: the key and the options that differ from the defaults
                     (`turboquant qjl_scale=unbiased`), which tells two settings of one method apart
  bits_per_element   average of the K and V layouts' bits per element (scales, zeros and, for
                     KIVI, the float32 residual rows of THIS batch included: `layouts_for_batch`)
  bytes_per_token    K + V bytes one token costs over all KV heads
  kl_mean, kl_max    KL(w_f32 || w_method) in nats over the positions of each (sequence, head),
                     mean and max over (sequence, head) pairs with a non-empty context. Both
                     weight rows are renormalised to sum 1 (the kernels divide by sum + 1e-6) and
                     floored inside the log (kvviz.metrics.kl_divergence), so a weight
                     the method flushes to 0 costs a large but finite amount.
  max_weight_err     max |w_method - w_f32| over all positions
  out_rel_l2         ||o_method - o_f32|| / ||o_f32|| over the whole decode output
  out_cos_mean, out_cos_min   cosine of o_method and o_f32 per (sequence, head)
  top8_overlap       mean over (sequence, head) of |top8(w_f32) & top8(w_method)| / min(8, context)
  seconds            host wall time of quantise + attend + weights (lavapipe: CPU time, not GPU time)
  decode_us          GPU-timestamp median of the method's decode on this batch (kvviz.gpu.timed.decode_time:
                     its fast split-K decode where it has one, else its decode kernels), dequant_us the
                     dequantise pass a first-wave decode needs first (None otherwise), decode_impl which;
                     decode_total_us = decode_us + dequant_us (the comparison's time axis). With
                     time_decode=False these are None.
"""
from __future__ import annotations

import time

import numpy as np

from kvviz.gpu.timed import checked, decode_time
from kvviz.gpu.timing import TIME_DECIMALS
from kvviz.metrics import attention_metrics
from kvviz.methods.base import batch_layouts

TOPK = 8


_layouts = batch_layouts


def attention_errors(w_ref, w, o_ref, o, context_lens, k: int = TOPK) -> dict:
    """The attention metrics of one method from GPU weights [S, H, ctx] and outputs [S, H, D],
    summarised over the (sequence, head) pairs with a non-empty context (kvviz.metrics)."""
    m = attention_metrics(w_ref, w, o_ref, o, context_lens, k)
    live = np.asarray(context_lens, np.int64) > 0
    o_ref = np.asarray(o_ref, np.float64)
    o = np.asarray(o, np.float64)
    ref_norm = np.linalg.norm(o_ref)
    kl = m.kl[live] if live.any() else np.zeros(1)
    cos = m.cosine[live] if live.any() else np.ones(1)
    return {
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "max_weight_err": float(m.max_weight_err.max()) if m.max_weight_err.size else 0.0,
        "out_rel_l2": float(np.linalg.norm(o - o_ref) / ref_norm) if ref_norm > 0 else float(np.linalg.norm(o)),
        "out_cos_mean": float(cos.mean()),
        "out_cos_min": float(cos.min()),
        f"top{k}_overlap": float(m.topk_overlap[live].mean()) if live.any() else 1.0,
    }


def baseline(ctx, batch, key, value, q, scale):
    """f32 paged cache, decode output and weights of the batch (the reference every method is held to)."""
    kvh, D = key.shape[1], key.shape[2]
    cache = ctx.paged.allocate("f32", batch.num_blocks, kvh, batch.block_size, D)
    ctx.paged.write(cache, key, value, batch.slot_mapping)
    return cache, ctx.paged.decode(cache, q, batch, scale), ctx.paged.weights(cache, q, batch, scale)


def compare_methods(ctx, batch, key, value, q, scale, methods, time_decode: bool = True, runs: int = 5) -> list[dict]:
    """Run the f32 baseline and every method on the same KV; one dict per method (see module doc)."""
    key = np.asarray(key)
    kvh, D = key.shape[1], key.shape[2]
    _, o_ref, w_ref = baseline(ctx, batch, key, value, q, scale)
    rows = []
    for m in methods:
        t0 = time.perf_counter()
        qkv = m.quantize(ctx, batch, key, value)
        o = m.attend(ctx, qkv, batch, q, scale)
        w = m.weights(ctx, qkv, batch, q, scale)
        dt = time.perf_counter() - t0
        kl, vl = _layouts(m, batch, D)
        row = {
            "method": m.id,
            "name": m.option_name(),
            "label": m.label,
            "options": dict(m.options()),
            "bits_per_element": (kl.bits_per_element + vl.bits_per_element) / 2.0,
            "bytes_per_token": (kl.bytes_per_token_per_head + vl.bytes_per_token_per_head) * kvh,
        }
        row.update(attention_errors(w_ref, w, o_ref, o, batch.context_lens))
        row["seconds"] = dt
        t = {"decode_us": None, "dequant_us": None, "impl": None}
        if time_decode:  # the kernels over the caches `quantize` filled (nothing is quantised again)
            t = decode_time(ctx.rt, checked(m.timed_kernels(ctx, batch, key, value, q, scale, qkv), m.id), runs)
        row["decode_us"], row["dequant_us"], row["decode_impl"] = t["decode_us"], t["dequant_us"], t["impl"]
        row["decode_total_us"] = (None if t["decode_us"] is None
                                  else round(t["decode_us"] + (t["dequant_us"] or 0.0), TIME_DECIMALS))
        rows.append(row)
    return rows


def format_table(rows: list[dict], f32_bytes_per_token: float | None = None) -> str:
    """A fixed-width text table of compare_methods rows (for `pytest -s`, the CLI and reports)."""
    head = f"{'method':<44} {'bits/el':>7} {'B/token':>8} {'KL mean':>10} {'KL max':>10} {'max|dw|':>9} {'out relL2':>9} {'cos min':>8} {'top8':>5}"
    lines = [head, "-" * len(head)]
    if f32_bytes_per_token is not None:
        lines.append(f"{'f32 baseline':<44} {32.0:>7.2f} {f32_bytes_per_token:>8.0f} {0.0:>10.2e} {0.0:>10.2e} {0.0:>9.2e} {0.0:>9.2e} {1.0:>8.5f} {1.0:>5.2f}")
    for r in rows:
        opts = ",".join(f"{k}={v}" for k, v in r["options"].items() if k != "context_len")
        name = f"{r['method']}" + (f"({opts})" if opts else "")
        lines.append(
            f"{name:<44} {r['bits_per_element']:>7.2f} {r['bytes_per_token']:>8.0f} {r['kl_mean']:>10.2e} "
            f"{r['kl_max']:>10.2e} {r['max_weight_err']:>9.2e} {r['out_rel_l2']:>9.2e} {r['out_cos_min']:>8.5f} "
            f"{r['top8_overlap']:>5.2f}"
        )
    return "\n".join(lines)
