"""The fast FP8 writer's branch-free path (shaders/fp8/write_fast.wgsl `fast_codes`, its per-row scale
division `scale_bits`) against the numpy oracle, word for word, on rows built to sit on its edges: every
FP8 midpoint (exact ties) and values 1..40 ulp either side of them, the FP8 values themselves, the FP8
subnormal range and its edge with the normals, saturation (max, the tie above it, beyond), f32 subnormals,
signed zeros, and amax over every float32 binade (scale floored at 2^-126, subnormal and zero amax); per
token and per tensor, with 1/scale exact and moved +-3 ulp (an inexact divider)."""
from __future__ import annotations

import os

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import numpy as np
import pytest

from kvviz.families.fp8 import format as fmt8
from kvviz.attention import writers as fw
from kvviz.families.fp8 import kernels as fp8_kernels
from kvviz.paging import PAD_SLOT, make_batch

from test_fast_writers import oracle_words, run_writer  # noqa: E402 - the fast writers' runner and oracles

D = 128


def _ulps(x: np.ndarray, k: int) -> np.ndarray:
    """x moved k ulp (in the bits of |x|, sign kept)."""
    b = np.abs(x).astype(np.float32).view(np.uint32).astype(np.int64) + k
    return (np.clip(b, 0, 0x7F7FFFFF).astype(np.uint32).view(np.float32) * np.sign(x)).astype(np.float32)


def edge_values(fmt) -> np.ndarray:
    """Magnitudes on and around the FP8 grid's rounding boundaries (scale 1)."""
    codes = np.arange(256, dtype=np.uint8)
    vals = fmt8.decode(codes, fmt)
    vals = np.unique(np.abs(vals[np.isfinite(vals)])).astype(np.float32)
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)
    top = np.float32(fmt.max)
    step = np.float32(2.0 ** (np.floor(np.log2(fmt.max)) - fmt.mbits))
    over = np.array([top + step / 2, top + step, top * 1.01, top * 2], np.float32)   # the tie above max, beyond
    out = [vals, mids, over]
    for k in (1, 2, 3, 5, 8, 15, 16, 17, 18, 19, 20, 24, 32, 40, 1000):
        out += [_ulps(mids, k), _ulps(mids, -k), _ulps(vals[1:], k), _ulps(vals[1:], -k)]
    small = np.array([2.0 ** -149, 1e-40, 2.0 ** -126, 2.0 ** -127 * 3, 1e-30], np.float32)  # f32 subnormals, tiny
    return np.concatenate(out + [small]).astype(np.float32)


def edge_rows(fmt, rng, n_rows: int, scaled: bool) -> np.ndarray:
    """[n_rows, D] rows: element 0 = max (so amax / FMAX = 1: scale 1, or `s` when scaled), the rest edge
    values times the row's scale, random signs, some zeros of both signs."""
    ev = edge_values(fmt)
    rows = np.empty((n_rows, D), np.float32)
    for r in range(n_rows):
        s = np.float32(1.0) if not scaled else np.float32(2.0 ** rng.integers(-20, 20) * rng.uniform(1, 2))
        x = rng.choice(ev, D).astype(np.float32)
        x = np.minimum(x, np.float32(fmt.max))        # amax stays max * s: the scale is s
        x = (x * s).astype(np.float32)
        x *= rng.choice(np.array([-1, 1], np.float32), D)
        x[rng.integers(0, D, 4)] = 0.0
        x[rng.integers(0, D, 4)] = -0.0
        x[0] = np.float32(fmt.max) * s
        rows[r] = x
    return rows


def batch_of(n: int):
    """A scattered paged batch of about n tokens, padding slots every 7th."""
    return make_batch([n], 16, policy="scattered", pad_every=7, seed=3)


def run_case(rt, writer, batch, k, v, ulps):
    gk, gv, tensor, _ = run_writer(rt, writer, batch, k, v, fw.Variant(rt, inv_ulps=ulps))
    for which, x, got in (("K", k, gk), ("V", v, gv)):
        ref = oracle_words(writer, batch, x)
        bad = np.argwhere(got != ref)
        assert not bad.size, f"{writer} {which} ulps {ulps}: {len(bad)} words differ, first at {tuple(bad[0])}: " \
                             f"{got[tuple(bad[0])]:#010x} vs {ref[tuple(bad[0])]:#010x}"


WRITERS = ["fp8_e4m3-per_token", "fp8_e5m2-per_token", "fp8_e4m3-per_tensor", "fp8_e5m2-per_tensor"]


@pytest.mark.parametrize("ulps", [-3, 0, 3])
@pytest.mark.parametrize("writer", WRITERS)
def test_fp8_words_at_midpoints_saturation_subnormals(rt, writer, ulps):
    fmt = fmt8.FORMATS[writer[4:8]]
    rng = np.random.default_rng(ulps + 3 + 10 * WRITERS.index(writer))
    batch = batch_of(40)
    T, kvh = batch.num_tokens, 2
    k = edge_rows(fmt, rng, T * kvh, scaled=False).reshape(T, kvh, D)
    v = edge_rows(fmt, rng, T * kvh, scaled=True).reshape(T, kvh, D)
    if writer.endswith("per_tensor"):
        v[:, :, 0] = np.float32(fmt.max)                  # one tensor scale 1: the midpoints stay midpoints
    run_case(rt, writer, batch, k, v, ulps)


@pytest.mark.parametrize("writer", ["fp8_e4m3-per_token", "fp8_e5m2-per_token"])
def test_fp8_scale_over_every_binade(rt, writer):
    """amax 2^e * m for every float32 exponent (and 0, subnormal amax): the per-token scale word
    max(amax / FMAX, 2^-126) and the codes under it; random mantissas and the FMAX-multiple edges."""
    fmt = fmt8.FORMATS[writer[4:8]]
    rng = np.random.default_rng(5)
    exps = np.arange(-149, 128)
    amax = []
    for e in exps:
        for m in (1.0, 1.75, rng.uniform(1, 2), rng.uniform(1, 2)):
            a = np.float32(np.ldexp(m, int(e)))
            if np.isfinite(a):
                amax.append(a)
    amax += [np.float32(0.0), np.float32(fmt.max), _ulps(np.array([fmt.max * 2.0 ** -126], np.float32), 1)[0],
             _ulps(np.array([fmt.max * 2.0 ** -126], np.float32), -1)[0], np.float32(3.4e38)]
    amax = np.array(amax, np.float32)
    batch = batch_of(amax.size)
    T, kvh = batch.num_tokens, 1
    amax = np.resize(amax, T)
    k = (rng.standard_normal((T, kvh, D)) / 4).astype(np.float32)
    k = np.clip(k, -1, 1) * amax[:, None, None]
    k = k.astype(np.float32)
    k[:, :, 0] = amax[:, None]
    v = (-k[:, :, ::-1]).copy()
    run_case(rt, writer, batch, k, v, 0)


@pytest.mark.parametrize("grid", [(1, 1, 1), (3, 1, 1), (2, 3, 1), (1000, 1, 1)])
def test_fp8_amax_any_grid(rt, grid):
    """The per-tensor amax kernel strides over the row blocks: any grid covers every live row once (padding
    rows, whose values are the largest here, left out)."""
    batch = make_batch([70, 5, 33], 16, policy="scattered", pad_every=5, seed=2)
    T, kvh, D2 = batch.num_tokens, 2, 64
    rng = np.random.default_rng(7)
    k = (rng.standard_normal((T, kvh, D2)) * 10.0 ** rng.uniform(-3, 3, (T, kvh, 1))).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D2)) * 10.0 ** rng.uniform(-2, 2, (T, kvh, 1))).astype(np.float32)
    pad = np.asarray(batch.slot_mapping).astype(np.uint32) == PAD_SLOT
    assert pad.any()
    k[pad], v[pad] = 1e30, -1e30
    var = fw.Variant(rt)
    L = var.lanes(D2 // 4)
    kern = rt.compile(fp8_kernels.WRITE_FP8_AMAX, NV=D2 // (4 * L), **var.defines(L))
    tensor = rt.upload(np.zeros(4, np.uint32), "tensor")
    sm = np.asarray(batch.slot_mapping).astype(np.uint32)
    bufs = [rt.upload(k, "key"), rt.upload(v, "value"), rt.upload(sm, "slots"), tensor]
    rt.run([kern.dispatch(grid, bufs, imm=kern.pack(kvh, D2, 16, D2 // 4, T * kvh, grid[0]))])
    got = rt.read(tensor, np.uint32, nbytes=16)
    want = [np.abs(x[~pad]).max().view(np.uint32) for x in (k, v)]
    np.testing.assert_array_equal(got[:2], want)
