"""Times the fast decode at the anchor shape (15 x 4096, 32/8 heads, d128, block 16, scattered) over
partition lengths, tokens per step and the no-subgroup variant, for the int8 (seed layout), f16 and
f32 caches; prints GPU medians and GB/s against the copy shader. Run on the device:
    python3 tools/fast_decode_tune.py [num_seqs ctx [policy [formats]]]

Variant mode (any --qk / --pv / --flush / --checks flag, or --variants for all of them): the default layout
of each format in `formats` (default int8,f16) for every combination of the kernel variants
(kvviz/attention/split_decode.py: qk f32 | i8 = int8 query + dot4I8Packed (int8, int4), pv f32 | f16 = f16 P.V
flushed every `flush` steps | h2 = f16-pair P.V from the integer codes (int8, int4), naga's runtime checks on | off;
--fold=off,on: the separate reduce or the reduce folded into the split kernel (default: fast_decode.FOLD); --lanes / --unroll: layouts, default 16 / 2; --prefetch=on,off: the
software-pipelined loads (default: fast_decode.PREFETCH); --lazy=on,off: rescale only when the max grows
(default: on for fast_decode.LAZY_FORMATS); --scatter=on,off: the reduce-scatter softmax (default: fast_decode.SCATTER); --magic=on,off: int8/int4 codes to f32 by the 2^23 trick (default:
fast_decode.MAGIC_CVT); --split: also time the split kernel without the reduce; --pt=N,...: tokens a partition
(0: the planner's); --rows=N,...: row groups a workgroup (0: the layout's); --budget=S: start no
new plan after S seconds), each output checked against its own oracle and tolerance
(int8 / f16 / f32 caches), then a table of median GPU us (pass timestamps). E.g. on the H200:
    python3 tools/fast_decode_tune.py 15 4096 scattered int8,f16 --variants
    python3 tools/fast_decode_tune.py --qk=f32,i8 --pv=f32,f16 --flush=2,4,8 --checks=on,off --lanes=8,16
    python3 tools/fast_decode_tune.py 15 4096 scattered int8,int4 --qk=f32,i8 --pv=f32,h2 --fold=off,on
"""
import sys
import time

import numpy as np

from kvviz.gpu.runtime import GpuRuntime
from kvviz.attention import split_decode as fd
from kvviz.gpu.copy import measure_copy
from kvviz.paging import make_batch

# --fp8-unit=off: e4m3 codes converted times 2^8 a vec4 (fast_decode.FP8_UNIT emptied), the A/B of the folded unit;
# --bt-ahead=off|all: each block-table entry loaded in the step that uses it, or a step ahead, for every format
# (fast_decode.BT_AHEAD_FORMATS: the default's formats)
FLAGS = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in sys.argv[1:] if a.startswith("--"))
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
S, T = (int(ARGS[0]), int(ARGS[1])) if len(ARGS) > 1 else (15, 4096)
POLICY = ARGS[2] if len(ARGS) > 2 else "scattered"  # how blocks are handed out: contiguous / scattered
VARIANT_MODE = bool({"variants", "qk", "pv", "flush", "checks", "lanes", "unroll", "prefetch", "lazy", "magic", "scatter", "split", "pt", "rows", "fold"} & set(FLAGS))
ONLY = ARGS[3].split(",") if len(ARGS) > 3 else (["int8", "f16"] if VARIANT_MODE else None)  # formats to time
BUDGET_S = float(FLAGS.get("budget") or 0)  # variant mode: start no new plan after this many seconds (0: no limit)
STARTED = time.monotonic()
H, KVH, D, BS = 32, 8, 128, 16
SCALE = 0.088
if FLAGS.get("fp8-unit") == "off":
    fd.FP8_UNIT = {}
if FLAGS.get("i8-f16"):  # int8 codes -> f32 by f16 pairs, or by the 2^23 trick alone (fast_decode.I8X4_VIA_F16)
    fd.I8X4_VIA_F16 = FLAGS["i8-f16"] == "on"
if FLAGS.get("bt-ahead") in ("off", "all"):  # block-table entries a step ahead for no format / every format
    fd.BT_AHEAD_FORMATS = () if FLAGS["bt-ahead"] == "off" else ("f32", "f16", "int8", "fp8_e4m3", "fp8_e5m2", "int4")
rt = GpuRuntime()
print(rt.summary.line())
copy_gbps, _ = measure_copy(rt, 256 << 20, 20, 3)
print(f"copy shader: {copy_gbps:.0f} GB/s")
batch = make_batch([T] * S, BS, policy=POLICY, seed=0)
print(f"{S} x {T} tokens, {POLICY} blocks")
rng = np.random.default_rng(0)
fast = fd.FastDecode(rt)
q = rng.standard_normal((S, H, D)).astype(np.float32)


def values(fmt, words):
    """What the tool's random cache words decode to (float64 [blocks, kvh, bs, D]), for the formats the
    variant mode checks; None for the others."""
    w = words.reshape(batch.num_blocks, KVH, BS, fmt.wpt(D))
    if fmt.name == "int8":
        return w[..., :D // 4].copy().view(np.int8).astype(np.float64) * w[..., D // 4:].view(np.float32).astype(np.float64)
    if fmt.name == "f16":
        return w.copy().view(np.float16).astype(np.float64)
    if fmt.name == "f32":
        return w.view(np.float32).astype(np.float64)
    if fmt.name == "int4":  # nibble l of word j is element 8j + l; value = code * s + z a group
        codes = (w[..., :D // 8, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15
        sz = w[..., D // 8:].view(np.float32).astype(np.float64).reshape(*w.shape[:-1], D // fmt.group_size, 2)
        codes = codes.reshape(*w.shape[:-1], D // fmt.group_size, fmt.group_size).astype(np.float64)
        return (codes * sz[..., :1] + sz[..., 1:]).reshape(*w.shape[:-1], D)
    return None


def variant_table(fmt, k, v, kw, vw):
    """Every requested variant combination of `fmt` at the default layout: checked, timed, tabled."""
    from kvviz.attention import paged_oracle as O
    every = "variants" in FLAGS
    qks = FLAGS.get("qk") or ("f32,i8" if every else "f32")
    pvs = FLAGS.get("pv") or ("f32,f16" if every else "f32")
    flushes = [int(x) for x in (FLAGS.get("flush") or ("2,4,8" if every else str(fd.PV_FLUSH))).split(",")]
    checks_list = [c == "on" for c in (FLAGS.get("checks") or ("on,off" if every else "on")).split(",")]
    layouts = [(int(ln), int(u), pf == "on", None if lz == "default" else lz == "on", None if mg == "default" else mg == "on", int(pt), int(rw), None if sc == "default" else sc == "on", None if fo == "default" else fo == "on")
               for fo in (FLAGS.get("fold") or "default").split(",")
               for ln in (FLAGS.get("lanes") or "16").split(",")
               for u in (FLAGS.get("unroll") or "2").split(",") for pf in (FLAGS.get("prefetch") or ("on" if fd.PREFETCH else "off")).split(",")
               for lz in (FLAGS.get("lazy") or "default").split(",")
               for mg in (FLAGS.get("magic") or "default").split(",")
               for pt in (FLAGS.get("pt") or "0").split(",") for rw in (FLAGS.get("rows") or "0").split(",")
               for sc in (FLAGS.get("scatter") or "default").split(",")]
    kf, vf = values(fmt, kw), values(fmt, vw)
    M = float(np.abs(vf).max()) if vf is not None else 0.0
    refs, rows = {}, []
    for qk in qks.split(","):
        if qk == "i8" and fmt.name not in fd.QK_I8_FORMATS:
            continue
        for pv in pvs.split(","):
            for (lanes, unroll, prefetch, lazy, magic, pt, rw, sc, fo), flush, checks in [(lay, f, c) for lay in layouts for f in (flushes if pv in ("f16", "h2") else [fd.PV_FLUSH])
                                                   for c in checks_list]:
                name = (fd.variant_name(qk, pv, flush) + ("" if (lanes, unroll) == (16, 2) else f" [L<={lanes}, U={unroll}]")
                        + (", prefetch" if prefetch else "") + ("" if lazy is None else ", lazy rescale" if lazy else ", eager rescale") + ("" if magic is None else ", magic cvt" if magic else ", no magic cvt")
                        + (f", {pt} tokens a partition" if pt else "") + (f", {rw} rows" if rw else "")
                        + ("" if sc is None else ", scatter softmax" if sc else ", all-lane softmax")
                        + ("" if fo is None else ", reduce folded in" if fo else ", separate reduce"))
                if BUDGET_S and time.monotonic() - STARTED > BUDGET_S:
                    print(f"{fmt.name} {name} checks={checks}: skipped, past the --budget of {BUDGET_S:.0f} s")
                    continue
                try:
                    plan = fast.plan(fmt, k, v, KVH, q, batch, SCALE, checks=checks, qk=qk, pv=pv, pv_flush=flush,
                                     lanes=lanes, unroll=unroll, prefetch=prefetch, lazy=lazy, magic=magic,
                                     partition_tokens=pt or None, rows=rw, scatter=sc, fold=fo)
                except Exception as exc:  # noqa: BLE001 (a tuning table: say what failed and go on)
                    print(f"{fmt.name} {name} checks={checks}: {exc}")
                    continue
                verdict = "-"
                if kf is not None:
                    if qk not in refs:
                        qr = q
                        if qk == "i8":
                            c, s = fd.quantize_query(q)
                            qr = c.astype(np.float64) * s[..., None].astype(np.float64)
                        refs[qk] = O.decode(qr, kf, vf, batch.block_tables, batch.context_lens, BS, SCALE)
                    rt.run(plan.dispatches)
                    err = float(np.abs(fast.read(plan) - refs[qk]).max())
                    tol = fd.f32_tolerance(M) + (float(fd.pv_tolerance(M, T, unroll, flush, 1.0, 4 if fmt.group_size else 2))
                                                 if pv in ("f16", "h2") else 0.0)
                    verdict = f"{err:.2e} {'ok' if err <= tol else 'OVER'} (tol {tol:.1e})"
                t = rt.time(plan.dispatches, 30, 5)
                split = rt.time(plan.dispatches[:1], 30, 5).median_us if "split" in FLAGS else None
                nb, _ = fd.decode_traffic(fmt, batch, H, KVH, D, plan.num_partitions)
                rows.append((fmt.name, name, checks, t.median_us, nb / (t.median_us * 1e3), verdict))
                sp = f" (split alone {split:.1f} us)" if split is not None else ""
                print(f"{fmt.name:5s} {name:50s} checks={checks!s:5s} {t.median_us:8.1f} us{sp}  error {verdict}", flush=True)
    return rows


table = []
for fmt in (fd.INT8, fd.F16, fd.F32, fd.fp8_format("e4m3", False), fd.int4_format(32)):
    if ONLY and fmt.name not in ONLY:
        continue
    n = batch.num_blocks * KVH * BS * fmt.wpt(D)
    kw = rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C)
    vw = rng.integers(0, 1 << 31, n, dtype=np.uint32) & np.uint32(0x3C3C3C3C)
    k, v = rt.upload(kw, "k"), rt.upload(vw, "v")
    if VARIANT_MODE:
        table += variant_table(fmt, k, v, kw, vw)
        continue
    cases = [(True, ln, u, r, pt, True) for ln in (8, 16, 32) for r in (0, 16) for u in (1, 2) for pt in (None, 1024, 2048)]
    if fmt not in (fd.INT8, fd.F16):
        cases = [(True, ln, 2, 0, pt, True) for ln in (8, 16, 32) for pt in (None, 1024)]
    if ONLY:  # the default layout, with and without naga's runtime checks (kvviz/gpu/trusted.py)
        cases = [(True, 16, 2, 0, None, True), (True, 16, 2, 0, None, False)]
    for sub, lanes, unroll, rows, pt, checks in cases:
        try:
            plan = fast.plan(fmt, k, v, KVH, q, batch, SCALE, partition_tokens=pt, subgroups=sub, unroll=unroll,
                             rows=rows, lanes=lanes, checks=checks)
        except Exception as exc:  # noqa: BLE001 (a tuning table: say what failed and go on)
            print(f"{fmt.name} sub={sub} U={unroll} rows={rows} pt={pt}: {exc}")
            continue
        t = rt.time(plan.dispatches, 30, 5)
        nb, _ = fd.decode_traffic(fmt, batch, H, KVH, D, plan.num_partitions)
        gbps = nb / (t.median_us * 1e3)
        print(f"{fmt.name:9s} subgroups={sub!s:5s} checks={checks!s:5s} {plan.describe():80s} {t.median_us:8.1f} us "
              f"{gbps:7.0f} GB/s {100 * gbps / copy_gbps:5.1f}% of copy")

if table:
    print(f"\nmedian GPU time of split + reduce, {S} x {T}, {H}/{KVH} heads, d{D}, block {BS}, {POLICY}; default layout")
    print(f"| format | variant | runtime checks | median us | GB/s | % of copy | max error vs its oracle |")
    print("|---|---|---|---|---|---|---|")
    for name, var, checks, us, gbps, verdict in table:
        print(f"| {name} | {var} | {'on' if checks else 'off'} | {us:.1f} | {gbps:.0f} | {100 * gbps / copy_gbps:.1f} | {verdict} |")
