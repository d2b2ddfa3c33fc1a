"""The fast ggml decode: split-K ("flash-decoding") paged attention that reads llama.cpp block-type caches
(q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4; kvviz/families/ggml/format.py) in place, without the dequantise pass
and the f32 copy of the cache the first-wave path makes. Shaders ggml/decode_fast.wgsl (split; its code
rendered from the template ggml/decode_fast.wgsl.j2) + fast_decode's reduce (reduce_spec), unchanged; numpy
reference: the method's own (kvviz/families/ggml/oracle.py: gguf's dequantisation through the f32 decode's
arithmetic in float64); tests tests/test_fast_decode_ggml.py. Reuses fast_decode's pieces (layout rules,
plan_partitions, the subgroup probe, the loop-budget check, the reduce, the split kernel's template
attention/split_kernel.wgsl.j2).

Record: a token's record (one KV head) is its ggml row (D/32 blocks of 34 / 18 / 20 / 22 / 24 / 18 / 17
bytes, byte for byte as ggml lays them out) padded to whole u32 words; paged [num_blocks, kv_heads,
block_size, wpt] u32. Blocks are not word aligned, so:
  - lanes: L lanes share a token row (the most of 16, 8, 4, 2, 1 up to the subgroup size; 1 without
    subgroups: the fallback, no shuffles), lane l owns DPL consecutive dims that lie inside ONE
    32-element block (DPL 4, 8, 16, 32) or are whole blocks (DPL a multiple of 32, e.g. the one-lane
    layout): a lane never spans part of two blocks; where no such split of D into equal lane slices is narrow
    enough (96, 160, 224), the lanes walk the head with padding (fast_decode.lane_split);
  - byte extraction: every byte offset a lane needs (its block's header, its code bytes, q5's qh word) is a
    per-lane constant computed once; per token the lane loads the words covering its bytes (one more than
    their count, the last clamped inside the record) and funnel-shifts them into aligned words,
    (w[j] >> sr) | ((w[j+1] << ((32 - sr) & 31)) & hm) with hm = 0 when sr = 0 (WGSL shifts take the amount
    mod 32, so "shift by 32" is that select, not a shift);
  - the block's f16 scale d is the right half-word (unpack2x16float of the word shifted by 0 / 16), q4_1 /
    q5_1's (d, m) pair one aligned word (20b and 24b are multiples of 4), mxfp4's E8M0 byte 2^(e-128)
    (ggml_e8m0_to_fp32_half: its codes are the doubled E2M1 values), iq4_nl's codes index its 16 values
    (packed as signed bytes in four words, picked by selects), q5's fifth bit from the qh word;
  - the scale is folded, never applied per element: logit = sum over the lane's blocks of
    d * dot(q, codes) (+ m * sum q for q4_1 / q5_1, sum q a per-lane constant), P.V accumulates
    (p*d) * codes (+ p*m); online softmax in base 2 (q pre-scaled by scale*log2(e)); the L partial logits
    summed by subgroupShuffleXor; one workgroup serves the G query heads of a KV head; per head / vec4 /
    token unrolled (naga clamps dynamic private-array indices).

Tolerance against the float64 oracle over the same words: 2e-5 * max(1, max |V^|) absolute, V^ = the
dequantised values (gguf.quants.dequantize; fast_decode.f32_tolerance): f32 accumulation in another order,
exp2, the scale folded into the dot / the weight instead of multiplying each element.

A measured variant, off by default (plan's qk="i8"; fd.QK_VARIANTS): the query quantised to int8 on the host, one scale
a query head (fast_decode.query_records_i8: the int8 cache's quantiser, dims in order, so a lane's query words line up
with its blocks' 32 elements), and dotted with every type's integer codes by dot4I8Packed: q8_0's bytes, q4's nibbles,
q5's nibbles with the qh bit spread into bit 4, iq4_nl's and mxfp4's table values (int8: kvalues_iq4nl, and the E2M1
values doubled, which the E8M0 half-scale takes back). The logit of a lane's block is d * f32(dot - off * sum q) (q4_0 /
q5_0's offsets 8 / 16), d * f32(dot) + m * f32(sum q) (q4_1 / q5_1), d * f32(dot) (q8_0, iq4_nl, mxfp4), with sum q the
lane's query codes' sum there; the lanes' sum times the query scale (and scale*log2 e). The integer dot is exact (32
codes a block: |dot| <= 32 * 128 * 128 < 2^24), so against its own oracle (the float64 decode of the dequantised int8
query over the dequantised cache) the variant is as exact as the f32 kernel: tolerance(). Unrolled kernels only (the
looped kernel is the exact f32 one). Tests tests/test_fast_decode_ggml_i8.py; timed by kvviz bench --variants.

Shapes it cannot take (a head size that is not a multiple of 32 or is over 256, a GQA group outside 1..16, an
unknown type) raise UnsupportedShape from plan(); the methods then keep the first-wave path (ggml_blocks.py).
"""
from __future__ import annotations


import numpy as np

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.ggml import format as fg
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.templates import render_defines
from kvviz.attention import split_decode as fd
from kvviz.paging import PagedBatch


SPLIT = KernelSpec(
    "ggml/decode_fast.wgsl",
    bindings=ro("q", "kc", "vc", "block_tables", "context_lens") + rw("partials"),
    immediates=Struct("P", "num_kv_heads num_heads block_size max_blocks partition_tokens num_partitions scale_log2:f32"),
)
REDUCE = fd.REDUCE
KERNELS = (SPLIT, REDUCE)

# the types whose fast decode is done (the others keep the first-wave path until they are)
TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4")
# the types the int8-query variant (qk="i8") takes: every one, as each value is an integer times the block's scale (plus
# its min): q8_0's int8, q4 / q5's codes (less 8 / 16 for the _0 types), iq4_nl's int8 table values, mxfp4's doubled E2M1
# values (0..12 and their negatives) times the E8M0 half-scale
QK_I8_TYPES = TYPES
# fast_decode's layout rules for 4-byte code words, a lane's dims nesting with the 32-element blocks (96, 160, ...
# have no such power-of-two split but one a lane wider than fast_decode.DPL_MAX: there the lanes walk the head with
# padding, fast_decode.lane_split)
_FMT = fd.CacheFormat("ggml", 4, group_size=fg.BLOCK)


def tolerance(max_abs_v: float) -> float:
    """2e-5 x max(1, max |V^|): the f32 fast decodes' bound (fast_decode.f32_tolerance)."""
    return fd.f32_tolerance(max_abs_v)


def unsupported(type_name: str, head_size: int, group: int) -> str:
    """Why this decode cannot take the shape ("" when it can)."""
    if type_name not in TYPES:
        return f"the ggml type {type_name!r} has no fast decode (types: {', '.join(TYPES)})"
    if head_size <= 0 or head_size % fg.BLOCK:
        return f"head size {head_size} is not a multiple of 32 (llama.cpp's block)"
    if head_size > 256:
        return f"head size {head_size} is over 256 (the unrolled per-lane state would spill registers)"
    if group < 1 or group > 16:
        return f"a GQA group of {group} query heads per KV head is outside 1..16"
    return ""


# ---------------------------------------------------------------------------------- code generation
def _iq4_words() -> list[int]:
    return _table_words(fg.IQ4_NL_VALUES)


def _table_words(values) -> list[int]:
    """16 small integer values as signed bytes, four u32 words (value c is byte c % 4 of word c // 4)."""
    b = np.array(values, np.int8).view(np.uint8)
    return [int(x) for x in b.view(np.uint32)]


def prefetch_words(t: fg.GgmlType, lay: fd.Layout) -> int:
    """u32 words a lane loads for one step (K and V, U tokens): what the prefetch holds twice."""
    dpl = lay.dims_per_lane
    nseg = max(1, dpl // 32)
    n = min(dpl, 32)
    ncw = (n if t.name == "q8_0" else min(n, 16)) // 4  # code words (render's count: 4-bit codes share bytes)
    per_seg = 1 + ncw + 1 + (2 if t.qh else 0)  # header, codes, the extra word for the shift, q5's qh words
    return 2 * lay.unroll * nseg * per_seg


def render(t: fg.GgmlType, head_size: int, group: int, lay: fd.Layout, block_size: int = 0,
           prefetch: bool = False, scatter: bool = False, looped: bool = False, fold: bool = False,
           qk: str = "f32") -> dict:
    """The {{...}} values of ggml/decode_fast.wgsl for one type and shape. block_size > 0 renders the block
    size as a constant (fast_decode.render's const_block); 0 reads it from the immediates. prefetch: each
    step issues the next step's block-table reads and word loads before its arithmetic (fast_decode.render's
    software pipelining; same arithmetic, bit-identical outputs). scatter: fast_decode's reduce-scatter softmax
    (L >= 2): the owners broadcast p, each lane applies its own blocks' V scales. looped: the looped kernel
    (attention/split_looped.wgsl.j2 over ggml/records.wgsl.j2; fast_decode.render's looped). A layout whose lanes
    walk more dims than the head (padded) reads clamped blocks there and never writes them. fold: the reduce folded
    in (fast_decode.fold_defines; the spec is then fast_decode.folded(SPLIT)); the unrolled kernel only. qk "i8": the
    int8-query variant (the module's docstring; QK_I8_TYPES), the unrolled kernel only."""
    D, G, L, RG, U = head_size, group, lay.lanes, lay.row_groups, lay.unroll
    if scatter and L < 2:
        raise InvalidInput("the scatter softmax needs L >= 2 lanes a row")
    i8 = check_qk(t.name, qk)
    if i8 and looped:
        raise InvalidInput("the looped kernel is the exact f32 one: the qk='i8' variant is unrolled")
    dpl = lay.dims_per_lane
    n = min(dpl, 32)  # elements of one segment (the lane's part of one block)
    q8 = t.name == "q8_0"
    span = lay.span
    values = dict(
        t=t, D=D, G=G, L=L, RG=RG, U=U, dpl=dpl, nv=dpl // 4, stride=span + 2, n=n, nseg=max(1, dpl // 32),
        q8=q8, mx=t.name == "mxfp4", iq=t.name == "iq4_nl", iq4_words=_iq4_words(), pad=span > D, nblocks=D // fg.BLOCK,
        ncw=(n if q8 else min(n, 16)) // 4,  # code words of a segment (4-bit codes: two a byte)
        code_hdr=t.header + (4 if t.qh else 0), scatter=scatter, prefetch=prefetch,
        bsx=f"{block_size}u" if block_size > 0 else "p.block_size",
        i8=i8, qrec=D // 4 + 1,  # an int8 query record: D/4 code words + its f32 scale word
        tab8_words=_table_words(fg.MXFP4_VALUES if t.name == "mxfp4" else fg.IQ4_NL_VALUES),
    )
    if looped:
        values.update(fns="ggml/records.wgsl.j2", qfactor="p.scale_log2", span=span, chunks=lay.chunks, G=G // lay.chunks)
    return {
        "FORMAT": t.name, "D": str(D), "G": str(values["G"]), "L": str(L), "RG": str(RG), "U": str(U),
        "WG": str(lay.workgroup), "WPT": str(t.words_per_token(D)), "BPB": str(t.block_bytes), "DPL": str(dpl),
        "STRIDE": str(D + 2), "SHARED": "1" if looped else str(max(1, RG // 2) * G * (span + 2)),
        "Q_TYPE": "u32" if i8 else "f32", "VARIANT": "looped" if looped else fd.variant_name(qk),
        **render_defines("attention/split_looped.wgsl.j2" if looped else "ggml/decode_fast.wgsl.j2", **values),
        **fd.fold_defines(SPLIT, G, lay.workgroup, fold and not looped),
    }


def check_qk(type_name: str, qk: str) -> bool:
    """Whether `qk` asks for the int8-query variant (InvalidInput for an unknown one, UnsupportedShape for a type
    outside QK_I8_TYPES)."""
    if qk not in fd.QK_VARIANTS:
        raise InvalidInput(f"fast ggml decode variant qk={qk!r}: one of {fd.QK_VARIANTS}")
    if qk == "i8" and type_name not in QK_I8_TYPES:
        raise UnsupportedShape(f"fast ggml decode qk='i8' takes {', '.join(QK_I8_TYPES)}, not {type_name}",
                               "Use qk='f32' (the default) for this type.")
    return qk == "i8"


# ---------------------------------------------------------------------------------- launcher
GgmlDecodePlan = fd.SiblingPlan  # label: the type name


class GgmlFastDecode(fd.SiblingDecode):
    """Compiles and dispatches the fast ggml decode on one runtime."""

    name = "fast ggml decode"

    def layout(self, head_size: int, group: int, subgroups: bool | None = None, unroll: int = 2, rows: int = 0,
               lanes: int = 16) -> fd.Layout:
        return self._layout(_FMT, head_size, group, subgroups, unroll, rows, lanes)

    def kernel(self, type_name: str, head_size: int, group: int, block_size: int = 0, prefetch: bool | None = None,
               scatter: bool | None = None, looped: bool | None = None, fold: bool = False, qk: str = "f32", **kw):
        """prefetch None: where a lane's words of a step fit fast_decode.PREFETCH_MAX_WORDS (prefetch_words).
        scatter None: fast_decode.SCATTER where a row has 2+ lanes. looped None: fast_decode.use_looped (not when
        prefetch or scatter is given; never for qk "i8", which is unrolled). fold: the reduce folded in (unrolled
        only). Returns (kernel, layout, looped)."""
        looped = fd.fold_looped(fold, looped)
        if check_qk(type_name, qk):
            if looped:
                raise InvalidInput("the looped kernel is the exact f32 one: the qk='i8' variant is unrolled")
            looped = False
        most = self._fast.lane_cap(kw.get("subgroups"), kw.get("lanes", 16))
        lay, looped = self._looped(self.layout(head_size, group, **kw), group, looped, most, prefetch, scatter)
        t = fg.TYPES[type_name]
        if looped:
            prefetch = scatter = False
        if prefetch is None:
            prefetch = fd.PREFETCH and prefetch_words(t, lay) <= fd.PREFETCH_MAX_WORDS
        if scatter is None:
            scatter = fd.SCATTER and lay.lanes > 1
        spec = fd.folded(SPLIT) if fold else SPLIT
        return self.rt.compile(spec, **render(t, head_size, group, lay, block_size, prefetch, scatter, looped, fold,
                                              qk)), lay, looped

    def plan(self, type_name: str, k, v, num_kv_heads: int, q, batch: PagedBatch, scale: float, *,
             partition_tokens: int | None = None, subgroups: bool | None = None, unroll: int = 2, rows: int = 0,
             lanes: int = 16, const_block: bool = True, prefetch: bool | None = None,
             scatter: bool | None = None, looped: bool | None = None, fold: bool | None = None,
             qk: str = "f32") -> GgmlDecodePlan:
        """Dispatches of one decode (q [S, H, D] f32, one query per sequence) over the ggml caches `k`, `v`
        (GPU buffers of [num_blocks, kv_heads, block_size, wpt] u32 words, the method's writer's). fold: the reduce
        folded in (default fast_decode.FOLD; False: the separate reduce). qk "i8": the int8-query variant (the
        module's docstring), against its own oracle; the default "f32" is the exact kernel."""
        q, G = fd.check_query(q, batch, num_kv_heads, scale)
        S, H, D = q.shape
        why = unsupported(type_name, D, G)
        if why:
            raise UnsupportedShape(f"fast ggml decode: {why}", "The first-wave decode (dequantise + f32) takes this shape.")
        if unroll not in (1, 2, 4):
            raise InvalidInput(f"unroll must be 1, 2 or 4 tokens a row group per step, got {unroll}")
        kern, lay, looped = self.kernel(type_name, D, G, batch.block_size if const_block else 0, subgroups=subgroups,
                                        unroll=unroll, rows=rows, lanes=lanes, prefetch=prefetch, scatter=scatter,
                                        looped=looped, fold=fd.plan_fold(fold), qk=qk)
        label = type_name + (f" ({fd.variant_name(qk)})" if qk != "f32" else "")
        return self._launch(kern, lay, k, v, [], num_kv_heads, q, batch, scale, partition_tokens,
                            fg.TYPES[type_name].words_per_token(D), label, looped, fd.plan_fold(fold),
                            fd.query_records_i8(q) if qk == "i8" else None)

    def decode(self, type_name: str, k, v, num_kv_heads: int, q, batch: PagedBatch, scale: float, **kw) -> np.ndarray:
        """Run the fast decode: [num_seqs, num_heads, head_size] f32."""
        plan = self.plan(type_name, k, v, num_kv_heads, q, batch, scale, **kw)
        self.rt.run(plan.dispatches)
        return self.read(plan)


def decode_traffic(type_name: str, batch: PagedBatch, num_heads: int, num_kv_heads: int, head_size: int,
                   num_partitions: int) -> tuple[int, float]:
    """(unique bytes, flops) of one decode: fast_decode.decode_traffic with the ggml record (wpt words)."""
    return fd.record_traffic(type_name, fg.TYPES[type_name].words_per_token(head_size), batch, num_heads,
                             num_kv_heads, head_size, num_partitions)
