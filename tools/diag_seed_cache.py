"""Why the fast int8 decode reads the seed writer's cache slower than int8_token's (same layout, same kernel):
times the one fast decode plan over both caches alternately, over fresh copies of each, and with each cache's
words written into the other's buffer (buffer vs data). Device diagnostic; prints GPU-timestamp medians."""
import numpy as np

from kvviz.bench import SHAPES, make_inputs
from kvviz.gpu.runtime import GpuRuntime
from kvviz.kernels import fast_decode as fd
from kvviz.kernels.paged import PagedKernels
from kvviz.methods import get_method
from kvviz.methods.context import GpuContext

rt = GpuRuntime()
ctx = GpuContext(rt)
shape = SHAPES["decode-15x4096"]
batch, key, value, q = make_inputs(shape)
scale = float(1 / np.sqrt(shape.head_size))
pk = PagedKernels(rt)
seed = pk.allocate("q8", batch.num_blocks, shape.num_kv_heads, shape.block_size, shape.head_size)
rt.run(pk.write_dispatches(seed, key, value, batch.slot_mapping))
qkv = get_method("int8_token").quantize(ctx, batch, key, value)
tok = qkv.device["cache"]
fast = fd.FastDecode(rt)


def words(buf, n):
    return rt.read(buf, np.uint32, (n // 4,))


def t(k, v, label):
    plan = fast.plan(fd.INT8, k, v, shape.num_kv_heads, q, batch, scale)
    r = rt.time(plan.dispatches, 30, 3)
    out = fast.read(plan)
    print(f"{label:<44} median {r.median_us:8.1f} us  p10..p90 {r.p10_us if hasattr(r, 'p10_us') else r.min_us:8.1f}..{r.p90_us:8.1f}  out[0,0,:2] {out.reshape(-1)[:2]}", flush=True)
    return out


ns, nt = seed.k.size, tok.k.size
print("seed cache bytes", ns, "int8_token cache bytes", nt, "num_blocks", batch.num_blocks)
sk, tk_ = words(seed.k, ns), words(tok.k, nt)
n = min(ns, nt) // 4
print("K words equal:", float(np.mean(sk[:n] == tk_[:n])))
for rep in range(2):
    a = t(seed.k, seed.v, f"seed writer's cache (rep {rep})")
    b = t(tok.k, tok.v, f"int8_token's cache (rep {rep})")
print("outputs max |diff|", float(np.abs(a - b).max()))
sv, tv = words(seed.v, ns), words(tok.v, nt)
fk, fv = rt.upload(sk, "seed_k_copy"), rt.upload(sv, "seed_v_copy")
t(fk, fv, "seed words in fresh buffers")
gk, gv = rt.upload(tk_, "tok_k_copy"), rt.upload(tv, "tok_v_copy")
t(gk, gv, "int8_token words in fresh buffers")
rt.write(seed.k, tk_[: ns // 4]) if nt >= ns else None
rt.write(seed.v, tv[: ns // 4]) if nt >= ns else None
if nt >= ns:
    t(seed.k, seed.v, "int8_token words in the seed's buffers")
rt.write(tok.k, sk[: nt // 4]) if ns >= nt else None
rt.write(tok.v, sv[: nt // 4]) if ns >= nt else None
if ns >= nt:
    t(tok.k, tok.v, "seed words in int8_token's buffers")
# where the words differ: codes vs scale words (the scale is the last word of each token record)
wpt = shape.head_size // 4 + 1
d = (sk[:n] != tk_[:n]).reshape(-1, wpt)
print("differing words by position in the record: codes", int(d[:, :-1].sum()), "scale", int(d[:, -1].sum()))
