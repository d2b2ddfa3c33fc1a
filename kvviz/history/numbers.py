"""The headline numbers of a window run, kept with it in the run history, and their change against a baseline.

`headline_numbers(res)` flattens what the panels show as numbers (the attention errors, the bits per
element, the decode time, the blocks used, the codes' statistics, the copy bandwidth) into one dict;
the history stores it with each window run, so a pinned baseline's numbers are there without its
results. `change(key, now, base)` is what every panel says beside a number: the change and whether
it is better, worse or neither. Qt-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

LOWER, HIGHER, NEITHER = -1, 1, 0  # which way is better


@dataclass(frozen=True)
class NumberSpec:
    label: str
    better: int = NEITHER
    fmt: str = ".3g"


NUMBERS: dict[str, NumberSpec] = {
    "kl_mean": NumberSpec("KL mean (nats)", LOWER),
    "kl_max": NumberSpec("KL max (nats)", LOWER),
    "cosine_min": NumberSpec("output cosine (min)", HIGHER, ".5f"),
    "cosine_mean": NumberSpec("output cosine (mean)", HIGHER, ".5f"),
    "rel_l2_mean": NumberSpec("output rel. L2 (mean)", LOWER),
    "rel_l2_max": NumberSpec("output rel. L2 (max)", LOWER),
    "topk_overlap_mean": NumberSpec("top-k overlap (mean)", HIGHER, ".3f"),
    "max_weight_err": NumberSpec("max |weight error|", LOWER),
    "bits_k": NumberSpec("K bits / element", NEITHER, ".3f"),
    "bits_v": NumberSpec("V bits / element", NEITHER, ".3f"),
    "decode_us": NumberSpec("decode, method (us)", LOWER, ".1f"),
    "f32_decode_us": NumberSpec("decode, f32 (us)", LOWER, ".1f"),
    "blocks_used": NumberSpec("blocks used", NEITHER, ".0f"),
    "copy_gbps": NumberSpec("copy bandwidth (GB/s)", HIGHER, ".3g"),
    "elapsed_s": NumberSpec("computed in (s)", LOWER, ".2f"),
}
# the codes' statistics (kvviz.metrics.CodeStats.stats) are kept as k_<name> / v_<name>; these are worse higher
WORSE_HIGHER_STATS = ("saturated", "zeroed")


def spec(key: str) -> NumberSpec:
    if key in NUMBERS:
        return NUMBERS[key]
    if key[:2] in ("k_", "v_"):
        name = key[2:]
        return NumberSpec(f"{key[0].upper()} {name.replace('_', ' ')}", LOWER if name in WORSE_HIGHER_STATS else NEITHER)
    return NumberSpec(key.replace("_", " "))


def method_decode_us(res) -> float:
    """The method's decode time: its attention and decode kernels' medians summed (what the overview shows)."""
    ts = [t for t in res.timings if t.variant == res.method.label and ("attn" in t.kernel or "decode" in t.kernel)]
    return float(sum(t.timing.median_us for t in ts)) if ts else math.nan


def headline_numbers(res) -> dict:
    """The numbers of a `Results` the panels show, flat: {key: float} (finite values only)."""
    s = res.metrics.summary()
    k_lay, v_lay = res.layouts
    base = next((t for t in res.timings if t.kernel == "paged_attn_f32"), None)
    out = {
        "kl_mean": s["kl_mean"], "kl_max": s["kl_max"], "cosine_min": s["cosine_min"], "cosine_mean": s["cosine_mean"],
        "rel_l2_mean": s["rel_l2_mean"], "rel_l2_max": s["rel_l2_max"],
        "topk_overlap_mean": s.get(f"top{res.metrics.k}_overlap_mean", math.nan),
        "max_weight_err": s["max_weight_err"], "bits_k": k_lay.bits_per_element, "bits_v": v_lay.bits_per_element,
        "decode_us": method_decode_us(res), "f32_decode_us": base.timing.median_us if base else math.nan,
        "blocks_used": float((res.batch.block_owner() >= 0).sum()), "copy_gbps": res.copy_gbps,
        "elapsed_s": res.elapsed_s,
    }
    for which, st in (("k", res.k_stats), ("v", res.v_stats)):
        for name, stat in st.stats.items():
            out[f"{which}_{name}"] = stat.value
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}


@dataclass(frozen=True)
class Change:
    text: str  # "+12.3%" (or "+0.00021" for a value near 0)
    verdict: str  # "better", "worse", "same" or "" (neither way is better)


def change(key: str, now: float, base: float) -> Change | None:
    """`now` against `base`: a relative change (an absolute one when base is 0); None when either is missing."""
    if now is None or base is None or not (math.isfinite(now) and math.isfinite(base)):
        return None
    sp = spec(key)
    d = now - base
    if base != 0 and abs(base) > 1e-30:
        rel = 100.0 * d / abs(base)
        ratio = now / base
        # a change of more than 10x reads better as a factor ("x167") than as "+16542.2%"
        text = f"x{ratio:.3g}" if ratio >= 10 else f"{rel:+.1f}%" if abs(rel) >= 0.05 else "\u00b10%"
        same = abs(rel) < 0.05
    else:
        text = f"{d:+{sp.fmt}}" if d else "\u00b10"
        same = d == 0
    if same:
        return Change(text, "same")
    if sp.better == NEITHER:
        return Change(text, "")
    return Change(text, "better" if (d < 0) == (sp.better == LOWER) else "worse")
