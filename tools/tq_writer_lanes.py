"""The fast TurboQuant writer (kvviz/kernels/fast_write_tq.py) at a bench shape: its words against
tq_general_compress's (the same cache layout, compared on the device's own output) at 4 / 8 / 16 lanes a row, and
the GPU-timestamp medians of each beside the general compressor and the seed compressor (tq_compress).

    python tools/tq_writer_lanes.py [--shape decode-15x4096] [--runs 30]
"""
import argparse

import numpy as np

from kvviz.bench import SHAPES, make_inputs
from kvviz.formats import turboquant as tqf
from kvviz.gpu.runtime import GpuRuntime
from kvviz.kernels import fast_write_tq as fwt
from kvviz.kernels import quant as qk
from kvviz.kernels import turboquant as tqk
from kvviz.kernels.copy import time_copy_shader


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="decode-15x4096", choices=sorted(SHAPES))
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    rt = GpuRuntime()
    shape = SHAPES[a.shape]
    batch, key, value, _ = make_inputs(shape)
    T, kvh, d = key.shape
    ct, nbytes = time_copy_shader(rt, 2 * key.nbytes, a.runs, 3)
    copy = ct.gbps(nbytes)
    print(f"adapter: {rt.summary.line()}; subgroup size {fwt.subgroup_size(rt)}\n"
          f"shape: {a.shape} ({T} tokens x {kvh} KV heads x {d}); copy shader {copy:.0f} GB/s (median {ct.median_us:.1f} us)")
    st = tqf.TQSettings(d)
    ident = np.tile(np.arange(d, dtype=np.uint32), (kvh, 1))
    nb = fwt.writer_bytes(batch, kvh, d)

    def cache():
        return tqk.general_allocate(rt, st, batch, kvh, ident, ident)

    def words(gc):
        return qk.read_cache(rt, gc.qc, "K"), qk.read_cache(rt, gc.qc, "V")

    def row(name, ds, note=""):
        t = rt.time(ds, a.runs)
        g = t.gbps(nb)
        print(f"{name:<44} {t.median_us:10.1f} {t.p90_us:9.1f} {g:8.0f} {100 * g / copy:6.1f}  {note}", flush=True)

    print(f"{'kernel':<44} {'median us':>10} {'p90 us':>9} {'GB/s':>8} {'%copy':>6}")
    g0 = cache()
    gd = tqk.general_compress_dispatches(rt, g0, key, value, batch.slot_mapping)
    rt.run(gd)
    want = words(g0)
    for L in (4, 8, 16):
        gc = cache()
        ds = fwt.dispatches(rt, st, key, value, batch.slot_mapping, gc.qc.k, gc.qc.v, batch.block_size, lanes=L)
        if ds is None:
            print(f"fast_write_tq L={L}: no subgroups")
            continue
        rt.run(ds)
        got = words(gc)
        same = all(np.array_equal(x, y) for x, y in zip(got, want))
        diff = sum(int((x != y).sum()) for x, y in zip(got, want))
        where = []
        for which, x, y in zip("KV", got, want):
            w = st.wpt(which)
            bad = np.flatnonzero(x != y) % w
            if bad.size:  # which record fields differ: code words, QJL words, the norm word's halves
                nrm = bad == w - 1
                hi = int(((x.reshape(-1, w)[:, -1] ^ y.reshape(-1, w)[:, -1]) >> 16 != 0).sum())
                where.append(f"{which}: {int((bad < d // 16).sum())} code, {int(((bad >= d // 16) & ~nrm).sum())} jl, "
                             f"{int(nrm.sum())} norm ({hi} with the high half)")
        row(f"fast_write_tq ({fwt.lanes_for(rt, d, L)} lanes a row)", ds,
            f"words == tq_general_compress: {same} ({diff} differ{'; ' + '; '.join(where) if where else ''})")
    row("tq_general_compress (paged records)", gd)
    tq = tqk.TurboQuantKernels(rt)
    comp = []
    for s in range(batch.num_seqs):
        rows = batch.token_rows(s)
        if len(rows):
            c = tq.allocate(kvh, d, len(rows))
            comp += tq.compress_dispatches(c, key[rows], value[rows])
    row("tq_compress (seed compressor, per sequence)", comp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
