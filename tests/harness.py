"""Helpers shared by the conformance tests: a covering-array generator for the grids whose full product adds
nothing, and one adapter per fast-decode family (tests/test_conformance.py runs every scenario through them).

Methods are reached through the registry (kvviz.families.registry.get_method) and kernels through the
family table (kvviz.families.catalogue), so the tests do not depend on where a family's modules live.
"""
from __future__ import annotations

import importlib
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import ml_dtypes
import numpy as np

from kvviz.errors import DeviceLimitError
from kvviz.errors import InvalidInput
from kvviz.errors import UnsupportedShape
from kvviz.families import catalogue as families
from kvviz.families.registry import get_method
from kvviz.families.registry import reference as method_reference
from kvviz.families.registry import registry  # noqa: F401 - test_conformance reaches the registry through the harness
from kvviz.paging import PAD_SLOT
from kvviz.paging import make_batch


def pairwise(*factors: Sequence, allowed: Callable[..., bool] = lambda *combo: True, seed_rows: Sequence = ()) -> list:
    """Rows (tuples, one value per factor) in which every pair of values of any two factors appears at least
    once: a covering array of strength 2, built greedily and deterministically (same input, same rows).

    Why pairs suffice where this is used: there, each known way for a kernel to go wrong is set by at most two
    of the factors at once (a writer's arithmetic by the writer alone, its lane split by writer and head size, its
    reduction by variant and lane count, ...), so every such pair meeting once exercises it; a third factor only
    multiplies cases that run code already run. Where a triple does decide a code path (int4's group nested in
    the lane split), or where exhaustiveness is the point (every code value, every tie), the tests keep a full
    grid instead.

    `allowed(*row)` excludes rows that cannot or must not run (a variant a writer lacks); a pair that only
    excluded rows hold is not required. `seed_rows` are taken first, as they are (cases a test must keep).
    Greedy: each step takes the first allowed row of the full product (in product order) that covers the most
    pairs still uncovered, until none is left.
    """
    n = len(factors)
    # work on value indices: values need not be hashable (a shape holds a list of lengths)
    idx_rows = [r for r in itertools.product(*(range(len(f)) for f in factors))
                if allowed(*(f[i] for f, i in zip(factors, r)))]

    def pairs(r):
        return {(i, r[i], j, r[j]) for i in range(n) for j in range(i + 1, n)}

    def index(row):
        return tuple(next(k for k, x in enumerate(f) if x == v) for f, v in zip(factors, row))

    need: set = set()
    for r in idx_rows:
        need |= pairs(r)
    out: list = []
    for row in seed_rows:
        out.append(tuple(row))
        need -= pairs(index(row))
    while need:
        best, gain = None, 0
        for r in idx_rows:
            g = len(pairs(r) & need)
            if g > gain:
                best, gain = r, g
        out.append(tuple(f[i] for f, i in zip(factors, best)))
        need -= pairs(best)
    return out


def covers_every_pair(rows: Sequence, factors: Sequence[Sequence], allowed: Callable[..., bool] = lambda *c: True) -> bool:
    """Whether `rows` hold every pair of values that some allowed row of the full product holds."""
    n = len(factors)

    def index(row):
        return tuple(next(k for k, x in enumerate(f) if x == v) for f, v in zip(factors, row))

    have = {(i, r[i], j, r[j]) for r in map(index, rows) for i in range(n) for j in range(i + 1, n)}
    for r in itertools.product(*(range(len(f)) for f in factors)):
        if allowed(*(f[i] for f, i in zip(factors, r))):
            for i in range(n):
                for j in range(i + 1, n):
                    if (i, r[i], j, r[j]) not in have:
                        return False
    return True


def kernels(name: str):
    """A kernel family's launcher module, through the family table (kvviz.families.catalogue)."""
    return families.launcher(name)


def oracle(name: str):
    """A kernel family's numpy reference module, through the family table."""
    return families.reference(name)


def bit_format(name: str):
    """A kernel family's bit-format module, through the family table."""
    return importlib.import_module(families.family(name).format)


fd = kernels("fast_decode")
O = oracle("fast_decode")  # kvviz.attention.paged_oracle: the float64 paged decode every fast decode is held to
quant = kernels("quant_selftest")  # the quantised caches' shared host side (read_cache)


# ================================================================================== scenario plumbing
@dataclass
class Result:
    """What one decode check found: the plan it ran, the output, its worst error over the tolerance, and (the
    TurboQuant decodes) whether the tolerance is tight enough to see the other QJL scale."""

    plan: object
    out: np.ndarray
    ratio: float
    caught: bool = True


@dataclass
class Refusal:
    """One bad input and how it must be refused: `call()` raises `error`, whose message matches `match` where the
    message is what tells the user what is wrong (its wording is the feature)."""

    what: str
    call: Callable
    error: type
    match: str | None = None


@dataclass
class Fact:
    """A predicate the family answers about a shape (its `unsupported` reason, a lane count): `holds` must be true."""

    what: str
    holds: bool


@dataclass
class Decode:
    """A fast decode as the conformance scenarios see it.

    check(ctx, D=, bs=, kvh=, G=, lens=, seed=, ...): decode one case and hold it to the family's oracle
        (asserting inside: finite, empty sequences 0, error within the family's tolerance) -> Result;
    layout(ctx, D, G, **kw): the lane layout the family would take;
    refusals(ctx): its bad inputs (Refusal) and shape predicates (Fact).
    """

    name: str
    kernel_family: str
    check: Callable
    layout: Callable
    refusals: Callable


_DECODERS: dict = {}


def decoder(rt, family: str, cls_name: str):
    """One decoder object of a family per runtime (the runtime compiles each kernel once anyway)."""
    key = (id(rt), family, cls_name)
    if key not in _DECODERS:
        _DECODERS[key] = getattr(kernels(family), cls_name)(rt)
    return _DECODERS[key]


def empty_gives_zero(out, lens):
    for s, n in enumerate(lens):
        if n == 0:
            assert not out[s].any(), "an empty sequence must give 0"


# ---------------------------------------------------------------------- fast_decode: caches built in numpy
FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def _fp8_codes(rng, n, kind):
    """Random finite FP8 codes (no NaN / inf encodings), every exponent including subnormals."""
    c = rng.integers(0, 256, n, dtype=np.uint8)
    if kind == "e4m3":
        c = np.where((c & 0x7F) == 0x7F, c ^ 0x01, c)
    else:
        c = np.where(((c >> 2) & 0x1F) == 0x1F, c & 0xFB, c)
    return c.astype(np.uint8)


def make_records(fmt, rng, n: int, D: int, amp: float = 1.0):
    """(words [n, wpt] u32, values [n, D] float64: what the words decode to) for n token records of a fast_decode
    cache format."""
    if fmt.name == "f32":
        x = (rng.standard_normal((n, D)) * amp).astype(np.float32)
        return x.view(np.uint32), x.astype(np.float64)
    if fmt.name == "f16":
        x = (rng.standard_normal((n, D)) * amp).astype(np.float16)
        return x.view(np.uint16).reshape(n, D // 2, 2).astype(np.uint32) @ np.array([1, 1 << 16], np.uint32), x.astype(np.float64)
    if fmt.name == "int8":
        codes = rng.integers(-128, 128, (n, D), dtype=np.int8)
        scale = (rng.uniform(0.5, 2.0, n) * amp / 127).astype(np.float32)
        words = np.concatenate([codes.view(np.uint32).reshape(n, D // 4), scale.view(np.uint32)[:, None]], 1)
        return words, codes.astype(np.float64) * scale[:, None].astype(np.float64)
    if fmt.fp8:
        codes = _fp8_codes(rng, n * D, fmt.fp8).reshape(n, D)
        val = codes.view(FP8[fmt.fp8]).astype(np.float64)
        cw = codes.view(np.uint32).reshape(n, D // 4)
        if fmt.scale == "token":
            scale = (rng.uniform(0.5, 2.0, n) * amp / 448).astype(np.float32)
            return np.concatenate([cw, scale.view(np.uint32)[:, None]], 1), val * scale[:, None].astype(np.float64)
        return cw, val  # per-tensor scale: applied by the caller
    if fmt.name == "int4":
        gs = fmt.group_size
        ng = D // gs
        codes = rng.integers(0, 16, (n, D), dtype=np.uint32)
        cw = (codes.reshape(n, D // 8, 8) << (4 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint64).astype(np.uint32)
        s = (rng.uniform(0.1, 0.3, (n, ng)) * amp).astype(np.float32)
        z = (rng.uniform(-2.0, -1.0, (n, ng)) * amp).astype(np.float32)
        sz = np.stack([s, z], -1).reshape(n, 2 * ng)
        f32 = lambda a: a.astype(np.float32)  # noqa: E731  (the kernel's fma(c, s, z) in f32)
        val = f32(codes.astype(np.float32) * np.repeat(s, gs, 1) + np.repeat(z, gs, 1)).astype(np.float64)
        return np.concatenate([cw, sz.view(np.uint32)], 1), val
    raise ValueError(fmt)


def build_caches(fmt, rng, batch, kvh, D, amp=1.0, tensor_scales=(1.0, 1.0)):
    """Paged caches [num_blocks, kvh, bs, wpt] u32 with random records, and their float64 values."""
    nb, bs, wpt = batch.num_blocks, batch.block_size, fmt.wpt(D)
    out = []
    for ts in tensor_scales:
        words, vals = make_records(fmt, rng, nb * kvh * bs, D, amp)
        out.append((np.ascontiguousarray(words.reshape(nb, kvh, bs, wpt)), vals.reshape(nb, kvh, bs, D) * ts))
    return out


FORMATS = [fd.F32, fd.F16, fd.INT8, fd.fp8_format("e4m3", False), fd.fp8_format("e5m2", False),
           fd.fp8_format("e4m3", True), fd.int4_format(32), fd.int4_format(64)]


def fmt_id(f) -> str:
    return f"{f.name}-{f.scale}-{f.group_size}"


def run_case(rt, fmt, lens, H, kvh, D, bs, *, seed=0, amp=1.0, q_amp=1.0, policy="scattered", tensor=(1.0, 1.0), **kw):
    """The fast decode of `fmt` over random records, held to the float64 oracle of the same words (kvviz.attention.
    paged_oracle.decode) within the f32 kernels' tolerance 2e-5 x max(1, max |V|): f32 accumulation in another order, exp2
    for exp, and the oracle's seed normaliser (sum + 1e-6) against the kernel's exact division.
    Returns (out, ref, batch, plan)."""
    rng = np.random.default_rng(seed)
    batch = make_batch(lens, bs, policy=policy, seed=seed)
    (kw_, kf), (vw_, vf) = build_caches(fmt, rng, batch, kvh, D, amp, tensor if fmt.scale == "tensor" else (1.0, 1.0))
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = 1.0 / np.sqrt(D)
    fast = decoder(rt, "fast_decode", "FastDecode")
    tb = None
    if fmt.scale == "tensor":
        tb = rt.upload(np.array([0.0, 0.0, *tensor], np.float32).view(np.uint32), "tensor")
    plan = fast.plan(fmt, rt.upload(kw_, "k"), rt.upload(vw_, "v"), kvh, q, batch, scale, tensor=tb, **kw)
    rt.run(plan.dispatches)
    out = fast.read(plan)
    ref = O.decode(q, kf, vf, batch.block_tables, batch.context_lens, bs, scale)
    tol = 2e-5 * max(1.0, float(np.abs(vf).max()))
    err = float(np.abs(out - ref).max(initial=0.0))
    assert np.isfinite(out).all()
    assert err <= tol, f"{fmt.name} D{D} H{H}/{kvh} bs{bs} lens {lens[:6]}: max error {err:.3g} > {tol:.3g}"
    return out, ref, batch, plan


def _fd_check(fmt):
    def check(ctx, *, D, bs, kvh, G, lens, seed=0, **kw):
        out, ref, batch, plan = run_case(ctx.rt, fmt, lens, kvh * G, kvh, D, bs, seed=seed, **kw)
        return Result(plan, out, 0.0)
    return check


def _fd_layout(fmt):
    return lambda ctx, D, G, **kw: decoder(ctx.rt, "fast_decode", "FastDecode").layout(fmt, D, G, **kw)


def _fd_refusals(ctx):
    rt = ctx.rt
    fast = decoder(rt, "fast_decode", "FastDecode")
    batch = make_batch([10], 16)
    k = rt.upload(np.zeros(16 * 2 * 33, np.uint32), "k")
    z = lambda H, D: np.zeros((1, H, D), np.float32)  # noqa: E731
    return [
        Refusal("8 heads over 3 KV heads", lambda: fast.decode(fd.INT8, k, k, 3, z(8, 128), batch, 0.1), InvalidInput, "divide"),
        Refusal("a NaN query", lambda: fast.decode(fd.INT8, k, k, 2, np.full((1, 8, 128), np.nan, np.float32), batch, 0.1),
                InvalidInput, "NaN|finite"),
        Refusal("head 100 in int4 groups of 32", lambda: fast.decode(fd.int4_format(32), k, k, 2, z(8, 100), batch, 0.1),
                UnsupportedShape, "head size"),
        Refusal("a cache smaller than the batch's blocks", lambda: fast.decode(fd.F32, k, k, 2, z(8, 128), batch, 0.1),
                InvalidInput, "cache holds"),
        Fact("head 512 is unsupported", bool(fd.unsupported(fd.INT8, 512, 4))),
        Fact("head 128 is supported", not fd.unsupported(fd.INT8, 128, 4)),
    ]


# ---------------------------------------------------------------------- fast_decode_ggml: the method's caches
def _ggml_check(tname):
    fgd = kernels("fast_decode_ggml")
    og = oracle("fast_decode_ggml")

    def check(ctx, *, D, bs, kvh, G, lens, seed=0, k_amp=1.0, v_amp=1.0, q_amp=1.0, zeros=False, words=True, **kw):
        """Quantise with the method (its GPU writer), decode with the fast kernel, compare with the method's
        attention oracle over the words read back (gguf.quants.dequantize through the f32 paged decode's arithmetic
        in float64); the words of every token must be gguf's bytes. Tolerance fast_decode_ggml.tolerance."""
        rng = np.random.default_rng(seed)
        m = get_method(tname)
        t = m.fmt
        batch = make_batch(lens, bs, policy="scattered", seed=seed)
        T = int(sum(lens))
        if zeros:
            k = np.zeros((T, kvh, D), np.float32)
            v = k.copy()
        else:
            k = (rng.standard_normal((T, kvh, D)) * k_amp).astype(np.float32)
            v = (rng.standard_normal((T, kvh, D)) * v_amp).astype(np.float32)
        H = kvh * G
        q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
        scale = D ** -0.5
        qkv = m.quantize(ctx, batch, k, v)
        qc = qkv.device["cache"]
        wpt = t.words_per_token(D)
        caches = {}
        for which, x in (("K", k), ("V", v)):
            full = quant.read_cache(ctx.rt, qc, which).reshape(batch.num_blocks, kvh, bs, wpt)
            if words:  # the words of every token are the oracle's (gguf's bytes)
                recs = full[batch.slot_mapping // bs, :, batch.slot_mapping % bs]
                np.testing.assert_array_equal(recs, og.quantize(x, t))
            caches[which] = og.dequantize(full, D, t).astype(np.float64)
        ref = O.decode(q.astype(np.float64), caches["K"], caches["V"], batch.block_tables, batch.context_lens, bs, scale)
        fast = decoder(ctx.rt, "fast_decode_ggml", "GgmlFastDecode")
        plan = fast.plan(tname, qc.k, qc.v, kvh, q, batch, scale, **kw)
        ctx.rt.run(plan.dispatches)
        out = fast.read(plan)
        assert out.shape == (len(lens), H, D) and np.isfinite(out).all()
        real = np.zeros(batch.num_blocks * bs, bool)
        real[batch.slot_mapping] = True
        tol = fgd.tolerance(float(np.abs(caches["V"].reshape(-1, kvh, D)[real]).max(initial=0.0)))
        err = float(np.abs(out - ref).max(initial=0.0))
        empty_gives_zero(out, lens)
        assert err <= tol, (f"{tname} D{D} bs{bs} G{G} kvh{kvh} lens {lens[:6]}: max error {err:.3g} > {tol:.3g} "
                            f"({plan.describe()})")
        return Result(plan, out, err / tol)
    return check


def _ggml_layout(ctx, D, G, **kw):
    return decoder(ctx.rt, "fast_decode_ggml", "GgmlFastDecode").layout(D, G, **kw)


def _ggml_refusals(ctx):
    rt = ctx.rt
    fgd = kernels("fast_decode_ggml")
    fast = decoder(rt, "fast_decode_ggml", "GgmlFastDecode")
    m = get_method("q8_0")
    batch = make_batch([64, 3], 16, seed=1)
    k = np.ones((67, 1, 64), np.float32)
    qc = m.quantize(ctx, batch, k, k).device["cache"]
    q = np.ones((2, 4, 64), np.float32)
    ones = lambda S, H, D: np.ones((S, H, D), np.float32)  # noqa: E731
    out = [
        Refusal("a type without a fast decode", lambda: fast.plan("q2_k", qc.k, qc.v, 1, q, batch, 0.1),
                UnsupportedShape, "no fast decode"),
        Refusal("GQA 17", lambda: fast.plan("q8_0", qc.k, qc.v, 1, ones(2, 17, 64), batch, 0.1), UnsupportedShape,
                "GQA group of 17"),
        Refusal("head 48", lambda: fast.plan("q8_0", qc.k, qc.v, 1, ones(2, 4, 48), batch, 0.1), UnsupportedShape,
                "multiple of 32"),
        Refusal("head 288", lambda: fast.plan("q8_0", qc.k, qc.v, 1, ones(2, 4, 288), batch, 0.1), UnsupportedShape,
                "over 256"),
        Fact("head 96 is supported (its lanes walk it with padding)", not fgd.unsupported("q8_0", 96, 1)),
        Fact("head 32 is supported", not fgd.unsupported("q8_0", 32, 1)),
        Refusal("3 queries for 2 sequences", lambda: fast.plan("q8_0", qc.k, qc.v, 1, ones(3, 4, 64), batch, 0.1),
                InvalidInput, "sequences"),
        Refusal("a NaN scale", lambda: fast.plan("q8_0", qc.k, qc.v, 1, q, batch, float("nan")), InvalidInput, "scale"),
        Refusal("a K buffer too small", lambda: fast.plan("q8_0", rt.empty(64, "tiny"), qc.v, 1, q, batch, 0.1),
                InvalidInput, "need"),
    ]
    if rt.loop_limit is not None:
        out.append(Refusal("one partition past the loop limit",
                           lambda: fast.plan("q8_0", qc.k, qc.v, 1, q, batch, 0.1, partition_tokens=64 * 1024 * 1024,
                                             subgroups=False, rows=1), DeviceLimitError, "loop limit"))
    return out


# ---------------------------------------------------------------------- fast_decode_kivi: the method's caches
def kivi_dequantised_caches(bufs, batch, bits, recent, kvh, D):
    """f32 paged caches [num_blocks, kvh, bs, D] (K^, V^) decoded from the words read back (kivi_seq_fields: codes,
    each key group's (scale, zero) from the side stream, each token's V (scale, zero), the residual rows); as the
    oracle dequantises (f32 code*scale + zero)."""
    kl = bit_format("fast_decode_kivi")
    bs = batch.block_size
    p = kl.plan(batch.context_lens, recent)
    fk_ = np.zeros((batch.num_blocks, kvh, bs, D), np.float32)
    fv_ = np.zeros_like(fk_)
    for s, f in enumerate(kivi_seq_fields(bufs, batch, bits, recent, kvh, D)):
        L, nq = int(p.context_lens[s]), int(p.n_q[s])
        blocks = np.asarray(batch.seq_blocks[s], np.int64)
        pos = np.arange(L)
        b, o = blocks[pos // bs], pos % bs
        if nq:
            g = np.arange(nq) // kl.GROUP
            fk_[b[:nq], :, o[:nq]] = (f["k_codes"].astype(np.float32) * f["k_scale"][g] + f["k_zero"][g]).astype(np.float32)
            fv_[b[:nq], :, o[:nq]] = (f["v_codes"].astype(np.float32) * f["v_scale"][..., None]
                                      + f["v_zero"][..., None]).astype(np.float32)
        fk_[b[nq:], :, o[nq:]] = f["k_res"]
        fv_[b[nq:], :, o[nq:]] = f["v_res"]
    return fk_, fv_


def kivi_seq_fields(bufs, batch, bits, recent, kvh, D) -> list:
    """Each sequence's quantised fields (kvviz.families.kivi.oracle.quantize_seq's dict: K codes, each key group's
    scale and zero, V codes / scale / zero, the residual rows) decoded from the words read back, for the int8-query
    variant's oracle (oracle.attention_i8)."""
    kl = bit_format("fast_decode_kivi")
    unpack_codes = bit_format("int4").unpack_codes
    bs = batch.block_size
    KW, WS = kl.kw(D, bits), kl.ws(D, bs)
    p = kl.plan(batch.context_lens, recent)
    nb = batch.num_blocks
    kcw = bufs["k"][:, :, : bs * KW].reshape(nb, kvh, bs, KW)
    vr = bufs["v"].reshape(nb, kvh, bs, KW + 2)
    out = []
    for s in range(batch.num_seqs):
        L, nq, r0 = int(p.context_lens[s]), int(p.n_q[s]), int(p.res_off[s])
        blocks = np.asarray(batch.seq_blocks[s], np.int64)
        pos = np.arange(nq)
        b, o = blocks[pos // bs], pos % bs
        ng = nq // kl.GROUP
        idx = np.arange(ng * 2 * D)
        side = bufs["k"][blocks[idx // WS], :, bs * KW + idx % WS] if ng else np.zeros((0, kvh), np.uint32)
        side = np.ascontiguousarray(side.T).view(np.float32).reshape(kvh, ng, D, 2).transpose(1, 0, 2, 3)  # [ng, kvh, D, 2]
        rec = vr[b, :, o]  # [nq, kvh, KW + 2]
        out.append({
            "k_codes": unpack_codes(kcw[b, :, o], bits).reshape(nq, kvh, D),
            "k_scale": np.ascontiguousarray(side[..., 0]), "k_zero": np.ascontiguousarray(side[..., 1]),
            "v_codes": unpack_codes(rec[..., :KW], bits).reshape(nq, kvh, D),
            "v_scale": np.ascontiguousarray(rec[..., KW]).view(np.float32),
            "v_zero": np.ascontiguousarray(rec[..., KW + 1]).view(np.float32),
            "k_res": bufs["res"][r0 : r0 + L - nq, 0], "v_res": bufs["res"][r0 : r0 + L - nq, 1],
        })
    return out


def kivi_kv(rng, T, kvh, D, k_amp=1.0, v_amp=1.0, zeros=False):
    if zeros:
        z = np.zeros((T, kvh, D), np.float32)
        return z, z.copy()
    k = (rng.standard_normal((T, kvh, D)) * k_amp).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D)) * v_amp).astype(np.float32)
    return k, v


def kivi_check(ctx, *, bits, recent, D, bs, kvh, G, lens, seed=0, k_amp=1.0, v_amp=1.0, q_amp=1.0, zeros=False,
               words=True, **kw):
    """Quantise with the method (Kivi.quantize: the GPU writers), decode with the fast kernel, compare with the
    method's attention oracle over the words read back (the oracle's dequantisation through the f32 paged decode's
    arithmetic in float64); the words read back must equal kvviz.families.kivi.oracle.write_buffers'. Tolerance
    fast_decode_kivi.tolerance. The output is cut back to the head size D (the method pads the head to 16).
    qk="i8" (in kw): the int8-query variant, against its own oracle (oracle.attention_i8 over the words read back)."""
    fk = kernels("fast_decode_kivi")
    okv = oracle("fast_decode_kivi")
    rng = np.random.default_rng(seed)
    m = get_method("kivi", bits=bits, recent=recent)
    batch = make_batch(lens, bs, policy="scattered", seed=seed)
    k, v = kivi_kv(rng, int(sum(lens)), kvh, D, k_amp, v_amp, zeros)
    H = kvh * G
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = D ** -0.5
    qkv = m.quantize(ctx, batch, k, v)
    qc = qkv.device["cache"]
    Dp = qc.head_size
    assert Dp == -(-D // 16) * 16
    qp = m._pad_q(q, Dp)
    bufs = m.read_buffers(ctx, qkv)
    if words:  # the words read back are the method's oracle's
        kp, vp, _ = okv.pad_head(k, v)
        ref_words = okv.write_buffers(batch, kp, vp, bits, recent)
        np.testing.assert_array_equal(bufs["k"], ref_words["k"])
        np.testing.assert_array_equal(bufs["v"], ref_words["v"])
        n = max(1, ref_words["plan"].total_res)
        np.testing.assert_array_equal(bufs["res"][:n].view(np.uint32), ref_words["res"][:n].view(np.uint32))
    fkc, fvc = kivi_dequantised_caches(bufs, batch, bits, recent, kvh, Dp)
    if kw.get("qk", "f32") == "i8":
        ref = okv.attention_i8(qp, scale, kivi_seq_fields(bufs, batch, bits, recent, kvh, Dp), kvh)
    else:
        ref = O.decode(qp.astype(np.float64), fkc.astype(np.float64), fvc.astype(np.float64), batch.block_tables,
                       batch.context_lens, bs, scale)
    fast = decoder(ctx.rt, "fast_decode_kivi", "KiviFastDecode")
    plan = fast.plan(bits, qc.k, qc.v, qc.extra["res"], kvh, qp, batch, scale, seq_plan=qc.extra["plan"],
                     info=qc.extra["info"], **kw)
    ctx.rt.run(plan.dispatches)
    out = fast.read(plan)
    assert out.shape == (len(lens), H, Dp) and np.isfinite(out).all()
    tol = fk.tolerance(float(np.abs(fvc).max(initial=0.0)))
    err = float(np.abs(out - ref).max(initial=0.0))
    empty_gives_zero(out, lens)
    assert err <= tol, (f"bits {bits} recent {recent} D{D} bs{bs} G{G} kvh{kvh} lens {lens[:6]}: max error "
                        f"{err:.3g} > {tol:.3g} ({plan.describe()})")
    return Result(plan, out[..., :D], err / tol)


def _kivi_check(bits, recent):
    return lambda ctx, **case: kivi_check(ctx, **{"bits": bits, "recent": recent, **case})


def _kivi_layout(bits):
    return lambda ctx, D, G, **kw: decoder(ctx.rt, "fast_decode_kivi", "KiviFastDecode").layout(bits, D, G, **kw)


def _kivi_refusals(ctx):
    rt = ctx.rt
    fk = kernels("fast_decode_kivi")
    kl = bit_format("fast_decode_kivi")
    fast = decoder(rt, "fast_decode_kivi", "KiviFastDecode")
    m = get_method("kivi", bits=2, recent=0)
    batch = make_batch([64, 3], 16, seed=1)
    k = np.ones((67, 1, 64), np.float32)
    qc = m.quantize(ctx, batch, k, k).device["cache"]
    args = (qc.k, qc.v, qc.extra["res"], 1)
    q = np.ones((2, 4, 64), np.float32)
    kw = dict(seq_plan=qc.extra["plan"])
    ones = lambda S, H, D: np.ones((S, H, D), np.float32)  # noqa: E731
    out = [
        Refusal("bits 3", lambda: fast.plan(3, *args, q, batch, 0.1, **kw), UnsupportedShape, "bits 3"),
        Refusal("GQA 17", lambda: fast.plan(2, *args, ones(2, 17, 64), batch, 0.1, **kw), UnsupportedShape,
                "GQA group of 17"),
        Refusal("head 72", lambda: fast.plan(2, *args, ones(2, 4, 72), batch, 0.1, **kw), UnsupportedShape, "multiple of 16"),
        Fact("block size 4 at head 16 is unsupported", "block size 4" in fk.unsupported(2, 16, 1, 4)),
        Fact("block size 8 at head 16 is supported", not fk.unsupported(2, 16, 1, 8)),
        Refusal("3 queries for 2 sequences", lambda: fast.plan(2, *args, ones(3, 4, 64), batch, 0.1, **kw), InvalidInput,
                "sequences"),
        Refusal("a NaN scale", lambda: fast.plan(2, *args, q, batch, float("nan"), **kw), InvalidInput, "scale"),
        Refusal("a plan of other context lengths", lambda: fast.plan(2, *args, q, batch, 0.1, seq_plan=kl.plan([64, 4], 0)),
                InvalidInput, "context lengths"),
        Refusal("a K buffer too small", lambda: fast.plan(2, rt.empty(64, "tiny"), *args[1:], q, batch, 0.1, **kw),
                InvalidInput, "needs"),
    ]
    if rt.loop_limit is not None:
        out.append(Refusal("one partition past the loop limit",
                           lambda: fast.plan(2, *args, q, batch, 0.1, partition_tokens=64 * 1024 * 1024, subgroups=False,
                                             rows=1, **kw), DeviceLimitError, "loop limit"))
    return out


# ---------------------------------------------------------------------- fast_decode_fp4: NVFP4, the method's caches
def nvfp4_quantised(ctx, D, bs, kvh, lens, *, seed=0, k_amp=1.0, v_amp=1.0, zeros=False, words=True):
    """(method, qkv, batch, float64 dequantised caches {"K", "V"}, max |V^|) over the method's own cache; with
    words=True its words and tensor scales must be the oracle's (kvviz.families.fp4.oracle.quantize_batch)."""
    f4 = bit_format("fast_decode_fp4")
    o4 = oracle("fast_decode_fp4")
    rng = np.random.default_rng(seed)
    m = get_method("nvfp4")
    batch = make_batch(lens, bs, policy="scattered", seed=seed)
    T = int(sum(lens))
    if zeros:
        k = np.zeros((T, kvh, D), np.float32)
        v = k.copy()
    else:
        k = (rng.standard_normal((T, kvh, D)) * k_amp).astype(np.float32)
        v = (rng.standard_normal((T, kvh, D)) * v_amp).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, v)
    qc = qkv.device["cache"]
    st = m.tensor_scales(ctx, qkv)
    wpt = f4.words_per_token(D)
    if words:
        ref = o4.quantize_batch(k, v, batch.slot_mapping)
        assert st == tuple(float(s) for s in ref[2])
    sm = batch.slot_mapping.astype(np.int64)
    real = sm != PAD_SLOT
    caches = {}
    for i, which in enumerate(("K", "V")):
        full = quant.read_cache(ctx.rt, qc, which).reshape(batch.num_blocks, kvh, bs, wpt)
        if words:  # the words of every token are the oracle's
            np.testing.assert_array_equal(full[sm[real] // bs, :, sm[real] % bs], ref[i][real])
        deq = o4.dequantize(*f4.unpack_records(full, D), np.float32(st[i]))  # the method's dequantiser's values
        caches[which] = deq.astype(np.float64)
    rows = np.zeros(batch.num_blocks * bs, bool)
    rows[sm[real]] = True
    vmax = float(np.abs(caches["V"].reshape(-1, kvh, D)[rows]).max(initial=0.0))
    return m, qkv, batch, caches, vmax


def nvfp4_check(ctx, *, D, bs, kvh, G, lens, seed=0, q_amp=1.0, k_amp=1.0, v_amp=1.0, zeros=False, words=True, **kw):
    """Quantise with the method, decode with the fast kernel, compare with the method's attention oracle over the
    words read back (e2m1 * e4m3 * s_t in float32, then the f32 paged decode's arithmetic in float64). Tolerance
    fast_decode_fp4.tolerance."""
    ffd = kernels("fast_decode_fp4")
    m, qkv, batch, caches, vmax = nvfp4_quantised(ctx, D, bs, kvh, lens, seed=seed, k_amp=k_amp, v_amp=v_amp,
                                                  zeros=zeros, words=words)
    rng = np.random.default_rng(seed + 1)
    q = (rng.standard_normal((len(lens), kvh * G, D)) * q_amp).astype(np.float32)
    scale = D ** -0.5
    ref = O.decode(q.astype(np.float64), caches["K"], caches["V"], batch.block_tables, batch.context_lens, bs, scale)
    qc = qkv.device["cache"]
    fast = decoder(ctx.rt, "fast_decode_fp4", "Fp4FastDecode")
    plan = fast.plan(qc.k, qc.v, qc.extra["tensor"], kvh, q, batch, scale, **kw)
    ctx.rt.run(plan.dispatches)
    out = fast.read(plan)
    assert out.shape == (len(lens), kvh * G, D) and np.isfinite(out).all()
    empty_gives_zero(out, lens)
    tol = ffd.tolerance(vmax)
    err = float(np.abs(out - ref).max(initial=0.0))
    assert err <= tol, f"nvfp4 D{D} bs{bs} G{G} kvh{kvh} lens {lens[:6]}: max error {err:.3g} > {tol:.3g} ({plan.describe()})"
    return Result(plan, out, err / tol)


def _nvfp4_layout(ctx, D, G, **kw):
    return decoder(ctx.rt, "fast_decode_fp4", "Fp4FastDecode").layout(D, G, **kw)


def _nvfp4_refusals(ctx):
    fast = decoder(ctx.rt, "fast_decode_fp4", "Fp4FastDecode")
    m, qkv, batch, _, _ = nvfp4_quantised(ctx, 64, 16, 1, [64, 3], seed=1, words=False)
    qc = qkv.device["cache"]
    tb = qc.extra["tensor"]
    q = np.ones((2, 4, 64), np.float32)
    ones = lambda S, H, D: np.ones((S, H, D), np.float32)  # noqa: E731
    small = ctx.rt.upload(np.zeros(16, np.uint32), "small")
    out = [
        Refusal("GQA 17", lambda: fast.plan(qc.k, qc.v, tb, 1, ones(2, 17, 64), batch, 0.1), UnsupportedShape,
                "GQA group of 17"),
        Refusal("head 56", lambda: fast.plan(qc.k, qc.v, tb, 1, ones(2, 4, 56), batch, 0.1), UnsupportedShape,
                "multiple of 16"),
        Refusal("head 272", lambda: fast.plan(qc.k, qc.v, tb, 1, ones(2, 4, 272), batch, 0.1), UnsupportedShape, "over 256"),
        Refusal("3 queries for 2 sequences", lambda: fast.plan(qc.k, qc.v, tb, 1, ones(3, 4, 64), batch, 0.1), InvalidInput),
        Refusal("4 heads over 3 KV heads", lambda: fast.plan(qc.k, qc.v, tb, 3, q, batch, 0.1), InvalidInput),
        Refusal("a NaN scale", lambda: fast.plan(qc.k, qc.v, tb, 1, q, batch, float("nan")), InvalidInput),
        Refusal("a NaN float64 query", lambda: fast.plan(qc.k, qc.v, tb, 1, q.astype(np.float64) + np.nan, batch, 0.1),
                InvalidInput),
        Refusal("no tensor-scale buffer", lambda: fast.plan(qc.k, qc.v, None, 1, q, batch, 0.1), InvalidInput, "tensor-scale"),
        Refusal("unroll 3", lambda: fast.plan(qc.k, qc.v, tb, 1, q, batch, 0.1, unroll=3), InvalidInput, "unroll"),
        Refusal("negative partition_tokens", lambda: fast.plan(qc.k, qc.v, tb, 1, q, batch, 0.1, partition_tokens=-4),
                InvalidInput, "partition_tokens"),
        Refusal("a K buffer too small", lambda: fast.plan(small, qc.v, tb, 1, q, batch, 0.1), InvalidInput, "cache holds"),
    ]
    if ctx.rt.loop_limit is not None:
        out.append(Refusal("one partition past the loop limit",
                           lambda: fast.plan(qc.k, qc.v, tb, 1, q, batch, 0.1, partition_tokens=64 * 1024 * 1024, rows=1),
                           DeviceLimitError, "loop limit"))
    return out


# ---------------------------------------------------------------------- fast_decode_tq: TurboQuant, per sequence
TQ_LAYER = 1


def tq_caches(tq, rng, lens, kvh, d, k_amp=1.0, v_amp=1.0, spread=False):
    """One seed-compressor cache (tq_compress.wgsl) per sequence."""
    caches = []
    for L in lens:
        c = tq.allocate(kvh, d, max(L, 1), layer=TQ_LAYER)
        if L:
            K = rng.standard_normal((L, kvh, d)) * k_amp
            V = rng.standard_normal((L, kvh, d)) * v_amp
            if spread:  # norms over 4 decades
                K *= 10.0 ** rng.uniform(-2, 2, (L, kvh, 1))
                V *= 10.0 ** rng.uniform(-2, 2, (L, kvh, 1))
            tq.compress(c, K.astype(np.float32), V.astype(np.float32))
        caches.append(c)
    return caches


def tq_max_v(tq, cache, L, d):
    """max |V^| of a sequence's first L tokens: V^ = n_v * RHT^-1(c[vidx])."""
    tqo = oracle("fast_decode_tq")
    kw, vw = tq.read(cache)
    dec = tqo.decode_cache(kw, vw, cache.n_kv_heads, cache.cache_cap, d)
    c = cache.params.centroids.astype(np.float64)
    sp, _ = cache.params.signs
    v = tqo.rht_inverse(c[dec.v_idx[:, :L]], sp) * dec.v_norm[:, :L, None].astype(np.float64)
    return float(np.abs(v).max(initial=0.0))


def tq_kernels(rt):
    return decoder(rt, "turboquant", "TurboQuantKernels")


def tq_check(ctx, *, D, kvh, G, lens, bs=None, seed=0, qjl="reference", q_amp=1.0, scale=None, **kw):
    """The per-sequence fast TurboQuant decode over seed-compressor caches, held to the seed kernel's oracle
    (kvviz.families.turboquant.oracle.attention_oracle, float64 over the same packed words) within fast_decode_tq.tolerance;
    `caught`: the tolerance would see the other QJL scale. `bs` is unused (one cache a sequence, no blocks)."""
    fq = kernels("fast_decode_tq")
    tqo = oracle("fast_decode_tq")
    tq = tq_kernels(ctx.rt)
    fast = decoder(ctx.rt, "fast_decode_tq", "TQFastDecode")
    rng = np.random.default_rng(seed)
    amps = {k: kw.pop(k) for k in ("k_amp", "v_amp", "spread") if k in kw}
    caches = tq_caches(tq, rng, lens, kvh, D, **amps)
    H = kvh * G
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    plan = fast.plan(caches, q, lens, scale, qjl, **kw)
    tq.rt.run(plan.rotate + plan.dispatches)
    out = fast.read(plan)
    assert np.isfinite(out).all()
    other = "unbiased" if qjl == "reference" else "reference"
    worst, caught = 0.0, False
    empty_gives_zero(out, lens)
    for s, L in enumerate(lens):
        if L == 0:
            continue
        kw_, vw_ = tq.read(caches[s])
        ref = tqo.attention_oracle(q[s:s + 1], kw_, vw_, kvh, caches[s].cache_cap, L - 1, L, scale, caches[s].params, qjl)[0]
        tol = fq.tolerance(tq_max_v(tq, caches[s], L, D))
        err = float(np.abs(out[s] - ref).max())
        assert err <= tol, f"D{D} G{G} kvh{kvh} seq {s} (L={L}) {qjl}: max error {err:.3g} > {tol:.3g} ({plan.describe()})"
        worst = max(worst, err / tol)
        if L > 1:
            alt = tqo.attention_oracle(q[s:s + 1], kw_, vw_, kvh, caches[s].cache_cap, L - 1, L, scale, caches[s].params, other)[0]
            caught |= float(np.abs(alt - ref).max()) > 10 * tol
    return Result(plan, out, worst, caught)


def _tq_layout(ctx, D, G, **kw):
    return decoder(ctx.rt, "fast_decode_tq", "TQFastDecode").layout(D, G, **kw)


def _tq_refusals(ctx):
    tq = tq_kernels(ctx.rt)
    fast = decoder(ctx.rt, "fast_decode_tq", "TQFastDecode")
    rng = np.random.default_rng(1)
    caches = tq_caches(tq, rng, [10, 5], 2, 64)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    q3 = rng.standard_normal((2, 3, 64)).astype(np.float32)
    other = tq_caches(tq, rng, [10], 1, 64)
    return [
        Refusal("position 5 of sequence 1 never written", lambda: fast.plan(caches, q, [10, 6], 0.1), InvalidInput),
        Refusal("every sequence empty", lambda: fast.plan(caches, q, [0, 0], 0.1), InvalidInput),
        Refusal("one cache for two sequences", lambda: fast.plan(caches[:1], q, [10, 5], 0.1), InvalidInput),
        Refusal("a NaN scale", lambda: fast.plan(caches, q, [10, 5], float("nan")), InvalidInput),
        Refusal("3 heads over 2 KV heads", lambda: fast.plan(caches, q3, [10, 5], 0.1), UnsupportedShape),
        Refusal("caches of other KV head counts", lambda: fast.plan([caches[0], other[0]], q, [10, 10], 0.1), InvalidInput),
    ]


# ---------------------------------------------------------------------- fast_decode_tq, paged: the general compressor's records
def tq_inputs(rng, T, kvh, d, k_amp=1.0, v_amp=1.0, zeros=0.0):
    K = rng.standard_normal((T, kvh, d)) * k_amp
    V = rng.standard_normal((T, kvh, d)) * v_amp
    if zeros:  # a share of the (token, head) vectors exactly zero (all their words 0)
        K[rng.random((T, kvh)) < zeros] = 0.0
        V[rng.random((T, kvh)) < zeros] = 0.0
    return K.astype(np.float32), V.astype(np.float32)


def tq_write_paged(rt, batch, K, V, layer=TQ_LAYER):
    """The paged writer: tq_general_compress at the seed configuration through the batch's slot mapping.
    Returns (GeneralTQCache, K records [nb, kvh, bs, WK], V records [nb, kvh, bs, WV])."""
    tqf = bit_format("turboquant")
    tqk = kernels("turboquant")
    T, kvh, d = K.shape
    st = tqf.TQSettings(d, layer=layer)
    assert st.is_seed
    ident = tqf.choose_channels(K, 0)
    gc = tqk.general_allocate(rt, st, batch, kvh, ident, ident)
    rt.run(tqk.general_compress_dispatches(rt, gc, K, V, batch.slot_mapping))
    shp = (batch.num_blocks, kvh, batch.block_size, -1)
    return gc, quant.read_cache(rt, gc.qc, "K").reshape(shp), quant.read_cache(rt, gc.qc, "V").reshape(shp)


def tq_paged_max_v(kc, vc, batch, s, d, p):
    tqo = oracle("fast_decode_tq")
    kw, vw = tqo.paged_sequence_words(kc, vc, batch, s, d)
    L = int(batch.context_lens[s])
    dec = tqo.decode_cache(kw, vw, kc.shape[1], L, d)
    v = tqo.rht_inverse(p.centroids.astype(np.float64)[dec.v_idx], p.signs[0]) * dec.v_norm[..., None].astype(np.float64)
    return float(np.abs(v).max(initial=0.0))


def tq_paged_check(ctx, *, D, bs, kvh, G, lens, seed=0, qjl="reference", q_amp=1.0, policy="scattered", k_amp=1.0,
                   v_amp=1.0, zeros=0.0, **kw):
    """The paged fast TurboQuant decode (one split dispatch a batch) over the general compressor's records, held to
    kvviz.families.turboquant.oracle.paged_attention_oracle (float64 over the same records gathered through the block
    tables) within fast_decode_tq.tolerance; `caught`: the tolerance would see the other QJL scale. qk="i8" (in kw):
    the int8-query variant against the oracle of its int8 query."""
    fq = kernels("fast_decode_tq")
    tqo = oracle("fast_decode_tq")
    tqf = bit_format("turboquant")
    rt = ctx.rt
    fast = decoder(rt, "fast_decode_tq", "TQFastDecode")
    rng = np.random.default_rng(seed)
    batch = make_batch(lens, bs, policy=policy, seed=seed)
    K, V = tq_inputs(rng, batch.num_tokens, kvh, D, k_amp, v_amp, zeros)
    gc, kc, vc = tq_write_paged(rt, batch, K, V)
    H = kvh * G
    q = (rng.standard_normal((len(lens), H, D)) * q_amp).astype(np.float32)
    scale = 1.0 / math.sqrt(D)
    p = tqf.TQParams(D, layer=TQ_LAYER)
    plan = fast.plan_paged(gc.qc.k, gc.qc.v, kvh, q, batch, scale, p, qjl, **kw)
    assert len([x for x in plan.dispatches if x.kernel.kspec is fq.PAGED_SPLIT]) == 1, "one split dispatch a batch"
    rt.run(plan.rotate + plan.dispatches)
    out = fast.read(plan)
    assert np.isfinite(out).all()
    qk = kw.get("qk", "f32")  # "i8": the int8-query variant, against its own oracle (the same query in int8)
    ref = tqo.paged_attention_oracle(q, kc, vc, batch, scale, p, qjl, qk=qk)
    other = tqo.paged_attention_oracle(q, kc, vc, batch, scale, p, "unbiased" if qjl == "reference" else "reference",
                                       qk=qk)
    worst, caught = 0.0, False
    empty_gives_zero(out, lens)
    for s, L in enumerate(lens):
        if L == 0:
            continue
        tol = fq.tolerance(tq_paged_max_v(kc, vc, batch, s, D, p))
        err = float(np.abs(out[s] - ref[s]).max())
        assert err <= tol, f"D{D} G{G} kvh{kvh} bs{bs} seq {s} (L={L}) {qjl}: error {err:.3g} > {tol:.3g} ({plan.describe()})"
        worst = max(worst, err / tol)
        if L > 1:
            caught |= float(np.abs(other[s] - ref[s]).max()) > 10 * tol
    return Result(plan, out, worst, caught)


def _tq_paged_refusals(ctx):
    tqf = bit_format("turboquant")
    rt = ctx.rt
    fast = decoder(rt, "fast_decode_tq", "TQFastDecode")
    rng = np.random.default_rng(1)
    d, kvh, bs = 64, 2, 16
    batch = make_batch([10, 5], bs, policy="scattered", seed=1)
    K, V = tq_inputs(rng, batch.num_tokens, kvh, d)
    gc, _, _ = tq_write_paged(rt, batch, K, V)
    p = tqf.TQParams(d, layer=TQ_LAYER)
    q = rng.standard_normal((2, 4, d)).astype(np.float32)
    k, v = gc.qc.k, gc.qc.v
    fast.plan_paged(k, v, kvh, q, batch, 0.1, p)  # the good case plans
    bad = make_batch([10, 5], bs, policy="scattered", seed=1)
    bad.block_tables = bad.block_tables.copy()
    bad.block_tables[1, 0] = bad.num_blocks  # out of the pool
    empty = make_batch([10, 0], bs, seed=1)
    empty.block_tables = empty.block_tables.copy()
    empty.block_tables[1, 0] = 99  # an empty sequence's entry 0 (read, never used, by the prefetching loads)
    rq = lambda H, D: rng.standard_normal((2, H, D)).astype(np.float32)  # noqa: E731
    q3, q8, q96, q17 = rq(3, d), rq(8, d), rq(4, 96), rq(17, d)
    return [
        Refusal("a block id past the pool", lambda: fast.plan_paged(k, v, kvh, q, bad, 0.1, p), InvalidInput, "block"),
        Refusal("an empty sequence's entry 0 past the pool", lambda: fast.plan_paged(k, v, kvh, q, empty, 0.1, p),
                InvalidInput, "entry 0"),
        Refusal("q for one sequence of two", lambda: fast.plan_paged(k, v, kvh, q[:1], batch, 0.1, p), InvalidInput),
        Refusal("a float64 query", lambda: fast.plan_paged(k, v, kvh, q.astype(np.float64), batch, 0.1, p), InvalidInput),
        Refusal("a 2-D query", lambda: fast.plan_paged(k, v, kvh, q[0], batch, 0.1, p), InvalidInput),
        Refusal("3 heads over 2 KV heads", lambda: fast.plan_paged(k, v, kvh, q3, batch, 0.1, p), InvalidInput),
        Refusal("a NaN scale", lambda: fast.plan_paged(k, v, kvh, q, batch, float("nan"), p), InvalidInput),
        Refusal("parameters of another head size",
                lambda: fast.plan_paged(k, v, kvh, q, batch, 0.1, tqf.TQParams(32, layer=TQ_LAYER)), InvalidInput,
                "head size"),
        Refusal("a V buffer too small for the pool", lambda: fast.plan_paged(k, rt.empty(64, "small"), kvh, q, batch, 0.1, p),
                InvalidInput, "V cache"),
        Refusal("4 KV heads over a cache of 2", lambda: fast.plan_paged(k, v, 4, q8, batch, 0.1, p), InvalidInput, "K cache"),
        Refusal("head 96 (not a seed head size)",
                lambda: fast.plan_paged(k, v, kvh, q96, batch, 0.1, tqf.TQParams(96, layer=TQ_LAYER)), UnsupportedShape),
        Refusal("GQA 17", lambda: fast.plan_paged(k, v, 1, q17, batch, 0.1, p), UnsupportedShape),
    ]


# ================================================================================== the table
DECODES: dict[str, Decode] = {}
for _f in FORMATS:
    DECODES[fmt_id(_f)] = Decode(fmt_id(_f), "fast_decode", _fd_check(_f), _fd_layout(_f), _fd_refusals)
for _t in kernels("fast_decode_ggml").TYPES:
    DECODES[_t] = Decode(_t, "fast_decode_ggml", _ggml_check(_t), _ggml_layout, _ggml_refusals)
for _b, _r in ((2, 0), (2, 16), (2, 128), (4, 0), (4, 16), (4, 128)):
    DECODES[f"kivi-b{_b}-r{_r}"] = Decode(f"kivi-b{_b}-r{_r}", "fast_decode_kivi", _kivi_check(_b, _r), _kivi_layout(_b),
                                          _kivi_refusals)
DECODES["nvfp4"] = Decode("nvfp4", "fast_decode_fp4", nvfp4_check, _nvfp4_layout, _nvfp4_refusals)
DECODES["tq"] = Decode("tq", "fast_decode_tq", tq_check, _tq_layout, _tq_refusals)
DECODES["tq-paged"] = Decode("tq-paged", "fast_decode_tq", tq_paged_check, _tq_layout, _tq_paged_refusals)


# ================================================================================== the fast writers
fw = importlib.import_module("kvviz.attention.writers")  # the fast writers' lanes, variants and row dispatches
ofw = importlib.import_module("kvviz.families.writer_oracles")  # the words every fast writer must leave
fmt8 = bit_format("fp8")

# (head_size, block_size, context lens, policy, pad_every, kv_heads): ragged, empty and single-token
# sequences, padding slots, scattered and fragmented blocks.
WRITER_SHAPES = [
    (64, 8, [1, 37, 0, 20], "contiguous", 0, 2),
    (128, 16, [70, 5, 0, 33], "scattered", 5, 2),
    (256, 32, [100, 1], "scattered", 3, 1),
    (80, 16, [45, 0, 1], "fragmented", 4, 1),
    (96, 8, [33, 17], "scattered", 0, 3),
    # the vLLM tests' heads whose rows no power-of-two lane count divides into few enough vec4s (or code words): the
    # lanes walk them with padding (kvviz/attention/writers.py padded_split); 112 and 192
    (120, 16, [40, 1, 0, 21], "scattered", 3, 2),
    (112, 8, [29, 2], "contiguous", 0, 1),
    (192, 16, [17, 33], "scattered", 4, 2),
]


def shape_id(s) -> str:
    d, b, _, p, pe, h = s
    return f"D{d}-bs{b}-{p}-pad{pe}-kvh{h}"


# (name, subgroups, lanes a row): the adapter's default (subgroup shuffles on lavapipe), one lane a row, and the
# workgroup-memory reduction an adapter without subgroups gets
WRITER_VARIANTS = [("default", None, None), ("one-lane", None, 1), ("no-subgroups", False, None)]


def make_rows(rng, T, kvh, D, writer):
    """K/V rows with magnitudes over 6 decades, an all-zero row, -0/+0, subnormals next to normal values,
    exact ties of the writer's rounding and values near its format's overflow."""
    k = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-3, 3, (T, kvh, 1))).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-2, 2, (T, kvh, 1))).astype(np.float32)
    i = np.arange(D)
    rows = []
    rows.append(np.zeros(D, np.float32))                                          # all zero
    rows.append(np.where(i % 2, 0.0, -0.0).astype(np.float32))                   # signed zeros
    sub = np.where(i % 3 == 0, 1e-40, (i - D / 2) * 0.01).astype(np.float32)     # subnormals next to normals
    rows.append(sub)
    if writer.startswith("int8"):
        # amax 127: int8_token's scale is exactly 1 and the seed's inverse 127/amax is 1: x = k + 0.5 ties
        t = ((i % 40) - 20).astype(np.float32) + np.float32(0.5)
        t[0] = 127.0
        rows += [t, np.full(D, 3.0e38, np.float32) * np.where(i % 2, 1, -1).astype(np.float32)]
    elif writer.startswith("fp8"):
        fmt = fmt8.FORMATS[writer[4:8]]
        every = fmt8.decode(np.arange(256, dtype=np.uint8), fmt)
        vals = np.unique(np.abs(every[np.isfinite(every)]))
        mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)                   # every midpoint: a tie
        t = np.resize(mids, D) * np.where(i % 2, 1, -1).astype(np.float32)
        t[0] = np.float32(fmt.max)                                                # amax = max: scale 1
        rows += [t, np.full(D, 3.0e38, np.float32)]
    elif writer.startswith("int4") or writer.startswith("kivi"):
        rows += [(np.float32(0.25) * (i % 31) - np.float32(2.0)).astype(np.float32),  # (x - min)/0.5 ties
                 np.full(D, np.float32(0.75)), (rng.standard_normal(D) * 1e37).astype(np.float32)]
    else:  # f16: the largest finite value, values that round down to it, ties of the f16 grid, subnormal halves
        t = np.resize(np.array([65504.0, 65519.99, -65519.0, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 2.0 ** -25,
                                3 * 2.0 ** -26, 2.0 ** -24 * 1.5, -6e-8, 1e-9], np.float32), D)
        rows += [t]
    for j, r in enumerate(rows):
        if j < T:
            k[j, 0] = r
            v[j, -1] = r[::-1]
    return k, v


def oracle_words(writer, batch, x, method=None):
    if writer == "int8_token":
        return ofw.int8_token(batch, x)
    if writer == "int8_seed":
        return ofw.int8_seed(batch, x)
    if writer.startswith("fp8"):
        return ofw.fp8(batch, x, writer[4:8], writer.split("-")[1])
    if writer.startswith("int4"):
        return ofw.int4(batch, x, method.group_for(x.shape[2]))
    return ofw.f16(batch, x)


def run_writer(rt, writer, batch, k, v, variant):
    """(K words, V words, tensor words or None, int4 method or None) written by the fast writer from zeroed caches."""
    T, kvh, D = k.shape
    sm = batch.slot_mapping
    method = None
    if writer in ("int8_token", "int8_seed"):
        wpt = D // 4 + 1
    elif writer.startswith("fp8"):
        wpt = D // 4 + (0 if writer.endswith("per_tensor") else 1)
    elif writer.startswith("int4"):
        method = get_method("int4_group", group_size=int(writer.split("-")[1]))
        wpt = method.wpt(D)
    else:
        wpt = D // 2
    n = batch.num_blocks * kvh * batch.block_size * wpt
    kb, vb = rt.upload(np.zeros(n, np.uint32), "k"), rt.upload(np.zeros(n, np.uint32), "v")
    tensor = None
    if writer in ("int8_token", "int8_seed"):
        d = kernels("int8").int8_dispatches(rt, k, v, sm, kb, vb, batch.block_size, seed=writer == "int8_seed", variant=variant)
    elif writer.startswith("fp8"):
        tensor = rt.upload(np.zeros(4, np.uint32), "tensor")
        d = kernels("fp8").fp8_dispatches(rt, fmt8.FORMATS[writer[4:8]], writer.endswith("per_tensor"), k, v, sm, kb, vb, tensor,
                              batch.block_size, variant=variant)
    elif writer.startswith("int4"):
        d = kernels("int4").int4_dispatches(rt, method.group_for(D), k, v, sm, kb, vb, batch.block_size, variant=variant)
    else:
        d = kernels("f16").f16_dispatches(rt, k, v, sm, kb, vb, batch.block_size)
    rt.run(d)
    shape = (batch.num_blocks, kvh, batch.block_size, wpt)
    t = rt.read(tensor, np.uint32, nbytes=16) if tensor is not None else None
    return rt.read(kb, np.uint32, shape), rt.read(vb, np.uint32, shape), t, method


def _fast_write_refusals(ctx):
    rt = ctx.rt
    batch = make_batch([4], 16)
    k = np.zeros((4, 1, 64), np.float32)
    buf = rt.upload(np.zeros(16 * 17, np.uint32), "c")
    sm = batch.slot_mapping
    out = [
        Refusal("key and value of other shapes", lambda: kernels("int8").int8_dispatches(rt, k, k[:, :, :32], sm, buf, buf, 16),
                InvalidInput, "key and value"),
        Refusal("fewer slots than rows", lambda: kernels("int8").int8_dispatches(rt, k, k, sm[:2], buf, buf, 16), InvalidInput, "slots"),
        Refusal("head 62", lambda: kernels("int8").int8_dispatches(rt, k[:, :, :62], k[:, :, :62], sm, buf, buf, 16), UnsupportedShape,
                "multiple of 4"),
        Refusal("3 lanes a row", lambda: fw.Variant(rt, False, 3), InvalidInput, "power of two"),
    ]
    if fw.subgroups_available(rt):
        out.append(Refusal("64 lanes of shuffles", lambda: fw.Variant(rt, True, 64), InvalidInput, "smallest subgroup"))
    return out


def _fast_write_tq_refusals(ctx):
    fwt = kernels("fast_write_tq")
    tqf = bit_format("turboquant")
    rt = ctx.rt
    d, kvh = 64, 2
    batch = make_batch([5], 16)
    st = tqf.TQSettings(d, layer=TQ_LAYER)
    K, V = tq_inputs(np.random.default_rng(0), 5, kvh, d)

    def run(k, v, sm=batch.slot_mapping, s=st):
        return fwt.dispatches(rt, s, k, v, sm, None, None, 16)

    nan = K.copy()
    nan[2, 1, 7] = np.nan
    inf = V.copy()
    inf[0, 0, 0] = np.inf
    return [
        Refusal("a NaN key", lambda: run(nan, V), InvalidInput, "NaN"),
        Refusal("an infinite value", lambda: run(K, inf), InvalidInput, "NaN or Inf"),
        Refusal("key and value of other shapes", lambda: run(K, V[:, :1]), InvalidInput, "shapes differ"),
        Refusal("float64 keys", lambda: run(K.astype(np.float64), V), InvalidInput, "float32"),
        Refusal("2-D rows", lambda: run(K[0], V[0]), InvalidInput, "float32"),
        Refusal("fewer slots than rows", lambda: run(K, V, batch.slot_mapping[:3]), InvalidInput, "slots"),
        Refusal("norms past f16", lambda: run(K * np.float32(1e4), V), InvalidInput, "f16"),
        Refusal("head 48", lambda: run(K[..., :48].copy(), V[..., :48].copy()), UnsupportedShape, "head_size 48"),
        Refusal("bits 3 (not the seed configuration)", lambda: run(K, V, s=tqf.TQSettings(d, bits=3)), UnsupportedShape,
                "seed configuration"),
        Refusal("settings of another head size", lambda: run(K, V, s=tqf.TQSettings(32)), InvalidInput, "head_size"),
        Refusal("3 lanes", lambda: fwt.dispatches(rt, st, K, V, batch.slot_mapping, None, None, 16, lanes=3), InvalidInput,
                "lanes"),
    ]


def _fast_write_ggml_refusals(ctx):
    fwg = kernels("fast_write_ggml")
    fg = bit_format("fast_write_ggml")
    rt = ctx.rt
    batch = make_batch([3], 16)
    k = np.zeros((3, 1, 48), np.float32)
    n = batch.num_blocks * batch.block_size * 20
    kb, vb = rt.upload(np.zeros(n, np.uint32), "k"), rt.upload(np.zeros(n, np.uint32), "v")
    sm = batch.slot_mapping
    types = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4")
    return [
        Refusal("head 48", lambda: fwg.ggml_dispatches(rt, "q8_0", k, k, sm, kb, vb, 16), Exception, "multiple of 32"),
        Refusal("3 blocks a lane", lambda: fwg.ggml_dispatches(rt, "q8_0", k[:, :, :32], k[:, :, :32], sm, kb, vb, 16,
                                                              blocks_per_lane=3), Exception, "multiples of 2"),
        Fact("the fewest blocks a lane of each type", [fwg.min_blocks_per_lane(fg.TYPES[t]) for t in types] == [2, 2, 1, 2, 1, 2, 4]),
    ]


WRITER_REFUSALS = {"fast_write": _fast_write_refusals, "fast_write_tq": _fast_write_tq_refusals,
                   "fast_write_ggml": _fast_write_ggml_refusals}


# ================================================================================== the methods end to end
og = oracle("ggml")
fg = bit_format("ggml")
o4 = oracle("fp4")


def ggml_kv(rng, T, kvh, D):
    """Per-token magnitudes over 6 decades, a zero vector, a constant vector, signed zeros, exact ties,
    outlier channels."""
    k = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-3, 3, (T, kvh, 1))).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-2, 2, (T, kvh, 1))).astype(np.float32)
    k[:, :, 3::37] *= np.float32(8)  # outlier channels; |x| stays below f16 max (q4_1 / q5_1 store the min as f16)
    if T > 4:
        k[1] = v[1] = 0.0
        k[2] = np.float32(0.75)
        v[2, :, ::2] = -0.0
        v[2, :, 1::2] = 0.0
        k[3] = (np.arange(D) % 32 - 16).astype(np.float32) * np.float32(0.5)
        v[4] = (np.float32(0.25) * (np.arange(D) % 31) - np.float32(2.0)).astype(np.float32)
    return k, v


def ggml_method_check(ctx, m, batch, k, v, H):
    """A ggml block type's method end to end: the cache bytes EQUAL gguf.quants.quantize's (the oracle's), the
    dequantised f32 cache equals gguf.quants.dequantize bit for bit, the scale fields too; attention through the
    method within 2e-5 * max(1, max|V^|) of the float64 decode over gguf's dequantised caches, weights within 2e-6,
    and the method's registered end-to-end reference agrees."""
    D = k.shape[2]
    qkv = m.quantize(ctx, batch, k, v)
    t = m.fmt
    nb, bs = batch.num_blocks, batch.block_size
    sm = batch.slot_mapping.astype(np.int64)
    real = sm != PAD_SLOT
    fl = {}
    for which, x in (("K", k), ("V", v)):
        recs = og.quantize(x, t)
        w = recs.shape[-1]
        full = np.zeros((nb, k.shape[1], bs, w), np.uint32)
        full[sm[real] // bs, :, sm[real] % bs] = recs[real]
        got = quant.read_cache(ctx.rt, qkv.device["cache"], which)
        np.testing.assert_array_equal(got, full.reshape(nb, k.shape[1], bs * w), err_msg=f"{m.id} {which} words")
        deq = og.dequantize(recs, D, t)
        f = np.zeros((nb, k.shape[1], bs, D), np.float32)
        f[sm[real] // bs, :, sm[real] % bs] = deq[real]
        gf = m.read_f32(ctx, qkv, which)
        # the slots tokens were written to (a used block's empty slots hold gguf's value of zero bytes, e.g. -0)
        np.testing.assert_array_equal(gf[sm[real] // bs, :, sm[real] % bs].view(np.uint32), deq[real].view(np.uint32),
                                      err_msg=f"{m.id} dequantised {which}")
        fl[which] = f.astype(np.float64)
        fields = qkv.extra["k_fields" if which == "K" else "v_fields"]
        exp = fg.unpack_rows(og.quantize_rows(x[real], t), D, t)
        np.testing.assert_array_equal(fields["scale"][real].view(np.uint32), exp["scale"].view(np.uint32))
    rng = np.random.default_rng(7)
    q = rng.standard_normal((batch.num_seqs, H, D)).astype(np.float32)
    scale = float(np.float32(8.0 / max(1e-30, np.abs(np.einsum("shd,bkpd->shbkp", q.astype(np.float64), fl["K"])).max())))
    out = m.attend(ctx, qkv, batch, q, scale)
    ref = O.decode(q, fl["K"], fl["V"], batch.block_tables, batch.context_lens, batch.block_size, scale)
    tol = 2e-5 * max(1.0, float(np.abs(fl["V"]).max()))
    assert np.abs(out - ref).max() <= tol, f"{m.id} decode err {np.abs(out - ref).max()} > {tol}"
    w = m.weights(ctx, qkv, batch, q, scale)
    ref_w = O.decode_weights(q, fl["K"], batch.block_tables, batch.context_lens, batch.block_size, scale)
    assert np.abs(w - ref_w).max() <= 2e-6
    # the method's registered end-to-end reference agrees
    r2, tol2 = method_reference(m.id)(m, batch, k, v, q, scale)
    assert np.abs(out - r2).max() <= tol2
    return qkv


def nvfp4_kv(rng, T, kvh, D):
    k = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-2, 2, (T, kvh, 1))).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-1, 1, (T, kvh, 1))).astype(np.float32)
    k[:, :, 5::29] *= np.float32(30)  # outlier channels
    if T > 3:
        k[1] = v[1] = 0.0
        v[2, :, ::2] = -0.0
        k[3] = np.float32(0.75)
    return k, v


def nvfp4_expected(batch, k, v):
    kr, vr, st = o4.quantize_batch(k, v, batch.slot_mapping)
    return {"K": kr, "V": vr, "st": st}


def nvfp4_method_check(ctx, batch, k, v, H, writer_impl="fast"):
    """NVFP4 end to end: cache words and per-tensor scales EQUAL the oracle's, the dequantised f32 cache equals the
    oracle's bit for bit, attention within 2e-5 * max(1, max|V^|) and weights within 2e-6 of the float64 decode,
    and the method's registered end-to-end reference agrees."""
    m = get_method("nvfp4")
    m.writer_impl = writer_impl
    D = k.shape[2]
    qkv = m.quantize(ctx, batch, k, v)
    ref = nvfp4_expected(batch, k, v)
    nb, bs, kvh = batch.num_blocks, batch.block_size, k.shape[1]
    sm = batch.slot_mapping.astype(np.int64)
    real = sm != PAD_SLOT
    assert qkv.extra["tensor_scales"] == tuple(float(s) for s in ref["st"])
    fl = {}
    for i, which in enumerate(("K", "V")):
        recs = ref[which]
        w = recs.shape[-1]
        full = np.zeros((nb, kvh, bs, w), np.uint32)
        full[sm[real] // bs, :, sm[real] % bs] = recs[real]
        np.testing.assert_array_equal(quant.read_cache(ctx.rt, qkv.device["cache"], which), full.reshape(nb, kvh, bs * w),
                                      err_msg=f"nvfp4 {which} words")
        deq = o4.dequantize(*o4.unpack_records(recs, D), ref["st"][i])
        gf = m.read_f32(ctx, qkv, which)
        np.testing.assert_array_equal(gf[sm[real] // bs, :, sm[real] % bs].view(np.uint32), deq[real].view(np.uint32))
        f = np.zeros((nb, kvh, bs, D), np.float64)
        f[sm[real] // bs, :, sm[real] % bs] = deq[real]
        fl[which] = f
    rng = np.random.default_rng(7)
    q = rng.standard_normal((batch.num_seqs, H, D)).astype(np.float32)
    scale = float(np.float32(4.0 / max(1e-30, np.abs(np.einsum("shd,bkpd->shbkp", q.astype(np.float64), fl["K"])).max())))
    out = m.attend(ctx, qkv, batch, q, scale)
    r = O.decode(q, fl["K"], fl["V"], batch.block_tables, batch.context_lens, batch.block_size, scale)
    tol = 2e-5 * max(1.0, float(np.abs(fl["V"]).max()))
    assert np.abs(out - r).max() <= tol
    w = m.weights(ctx, qkv, batch, q, scale)
    assert np.abs(w - O.decode_weights(q, fl["K"], batch.block_tables, batch.context_lens, batch.block_size, scale)).max() <= 2e-6
    r2, tol2 = method_reference("nvfp4")(m, batch, k, v, q, scale)
    assert np.abs(out - r2).max() <= tol2
    return qkv


# ---------------------------------------------------------------------- the per-token / per-group methods
oi8 = oracle("int8")
oi4 = oracle("int4")
of8 = oracle("fp8")
okv = oracle("kivi")


def quant_kv(rng, T, kvh, D):
    """Gaussian K/V with per-token magnitudes over 6 decades, a zero vector, a constant vector,
    a vector with -0.0 and +0.0 and exact ties of the int8 grid."""
    k = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-3, 3, (T, kvh, 1))).astype(np.float32)
    v = (rng.standard_normal((T, kvh, D)) * 10.0 ** rng.uniform(-2, 2, (T, kvh, 1))).astype(np.float32)
    if T > 3:
        k[1] = 0.0
        v[1] = 0.0
        k[2] = np.float32(0.75)
        v[2, :, ::2] = -0.0
        v[2, :, 1::2] = 0.0
        k[3] = (np.arange(D) - D // 2).astype(np.float32) * np.float32(0.5)
        # every group of >= 31 elements spans exactly 7.5 in 0.25 steps: scale 7.5/15 = 0.5 is exact and
        # (x - min)/scale hits exact .5 ties, which must round half to even
        k[4] = v[4] = (np.float32(0.25) * (np.arange(D) % 31) - np.float32(2.0)).astype(np.float32)
    return k, v


def quant_expected(m, batch, k, v):
    """Oracle: full K / V cache words (from zeroed buffers), dequantised f32 caches and per-row fields."""
    nb, bs = batch.num_blocks, batch.block_size
    T, kvh, D = k.shape
    sm = batch.slot_mapping.astype(np.int64)
    real = sm != PAD_SLOT
    if m.family == "kivi":
        ref = okv.write_buffers(batch, k, v, m.bits, m.recent)
        kc, vc = okv.dequantize_cache(batch, k, v, m.bits, m.recent, ref["per_seq"])
        # |zero| of every element (codes 0, residual rows 0): bounds an fma's deviation, see fused_tol
        zs = [dict(qs, k_codes=0 * qs["k_codes"], v_codes=0 * qs["v_codes"], k_res=0 * qs["k_res"], v_res=0 * qs["v_res"])
              for qs in ref["per_seq"]]
        kz, vz = okv.dequantize_cache(batch, k, v, m.bits, m.recent, zs)
        return {"K": ref["k"], "V": ref["v"], "res": ref["res"], "fK": kc, "fV": vc, "zK": kz, "zV": vz, "oracle": ref}
    out = {}
    for which, x in (("K", k), ("V", v)):
        if m.family == "int8":
            codes, scales = oi8.quantize(x)
            recs, deq = oi8.pack_records(codes, scales), oi8.dequantize(codes, scales)
            out[which + "codes"], out[which + "scales"] = codes, scales
        elif m.family == "int4":
            G = m.group_for(D)  # group_size, or the group it picks at a head size it does not divide
            codes, scales, zeros = oi4.quantize_groups(x, G)
            recs = oi4.pack_records(codes, scales, zeros)
            deq = oi4.dequantize_groups(codes, scales, zeros, G)
            zmap = oi4.dequantize_groups(0 * codes, scales, zeros, G)  # = zero of each element
            out[which + "codes"], out[which + "scales"], out[which + "zeros"] = codes, scales, zeros
        else:
            codes, scales = of8.quantize(x, m.fmt, m.scale_mode, batch.slot_mapping)
            recs = of8.pack_records(codes, None if m.per_tensor else scales)
            deq = of8.dequantize(codes, scales, m.fmt)
            out[which + "codes"], out[which + "scales"] = codes, scales
        w = recs.shape[-1]
        full = np.zeros((nb, kvh, bs, w), np.uint32)
        full[sm[real] // bs, :, sm[real] % bs] = recs[real]
        out[which] = full.reshape(nb, kvh, bs * w)
        f = np.zeros((nb, kvh, bs, D), np.float32)
        f[sm[real] // bs, :, sm[real] % bs] = deq[real]
        out["f" + which] = f
        if m.family == "int4":
            z = np.zeros((nb, kvh, bs, D), np.float32)
            z[sm[real] // bs, :, sm[real] % bs] = zmap[real]
            out["z" + which] = z
    return out


def fused_tol(m, ref, which):
    """Dequantised-cache tolerance. int8 / FP8: one float32 multiply, exact (0). int4 / KIVI compute
    code*scale + zero, which Vulkan lets a driver contract into an fma (NVIDIA does; lavapipe does not):
    fused and unfused differ by at most the product's rounding plus the sum's, i.e. within
    2^-23 * (|code*scale| + |result|) <= 2^-23 * (2|result| + |zero|); allowed 2^-22 * (|result| + 2|zero|)."""
    if m.family in ("int8", "fp8"):
        return 0.0
    return 2.0**-22 * (np.abs(ref["f" + which]).astype(np.float64) + 2.0 * np.abs(ref["z" + which]))


def quant_method_check(ctx, m, batch, k, v, H, scale=None):
    """A per-token / per-group method (int8, int4, FP8, KIVI) end to end against its numpy oracle: 1. the cache
    words EQUAL the oracle's (codes, scales, zeros, FP8 bytes, KIVI side streams and residual rows: every
    quantiser divides with a correctly rounded division and takes min / max on integer keys of the float bits), and
    the per-row fields read back; 2. the dequantised f32 caches within fused_tol (0 for int8 / FP8); 3. attention
    through the f32 decode within 2e-5 * max(1, max|V^|) of the float64 oracle over the oracle's dequantised caches,
    weights within 2e-6. Returns (qkv, the oracle's dict)."""
    rt = ctx.rt
    D = k.shape[2]
    rng = np.random.default_rng(7)
    qkv = m.quantize(ctx, batch, k, v)
    ref = quant_expected(m, batch, k, v)
    real = batch.slot_mapping != PAD_SLOT
    # 1. the cache words, exactly
    if m.family == "kivi":
        bufs = m.read_buffers(ctx, qkv)
        for which, key in (("K", "k"), ("V", "v")):
            np.testing.assert_array_equal(bufs[key], ref[which], err_msg=f"{m.id} {which} words")
        np.testing.assert_array_equal(bufs["res"].view(np.uint32), ref["res"].view(np.uint32), err_msg="residual rows")
        # per-row fields read back from the GPU agree with the per-sequence oracle
        p = ref["oracle"]["plan"]
        for s in range(batch.num_seqs):
            rows = batch.token_rows(s)
            nq = int(p.n_q[s])
            qs = ref["oracle"]["per_seq"][s]
            np.testing.assert_array_equal(qkv.k_codes[rows[:nq]], qs["k_codes"])
            np.testing.assert_array_equal(qkv.v_codes[rows[:nq]], qs["v_codes"])
            np.testing.assert_array_equal(qkv.v_scales[rows[:nq]], qs["v_scale"])
            np.testing.assert_array_equal(qkv.extra["v_zeros"][rows[:nq]], qs["v_zero"])
            g = np.arange(nq) // okv.GROUP
            np.testing.assert_array_equal(qkv.k_scales[rows[:nq]], qs["k_scale"][g])
            np.testing.assert_array_equal(qkv.extra["k_zeros"][rows[:nq]], qs["k_zero"][g])
            assert qkv.extra["residual"][rows[nq:]].all() and not qkv.extra["residual"][rows[:nq]].any()
    else:
        for which in ("K", "V"):
            got = quant.read_cache(rt, qkv.device["cache"], which)
            np.testing.assert_array_equal(got, ref[which], err_msg=f"{m.id} {which} words")
        for which, codes, scales in (("K", qkv.k_codes, qkv.k_scales), ("V", qkv.v_codes, qkv.v_scales)):
            exp_codes = ref[which + "codes"][real]
            if m.family == "fp8":
                exp_codes = of8.decode(exp_codes, m.fmt)
                np.testing.assert_array_equal(codes[real].view(np.uint32), exp_codes.view(np.uint32))
            else:
                np.testing.assert_array_equal(codes[real], exp_codes)
            np.testing.assert_array_equal(scales[real].view(np.uint32), ref[which + "scales"][real].view(np.uint32))
        if m.family == "int8":
            assert qkv.k_codes[real].min(initial=0) >= -127 and qkv.v_codes[real].min(initial=0) >= -127
    # 2. the dequantised f32 caches
    for which in ("K", "V"):
        got = m.read_f32(ctx, qkv, which)
        err = np.abs(got.astype(np.float64) - ref["f" + which])
        tol = fused_tol(m, ref, which)
        assert (err <= tol).all(), f"{m.id} dequantised {which}: max err {err.max()}, max err/tol {(err / np.maximum(tol, 1e-300)).max()}"
    # 3. attention through the f32 decode vs the float64 oracle over the oracle's dequantised caches
    q = rng.standard_normal((batch.num_seqs, H, D)).astype(np.float32)
    fk, fv = ref["fK"].astype(np.float64), ref["fV"].astype(np.float64)
    if scale is None:
        # keys span 6 decades of magnitude: pick the softmax scale so the largest |logit| is 8,
        # which keeps the f32 kernels' logit rounding inside the weight tolerance below
        scale = float(np.float32(8.0 / max(1e-30, np.abs(np.einsum("shd,bkpd->shbkp", q.astype(np.float64), fk)).max())))
    out = m.attend(ctx, qkv, batch, q, scale)
    ref_out = O.decode(q, fk, fv, batch.block_tables, batch.context_lens, batch.block_size, scale)
    tol = 2e-5 * max(1.0, float(np.abs(fv).max()))
    assert np.abs(out - ref_out).max() <= tol, f"{m.id} decode err {np.abs(out - ref_out).max()} > {tol}"
    w = m.weights(ctx, qkv, batch, q, scale)
    ref_w = O.decode_weights(q, fk, batch.block_tables, batch.context_lens, batch.block_size, scale)
    assert np.abs(w - ref_w).max() <= 2e-6, f"{m.id} weights err {np.abs(w - ref_w).max()}"
    return qkv, ref


# ------------------------------------------------------------------------------------------------ bench variants
def checked_variant_rows(rt, method: str, names, lens=(33, 70)) -> dict:
    """`kvviz bench --variants` over `method` at a tiny ragged shape (sequences of `lens` tokens): its rows by kernel
    name, each of `names` timed and held to its own oracle within its tolerance."""
    from kvviz.bench import BenchShape, run_bench

    shape = BenchShape("tiny", tuple(lens), 4, 2, 64, 16, "scattered")
    res = run_bench([shape], runs=1, warmup=0, rt=rt, log=lambda *a: None, frontends=("glslang",),
                    methods=(method,), variants=True)
    rows = {r["kernel"]: r for r in res["rows"]}
    for name in names:
        r = rows[name]
        assert r["gpu_us_median"] and r["within_tolerance"], (name, r["note"])
    return rows
