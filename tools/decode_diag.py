"""Where the exact int8 fast decode spends its time: scratch variants of the rendered kernel with one part taken out,
timed at the anchor shape (15 x 4096, 32/8 heads, d128, block 16, scattered blocks) beside the kernel as built. The
variants compute wrong outputs on purpose (diagnostics, never a product path); each is named by what it leaves out:
    all block ids 0    every token reads block 0 (one 17 KB page, cache-resident): the kernel without DRAM traffic
    no shuffles        subgroupShuffle / subgroupShuffleXor replaced by their own argument (the lane's value)
    cheap codes        the int8 -> f32 conversions (i8x4) replaced by one AND and a bitcast a word
    no P.V             the accumulator updates dropped (the compiler then drops the V loads and conversions too)
and, for the kernel as built, the reduce alone in its own pass beside split + reduce in one (the rest is the gap).
With --fixed, where a decode's fixed cost goes (best at a shape of few steps a workgroup, e.g. 16 x 64):
    no steps           the token loop's body dropped (the prologue's loads, the merge and the write stay)
    empty              prologue, loop body, merge and write all dropped: the launch of the grid and its timestamps
Run on the device: python3 tools/decode_diag.py [passes [num_seqs ctx]] [--fixed]"""
import dataclasses
import re
import sys

import numpy as np

from kvviz.gpu.runtime import GpuRuntime
from kvviz.attention import split_decode as fd
from kvviz.gpu.copy import measure_copy
from kvviz.paging import make_batch

H, KVH, D, BS = 32, 8, 128, 16
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
PASSES = int(ARGS[0]) if ARGS else 2
S, T = (int(ARGS[1]), int(ARGS[2])) if len(ARGS) > 2 else (15, 4096)
CHEAP = "fn cheap4(w: u32) -> vec4<f32> { return vec4<f32>(bitcast<f32>(w & 0x3F7FFFFFu)); }"


def no_shuffles(d):
    step = d["STEP"]
    for _ in range(3):  # nested calls: innermost first
        step = re.sub(r"subgroupShuffle(?:Xor)?\(([^(),]*(?:\([^()]*\))?[^(),]*), [^()]*?(?:\([^()]*\))?\)", r"(\1)", step)
    d["STEP"] = step.replace("subgroupAny(", "(")
    return d


def cheap_codes(d):
    d["STEP"] = d["STEP"].replace("i8x4(", "cheap4(")
    d["HELPERS"] = d["HELPERS"] + "\n" + CHEAP
    return d


def no_pv(d):
    d["STEP"] = "\n".join(ln for ln in d["STEP"].split("\n") if not re.match(r"\s*a\d+_\d+ = ", ln))
    return d


def no_steps(d):
    d["STEP"] = ""
    return d


def empty(d):
    return {**d, "PROLOGUE": "", "STEP": "", "MERGE": "", "WRITE": "", "SG_GUARD": ""}


rt = GpuRuntime()
print(rt.summary.line())
copy_gbps, _ = measure_copy(rt, 256 << 20, 20, 3)
print(f"copy shader: {copy_gbps:.0f} GB/s")
batch = make_batch([T] * S, BS, policy="scattered", seed=0)
zero = dataclasses.replace(batch, block_tables=np.zeros_like(batch.block_tables))
rng = np.random.default_rng(0)
q = rng.standard_normal((S, H, D)).astype(np.float32)
n = batch.num_blocks * KVH * BS * fd.INT8.wpt(D)
k = rt.upload(rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C), "k")
v = rt.upload(rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C), "v")
render = fd.render
cases = [("as built", None, batch), ("all block ids 0", None, zero), ("no shuffles", no_shuffles, batch),
         ("cheap codes", cheap_codes, batch), ("no P.V", no_pv, batch)]
if "--fixed" in sys.argv[1:]:
    cases = [("as built", None, batch), ("no steps", no_steps, batch), ("empty", empty, batch)]
for p in range(1, PASSES + 1):
    for name, patch, b in cases:
        fd.render = (lambda *a, _p=patch, **kw: _p(render(*a, **kw))) if patch else render
        try:
            plan = fd.FastDecode(rt).plan(fd.INT8, k, v, KVH, q, b, 0.088)
            split = rt.time(plan.dispatches[:1], 30, 5).median_us
        except Exception as exc:  # noqa: BLE001 (a diagnostic table: say what failed and go on)
            print(f"pass {p} {name:18s} failed: {exc}")
            continue
        extra = ""
        if patch is None and b is batch:  # the kernel as built: the reduce alone, and split + reduce in one pass
            both = rt.time(plan.dispatches, 30, 5).median_us
            extra = f"  reduce alone {rt.time(plan.dispatches[1:], 30, 5).median_us:6.1f} us  split + reduce {both:7.1f} us"
        print(f"pass {p} {name:18s} split {split:7.1f} us{extra}", flush=True)
fd.render = render
