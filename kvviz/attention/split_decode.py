"""The fast paged decode: split-K ("flash-decoding") attention that reads each method's packed cache in
place. Family "fast" (kvviz/families/catalogue.py): shaders attention/split_decode.wgsl + attention/split_reduce.wgsl,
numpy reference: the method's own (kvviz/attention/paged_oracle.py), tests tests/test_fast_decode.py.

What makes it fast (docs/fast-kernels.md s.6, measured s.8):
  - the context is split into partitions across workgroups (grid: partitions x KV heads x sequences),
    sized so the grid fills the device; a reduce kernel combines the partitions;
  - one workgroup serves the G query heads of a KV head: every K/V word is loaded once for G heads;
  - K is read once, with an online softmax (base 2, the query pre-scaled by scale*log2(e));
  - a token row is shared by L lanes that each own D/L dims (more where no power of two divides the head into the
    record's slices: the lanes then walk it with padding, lane_split); the row's G x U partial logits of a step are
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
per-tensor scales), "int4" (8 codes a word, an f32 (scale, zero) pair per group). A shape the format cannot
take (say head size 100 for int4: not whole code words) is refused by `unsupported()`; callers then keep the
first-wave path. Adapters without subgroups get the L = 1 variant (a lane per token row, no shuffles).

The unrolled code above is what hardware runs; software rasterisers run the looped code instead (render's looped,
LOOPED, use_looped: shaders/attention/split_looped.wgsl.j2), whose size does not grow with the head size or the
group (docs/kernels.md, "Head sizes: padded lanes and the looped decode").

Measured variants, off by default (plan/decode keywords qk="i8", pv="f16" / "h2", pv_flush, fold; see "variants"
and "the folded reduce" below): an int8 query dotted with dot4I8Packed (int8 and int4 caches here; the llama.cpp block
types q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl and mxfp4 in their sibling decode, kvviz/families/ggml/decode.py
QK_I8_TYPES), f16 P.V accumulation (vec4, or f16 pairs made from the integer codes' bits), the reduce folded into the
split kernel; tests/test_fast_decode_variants.py, tests/test_fast_decode_ggml_i8.py and tests/test_decode_fold.py,
timed by tools/fast_decode_tune.py and kvviz bench --variants.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import numpy as np

from kvviz.attention.int8_records import QMAX, SCALE_FLOOR
from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape, require_f32
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime
from kvviz.gpu.shaders import SHADER_DIR
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
# pv="h2" (int8 and int4 caches): P.V in vec2<f16> pairs, the packed half2 FMAs (attention/split_packed.wgsl.j2): V codes
#   become exact f16 integers by bit operations (no int-to-float instruction), the token's V values are made once in
#   f16 (int8: times the f16 scale; int4: c * s + z) and shared by the G heads, the weights p * 2^-shift; flushed into
#   f32 as pv="f16" is (pv_tolerance, with the int4 value's extra roundings: value_roundings). Works with the scatter
#   softmax. qk="i8" also takes the int4 cache there: each code word's even and odd nibbles as two words of bytes,
#   against the query codes laid out in that order (query_records_i8), and s * dot + z * sum(q codes) a group.
QK_VARIANTS = ("f32", "i8")
PV_VARIANTS = ("f32", "f16", "h2")
# caches whose K codes are integers dot4I8Packed takes (the llama.cpp block types': kvviz/families/ggml/decode.py QK_I8_TYPES)
QK_I8_FORMATS = ("int8", "int4")
PACKED_FORMATS = ("int8", "int4")  # caches attention/split_packed.wgsl.j2 renders (pv="h2"; qk="i8" for int4)
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
# Which adapters run the looped kernels (attention/split_looped.wgsl.j2; render's looped) instead of the unrolled ones:
# "software" (software rasterisers: lavapipe's LLVM builds an unrolled kernel in tens of seconds, its time growing
# with G x a lane's dims, and the looped one in about a second), "all", or "none". The unrolled kernels stay on
# hardware until the two are measured there (tools/fast_decode_tune.py --looped=on,off; kvviz bench --decode-code).
LOOPED = "software"
LOOPED_CHOICES = ("software", "all", "none")


def use_looped(rt, looped: bool | None = None, *unrolled_knobs, wide: bool = False) -> bool:
    """Whether a fast decode on `rt` takes the looped kernel: `looped` where given; else not when any of
    `unrolled_knobs` (the unrolled kernel's own options: prefetch, lazy, magic, scatter) is given (not None: a
    caller asking for one of them asks for the unrolled kernel); else where the layout is `wide` (wide_layout: the
    unrolled kernel would be larger than at any power-of-two head), else by LOOPED."""
    if looped is not None:
        return bool(looped)
    if any(k is not None for k in unrolled_knobs):
        return False
    if wide:
        return True
    if LOOPED not in LOOPED_CHOICES:
        raise InvalidInput(f"fast decode: LOOPED must be one of {LOOPED_CHOICES}, got {LOOPED!r}")
    summary = getattr(rt, "summary", None)
    return LOOPED == "all" or (LOOPED == "software" and bool(getattr(summary, "is_software", False)))


PV_FLUSH = 4  # steps between flushes of the f16 accumulator (8 tokens a row group at U = 2)
F16_EPS = 2.0 ** -11  # f16 unit roundoff


def pv_shift(unroll: int, pv_flush: int) -> int:
    """Weights enter the f16 accumulator times 2^-shift, 2^shift >= the tokens between flushes, so the
    accumulator stays within max|V| (no f16 overflow before V itself overflows)."""
    return max(0, math.ceil(math.log2(unroll * pv_flush)))


def variant_name(qk: str = "f32", pv: str = "f32", pv_flush: int = PV_FLUSH, unroll: int = 2) -> str:
    """What a timing row calls the variant: "f32", "int8 q, dot4I8Packed", "f16 P.V (flush 4 steps)", ..."""
    parts = (["int8 q, dot4I8Packed"] if qk == "i8" else []) + ([f"f16 P.V, flush every {pv_flush} steps"] if pv == "f16" else [])
    parts += [f"f16x2 P.V, flush every {pv_flush} steps"] if pv == "h2" else []
    return "; ".join(parts) or "f32"


def quantize_query(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q [S, H, D] f32 -> (codes int8 [S, H, D], scales f32 [S, H]): int8_token's quantiser
    (kvviz/families/int8/oracle.quantize, float32 ops, round half to even), one scale a query head."""
    q = np.asarray(q, dtype=np.float32)
    scales = np.maximum(np.abs(q).max(axis=-1) / QMAX, SCALE_FLOOR).astype(np.float32)
    codes = np.clip(np.rint((q / scales[..., None]).astype(np.float32)), -128, 127).astype(np.int8)
    return codes, scales


def query_records_i8(q: np.ndarray, fmt: CacheFormat | None = None) -> np.ndarray:
    """The int8 query the qk="i8" kernel reads: [S, H, D/4 + 1] u32, codes 4 a word then the f32 scale. For the int4
    cache the codes of each 8 dims go as dims 0, 2, 4, 6 then 1, 3, 5, 7: the order of a code word's even and odd
    nibbles (attention/split_packed.wgsl.j2)."""
    codes, scales = quantize_query(q)
    S, H, D = codes.shape
    if fmt is not None and fmt.elems_per_word == 8:
        codes = codes.reshape(S, H, D // 8, 4, 2).transpose(0, 1, 2, 4, 3).reshape(S, H, D)
    return np.concatenate([codes.reshape(S, H, D).view(np.uint32), scales.view(np.uint32)[..., None]], -1)


def pv_tolerance(max_abs_v: float, tokens: int, unroll: int = 2, pv_flush: int = PV_FLUSH,
                 softmax_sum: float | np.ndarray = 1.0, value_roundings: int = 2):
    """Error bound of the f16 P.V accumulation over the f32 kernel's (add F32_TOL on top), first order
    in the f16 unit roundoff u = 2^-11, for max|V| = M, U tokens a step and a flush every F steps:
      - rounding: a term is rounded when its weight and its V value become f16 (1 + value_roundings: 2 for
        the int8 scale and its multiply; pv="h2"'s int4 value c * s + z takes 4 in units of M, since |c s| <= 2M
        and |z| <= M: s's rounding on c s, z's, and the FMA's), by its own step's FMA chain (<= U) and, in each
        later step before the flush, by the rescale (f16(alpha) and the multiply) and that step's U FMAs:
        n = 1 + value_roundings + U + (F - 1)(U + 2) roundings, each relative u of a term; the terms sum to at
        most l * M, divided by l in the reduce: n * u * M;
      - underflow: an f16 op whose result is subnormal errs by up to 2^-25 absolute (x 2^shift unscaled);
        at most 5 such ops a token (weight, product, rescale, alpha, V value) over all the sequence's
        tokens, divided by the softmax sum l >= 1 (pass the oracle's l for a tighter bound):
        5 * tokens * 2^(shift - 25) * max(1, M) / l."""
    n = 1 + value_roundings + unroll + (pv_flush - 1) * (unroll + 2)
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
    chunks: int = 1  # the looped kernel: workgroups a GQA group is split over (G / chunks query heads each)

    @property
    def span(self) -> int:
        """Dims the lanes of a row walk: the head size, or more where the last lanes' dims are padding."""
        return self.lanes * self.dims_per_lane

    @property
    def workgroup(self) -> int:
        return self.lanes * self.row_groups

    @property
    def tokens_per_step(self) -> int:
        return self.row_groups * self.unroll


MAX_HEAD = 256  # the largest head size the fast decodes take


def unsupported(fmt: CacheFormat, head_size: int, group: int) -> str:
    """Why the fast decode cannot take this shape ("" when it can)."""
    if head_size <= 0 or head_size % 4 or head_size % fmt.elems_per_word:
        return f"head size {head_size} is not a multiple of 4 and of the {fmt.elems_per_word} codes a word of {fmt.name}"
    if head_size > 256:
        return f"head size {head_size} is over {MAX_HEAD} (the unrolled per-lane state would spill registers)"
    if group < 1 or group > 16:
        return f"a GQA group of {group} query heads per KV head is outside 1..16"
    if fmt.group_size:
        gs = fmt.group_size
        if gs % 4 or head_size % gs:
            return f"group size {gs} is not a multiple of 4 dividing head size {head_size}"
    return ""


def lane_dims_ok(fmt: CacheFormat, dpl: int) -> bool:
    """Whether a lane may own `dpl` consecutive dims of `fmt`'s record: whole vec4s and code words, nesting with
    the format's group (one divides the other)."""
    if dpl <= 0 or dpl % 4 or dpl % fmt.elems_per_word:
        return False
    return not fmt.group_size or fmt.group_size % dpl == 0 or dpl % fmt.group_size == 0


def padded_dims(fmt: CacheFormat, head_size: int, lanes: int) -> int:
    """Dims a lane owns when `lanes` lanes walk the head: the fewest fmt allows that cover it (lanes x dims >= head
    size; dims past the head are padding: a zero query, clamped reads, never written)."""
    dpl = max(4, -(-head_size // lanes))
    while not lane_dims_ok(fmt, dpl):
        dpl += 4 - dpl % 4 if dpl % 4 else 4
    return dpl


def wide_layout(lay: "Layout", most: int) -> bool:
    """Whether `lay`'s lanes own more dims than `most` lanes own at the largest head (MAX_HEAD / most): a record
    whose groups nest with no narrower slice (int4's groups of 24 at head 144: 24 dims a lane at 8 lanes of 16). The
    unrolled kernel's code grows with a lane's dims; such a layout takes the looped kernel (use_looped)."""
    return lay.dims_per_lane > max(4, MAX_HEAD // (1 << (max(1, int(most)).bit_length() - 1)))


def lane_split(fmt: CacheFormat, head_size: int, most: int) -> tuple[int, int]:
    """(lanes, dims a lane) of a token row, lanes a power of two <= `most` (the subgroup size, 1 without subgroups):
    of the splits whose lanes own no more dims than `most` lanes own at the largest head (MAX_HEAD / most; or than
    `most` lanes need for this head: the unrolled kernel's code grows with a lane's dims, G x U x dims/4 lines a
    step, so no head size makes it much larger than that one does), the one that walks the fewest dims (the head
    itself where an exact split exists), then the one with more lanes. Where no power of two divides the head into
    such slices (100, 120 at 16 lanes; 80 for NVFP4's 16-element sub-blocks) the lanes walk it with padding."""
    most = 1 << (max(1, int(most)).bit_length() - 1)
    cap = max(padded_dims(fmt, head_size, most), MAX_HEAD // most)
    best = None
    L = most
    while L >= 1:
        dpl = padded_dims(fmt, head_size, L)
        if dpl <= cap and (best is None or L * dpl < best[0] * best[1]):
            best = (L, dpl)
        L //= 2
    return best


def choose_layout(fmt: CacheFormat, head_size: int, group: int, subgroups: int, shared_limit: int,
                  unroll: int = 2, rows: int = 0, split: tuple[int, int] | None = None) -> Layout:
    """Lanes a row and dims a lane (`split`, else lane_split: at most `subgroups` lanes, the subgroup size or
    less, 1 without subgroups; the lanes may walk the head with padding), row groups (`rows`, or the most up to
    128 threads whose merge fits the workgroup memory: RG/2 states of G heads x (L x dims + 2) floats), tokens a
    row group per step (`unroll`). More lanes a row: fewer dims a lane, so fewer registers for the G query
    slices and accumulators."""
    L, dpl = split or lane_split(fmt, head_size, max(1, int(subgroups)))
    if L == 0:
        raise UnsupportedShape(f"fast decode: {unsupported(fmt, head_size, group) or 'no lane split without subgroups'}")
    span = L * dpl
    rg = rows or 128 // L
    if rows and (rows & (rows - 1) or rows * L > 1024):
        raise InvalidInput(f"rows must be a power of two with rows x lanes <= 1024 threads, got {rows} x {L}")
    rg = max(rg, 1)
    while rg > 1 and (rg // 2) * group * (span + 2) * 4 > shared_limit:
        if rows:
            raise DeviceLimitError(f"fast decode: {rows} row groups need {(rows // 2) * group * (span + 2) * 4} "
                                   f"bytes of workgroup memory, the adapter allows {shared_limit}")
        rg //= 2
    return Layout(L, rg, unroll, dpl)


def looped_layout(lay: Layout, group: int, shared_limit: int, row_group_extra: int = 0) -> Layout:
    """The looped kernel's layout (attention/split_looped.wgsl.j2) from `lay`'s lanes: its state lives in workgroup
    memory (the query slices of its heads and an accumulator a row group and head: (1 + RG) x G x span floats, plus
    the merge's (m, l) pairs), so the row groups are the most that fit, and a GQA group whose state does not fit
    with at least 4 row groups (or 128 / L) is split into chunks of fewer heads a workgroup (each chunk reads the K/V
    again). row_group_extra: more floats a row group keeps (KIVI's key-group scales)."""
    span, L = lay.span, lay.lanes
    want = max(1, min(4, 128 // L))
    best = None
    for chunks in [c for c in range(1, group + 1) if group % c == 0]:
        gc = group // chunks
        rg = 1 << ((128 // L).bit_length() - 1)
        while rg >= 1 and 4 * (gc * span * (1 + rg) + rg * row_group_extra + 2 * gc * max(1, rg // 2)) > shared_limit:
            rg //= 2
        if rg >= want:
            return Layout(L, rg, lay.unroll, lay.dims_per_lane, chunks)
        if rg >= 1 and (best is None or rg > best.row_groups):
            best = Layout(L, rg, lay.unroll, lay.dims_per_lane, chunks)
    if best is None:
        raise DeviceLimitError(f"fast decode: one query head's state ({4 * 2 * span} bytes) exceeds the adapter's "
                               f"{shared_limit} bytes of workgroup memory")
    return best


def looped_loops(pt: int, lay: Layout, group: int) -> int:
    """Loop iterations of one invocation of the looped kernel over a partition of `pt` tokens (each loop charged
    iterations + 2, kvviz/gpu/loop_budget.py): the steps, each U tokens of two loops over the lane's vec4s; the
    query staging, the zeroing, the merge's levels and the write."""
    nv = lay.dims_per_lane // 4
    steps = math.ceil(pt / lay.tokens_per_step)
    step = lay.unroll + 2 + lay.unroll * 2 * (nv + 2)
    staging = math.ceil(group // lay.chunks * lay.span / 4 / lay.workgroup) + 2
    levels = max(0, lay.row_groups.bit_length() - 1)
    return steps + 2 + steps * step + staging + (nv + 2) + levels + 2 + levels * (nv + 2) + (nv + 2)


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


# ---------------------------------------------------------------------------------- the folded reduce
# The reduce folded into the split kernel (shaders/attention/split_fold.wgsl): the last workgroup of each (sequence, KV
# head), found by an atomic counter, combines the partitions in the same dispatch, so a decode is one dispatch instead
# of two. The separate reduce (REDUCE / REDUCE_WIDE) stays as the variant fold=False (and wherever a plan is given a
# reduce). The folded kernel has two more bindings (counters, out) after its own, so its last buffer is the output as
# the reduce's is; counters hold one u32 a (sequence, KV head), 0 between runs (the last workgroup resets its own).
FOLD = False  # the default of the split decodes' plans (fast_decode, ggml, fp4)


def folded(spec: KernelSpec) -> KernelSpec:
    """A split kernel's spec with the folded reduce's bindings (counters, out) after its own."""
    return dataclasses.replace(spec, bindings=spec.bindings + rw("counters", "out"))


def fold_defines(spec: KernelSpec, group: int, workgroup: int, fold: bool) -> dict:
    """The FOLD_DECLS / FOLD values of a split kernel (attention/split_decode.wgsl, ggml/ and fp4/decode_fast.wgsl):
    the folded reduce's bindings, workgroup flag and function, and its call; both empty without the fold."""
    if not fold:
        return {"FOLD_DECLS": "", "FOLD": ""}
    text = (SHADER_DIR / "attention" / "split_fold.wgsl").read_text()
    n = len(spec.bindings)
    for name, value in (("COUNTER_BINDING", n), ("OUT_BINDING", n + 1), ("G", group), ("WG", workgroup)):
        text = text.replace("{{%s}}" % name, str(value))
    return {"FOLD_DECLS": text, "FOLD": "  fold_partitions(seq, kvh, li);"}


def fold_loops(P: int, group: int, head_size: int, workgroup: int) -> int:
    """Loop iterations of one invocation of the folded reduce (charged as kvviz/gpu/loop_budget.py does): its loop over
    the G x D outputs, two loops over the P partitions in each step."""
    steps = math.ceil(group * head_size / workgroup)
    return steps * (2 * (P + 2) + 1) + 2


def fold_dispatch(rt: GpuRuntime, kern, bufs: list, grid, imm: bytes, S: int, num_kv_heads: int, out) -> Dispatch:
    """The folded split kernel's dispatch: its buffers, then a fresh zeroed counter a (sequence, KV head) and out."""
    counters = rt.upload(np.zeros(max(1, S * num_kv_heads), np.uint32), "fold_counters")
    return Dispatch(kern, [*bufs, counters, out], grid, imm)


def plan_fold(fold: bool | None, reduce: KernelSpec | None = None) -> bool:
    """Whether a plan folds its reduce in: `fold` as asked, else FOLD unless the plan was given a separate reduce."""
    if fold and reduce is not None:
        raise InvalidInput("a decode plan takes a separate reduce or folds it in, not both")
    return (FOLD and reduce is None) if fold is None else bool(fold)


def fold_looped(fold: bool, looped: bool | None) -> bool | None:
    """A sibling kernel's `looped` under the fold: the folded reduce is in the unrolled kernels only (None becomes
    False; True with the fold is refused)."""
    if fold and looped:
        raise InvalidInput("the folded reduce is in the unrolled kernels, not the looped one")
    return False if fold else looped


# ---------------------------------------------------------------------------------- code generation
# The kernel's generated code is shaders/attention/split_decode.wgsl.j2 (the split kernels' shape:
# attention/split_kernel.wgsl.j2; the formats' code expressions: attention/cache_formats.wgsl.j2); render() picks its
# values. magic converts integer codes without the int-to-float instruction (a quarter-rate op on NVIDIA), exactly:
# int8 by f16 pairs when I8X4_VIA_F16 (2 conversions and 6 integer ops a word), else by the 2^23 mantissa trick.
I8X4_VIA_F16 = True  # render's magic int8 conversion takes the f16 route (tools/fast_decode_tune.py --i8-f16=off|on)


def render(fmt: CacheFormat, head_size: int, group: int, lay: Layout, qk: str = "f32", pv: str = "f32",
           pv_flush: int = PV_FLUSH, block_size: int = 0, prefetch: bool = False, lazy: bool = False,
           magic: bool = False, scatter: bool = False, looped: bool = False, fold: bool = False) -> dict:
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
    lane sums in another order: within the f32 tolerance, not bit for bit.
    looped: attention/split_looped.wgsl.j2's code instead (loops over the heads and a lane's vec4s, one token at a
    time; its size does not grow with the head size or the group; the f32 tolerance, not bit for bit); prefetch,
    lazy, magic and scatter do not apply to it.
    A layout whose lanes walk more dims than the head (lay.span > head_size: padded) reads a zero query and
    clamped words there and never writes those dims.
    fold: the reduce folded in (fold_defines; the kernel's spec is then folded(SPLIT)); unrolled kernels only."""
    D, G, L, RG, U = head_size, group, lay.lanes, lay.row_groups, lay.unroll
    i8, h16, h2 = qk == "i8", pv == "f16", pv == "h2"
    packed = h2 or (i8 and fmt.elems_per_word == 8)  # attention/split_packed.wgsl.j2's variants
    if packed and fmt.name not in PACKED_FORMATS:
        raise InvalidInput(f"the packed variants take the int8 and int4 caches, not {fmt.name}")
    if packed and lay.span > head_size:
        raise UnsupportedShape(f"the packed variants need lanes that split head size {head_size} without padding",
                               "Use qk='f32' and pv='f32' for this head size.")
    if scatter and (L < 2 or h16):
        raise InvalidInput("the scatter softmax needs L >= 2 lanes a row and f32 P.V")
    if looped and (i8 or h16 or h2 or fold):
        raise InvalidInput("the looped kernel is the exact f32 one with the separate reduce: the qk='i8' and pv='f16' / "
                           "'h2' variants and the folded reduce are unrolled")
    dpl = lay.dims_per_lane
    gs = fmt.group_size
    span = lay.span
    values = dict(
        fmt=fmt, D=D, G=G, L=L, RG=RG, U=U, dpl=dpl, nv=dpl // 4, wpl=dpl // fmt.elems_per_word, stride=span + 2,
        pad=span > D, cw=fmt.code_words(D), gs=gs, groups_per_lane=max(1, dpl // gs) if gs else 0,
        groups=D // gs if gs else 0,
        qrec=D // 4 + 1,  # an int8 query record: D/4 code words + its f32 scale word
        i8=i8, h16=h16, h2=h2, pv_flush=pv_flush, shift=pv_shift(U, pv_flush), lazy=lazy, lazy_tau=LAZY_TAU, magic=magic,
        via_f16=I8X4_VIA_F16, scatter=scatter, prefetch=prefetch, bt_ahead=fmt.name in BT_AHEAD_FORMATS,
        bsx=f"{block_size}u" if block_size > 0 else "p.block_size",
        unit=FP8_UNIT.get(fmt.fp8 or "", 1.0),  # e4m3 codes enter as value / 2^8: the query and the V scale take 2^8
    )
    if looped:
        values.update(fns="attention/cache_records.wgsl.j2", qfactor="p.scale_log2", unit=1.0, span=span,
                      chunks=lay.chunks, G=G // lay.chunks)
    template = ("attention/split_looped.wgsl.j2" if looped else "attention/split_packed.wgsl.j2" if packed
                else "attention/split_decode.wgsl.j2")
    return {
        "FORMAT": f"{fmt.name}" + (f", {fmt.scale} scale" if fmt.scale != "none" else "") + (f", group {gs}" if gs else ""),
        "D": str(D), "G": str(values["G"]), "L": str(L), "RG": str(RG), "U": str(U), "WG": str(lay.workgroup),
        "WPT": str(fmt.wpt(D)), "DPL": str(dpl), "WPL": str(values["wpl"]), "STRIDE": str(D + 2),
        "SHARED": "1" if looped else str(max(1, RG // 2) * G * (span + 2)),
        "VARIANT": ("looped" if looped else variant_name(qk, pv, pv_flush, U) + ("; scatter softmax" if scatter else ""))
                   + (f"; {L} lanes x {dpl} dims walk the head (padded)" if span > D else ""),
        "ENABLES": "enable f16;" if h16 or h2 else "",
        "Q_TYPE": "u32" if i8 else "f32",
        **render_defines(template, **values),
        **fold_defines(SPLIT, G, lay.workgroup, fold),
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
    looped: bool = False  # the looped kernel (render's looped), else the unrolled one

    def describe(self) -> str:
        L = self.layout
        v = "" if self.variant == "f32" else f", {self.variant}"
        return (f"{self.num_partitions} partition(s) of {self.partition_tokens} tokens, {L.workgroup} threads "
                f"({L.row_groups} rows x {layout_lanes(L, self.shape[2])}, {L.unroll} tokens a row per step){v}"
                f"{looped_note(self.looped, L)}{wide_note(self.dispatches)}")


def layout_lanes(lay: Layout, head_size: int) -> str:
    """"8 lanes" / "8 lanes of 16 dims, padded to 128": what a plan's description says of its lanes."""
    pad = f" of {lay.dims_per_lane} dims, padded to {lay.span}" if lay.span > head_size else ""
    return f"{lay.lanes} lanes{pad}"


def looped_note(looped: bool, lay: Layout) -> str:
    if not looped:
        return ""
    return ", looped" + (f" ({lay.chunks} workgroups a GQA group)" if lay.chunks > 1 else "")


def wide_note(dispatches) -> str:
    """", wide reduce" when a plan's reduce is REDUCE_WIDE, ", reduce folded in" when the split kernel reduces (a bench
    row then says which ran)."""
    if len(dispatches) == 1:
        return ", reduce folded in"
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

    def lane_cap(self, subgroups: bool | None = None, lanes: int = 16) -> int:
        """The most lanes a token row may take: `lanes`, at most the subgroup size; 1 without subgroups."""
        return min(self.subgroup_size, lanes) if subgroups is None or subgroups else 1

    def layout(self, fmt: CacheFormat, head_size: int, group: int, subgroups: bool | None = None,
               unroll: int = 2, rows: int = 0, lanes: int = 16) -> Layout:
        """lanes: the most lanes a token row may take (the subgroup size caps it)."""
        limit = int(self.rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)
        return choose_layout(fmt, head_size, group, self.lane_cap(subgroups, lanes), limit, unroll, rows)

    def kernel(self, fmt: CacheFormat, head_size: int, group: int, subgroups: bool | None = None, unroll: int = 2,
               rows: int = 0, lanes: int = 16, checks: bool = True, qk: str = "f32", pv: str = "f32",
               pv_flush: int = PV_FLUSH, block_size: int = 0, prefetch: bool | None = None, lazy: bool = False,
               magic: bool = False, scatter: bool | None = None, looped: bool | None = None, fold: bool = False):
        """checks=False: the shader module without naga's runtime checks (kvviz/gpu/trusted.py), a
        measured variant; the host has validated every index the kernel reads. qk / pv: the variants
        (QK_VARIANTS, PV_VARIANTS above). looped: render's looped (None: use_looped, and only for the exact f32
        kernel with the separate reduce: the variants are unrolled; prefetch or scatter given: unrolled). fold: the
        reduce folded in (FOLD above)."""
        self.check_variant(fmt, qk, pv, pv_flush)
        lay = self.layout(fmt, head_size, group, subgroups, unroll, rows, lanes)
        if looped is None:
            looped = qk == "f32" and pv == "f32" and not fold and use_looped(
                self.rt, None, prefetch, scatter, wide=wide_layout(lay, self.lane_cap(subgroups, lanes)))
        if looped:
            prefetch = lazy = magic = scatter = False
            lay = looped_layout(lay, group, int(self.rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384))
        if prefetch is None:  # the default: where it measured faster (PREFETCH, prefetch_fits); True / False force it
            prefetch = PREFETCH and prefetch_fits(fmt, head_size, lay)
        if scatter is None:  # the default (SCATTER) where the layout allows it; True forces it (or refuses)
            scatter = SCATTER and lay.lanes > 1 and pv in ("f32", "h2")
        defines = render(fmt, head_size, group, lay, qk, pv, pv_flush, block_size, prefetch, lazy, magic, scatter, looped,
                         fold)
        if not checks:
            if not available():
                raise UnsupportedShape("this wgpu build has no wgpuDeviceCreateShaderModuleTrusted",
                                       "Keep the runtime checks (the default).")
            defines[RUNTIME_CHECKS_OFF[0]] = RUNTIME_CHECKS_OFF[1]
        return self.rt.compile(folded(SPLIT) if fold else SPLIT, **defines), lay

    def check_variant(self, fmt: CacheFormat, qk: str, pv: str, pv_flush: int) -> None:
        if qk not in QK_VARIANTS or pv not in PV_VARIANTS:
            raise InvalidInput(f"fast decode variant qk={qk!r}, pv={pv!r}: qk is one of {QK_VARIANTS}, pv one of {PV_VARIANTS}")
        if qk == "i8" and fmt.name not in QK_I8_FORMATS:
            raise UnsupportedShape(f"fast decode qk='i8' (dot4I8Packed) needs integer K codes; {fmt.name} has none",
                                   "Use qk='f32' (the default) for this format.")
        if pv == "h2" and fmt.name not in PACKED_FORMATS:
            raise UnsupportedShape(f"fast decode pv='h2' (f16 pairs from integer codes) takes the int8 and int4 caches, "
                                   f"not {fmt.name}", "Use pv='f16' or pv='f32' for this format.")
        if pv in ("f16", "h2"):
            if "shader-f16" not in self.rt.features:
                raise UnsupportedShape(f"fast decode pv={pv!r} needs the adapter feature shader-f16, which this adapter lacks",
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
             scatter: bool | None = None, reduce: KernelSpec | None = None, looped: bool | None = None,
             fold: bool | None = None) -> FastDecodePlan:
        """Dispatches of one decode over caches `k`, `v` (GPU buffers of [num_blocks, kv_heads,
        block_size, wpt] u32 words, or f32 for the f32 format). qk="i8" / pv="f16": the variants
        (see QK_VARIANTS above), each with its own oracle and tolerance; the defaults are exact f32.
        reduce: REDUCE or REDUCE_WIDE for any partition count (default reduce_spec: the Kernel lab's reduce
        slots and A/Bs pick one). fold: the reduce folded into the split kernel (default FOLD where no reduce is given;
        False: the separate reduce)."""
        q, G = check_query(q, batch, num_kv_heads, scale)
        S, H, D = q.shape
        why = unsupported(fmt, D, G)
        if why:
            raise UnsupportedShape(f"fast decode ({fmt.name}): {why}", "The first-wave decode takes this shape.")
        if unroll not in (1, 2, 4):
            raise InvalidInput(f"unroll must be 1, 2 or 4 tokens a row group per step, got {unroll}")
        fold = plan_fold(fold, reduce)
        if looped is None:
            wide = wide_layout(self.layout(fmt, D, G, subgroups, unroll, rows, lanes), self.lane_cap(subgroups, lanes))
            looped = qk == "f32" and pv == "f32" and not fold and use_looped(self.rt, None, prefetch, lazy, magic, scatter,
                                                                             wide=wide)
        kern, lay = self.kernel(fmt, D, G, subgroups, unroll, rows, lanes, checks, qk, pv, pv_flush,
                                batch.block_size if const_block else 0, prefetch,
                                fmt.name in LAZY_FORMATS if lazy is None else lazy, fmt.name in MAGIC_CVT if magic is None else magic,
                                scatter, looped, fold)
        mcl = int(batch.max_context_len)
        pt, P = split_context(partition_tokens, self.planned_tokens(S, num_kv_heads, mcl, lay, G, looped),
                              lay.tokens_per_step, mcl)
        check_grid(self.rt, "fast decode", (("partitions", P), ("KV heads", num_kv_heads * lay.chunks), ("sequences", S)))
        reduce = reduce or reduce_spec(P)
        self._check_loops(pt, lay, P, reduce_loops(P, reduce), G, looped, fold_loops(P, G, D, lay.workgroup) if fold else 0)
        wpt = fmt.wpt(D)
        need = batch.num_blocks * num_kv_heads * batch.block_size * wpt * 4
        for name, buf in (("K", k), ("V", v)):
            if buf.size < need:
                raise InvalidInput(f"fast decode: the {name} cache holds {buf.size} bytes, the batch's "
                                   f"{batch.num_blocks} blocks of {fmt.name} need {need}")
            if buf.size > self.rt.max_binding:  # the split kernel binds each cache whole (an f32 cache may be larger)
                raise DeviceLimitError(
                    f"fast decode: the {name} cache ({buf.size / 2**20:.1f} MiB) is over the adapter's storage-binding "
                    f"limit of {self.rt.max_binding / 2**20:.1f} MiB, and the split kernel binds a cache whole",
                    "Use fewer or shorter sequences, or the paged decode, which binds a large cache in windows.")
        bt = np.ascontiguousarray(batch.block_tables, dtype=np.uint32)
        partials = self.rt.empty(S * H * P * (D + 2) * 4, "fast_decode_partials")
        out = self.rt.empty(S * H * D * 4, "fast_decode_out")
        qbuf = self.rt.upload(query_records_i8(q, fmt) if qk == "i8" else q, "q")
        bufs = [qbuf, k, v, self.rt.upload(bt, "block_tables"),
                self.rt.upload(batch.context_lens.astype(np.uint32), "context_lens"), self._tensor(tensor), partials]
        imm = kern.pack(num_kv_heads, H, batch.block_size, bt.shape[1], pt, P, float(scale) * LOG2E)
        if fold:
            d = [fold_dispatch(self.rt, kern, bufs, (P, num_kv_heads, S), imm, S, num_kv_heads, out)]
        else:
            d = [Dispatch(kern, bufs, (P, num_kv_heads * lay.chunks, S), imm),
                 self.rt.compile(reduce).dispatch((H, S, 1), [partials, out], H, D, P)]
        return FastDecodePlan(d, out, (S, H, D), pt, P, lay, variant_name(qk, pv, pv_flush, unroll), looped)

    def planned_tokens(self, num_seqs: int, num_kv_heads: int, max_len: int, lay: Layout, group: int,
                       looped: bool) -> int:
        """plan_partitions' tokens a partition; for the looped kernel on an adapter with a loop limit, no more than
        its loops over a partition fit (looped_loops)."""
        pt = plan_partitions(num_seqs, num_kv_heads * lay.chunks, max_len, lay.tokens_per_step)
        limit = self.rt.loop_limit
        if looped and limit is not None:
            step = lay.tokens_per_step
            while pt > step and looped_loops(pt, lay, group) > limit:
                pt -= step
        return pt

    def _check_loops(self, pt: int, lay: Layout, P: int, reduce_need: int | None = None, group: int = 0,
                     looped: bool = False, fold_need: int = 0) -> None:
        """The split kernel loops pt / (RG*U) times (the looped kernel more: looped_loops, `group` its GQA group;
        with the reduce folded in, fold_need more: fold_loops), the reduce reduce_loops(P) (or reduce_need: another
        reduce, TurboQuant's with its butterflies): both must fit a software rasteriser's per-invocation loop budget
        (kvviz/gpu/loop_budget.py)."""
        limit = self.rt.loop_limit
        if limit is None:
            return
        split = (looped_loops(pt, lay, group) if looped else math.ceil(pt / lay.tokens_per_step) + 2) + fold_need
        need = max(split, reduce_loops(P) if reduce_need is None else reduce_need)
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
    looped: bool = False  # the looped kernel (attention/split_looped.wgsl.j2), else the unrolled one

    def describe(self) -> str:
        L = self.layout
        pad = f", padded to {L.span}" if L.span > self.shape[2] else ""
        return (f"{self.label}: {self.num_partitions} partition(s) of {self.partition_tokens} tokens, {L.workgroup} "
                f"threads ({L.row_groups} rows x {L.lanes} lanes of {L.dims_per_lane} dims{pad}, {L.unroll} tokens a row "
                f"per step){looped_note(self.looped, L)}{wide_note(self.dispatches)}")


class SiblingDecode:
    """The launcher the sibling split kernels share (fast_decode_ggml, fast_decode_fp4): the lane layout under
    the subgroup probe, the partition split, the grid / loop-budget / buffer-size checks, the split dispatch
    (bindings q, k, v, block_tables, context_lens, [extra...], partials; the immediates of SPLIT) and the reduce."""

    name = "fast decode"  # in messages: "fast ggml decode", ...

    def __init__(self, rt):
        self.rt = rt
        self._fast = FastDecode(rt)  # the subgroup probe and the loop-budget check

    def _layout(self, fmt: CacheFormat, head_size: int, group: int, subgroups: bool | None, unroll: int,
                rows: int, lanes: int) -> Layout:
        """The record's lane split (choose_layout: fmt's group_size is the record's block, which a lane's dims nest
        with); lanes: the most lanes a token row may take (the subgroup size caps it; 1 without subgroups)."""
        return choose_layout(fmt, head_size, group, self._fast.lane_cap(subgroups, lanes), self._shared_limit(), unroll,
                             rows)

    def _shared_limit(self) -> int:
        return int(self.rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)

    def _looped(self, lay: Layout, group: int, looped: bool | None, most: int, *unrolled_knobs) -> tuple[Layout, bool]:
        """(layout, looped): use_looped's choice (`most`: the lane cap `lay` was chosen under), and the looped
        kernel's layout (looped_layout) where it is taken."""
        looped = use_looped(self.rt, looped, *unrolled_knobs, wide=wide_layout(lay, most))
        return (looped_layout(lay, group, self._shared_limit()) if looped else lay), looped

    def _launch(self, kern, lay: Layout, k, v, extra: list, num_kv_heads: int, q, batch: PagedBatch, scale: float,
                partition_tokens: int | None, wpt: int, label: str, looped: bool = False,
                fold: bool = False, q_words: np.ndarray | None = None) -> SiblingPlan:
        """Split + reduce dispatches over caches k, v of `wpt` words a record, q checked by check_query; fold: the
        (unrolled) kernel has the reduce folded in (one dispatch); q_words: what the kernel reads for q where it is not
        q itself (the int8 query records, query_records_i8)."""
        S, H, D = q.shape
        G = H // num_kv_heads
        mcl = int(batch.max_context_len)
        pt, P = split_context(partition_tokens, self._fast.planned_tokens(S, num_kv_heads, mcl, lay, G, looped),
                              lay.tokens_per_step, mcl)
        check_grid(self.rt, self.name, (("partitions", P), ("KV heads", num_kv_heads * lay.chunks), ("sequences", S)))
        self._fast._check_loops(pt, lay, P, None, G, looped, fold_loops(P, G, D, lay.workgroup) if fold else 0)
        need = batch.num_blocks * num_kv_heads * batch.block_size * wpt * 4
        for which, buf in (("K", k), ("V", v)):
            if buf.size < need:
                raise InvalidInput(f"{self.name}: the {which} cache holds {buf.size} bytes, the batch's "
                                   f"{batch.num_blocks} blocks of {label} need {need}")
        bt = np.ascontiguousarray(batch.block_tables, dtype=np.uint32)
        tag = self.name.replace(" ", "_")
        partials = self.rt.empty(S * H * P * (D + 2) * 4, f"{tag}_partials")
        out = self.rt.empty(S * H * D * 4, f"{tag}_out")
        bufs = [self.rt.upload(q if q_words is None else q_words, "q"), k, v, self.rt.upload(bt, "block_tables"),
                self.rt.upload(batch.context_lens.astype(np.uint32), "context_lens"), *extra, partials]
        imm = kern.pack(num_kv_heads, H, batch.block_size, bt.shape[1], pt, P, float(scale) * LOG2E)
        if fold:
            d = [fold_dispatch(self.rt, kern, bufs, (P, num_kv_heads, S), imm, S, num_kv_heads, out)]
        else:
            d = [Dispatch(kern, bufs, (P, num_kv_heads * lay.chunks, S), imm),
                 self.rt.compile(reduce_spec(P)).dispatch((H, S, 1), [partials, out], H, D, P)]
        return SiblingPlan(d, out, (S, H, D), pt, P, lay, label, looped)

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
