"""The fast paged decode: split-K ("flash-decoding") attention that reads each method's packed cache in
place. Family "fast" (kvviz/families/catalogue.py): shaders attention/split_decode.wgsl + attention/split_reduce.wgsl,
numpy reference: the method's own (kvviz/attention/paged_oracle.py), tests tests/test_fast_decode.py.

What makes it fast (docs/fast-kernels.md s.6, measured s.8):
  - the context is split into partitions across workgroups (grid: partitions x KV heads x sequences),
    sized so the grid fills the device; a reduce kernel combines the partitions;
  - one workgroup serves the G query heads of a KV head: every K/V word is loaded once for G heads;
  - K is read once, with an online softmax (base 2, the query pre-scaled by scale*log2(e));
  - a token row is shared by L lanes that each own D/L dims; the row's G x U partial logits of a step are
    reduce-scattered by subgroup shuffles, so each (head, token) logit's softmax step runs once on the lanes
    that own it, and the lanes then take the weights from their owners (the scatter softmax);
  - codes go straight into the dot products (unpack4xI8, FP8 bit arithmetic, unpack2x16float), and the
    per-token scales multiply the logit and the probability: no dequantise pass, no f32 copy of the cache;
  - the per-head, per-token code is unrolled (one variable per head and vec4), because naga clamps
    dynamic indices of private arrays and those arrays then leave registers: Jinja2 templates write it
    (shaders/attention/split_decode.wgsl.j2 over the split kernels' attention/split_kernel.wgsl.j2 and
    split_macros.wgsl.j2; kvviz.gpu.templates renders them), render() picks their values.

Formats (CacheFormat): "f32" (the baseline paged cache), "f16", "int8" (the seed int8 layout, which
int8_token shares: 4 codes a word + an f32 scale word), "fp8_e4m3"/"fp8_e5m2" (per-token scale word or
per-tensor scales), "int4" (8 codes a word, an f32 (scale, zero) pair per group). A shape the generator
cannot lay out (say head size 100 for int4) is refused by `unsupported()`; callers then keep the
first-wave path. Adapters without subgroups get the L = 1 variant (a lane per token row, no shuffles).

Measured variants, off by default (plan/decode keywords qk="i8", pv="f16", pv_flush; see "variants" below):
an int8 query dotted with dot4I8Packed, and f16 P.V accumulation; tests/test_fast_decode_variants.py,
timed by tools/fast_decode_tune.py --variants.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from kvviz.attention.int8_records import QMAX, SCALE_FLOOR
from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape, require_f32
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime
from kvviz.gpu.templates import render_defines
from kvviz.gpu.timed import TimedKernel
from kvviz.gpu.trusted import RUNTIME_CHECKS_OFF, available
from kvviz.paging import PagedBatch

log = logging.getLogger("kvviz.attention.split_decode")

LOG2E = 1.4426950408889634

SPLIT = KernelSpec(
    "attention/split_decode.wgsl",
    bindings=ro("q", "kc", "vc", "block_tables", "context_lens", "tensor") + rw("partials"),
    immediates=Struct("P", "num_kv_heads num_heads block_size max_blocks partition_tokens num_partitions scale_log2:f32"),
)
REDUCE = KernelSpec("attention/split_reduce.wgsl", bindings=ro("partials") + rw("out"),
                    immediates=Struct("P", "num_heads head_size num_partitions"))
# the same combine for many partitions (reduce_spec picks one of the two)
REDUCE_WIDE = KernelSpec("attention/split_reduce_wide.wgsl", bindings=ro("partials") + rw("out"),
                         immediates=Struct("P", "num_heads head_size num_partitions"))
SUBGROUP_PROBE = KernelSpec("probe/subgroup_size.wgsl", bindings=rw("out"))
KERNELS = (SPLIT, REDUCE, REDUCE_WIDE, SUBGROUP_PROBE)

# A tensor-scale buffer for formats without per-tensor scales: words 2 and 3 (K, V scale) are 1.0
# (the FP8 per-tensor writer's layout: [amax K, amax V, scale K, scale V]).
_ONES = np.array([0.0, 0.0, 1.0, 1.0], np.float32).view(np.uint32)

# ---------------------------------------------------------------------------------- variants
# Two measured variants of the split kernel, both off by default (the exact f32 kernel is what every
# other module uses). Each has its own oracle and tolerance (tests/test_fast_decode_variants.py):
#
# qk="i8": each query head is quantised to int8 on the host (symmetric, scale max(amax/127, 1e-8), codes
#   rint(q / scale) clamped to [-128, 127], round half to even: kvviz/families/int8/oracle.quantize) and uploaded
#   as int8 records [S, H, D/4 + 1] u32 (the int8 cache's record shape); the logit is
#   f32(sum of dot4I8Packed(q word, K word)) * (q_scale * scale*log2 e) * k_scale. The integer dot is
#   exact, so against its own oracle (the f32 decode of the dequantised int8 query) it is as exact as the
#   f32 kernel: same tolerance. Only formats whose K codes are int8 words (int8 / int8_token).
# pv="f16": P.V accumulated in vec4<f16> (two f16x2 FMAs in hardware), V scales folded into the f16 V
#   values once per token (shared by the G heads), weights p * 2^-shift; the f16 accumulator is rescaled
#   with the online max in f16 and flushed into the f32 accumulator every `pv_flush` steps (U tokens of
#   a row group each) and after the loop. Per flush, not per page: a row group's tokens are not a page's
#   (RG row groups interleave in every page), and the flush period is the knob that trades the f16 error
#   bound (pv_tolerance: linear in it) against the flush's f32 work (G * D/L FMAs a lane). Needs the
#   adapter feature shader-f16; without it plan() refuses (UnsupportedShape) instead of silently running
#   another kernel than the one asked for. V must lie in the f16 range (|V| <= 65504): beyond it the
#   output is inf / NaN, which callers refuse as non-finite.
QK_VARIANTS = ("f32", "i8")
PV_VARIANTS = ("f32", "f16")
# Defaults chosen by measurement on the H200 at the anchor shape (figures in docs/benchmarks.md): the prefetch
# is faster for int8, f16 and int4; the 2^23 conversion on top helps int8 but slows int4 (so int8 only, MAGIC_CVT);
# lazy rescale without the scatter softmax is mixed (slower for f16 with the prefetch), so off. Rendering the block
# size as a constant is faster than reading it from a uniform.
PREFETCH = True  # software-pipelined loads (render's prefetch; tools/fast_decode_tune.py --prefetch)
# ... when a lane's words of one step fit this many registers: the prefetch holds two steps' words. The f32
# cache at 16 lanes and 2 tokens a row loads 32 words a step, and prefetching them measured slower on the H200
# (fast_decode_f32 at the anchor: the extra registers leave fewer warps resident); a wide lane (the one-lane layout
# without subgroups: a whole head a lane) would double a shader that is already huge (lavapipe's LLVM took
# over 10 minutes to compile the f16 head-64 one-lane kernel with it).
PREFETCH_MAX_WORDS = 24
# Formats whose prefetch loads each token's block-table entry a step before the words it addresses (the loads'
# bt_ahead), so the next step's loads need not wait on a block-table load first (a warp issues in order). On the
# H200 at the anchor it is faster for f16 and int4 but slower for int8, so not int8; f32 and fp8_e4m3 do not move
# (tools/fast_decode_tune.py --bt-ahead=off|all; figures in docs/benchmarks.md).
BT_AHEAD_FORMATS = ("f16", "int4")
# Measured slower there, so not used: the prefetch two steps ahead; the query slices in workgroup memory, read back
# each step instead of held in registers. An SM holds 4 of the int8 decode's 128-thread workgroups (5 partitions,
# 600 workgroups, is much slower than 4), and the 480 of the anchor fit. Also slower: each step's P.V run one step
# late, beside the next step's logits (the same operations in the same order, so the same bits), for every format;
# its extra live registers a thread push the kernel past what lets an SM hold 4. Figures in docs/benchmarks.md.


def prefetch_fits(fmt: CacheFormat, head_size: int, lay: Layout) -> bool:
    """Whether the prefetching kernel is used for this layout (PREFETCH_MAX_WORDS)."""
    wpl = lay.dims_per_lane // fmt.elems_per_word
    extra = 2 if fmt.scale == "token" else 0
    if fmt.group_size:
        extra = 4 * max(1, lay.dims_per_lane // fmt.group_size)
    return lay.unroll * (2 * wpl + extra) <= PREFETCH_MAX_WORDS
# FP8 formats whose fp8x4 yields value / FP8_UNIT, the unit folded into the query and the V scale (exact: a power of
# two), not multiplied into every vec4 of codes: one multiply fewer per code vec4, measured faster on the H200.
FP8_UNIT = {"e4m3": 256.0}
MAGIC_CVT = ("int8",)  # formats whose codes -> f32 by the 2^23 trick (render's magic; tools/fast_decode_tune.py --magic)
# Lazy rescale (render's lazy; tools/fast_decode_tune.py --lazy), the default for these formats. With the scatter
# softmax an owner moves its max only past the old one + LAZY_TAU (log2 units, so p <= 2^8: no f32 range concern)
# and the G heads' accumulators are rescaled in one branch uniform over the subgroup (the scatter softmax's tau,
# split_macros' lazy_rescale). On the H200 at the anchor it is faster for int8 (and its int8-query variant) but slower
# for f16 and fp8_e4m3, and for int4 at 4 tokens a row, so int8 only. Without the scatter softmax: rescale in the steps
# where the max grows.
LAZY_FORMATS = ("int8",)
LAZY_TAU = 8.0
# The reduce-scatter softmax (split_macros' scatter_step; tools/fast_decode_tune.py --scatter): measured faster on the
# H200 at the anchor for every format and the int8-query variant (figures in docs/benchmarks.md).
SCATTER = True
PV_FLUSH = 4  # steps between flushes of the f16 accumulator (8 tokens a row group at U = 2)
F16_EPS = 2.0 ** -11  # f16 unit roundoff


def pv_shift(unroll: int, pv_flush: int) -> int:
    """Weights enter the f16 accumulator times 2^-shift, 2^shift >= the tokens between flushes, so the
    accumulator stays within max|V| (no f16 overflow before V itself overflows)."""
    return max(0, math.ceil(math.log2(unroll * pv_flush)))


def variant_name(qk: str = "f32", pv: str = "f32", pv_flush: int = PV_FLUSH, unroll: int = 2) -> str:
    """What a timing row calls the variant: "f32", "int8 q, dot4I8Packed", "f16 P.V (flush 4 steps)", ..."""
    parts = (["int8 q, dot4I8Packed"] if qk == "i8" else []) + ([f"f16 P.V, flush every {pv_flush} steps"] if pv == "f16" else [])
    return "; ".join(parts) or "f32"


def quantize_query(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q [S, H, D] f32 -> (codes int8 [S, H, D], scales f32 [S, H]): int8_token's quantiser
    (kvviz/families/int8/oracle.quantize, float32 ops, round half to even), one scale a query head."""
    q = np.asarray(q, dtype=np.float32)
    scales = np.maximum(np.abs(q).max(axis=-1) / QMAX, SCALE_FLOOR).astype(np.float32)
    codes = np.clip(np.rint((q / scales[..., None]).astype(np.float32)), -128, 127).astype(np.int8)
    return codes, scales


def query_records_i8(q: np.ndarray) -> np.ndarray:
    """The int8 query the qk="i8" kernel reads: [S, H, D/4 + 1] u32, codes 4 a word then the f32 scale."""
    codes, scales = quantize_query(q)
    S, H, D = codes.shape
    return np.concatenate([codes.reshape(S, H, D).view(np.uint32), scales.view(np.uint32)[..., None]], -1)


def pv_tolerance(max_abs_v: float, tokens: int, unroll: int = 2, pv_flush: int = PV_FLUSH,
                 softmax_sum: float | np.ndarray = 1.0):
    """Error bound of the f16 P.V accumulation over the f32 kernel's (add F32_TOL on top), first order
    in the f16 unit roundoff u = 2^-11, for max|V| = M, U tokens a step and a flush every F steps:
      - rounding: a term is rounded when its weight and its V value become f16 (1 + 2: the int8 scale
        multiply), by its own step's FMA chain (<= U) and, in each later step before the flush, by the
        rescale (f16(alpha) and the multiply) and that step's U FMAs: n = 3 + U + (F - 1)(U + 2)
        roundings, each relative u of a term; the terms sum to at most l * M, divided by l in the reduce:
        n * u * M;
      - underflow: an f16 op whose result is subnormal errs by up to 2^-25 absolute (x 2^shift unscaled);
        at most 5 such ops a token (weight, product, rescale, alpha, V value) over all the sequence's
        tokens, divided by the softmax sum l >= 1 (pass the oracle's l for a tighter bound):
        5 * tokens * 2^(shift - 25) * max(1, M) / l."""
    n = 3 + unroll + (pv_flush - 1) * (unroll + 2)
    under = 5 * tokens * 2.0 ** (pv_shift(unroll, pv_flush) - 25) * max(1.0, max_abs_v) / np.asarray(softmax_sum)
    return n * F16_EPS * max_abs_v + under


def f32_tolerance(max_abs_v: float) -> float:
    """The f32 kernel's (and the int8-q variant's, against its own oracle) bound: 2e-5 x max(1, max|V|)."""
    return 2e-5 * max(1.0, max_abs_v)


@dataclass(frozen=True)
class CacheFormat:
    """How one token's record of one KV head sits in u32 words."""

    name: str
    elems_per_word: int  # 1 f32, 2 f16, 4 int8 / fp8, 8 int4
    scale: str = "none"  # "none", "token" (an f32 word after the codes), "tensor" (tensor words 2 / 3)
    group_size: int = 0  # int4: an f32 (scale, zero) pair per group, after the codes
    fp8: str = ""  # "e4m3" / "e5m2"

    def code_words(self, head_size: int) -> int:
        return head_size // self.elems_per_word

    def wpt(self, head_size: int) -> int:
        n = self.code_words(head_size) + (1 if self.scale == "token" else 0)
        return n + (2 * (head_size // self.group_size) if self.group_size else 0)


F32 = CacheFormat("f32", 1)
F16 = CacheFormat("f16", 2)
INT8 = CacheFormat("int8", 4, "token")


def fp8_format(kind: str, per_tensor: bool) -> CacheFormat:
    return CacheFormat(f"fp8_{kind}", 4, "tensor" if per_tensor else "token", fp8=kind)


def int4_format(group_size: int) -> CacheFormat:
    return CacheFormat("int4", 8, group_size=group_size)


@dataclass(frozen=True)
class Layout:
    """The generator's choices for one (format, head size, GQA group, adapter)."""

    lanes: int  # L: lanes sharing one token row
    row_groups: int  # RG: token rows in flight per workgroup step
    unroll: int  # U: tokens per row group per step
    dims_per_lane: int

    @property
    def workgroup(self) -> int:
        return self.lanes * self.row_groups

    @property
    def tokens_per_step(self) -> int:
        return self.row_groups * self.unroll


def unsupported(fmt: CacheFormat, head_size: int, group: int) -> str:
    """Why the fast decode cannot take this shape ("" when it can)."""
    if head_size <= 0 or head_size % 4 or head_size % fmt.elems_per_word:
        return f"head size {head_size} is not a multiple of 4 and of the {fmt.elems_per_word} codes a word of {fmt.name}"
    if head_size > 256:
        return f"head size {head_size} is over 256 (the unrolled per-lane state would spill registers)"
    if group < 1 or group > 16:
        return f"a GQA group of {group} query heads per KV head is outside 1..16"
    if fmt.group_size:
        gs = fmt.group_size
        if gs % 4 or head_size % gs:
            return f"group size {gs} is not a multiple of 4 dividing head size {head_size}"
    if _lanes(fmt, head_size, 32) == 0:
        return f"no lane split of head size {head_size} fits the {fmt.name} record"
    return ""


def _lanes(fmt: CacheFormat, head_size: int, most: int) -> int:
    for L in (32, 16, 8, 4, 2, 1):
        if L > most:
            continue
        dpl = head_size // L
        if head_size % L or dpl % 4 or dpl % fmt.elems_per_word:
            continue
        if fmt.group_size and not (fmt.group_size % dpl == 0 or dpl % fmt.group_size == 0):
            continue
        return L
    return 0


def choose_layout(fmt: CacheFormat, head_size: int, group: int, subgroups: int, shared_limit: int,
                  unroll: int = 2, rows: int = 0) -> Layout:
    """Lanes a row (the most that divide the record, at most `subgroups` lanes: the subgroup size or
    less, 1 without subgroups), row groups (`rows`, or the most up to 128 threads whose merge fits the
    workgroup memory: RG/2 states of G heads x (D + 2) floats), tokens a row group per step (`unroll`).
    More lanes a row: fewer dims a lane, so fewer registers for the G query slices and accumulators."""
    L = _lanes(fmt, head_size, max(1, int(subgroups)))
    if L == 0:
        raise UnsupportedShape(f"fast decode: {unsupported(fmt, head_size, group) or 'no lane split without subgroups'}")
    rg = rows or 128 // L
    if rows and (rows & (rows - 1) or rows * L > 1024):
        raise InvalidInput(f"rows must be a power of two with rows x lanes <= 1024 threads, got {rows} x {L}")
    rg = max(rg, 1)
    while rg > 1 and (rg // 2) * group * (head_size + 2) * 4 > shared_limit:
        if rows:
            raise DeviceLimitError(f"fast decode: {rows} row groups need {(rows // 2) * group * (head_size + 2) * 4} "
                                   f"bytes of workgroup memory, the adapter allows {shared_limit}")
        rg //= 2
    return Layout(L, rg, unroll, head_size // L)


def block_lanes(head_size: int, most: int, block: int) -> int:
    """Lanes a row of records in blocks of `block` elements: the most (<= `most`) whose dims a lane (a multiple
    of 4) nest with the blocks (one divides the other); 0 when none."""
    for L in (32, 16, 8, 4, 2, 1):
        if L > most or head_size % L:
            continue
        dpl = head_size // L
        if dpl % 4 == 0 and (block % dpl == 0 or dpl % block == 0):
            return L
    return 0


def check_query(q, batch: PagedBatch, num_kv_heads: int, scale: float):
    """What every fast decode's plan checks of its query, batch and scale: (q as f32 [S, H, D], G)."""
    q = require_f32("q", q, "[num_seqs, num_heads, head_size]", 3)
    S, H, D = q.shape
    if S != batch.num_seqs:
        raise InvalidInput(f"q has {S} sequences, the batch {batch.num_seqs}")
    if num_kv_heads <= 0 or H % num_kv_heads:
        raise InvalidInput(f"{H} query heads do not divide into {num_kv_heads} KV heads")
    if not np.isfinite(scale) or scale <= 0:
        raise InvalidInput(f"the attention scale must be a positive finite number, got {scale}")
    return q, H // num_kv_heads


def split_context(partition_tokens: int | None, planned: int, step: int, max_len: int) -> tuple[int, int]:
    """(tokens a partition, a multiple of `step`; partitions of the longest sequence): `partition_tokens` as
    asked, else `planned` (plan_partitions)."""
    pt = partition_tokens or planned
    if pt <= 0:
        raise InvalidInput(f"partition_tokens must be positive, got {pt}")
    pt = int(math.ceil(pt / step) * step)
    return pt, max(1, math.ceil(max(max_len, 1) / pt))


REDUCE_CHUNK = 8  # partitions a step of decode_reduce.wgsl (and of TurboQuant's reduce: CHUNK there)
WIDE_REDUCE_GROUPS, WIDE_REDUCE_CHUNK = 4, 8  # decode_reduce_wide.wgsl's GROUPS and CHUNK
# the most partitions decode_reduce.wgsl takes; decode_reduce_wide.wgsl takes more. On the H200 the wide one is
# slower at 4 partitions and faster at 15 and more (figures in docs/benchmarks.md).
WIDE_REDUCE_FROM = 9


def reduce_spec(P: int) -> KernelSpec:
    """The reduce of the fast decodes' partials for P partitions: REDUCE, or REDUCE_WIDE for many."""
    return REDUCE_WIDE if P >= WIDE_REDUCE_FROM else REDUCE


def chunked_reduce_loops(P: int) -> int:
    """Loop iterations of one invocation of decode_reduce.wgsl (or TurboQuant's reduce) over P partitions: two loops
    of ceil(P / CHUNK) steps, each charged + 2 (kvviz/gpu/loop_budget.py)."""
    return 2 * (math.ceil(P / REDUCE_CHUNK) + 2)


def reduce_loops(P: int, spec: KernelSpec | None = None) -> int:
    """Loop iterations of one invocation of `spec` (default reduce_spec(P)) over P partitions (the wide one: one
    loop of ceil(P / (GROUPS * CHUNK)) steps, charged + 2)."""
    if (spec or reduce_spec(P)) == REDUCE:
        return chunked_reduce_loops(P)
    return math.ceil(P / (WIDE_REDUCE_GROUPS * WIDE_REDUCE_CHUNK)) + 2


def check_grid(rt: GpuRuntime, name: str, counts) -> None:
    """DeviceLimitError when one of the (what, n) grid dimensions exceeds the adapter's limit."""
    for what, n in counts:
        if n > rt.max_grid:
            raise DeviceLimitError(f"{name}: {n} {what} exceed the adapter's {rt.max_grid} workgroups per grid "
                                   "dimension", "Use longer partitions or fewer sequences per batch.")


# ---------------------------------------------------------------------------------- code generation
# The kernel's generated code is shaders/attention/split_decode.wgsl.j2 (the split kernels' shape:
# attention/split_kernel.wgsl.j2; the formats' code expressions: attention/cache_formats.wgsl.j2); render() picks its
# values. magic converts integer codes without the int-to-float instruction (a quarter-rate op on NVIDIA), exactly:
# int8 by f16 pairs when I8X4_VIA_F16 (2 conversions and 6 integer ops a word), else by the 2^23 mantissa trick.
I8X4_VIA_F16 = True  # render's magic int8 conversion takes the f16 route (tools/fast_decode_tune.py --i8-f16=off|on)


def render(fmt: CacheFormat, head_size: int, group: int, lay: Layout, qk: str = "f32", pv: str = "f32",
           pv_flush: int = PV_FLUSH, block_size: int = 0, prefetch: bool = False, lazy: bool = False,
           magic: bool = False, scatter: bool = False) -> dict:
    """The {{...}} values of attention/split_decode.wgsl for one format and shape (and variant: QK_VARIANTS,
    PV_VARIANTS; the defaults render the exact f32 kernel): its plain values, and its code blocks (HELPERS,
    PROLOGUE, STEP, MERGE, WRITE, SG_PARAM, SG_GUARD) rendered from shaders/attention/split_decode.wgsl.j2 with
    the values picked here.

    block_size > 0 renders the block size as a constant (token -> block and offset become a shift and a
    mask for powers of two instead of an integer division a token); 0 reads it from the immediates.
    prefetch: software pipelining. Each step issues the NEXT step's block-table reads and K/V loads before
    it computes on the words loaded one step earlier, so the two dependent memory latencies of a step
    (block table -> cache words) overlap the arithmetic instead of stalling it; the last step re-loads
    its partition's last token (in bounds, unused). The arithmetic is the same, so are the outputs (bit for
    bit: tests/test_fast_decode.py).
    lazy: the accumulators and l are rescaled only in the steps where the running max grows (a branch,
    uniform over a row group's lanes) instead of by alpha = exp2(m - m_new) every step; same values up to
    the compiler's fusing of multiply-adds (within the f32 tolerance, not bit for bit). f32 P.V only. With the
    scatter softmax: only where it grows past the old max + LAZY_TAU, one branch for the subgroup.
    magic: int8 / int4 codes become f32 by the 2^23 mantissa trick (int8 by f16 pairs when I8X4_VIA_F16)
    instead of the int-to-float conversion; exact, bit-identical outputs.
    scatter: the reduce-scatter softmax: each (head, token) logit's softmax step runs on the
    lanes that own it instead of on all L lanes; f32 P.V, L >= 2. Same arithmetic per logit, the
    lane sums in another order: within the f32 tolerance, not bit for bit."""
    D, G, L, RG, U = head_size, group, lay.lanes, lay.row_groups, lay.unroll
    i8, h16 = qk == "i8", pv == "f16"
    if scatter and (L < 2 or h16):
        raise InvalidInput("the scatter softmax needs L >= 2 lanes a row and f32 P.V")
    dpl = lay.dims_per_lane
    gs = fmt.group_size
    values = dict(
        fmt=fmt, D=D, G=G, L=L, RG=RG, U=U, dpl=dpl, nv=dpl // 4, wpl=dpl // fmt.elems_per_word, stride=D + 2,
        cw=fmt.code_words(D), gs=gs, groups_per_lane=max(1, dpl // gs) if gs else 0,
        qrec=D // 4 + 1,  # an int8 query record: D/4 code words + its f32 scale word
        i8=i8, h16=h16, pv_flush=pv_flush, shift=pv_shift(U, pv_flush), lazy=lazy, lazy_tau=LAZY_TAU, magic=magic,
        via_f16=I8X4_VIA_F16, scatter=scatter, prefetch=prefetch, bt_ahead=fmt.name in BT_AHEAD_FORMATS,
        bsx=f"{block_size}u" if block_size > 0 else "p.block_size",
        unit=FP8_UNIT.get(fmt.fp8 or "", 1.0),  # e4m3 codes enter as value / 2^8: the query and the V scale take 2^8
    )
    return {
        "FORMAT": f"{fmt.name}" + (f", {fmt.scale} scale" if fmt.scale != "none" else "") + (f", group {gs}" if gs else ""),
        "D": str(D), "G": str(G), "L": str(L), "RG": str(RG), "U": str(U), "WG": str(lay.workgroup),
        "WPT": str(fmt.wpt(D)), "DPL": str(dpl), "WPL": str(values["wpl"]), "STRIDE": str(D + 2),
        "SHARED": str(max(1, RG // 2) * G * (D + 2)),
        "VARIANT": variant_name(qk, pv, pv_flush, U) + ("; scatter softmax" if scatter else ""),
        "ENABLES": "enable f16;" if h16 else "",
        "Q_TYPE": "u32" if i8 else "f32",
        **render_defines("attention/split_decode.wgsl.j2", **values),
    }


# ---------------------------------------------------------------------------------- launcher
@dataclass
class FastDecodePlan:
    """What one fast decode runs: its dispatches, where the output lands and how it was split."""

    dispatches: list
    out: object  # [S, H, D] f32 buffer
    shape: tuple[int, int, int]
    partition_tokens: int
    num_partitions: int
    layout: Layout
    variant: str = "f32"  # variant_name(qk, pv, ...): "f32" is the exact default kernel

    def describe(self) -> str:
        L = self.layout
        v = "" if self.variant == "f32" else f", {self.variant}"
        return (f"{self.num_partitions} partition(s) of {self.partition_tokens} tokens, {L.workgroup} threads "
                f"({L.row_groups} rows x {L.lanes} lanes, {L.unroll} tokens a row per step){v}{wide_note(self.dispatches)}")


def wide_note(dispatches) -> str:
    """", wide reduce" when a plan's reduce is REDUCE_WIDE (a bench row then says which of the two ran)."""
    return ", wide reduce" if any(d.kernel.kspec == REDUCE_WIDE for d in dispatches) else ""


def plan_partitions(num_seqs: int, num_kv_heads: int, max_len: int, tokens_per_step: int,
                    target_workgroups: int = 480, min_tokens: int = 256, max_tokens: int = 4096) -> int:
    """Tokens per partition: enough partitions that the grid has about `target_workgroups` workgroups,
    each partition at least `min_tokens` long (a shorter one spends more on its merge and its partial
    than on its tokens) and at most `max_tokens` (a software rasteriser's loop budget and the reduce's
    loops stay short). A multiple of the workgroup's step.

    480 is what measured best on the H200 at the anchor shape (15 x 4096, 8 KV heads: 4 partitions of
    1024 tokens; tools/fast_decode_tune.py, docs/fast-kernels.md): more, shorter partitions lost more
    to their merges than they won in parallelism."""
    pairs = max(1, num_seqs * num_kv_heads)
    parts = max(1, math.ceil(target_workgroups / pairs))
    pt = math.ceil(max(1, max_len) / parts)
    pt = min(max(pt, min_tokens), max_tokens)
    return int(math.ceil(pt / tokens_per_step) * tokens_per_step)


class FastDecode:
    """Compiles and dispatches the fast decode on one runtime."""

    def __init__(self, rt: GpuRuntime):
        self.rt = rt
        self._ones = None

    @property
    def subgroup_size(self) -> int:
        """The adapter's subgroup size, measured once (shaders/probe/subgroup_size.wgsl): the smallest any
        invocation reported; 1 without the subgroup feature."""
        if getattr(self.rt, "_kvviz_subgroup_size", None) is None:
            size = 1
            if "subgroup" in self.rt.features:
                buf = self.rt.empty(64 * 4, "subgroup-probe")
                self.rt.run([self.rt.compile(SUBGROUP_PROBE).dispatch((1, 1, 1), [buf])])
                size = max(1, int(self.rt.read(buf, np.uint32, (64,)).min()))
                buf.destroy()
                log.info("subgroup size: %d", size)
            self.rt._kvviz_subgroup_size = size
        return self.rt._kvviz_subgroup_size

    @property
    def subgroups(self) -> bool:
        return self.subgroup_size > 1

    def layout(self, fmt: CacheFormat, head_size: int, group: int, subgroups: bool | None = None,
               unroll: int = 2, rows: int = 0, lanes: int = 16) -> Layout:
        """lanes: the most lanes a token row may take (the subgroup size caps it)."""
        sub = min(self.subgroup_size, lanes) if subgroups is None or subgroups else 1
        limit = int(self.rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)
        return choose_layout(fmt, head_size, group, sub, limit, unroll, rows)

    def kernel(self, fmt: CacheFormat, head_size: int, group: int, subgroups: bool | None = None, unroll: int = 2,
               rows: int = 0, lanes: int = 16, checks: bool = True, qk: str = "f32", pv: str = "f32",
               pv_flush: int = PV_FLUSH, block_size: int = 0, prefetch: bool | None = None, lazy: bool = False,
               magic: bool = False, scatter: bool | None = None):
        """checks=False: the shader module without naga's runtime checks (kvviz/gpu/trusted.py), a
        measured variant; the host has validated every index the kernel reads. qk / pv: the variants
        (QK_VARIANTS, PV_VARIANTS above)."""
        self.check_variant(fmt, qk, pv, pv_flush)
        lay = self.layout(fmt, head_size, group, subgroups, unroll, rows, lanes)
        if prefetch is None:  # the default: where it measured faster (PREFETCH, prefetch_fits); True / False force it
            prefetch = PREFETCH and prefetch_fits(fmt, head_size, lay)
        if scatter is None:  # the default (SCATTER) where the layout allows it; True forces it (or refuses)
            scatter = SCATTER and lay.lanes > 1 and pv == "f32"
        defines = render(fmt, head_size, group, lay, qk, pv, pv_flush, block_size, prefetch, lazy, magic, scatter)
        if not checks:
            if not available():
                raise UnsupportedShape("this wgpu build has no wgpuDeviceCreateShaderModuleTrusted",
                                       "Keep the runtime checks (the default).")
            defines[RUNTIME_CHECKS_OFF[0]] = RUNTIME_CHECKS_OFF[1]
        return self.rt.compile(SPLIT, **defines), lay

    def check_variant(self, fmt: CacheFormat, qk: str, pv: str, pv_flush: int) -> None:
        if qk not in QK_VARIANTS or pv not in PV_VARIANTS:
            raise InvalidInput(f"fast decode variant qk={qk!r}, pv={pv!r}: qk is one of {QK_VARIANTS}, pv one of {PV_VARIANTS}")
        if qk == "i8" and fmt.name != "int8":
            raise UnsupportedShape(f"fast decode qk='i8' (dot4I8Packed) needs K codes that are int8 words; {fmt.name} has none",
                                   "Use qk='f32' (the default) for this format.")
        if pv == "f16":
            if "shader-f16" not in self.rt.features:
                raise UnsupportedShape("fast decode pv='f16' needs the adapter feature shader-f16, which this adapter lacks",
                                       "Use pv='f32' (the default).")
            if int(pv_flush) != pv_flush or not 1 <= pv_flush <= 64:
                raise InvalidInput(f"pv_flush must be 1..64 steps between flushes of the f16 accumulator, got {pv_flush}")

    def _tensor(self, tensor):
        if tensor is not None:
            return tensor
        if self._ones is None:
            self._ones = self.rt.upload(_ONES, "fast_decode_unit_scales")
        return self._ones

    def plan(self, fmt: CacheFormat, k, v, num_kv_heads: int, q, batch: PagedBatch, scale: float, *,
             tensor=None, partition_tokens: int | None = None, subgroups: bool | None = None,
             unroll: int = 2, rows: int = 0, lanes: int = 16, checks: bool = True, qk: str = "f32",
             pv: str = "f32", pv_flush: int = PV_FLUSH, prefetch: bool | None = None,
             const_block: bool = True, lazy: bool | None = None, magic: bool | None = None,
             scatter: bool | None = None, reduce: KernelSpec | None = None) -> FastDecodePlan:
        """Dispatches of one decode over caches `k`, `v` (GPU buffers of [num_blocks, kv_heads,
        block_size, wpt] u32 words, or f32 for the f32 format). qk="i8" / pv="f16": the variants
        (see QK_VARIANTS above), each with its own oracle and tolerance; the defaults are exact f32.
        reduce: REDUCE or REDUCE_WIDE for any partition count (default reduce_spec: the Kernel lab's reduce
        slots and A/Bs pick one)."""
        q, G = check_query(q, batch, num_kv_heads, scale)
        S, H, D = q.shape
        why = unsupported(fmt, D, G)
        if why:
            raise UnsupportedShape(f"fast decode ({fmt.name}): {why}", "The first-wave decode takes this shape.")
        if unroll not in (1, 2, 4):
            raise InvalidInput(f"unroll must be 1, 2 or 4 tokens a row group per step, got {unroll}")
        kern, lay = self.kernel(fmt, D, G, subgroups, unroll, rows, lanes, checks, qk, pv, pv_flush,
                                batch.block_size if const_block else 0, prefetch,
                                fmt.name in LAZY_FORMATS if lazy is None else lazy, fmt.name in MAGIC_CVT if magic is None else magic,
                                scatter)
        mcl = int(batch.max_context_len)
        pt, P = split_context(partition_tokens, plan_partitions(S, num_kv_heads, mcl, lay.tokens_per_step),
                              lay.tokens_per_step, mcl)
        check_grid(self.rt, "fast decode", (("partitions", P), ("KV heads", num_kv_heads), ("sequences", S)))
        reduce = reduce or reduce_spec(P)
        self._check_loops(pt, lay, P, reduce_loops(P, reduce))
        wpt = fmt.wpt(D)
        need = batch.num_blocks * num_kv_heads * batch.block_size * wpt * 4
        for name, buf in (("K", k), ("V", v)):
            if buf.size < need:
                raise InvalidInput(f"fast decode: the {name} cache holds {buf.size} bytes, the batch's "
                                   f"{batch.num_blocks} blocks of {fmt.name} need {need}")
        bt = np.ascontiguousarray(batch.block_tables, dtype=np.uint32)
        partials = self.rt.empty(S * H * P * (D + 2) * 4, "fast_decode_partials")
        out = self.rt.empty(S * H * D * 4, "fast_decode_out")
        qbuf = self.rt.upload(query_records_i8(q) if qk == "i8" else q, "q")
        bufs = [qbuf, k, v, self.rt.upload(bt, "block_tables"),
                self.rt.upload(batch.context_lens.astype(np.uint32), "context_lens"), self._tensor(tensor), partials]
        imm = kern.pack(num_kv_heads, H, batch.block_size, bt.shape[1], pt, P, float(scale) * LOG2E)
        d = [Dispatch(kern, bufs, (P, num_kv_heads, S), imm),
             self.rt.compile(reduce).dispatch((H, S, 1), [partials, out], H, D, P)]
        return FastDecodePlan(d, out, (S, H, D), pt, P, lay, variant_name(qk, pv, pv_flush, unroll))

    def _check_loops(self, pt: int, lay: Layout, P: int, reduce_need: int | None = None) -> None:
        """The split kernel loops pt / (RG*U) times, the reduce reduce_loops(P) (or reduce_need: another reduce,
        TurboQuant's with its butterflies): both must fit a software rasteriser's per-invocation loop budget
        (kvviz/gpu/loop_budget.py)."""
        limit = self.rt.loop_limit
        if limit is None:
            return
        need = max(math.ceil(pt / lay.tokens_per_step) + 2, reduce_loops(P) if reduce_need is None else reduce_need)
        if need > limit:
            raise DeviceLimitError(f"fast decode: {need} loop iterations per invocation exceed this adapter's "
                                   f"loop limit of {limit}", "Use more partitions (shorter partition_tokens).")

    def read(self, plan: FastDecodePlan) -> np.ndarray:
        return self.rt.read(plan.out, np.float32, plan.shape)

    def decode(self, fmt: CacheFormat, k, v, num_kv_heads: int, q, batch: PagedBatch, scale: float, **kw) -> np.ndarray:
        """Run the fast decode: [num_seqs, num_heads, head_size] f32."""
        plan = self.plan(fmt, k, v, num_kv_heads, q, batch, scale, **kw)
        self.rt.run(plan.dispatches)
        return self.read(plan)


def decode_traffic(fmt: CacheFormat, batch: PagedBatch, num_heads: int, num_kv_heads: int, head_size: int,
                   num_partitions: int) -> tuple[int, float]:
    """(unique bytes, flops) of one fast decode: every context token's K and V record of each KV head
    read once, the block-table entries, q read, the partials written and read back, the output written;
    flops = 2 (multiply-add) x head_size x (QK + PV) for every (token, query head)."""
    tokens = int(np.sum(batch.context_lens))
    S = batch.num_seqs
    rec = fmt.wpt(head_size) * 4
    kv = 2 * tokens * num_kv_heads * rec
    tables = sum(-(-int(n) // batch.block_size) for n in batch.context_lens) * 4 * num_kv_heads
    qo = 2 * S * num_heads * head_size * 4
    partials = 2 * S * num_heads * num_partitions * (head_size + 2) * 4
    return int(kv + tables + qo + partials), float(4 * head_size * num_heads * tokens)


def fast_decode_rows(ctx, method, k, v, num_kv_heads: int, batch: PagedBatch, q, scale: float, tensor=None) -> list:
    """The fast decode of `method` over its caches as a timed row ([] when the method has no fast
    format or the shape does not fit it)."""
    q = np.asarray(q)
    S, H, D = q.shape
    fmt = method.fast_cache_format(D)
    if fmt is None or H % num_kv_heads or unsupported(fmt, D, H // num_kv_heads):
        return []
    plan = ctx.fast.plan(fmt, k, v, num_kv_heads, q, batch, scale, tensor=tensor)
    nbytes, flops = decode_traffic(fmt, batch, H, num_kv_heads, D, plan.num_partitions)
    return [TimedKernel(f"fast_decode_{fmt.name} ({plan.num_partitions} partitions)", plan.dispatches, nbytes,
                        "decode", "fast", flops)]


# ---------------------------------------------------------------------------------- siblings' launcher
@dataclass
class SiblingPlan:
    """What a sibling fast decode over byte-packed records (llama.cpp block types, NVFP4) runs: its split and
    the shared reduce, where the output lands, how it split; `label` names the record type."""

    dispatches: list
    out: object  # [S, H, D] f32 buffer
    shape: tuple[int, int, int]
    partition_tokens: int
    num_partitions: int
    layout: Layout
    label: str

    def describe(self) -> str:
        L = self.layout
        return (f"{self.label}: {self.num_partitions} partition(s) of {self.partition_tokens} tokens, {L.workgroup} "
                f"threads ({L.row_groups} rows x {L.lanes} lanes of {L.dims_per_lane} dims, {L.unroll} tokens a row per step)"
                f"{wide_note(self.dispatches)}")


class SiblingDecode:
    """The launcher the sibling split kernels share (fast_decode_ggml, fast_decode_fp4): the lane layout under
    the subgroup probe, the partition split, the grid / loop-budget / buffer-size checks, the split dispatch
    (bindings q, k, v, block_tables, context_lens, [extra...], partials; the immediates of SPLIT) and the reduce."""

    name = "fast decode"  # in messages: "fast ggml decode", ...

    def __init__(self, rt):
        self.rt = rt
        self._fast = FastDecode(rt)  # the subgroup probe and the loop-budget check

    def _layout(self, fmt: CacheFormat, lanes_of, head_size: int, group: int, subgroups: bool | None, unroll: int,
                rows: int, lanes: int, why: str) -> Layout:
        """lanes_of(head_size, most): the record's lane split (0: none; `why` says so); lanes: the most lanes a
        token row may take (the subgroup size caps it; 1 without subgroups)."""
        sub = min(self._fast.subgroup_size, lanes) if subgroups is None or subgroups else 1
        L = lanes_of(head_size, max(1, int(sub)))
        if L == 0:
            raise UnsupportedShape(f"{self.name}: {why}")
        limit = int(self.rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)
        return choose_layout(fmt, head_size, group, L, limit, unroll, rows)

    def _launch(self, kern, lay: Layout, k, v, extra: list, num_kv_heads: int, q, batch: PagedBatch, scale: float,
                partition_tokens: int | None, wpt: int, label: str) -> SiblingPlan:
        """Split + reduce dispatches over caches k, v of `wpt` words a record, q checked by check_query."""
        S, H, D = q.shape
        mcl = int(batch.max_context_len)
        pt, P = split_context(partition_tokens, plan_partitions(S, num_kv_heads, mcl, lay.tokens_per_step),
                              lay.tokens_per_step, mcl)
        check_grid(self.rt, self.name, (("partitions", P), ("KV heads", num_kv_heads), ("sequences", S)))
        self._fast._check_loops(pt, lay, P)
        need = batch.num_blocks * num_kv_heads * batch.block_size * wpt * 4
        for which, buf in (("K", k), ("V", v)):
            if buf.size < need:
                raise InvalidInput(f"{self.name}: the {which} cache holds {buf.size} bytes, the batch's "
                                   f"{batch.num_blocks} blocks of {label} need {need}")
        bt = np.ascontiguousarray(batch.block_tables, dtype=np.uint32)
        tag = self.name.replace(" ", "_")
        partials = self.rt.empty(S * H * P * (D + 2) * 4, f"{tag}_partials")
        out = self.rt.empty(S * H * D * 4, f"{tag}_out")
        bufs = [self.rt.upload(q, "q"), k, v, self.rt.upload(bt, "block_tables"),
                self.rt.upload(batch.context_lens.astype(np.uint32), "context_lens"), *extra, partials]
        imm = kern.pack(num_kv_heads, H, batch.block_size, bt.shape[1], pt, P, float(scale) * LOG2E)
        d = [Dispatch(kern, bufs, (P, num_kv_heads, S), imm),
             self.rt.compile(reduce_spec(P)).dispatch((H, S, 1), [partials, out], H, D, P)]
        return SiblingPlan(d, out, (S, H, D), pt, P, lay, label)

    def read(self, plan: SiblingPlan) -> np.ndarray:
        return self.rt.read(plan.out, np.float32, plan.shape)


def record_traffic(label: str, wpt: int, batch: PagedBatch, num_heads: int, num_kv_heads: int, head_size: int,
                   num_partitions: int, extra_bytes: int = 0) -> tuple[int, float]:
    """(unique bytes, flops) of a sibling decode: decode_traffic with records of `wpt` words (decode_traffic
    counts D/4 a record for a 4-codes-a-word format) plus `extra_bytes` (a tensor-scale buffer)."""
    nbytes, flops = decode_traffic(CacheFormat(label, 4), batch, num_heads, num_kv_heads, head_size, num_partitions)
    tokens = int(np.sum(batch.context_lens))
    nbytes += 2 * tokens * num_kv_heads * (wpt - head_size // 4) * 4 + extra_bytes
    return int(nbytes), flops
