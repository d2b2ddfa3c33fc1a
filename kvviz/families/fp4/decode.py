"""The fast NVFP4 decode: split-K ("flash-decoding") paged attention that reads the nvfp4 method's cache
(kvviz/families/fp4/format.py: E2M1 codes, an FP8 E4M3 scale per 16 elements, an f32 scale per tensor) in place,
without the dequantise pass and the f32 copy of the cache the first-wave path makes. Shaders
fp4/decode_fast.wgsl (split; its code rendered from the template fp4/decode_fast.wgsl.j2) + fast_decode's reduce
(reduce_spec), unchanged; numpy reference: the method's own (kvviz/families/fp4/oracle.py: e2m1 * e4m3 * s_t through the f32 decode's
arithmetic in float64); tests tests/test_fast_decode_nvfp4.py.

Why a module of its own and not a type of fast_decode_ggml: a ggml record is a row of byte-packed blocks
(header then codes, not word aligned: funnel shifts); the NVFP4 record keeps its E4M3 scale bytes in the
first ceil(D/64) words and its codes word aligned after them (2 words a 16-element sub-block), and a
per-tensor scale sits in a side buffer. The shared pieces come from fast_decode (layout rules, plan_partitions,
the checks, the subgroup probe, the loop budget, the reduce) and from its templates (the split kernel's shape
attention/split_kernel.wgsl.j2 with its loads, softmax, merge and write; the FP8 helper fp8x4).

Record (a token of one KV head, D a multiple of 16, SW = ceil(D/64) scale words):
    words 0..SW-1: E4M3 scale byte s = sub-block s; then code words SW + 2s, SW + 2s + 1 of sub-block s:
    byte i of the pair holds element 16s+i in its low nibble and 16s+8+i in its high nibble.
Lanes: L lanes share a token row (the most of 16, 8, 4, 2, 1 up to the subgroup size; 1 without subgroups),
lane l owns DPL consecutive dims, DPL 4 or 8 (inside one sub-block: one or two code words, read at
the lane's nibble) or a multiple of 16 (whole sub-blocks, two code words each). D = 80, 48, 112 ... have
no such power-of-two split but a wide one; there the lanes walk the head with padding (fast_decode.lane_split:
the last lanes' sub-blocks past the head read clamped words and are never written).

Arithmetic: e2m1x4 moves 4 E2M1 codes into f16 bit patterns (sign, 2-bit exponent, 1-bit mantissa; the f16
is the value x 2^-14, subnormal for 0 / 0.5) and widens them by unpack2x16float: exact. The sub-block's
scale d = e4m3 x 2^14 (fast_decode's fp8x4, exact), and codes x d is exact in f32 (2 x 4 significant bits):
the dequantiser's e2m1 * e4m3 before the tensor scale. The K tensor scale is folded into the query
(pre-scaled by scale * log2(e) * s_t K), the V tensor scale into the softmax weight (p * s_t V): those two
products round where the dequantiser rounds (e2m1*e4m3)*s_t once per element, so the output is within the
f32 fast decodes' bound, not bit for bit: 2e-5 * max(1, max |V^|) against the float64 oracle over the same
codes (tolerance; fast_decode.f32_tolerance). Online softmax in base 2, the G heads of a KV head in one
workgroup, the reduce-scatter softmax where a row has 2+ lanes, software-pipelined loads where a lane's
words of a step fit fast_decode.PREFETCH_MAX_WORDS.

A variant, off by default (plan's qk="i8"; fd.QK_VARIANTS): the query quantised to int8 on the host, one scale a query
head (fast_decode.query_records_i8: the int8 cache's quantiser), dotted by dot4I8Packed with the E2M1 values doubled
into signed bytes (0, 1, 2, 3, 4, 6, 8, 12 and their negatives: e2m1x4i8; the E2M1 values are halves of these
integers). The query codes go in dim order, as for the int8 cache: a code word's low nibbles are 4 consecutive elements
of its sub-block (16s+0..3 in the first word of the pair, 16s+4..7 in the second) in byte order, and so are its high
nibbles (16s+8..11, 16s+12..15), so either nibble of a word masked into bytes lines up with one query word (unlike the
int4 cache's words, whose even and odd nibbles are alternate dims). The logit of a lane's sub-block is
e4m3 * f32(sum of dot4I8Packed(q word, doubled E2M1 word)); the lanes' sum times the head's query scale with
scale*log2(e), s_t K and the 1/2 of the doubled values, one per-lane factor (where the f32 kernel folds s_t K into its
query). The integer dot is exact (16 codes a sub-block: |dot| <= 16 x 128 x 12 = 24576 < 2^24), and so is its product
with the E4M3 scale (4 + 15 significant bits); what rounds is the sum over the lane's sub-blocks and the lanes, and the
query scale's multiply: fewer roundings than the f32 kernel's dot. So against its own oracle (the float64 decode of the
dequantised int8 query over the dequantised cache) the variant is as exact as the f32 kernel: tolerance(). P.V is the
f32 kernel's. Unrolled kernels only (the looped kernel is the exact f32 one). Tests tests/test_fast_decode_nvfp4_i8.py;
timed by kvviz bench --variants.

Shapes it cannot take (head size not a multiple of 16 or over 256, a GQA group outside 1..16) raise
UnsupportedShape from plan(); the method then keeps the first-wave path (kvviz/families/fp4/method.py).
"""
from __future__ import annotations


import numpy as np

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.fp4 import format as f4
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.templates import render_defines
from kvviz.attention import split_decode as fd
from kvviz.paging import PagedBatch

SUB = f4.SUB

SPLIT = KernelSpec(
    "fp4/decode_fast.wgsl",
    bindings=ro("q", "kc", "vc", "block_tables", "context_lens", "tensor") + rw("partials"),
    immediates=Struct("P", "num_kv_heads num_heads block_size max_blocks partition_tokens num_partitions scale_log2:f32"),
)
REDUCE = fd.REDUCE
KERNELS = (SPLIT, REDUCE)

# fast_decode's layout rules for 4-byte words, a lane's dims nesting with the 16-element sub-blocks
_FMT = fd.CacheFormat("nvfp4", 4, group_size=SUB)
# The E2M1 codes -> f32 helper (exact: see the module docstring; shaders/fp4/decode_fast.wgsl.j2) yields the codes' values
# x 2^-14; the E4M3 scale byte goes through the fast decode's FP8 helper (fp8x4), and the sub-block's scale takes the 2^14.
E2M1_UNIT = 2.0 ** 14  # e2m1x4's values are the codes' x 2^-14


def tolerance(max_abs_v: float) -> float:
    """2e-5 x max(1, max |V^|): the f32 fast decodes' bound (fast_decode.f32_tolerance)."""
    return fd.f32_tolerance(max_abs_v)


def unsupported(head_size: int, group: int) -> str:
    """Why this decode cannot take the shape ("" when it can)."""
    if head_size <= 0 or head_size % SUB:
        return f"head size {head_size} is not a multiple of 16 (NVFP4's E4M3 scale covers 16 elements)"
    if head_size > 256:
        return f"head size {head_size} is over 256 (the unrolled per-lane state would spill registers)"
    if group < 1 or group > 16:
        return f"a GQA group of {group} query heads per KV head is outside 1..16"
    return ""


def _counts(dpl: int) -> tuple[int, int]:
    """(code words, scale words) a lane loads per token of K or V."""
    if dpl < SUB:
        return dpl // 4, 1
    return dpl // 8, dpl // SUB


def prefetch_words(lay: fd.Layout) -> int:
    """u32 words a lane loads for one step (K and V, U tokens): what the prefetch holds twice."""
    return 2 * lay.unroll * sum(_counts(lay.dims_per_lane))


# ---------------------------------------------------------------------------------- code generation
def render(head_size: int, group: int, lay: fd.Layout, block_size: int = 0, prefetch: bool = False,
           scatter: bool = False, looped: bool = False, fold: bool = False, qk: str = "f32") -> dict:
    """The {{...}} values of fp4/decode_fast.wgsl for one shape. block_size > 0 renders the block size as a
    constant (fast_decode.render's const_block); 0 reads it from the immediates. prefetch: software
    pipelining (fast_decode.render's; same arithmetic, bit-identical outputs). scatter: fast_decode's
    reduce-scatter softmax (L >= 2; the V tensor scale is the owners' weight scale). looped: the looped kernel
    (attention/split_looped.wgsl.j2 over fp4/records.wgsl.j2; fast_decode.render's looped). A layout whose lanes
    walk more dims than the head (padded) reads clamped words there and never writes them. fold: the reduce folded
    in (fast_decode.fold_defines; the spec is then fast_decode.folded(SPLIT)); the unrolled kernel only. qk "i8": the
    int8-query variant (the module's docstring), the unrolled kernel only."""
    D, G, L, RG, U = head_size, group, lay.lanes, lay.row_groups, lay.unroll
    if scatter and L < 2:
        raise InvalidInput("the scatter softmax needs L >= 2 lanes a row")
    i8 = check_qk(qk)
    if i8 and looped:
        raise InvalidInput("the looped kernel is the exact f32 one: the qk='i8' variant is unrolled")
    dpl = lay.dims_per_lane
    if dpl % 4 or not (SUB % dpl == 0 or dpl % SUB == 0):
        raise InvalidInput(f"nvfp4 fast decode: {dpl} dims a lane neither lie inside a 16-element sub-block nor cover whole ones")
    ncw, nsw = _counts(dpl)
    span = lay.span
    values = dict(D=D, G=G, L=L, RG=RG, U=U, dpl=dpl, nv=dpl // 4, stride=span + 2, sub=SUB, ncw=ncw, nsw=nsw,
                  e2m1_unit=E2M1_UNIT, scatter=scatter, prefetch=prefetch, pad=span > D, nsb=D // SUB,
                  bsx=f"{block_size}u" if block_size > 0 else "p.block_size",
                  i8=i8, qrec=D // 4 + 1)  # an int8 query record: D/4 code words + its f32 scale word
    if looped:
        values.update(fns="fp4/records.wgsl.j2", qfactor="qsc", span=span, chunks=lay.chunks, G=G // lay.chunks)
    return {
        "FORMAT": "nvfp4", "D": str(D), "G": str(values["G"]), "L": str(L), "RG": str(RG), "U": str(U),
        "WG": str(lay.workgroup), "WPT": str(f4.words_per_token(D)), "SW": str(f4.scale_words(D)), "DPL": str(dpl),
        "STRIDE": str(D + 2), "SHARED": "1" if looped else str(max(1, RG // 2) * G * (span + 2)),
        "Q_TYPE": "u32" if i8 else "f32", "VARIANT": "looped" if looped else fd.variant_name(qk),
        **render_defines("attention/split_looped.wgsl.j2" if looped else "fp4/decode_fast.wgsl.j2", **values),
        **fd.fold_defines(SPLIT, G, lay.workgroup, fold and not looped),
    }


def check_qk(qk: str) -> bool:
    """Whether `qk` asks for the int8-query variant (InvalidInput for an unknown one)."""
    if qk not in fd.QK_VARIANTS:
        raise InvalidInput(f"fast nvfp4 decode variant qk={qk!r}: one of {fd.QK_VARIANTS}")
    return qk == "i8"


# ---------------------------------------------------------------------------------- launcher
Fp4DecodePlan = fd.SiblingPlan  # label "nvfp4"


class Fp4FastDecode(fd.SiblingDecode):
    """Compiles and dispatches the fast NVFP4 decode on one runtime."""

    name = "fast nvfp4 decode"

    def layout(self, head_size: int, group: int, subgroups: bool | None = None, unroll: int = 2, rows: int = 0,
               lanes: int = 16) -> fd.Layout:
        return self._layout(_FMT, head_size, group, subgroups, unroll, rows, lanes)

    def kernel(self, head_size: int, group: int, block_size: int = 0, prefetch: bool | None = None,
               scatter: bool | None = None, looped: bool | None = None, fold: bool = False, qk: str = "f32", **kw):
        """prefetch None: where a lane's words of a step fit fast_decode.PREFETCH_MAX_WORDS (prefetch_words).
        scatter None: fast_decode.SCATTER where a row has 2+ lanes. looped None: fast_decode.use_looped (not when
        prefetch or scatter is given; never for qk "i8", which is unrolled). fold: the reduce folded in (unrolled
        only). Returns (kernel, layout, looped)."""
        looped = fd.fold_looped(fold, looped)
        if check_qk(qk):
            if looped:
                raise InvalidInput("the looped kernel is the exact f32 one: the qk='i8' variant is unrolled")
            looped = False
        most = self._fast.lane_cap(kw.get("subgroups"), kw.get("lanes", 16))
        lay, looped = self._looped(self.layout(head_size, group, **kw), group, looped, most, prefetch, scatter)
        if looped:
            prefetch = scatter = False
        if prefetch is None:
            prefetch = fd.PREFETCH and prefetch_words(lay) <= fd.PREFETCH_MAX_WORDS
        if scatter is None:
            scatter = fd.SCATTER and lay.lanes > 1
        spec = fd.folded(SPLIT) if fold else SPLIT
        return self.rt.compile(spec, **render(head_size, group, lay, block_size, prefetch, scatter, looped, fold,
                                              qk)), lay, looped

    def plan(self, k, v, tensor, num_kv_heads: int, q, batch: PagedBatch, scale: float, *,
             partition_tokens: int | None = None, subgroups: bool | None = None, unroll: int = 2, rows: int = 0,
             lanes: int = 16, const_block: bool = True, prefetch: bool | None = None,
             scatter: bool | None = None, looped: bool | None = None, fold: bool | None = None,
             qk: str = "f32") -> Fp4DecodePlan:
        """Dispatches of one decode (q [S, H, D] f32, one query per sequence) over the nvfp4 caches `k`, `v`
        (GPU buffers of [num_blocks, kv_heads, block_size, wpt] u32 words, the method's writer's) and its
        tensor-scale buffer `tensor` ([amax K, amax V, s_t K, s_t V] f32 bits). fold: the reduce folded in
        (default fast_decode.FOLD; False: the separate reduce). qk "i8": the int8-query variant (the module's
        docstring), against its own oracle; the default "f32" is the exact kernel."""
        q, G = fd.check_query(q, batch, num_kv_heads, scale)
        S, H, D = q.shape
        why = unsupported(D, G)
        if why:
            raise UnsupportedShape(f"fast nvfp4 decode: {why}", "The first-wave decode (dequantise + f32) takes this shape.")
        if unroll not in (1, 2, 4):
            raise InvalidInput(f"unroll must be 1, 2 or 4 tokens a row group per step, got {unroll}")
        if tensor is None or tensor.size < 16:
            raise InvalidInput("fast nvfp4 decode: the tensor-scale buffer (4 words: amax K, amax V, s_t K, s_t V) is missing")
        kern, lay, looped = self.kernel(D, G, batch.block_size if const_block else 0, subgroups=subgroups,
                                        unroll=unroll, rows=rows, lanes=lanes, prefetch=prefetch, scatter=scatter,
                                        looped=looped, fold=fd.plan_fold(fold), qk=qk)
        label = "nvfp4" + (f" ({fd.variant_name(qk)})" if qk != "f32" else "")
        return self._launch(kern, lay, k, v, [tensor], num_kv_heads, q, batch, scale, partition_tokens,
                            f4.words_per_token(D), label, looped, fd.plan_fold(fold),
                            fd.query_records_i8(q) if qk == "i8" else None)

    def decode(self, k, v, tensor, num_kv_heads: int, q, batch: PagedBatch, scale: float, **kw) -> np.ndarray:
        """Run the fast decode: [num_seqs, num_heads, head_size] f32."""
        plan = self.plan(k, v, tensor, num_kv_heads, q, batch, scale, **kw)
        self.rt.run(plan.dispatches)
        return self.read(plan)


def decode_traffic(batch: PagedBatch, num_heads: int, num_kv_heads: int, head_size: int,
                   num_partitions: int) -> tuple[int, float]:
    """(unique bytes, flops) of one decode: fast_decode.decode_traffic with the nvfp4 record (wpt words)
    plus the 16-byte tensor-scale buffer."""
    return fd.record_traffic("nvfp4", f4.words_per_token(head_size), batch, num_heads, num_kv_heads, head_size,
                             num_partitions, 16)
