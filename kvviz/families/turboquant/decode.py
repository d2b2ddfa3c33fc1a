"""The fast TurboQuant decode: split-K ("flash-decoding") attention over TurboQuant's seed configuration (2-bit
polar keys + 1-bit QJL residual signs + f16 norms, 2-bit polar values + f16 norm), read in place, in two cache
layouts with the same arithmetic:

PAGED (plan_paged; the method's decode): per-token records in [num_blocks, num_kv_heads, block_size, WK | WV] u32,
keys [polar D/16 | jl D/32 | pack2x16float(n, rn)], values [polar D/16 | pack2x16float(n, 0)] (paged_words), written
by the general-settings compressor (tq_general_compress.wgsl) through the batch's slot mapping: at the seed
configuration it writes the seed compressor's words bit for bit (tests/test_fast_decode_tq_paged.py). Shader
turboquant/decode_fast_paged.wgsl reads the records through the block tables (the fast decodes' loads and prefetch;
the block size a compile-time constant): ONE split dispatch for the batch, grid (partitions, num_kv_heads,
num_seqs), into one partials buffer [S, H, P, D+2], and ONE reduce (turboquant/decode_fast_reduce.wgsl, grid (H, S, 1)).

Per sequence (plan; the reference beside it): TurboQuant's seed cache (kvviz/families/turboquant/kernels.TQCache: one buffer
pair per sequence, slot = kv_head * cache_cap + position, in regions), which the seed flash_attention_tq reads.
Shader turboquant/decode_fast.wgsl: one split dispatch per non-empty sequence (its own cache buffers AND its own partials
buffer; grid (its partitions, num_kv_heads, 1)), then one small reduce per non-empty sequence (grid
(num_heads, 1, 1)) into the shared output. wgpu orders consecutive dispatches that write the same buffer with a
barrier; since no two splits write the same buffer, the sequences' splits overlap, and the partitions are sized
for the whole batch (~480 workgroups over all sequences' KV heads). Only the reduces (tiny) are ordered among
themselves. A batch of one sequence (the long-context case) is one split + one reduce.

The seed flash_attention_tq stays as the reference. Numpy reference: the method's own
(kvviz/families/turboquant/oracle.attention_oracle, float64, over the same packed words; paged_attention_oracle gathers a
paged cache's records through the block tables); tests tests/test_fast_decode_tq.py, tests/test_fast_decode_tq_paged.py.

What it does:
  - the query is rotated once per decode by the seed's tq_rotate_q (q_rot, q_jl), all sequences in one
    dispatch; the split kernel pre-scales q_rot by scale*log2(e) and q_jl by qjl_scale*scale*log2(e);
  - per token: logit = n_k * (<q_rot, c[idx]> + rn * <q_jl, 2 bits - 1>) (the seed's estimator), the 4
    centroids selected per 2-bit code (vec4 selects), the QJL term as a sign flip of q_jl (xor of the f32
    sign bit), online softmax in base 2;
  - values accumulate n_v * p * c[vidx] in the rotated space; the reduce combines the partitions
    (M, L, acc), divides by L and applies the inverse RHT (WHT / sqrt(D), then the polar signs) once per
    output row, as the seed's epilogue and the oracle do;
  - the context of each sequence is split into partitions (fast_decode.plan_partitions: ~480 workgroups
    over all live sequences' KV heads), one workgroup per (partition, KV head, sequence) serving
    the G query heads of the KV head's GQA group; L lanes share a token row (L = D/16 or the subgroup
    size, whichever is smaller; 1 without subgroups: the fallback), partial logits summed by
    subgroupShuffleXor; the row groups of a workgroup merge through workgroup memory.

Tolerance against the float64 oracle over the same codes: 2e-5 * max(1, max |V^|) absolute, V^ = the
dequantised values n_v * RHT^-1(c[vidx]) (the f32 fast decodes' bound; f32 accumulation in another order,
exp2, f32 centroids).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvviz.attention import split_decode as fd
from kvviz.errors import InvalidInput, UnsupportedShape, require_f32
from kvviz.families.turboquant import format as tqf, kernels as tqk
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.templates import render_defines
from kvviz.gpu.runtime import Dispatch

LOG2E = fd.LOG2E

SPLIT = KernelSpec(
    "turboquant/decode_fast.wgsl",
    bindings=ro("qrot", "kc", "vc") + rw("partials"),
    immediates=Struct("P", "num_heads num_kv_heads cache_cap seq_len seq partition_tokens num_partitions q_region "
                      "scale_log2:f32 qjl_log2:f32 c0:f32 c1:f32 c2:f32 c3:f32"),
)
REDUCE = KernelSpec("turboquant/decode_fast_reduce.wgsl", bindings=ro("partials", "signs") + rw("out"),
                    immediates=Struct("P", "num_heads head_size num_partitions sign_off out_seq inv_sqrt_d:f32"))
# the paged variant's split (turboquant/decode_fast_paged.wgsl): the batch's block tables, one dispatch for every sequence
PAGED_SPLIT = KernelSpec(
    "turboquant/decode_fast_paged.wgsl",
    bindings=ro("qrot", "kc", "vc", "block_tables", "context_lens") + rw("partials"),
    immediates=Struct("P", "num_heads num_kv_heads block_size max_blocks partition_tokens num_partitions q_region "
                      "scale_log2:f32 qjl_log2:f32 c0:f32 c1:f32 c2:f32 c3:f32"),
)
KERNELS = (SPLIT, REDUCE, PAGED_SPLIT)


def reduce_butterfly_loops(D: int) -> int:
    """Loop iterations of decode_tq_reduce.wgsl beyond its loops over the partitions (those of decode_reduce.wgsl:
    fast_decode.chunked_reduce_loops): the inverse rotation's butterfly loop, log2 D steps, charged + 2."""
    return max(1, math.ceil(math.log2(max(2, D)))) + 2


# the generator's record: 16 two-bit codes a polar word (fd.choose_layout then gives lanes owning whole words)
TQ_FORMAT = fd.CacheFormat("turboquant", 16)


def tolerance(max_abs_v: float) -> float:
    """2e-5 x max(1, max |V^|): the f32 fast decodes' bound (fast_decode.f32_tolerance)."""
    return fd.f32_tolerance(max_abs_v)


def unsupported(head_size: int, group: int) -> str:
    """Why this decode cannot take the shape ("" when it can): the seed layout's head sizes, GQA 1..16."""
    if head_size not in tqf.SEED_HEAD_SIZES:
        return f"head size {head_size} is not one of the seed layout's {tqf.SEED_HEAD_SIZES}"
    if group < 1 or group > 16:
        return f"a GQA group of {group} query heads per KV head is outside 1..16"
    return ""


def render(head_size: int, group: int, lay: fd.Layout, paged: bool = False, block_size: int = 0,
           prefetch: bool = False, scatter: bool = False, looped: bool = False, i8: bool = False) -> dict:
    """The {{...}} values of turboquant/decode_fast.wgsl (per-sequence cache) or, with `paged`, of
    turboquant/decode_fast_paged.wgsl (per-token records [num_blocks, kv_heads, block_size, WK | WV] read through the
    block tables; the loads are the fast decodes', with their prefetch; block_size > 0 renders the block
    size as a constant, 0 reads it from the immediates). The arithmetic is the same in both; the code is rendered
    from the template turboquant/decode_fast.wgsl.j2. scatter: fast_decode's reduce-scatter softmax (L >= 2; the
    owners apply the token's norms). looped (paged only): attention/split_looped.wgsl.j2's code over
    turboquant/records.wgsl.j2 (fast_decode.render's looped; the QJL term its aux query). i8 (paged, unrolled): the
    int8-query variant (query_records_i8; a codebook symmetric about 0, symmetric_codebook)."""
    D, G, L, RG, U = head_size, group, lay.lanes, lay.row_groups, lay.unroll
    if i8 and (looped or not paged):
        raise InvalidInput("the int8-query TurboQuant decode is the paged unrolled kernel")
    if i8 and lay.dims_per_lane * L != D:
        raise UnsupportedShape(f"the int8-query TurboQuant decode needs lanes owning whole polar words of the head: "
                               f"{L} lanes x {lay.dims_per_lane} dims is not {D}")
    if scatter and L < 2:
        raise InvalidInput("the scatter softmax needs L >= 2 lanes a row")
    if looped and not paged:
        raise InvalidInput("the looped TurboQuant decode reads the paged records only")
    dpl = lay.dims_per_lane
    values = dict(D=D, G=G, L=L, RG=RG, U=U, dpl=dpl, nv=dpl // 4, wpl=dpl // 16, stride=D + 2, paged=paged,
                  scatter=scatter, prefetch=prefetch and paged,  # the per-sequence cache's loads are not pipelined
                  bsx=f"{block_size}u" if block_size > 0 else "p.block_size",
                  i8=i8, qrec=query_record_words(D))
    if looped:
        values.update(fns="turboquant/records.wgsl.j2", qfactor="p.scale_log2", qbuf="qrot", aux=True,
                      aux_offset="p.q_region", aux_factor="p.qjl_log2", span=lay.span, chunks=lay.chunks,
                      G=G // lay.chunks)
    return {
        "D": str(D), "G": str(values["G"]), "L": str(L), "RG": str(RG), "U": str(U), "WG": str(lay.workgroup),
        "PW": str(D // 16), "JW": str(D // 32), "DPL": str(dpl), "WPL": str(dpl // 16), "STRIDE": str(D + 2),
        "SHARED": "1" if looped else str(max(1, RG // 2) * G * (D + 2)),
        **render_defines("attention/split_looped.wgsl.j2" if looped else "turboquant/decode_fast.wgsl.j2", **values),
    } | ({"WK": str(tqf.key_bytes_per_vector(D) // 4), "WV": str(tqf.value_bytes_per_vector(D) // 4),
           "QT": "u32" if i8 else "f32"} if paged else {})


def symmetric_codebook(centroids) -> bool:
    """Whether (c3 - c2) - (c1 - c0) is 0 in float32: a code's b0 b1 term, which the int8-query kernel leaves out (the
    Lloyd-Max codebook of a rotated coordinate is symmetric about 0: c3 = -c0, c2 = -c1)."""
    c = np.asarray(centroids, np.float32)
    return float((c[3] - c[2]) - (c[1] - c[0])) == 0.0


def query_record_words(head_size: int) -> int:
    """u32 words of a query head's int8 record: D/4 polar code words, D/4 QJL code words, the two f32 scales."""
    return head_size // 2 + 2


def query_records_i8(q_rot: np.ndarray, q_jl: np.ndarray) -> np.ndarray:
    """The int8 query the qk="i8" kernel reads: [S, H, D/2 + 2] u32. q_rot and q_jl [S, H, D] f32 (the rotation's
    output, format.rotate_q_parts) each quantised by fast_decode.quantize_query (one scale a head); a polar word's 16
    codes as 4 query words (j, k) -> element j + 4k, a QJL word's 32 as 8 words (j, k) -> element j + 8k: the order of
    the kernel's masks (turboquant/decode_fast.wgsl.j2). Then the two scales."""
    cr, sr = fd.quantize_query(q_rot)
    cj, sj = fd.quantize_query(q_jl)
    S, H, D = cr.shape
    cr = cr.reshape(S, H, D // 16, 4, 4).transpose(0, 1, 2, 4, 3).reshape(S, H, D)
    cj = cj.reshape(S, H, D // 32, 4, 8).transpose(0, 1, 2, 4, 3).reshape(S, H, D)
    return np.concatenate([np.ascontiguousarray(cr).view(np.uint32), np.ascontiguousarray(cj).view(np.uint32),
                           sr.view(np.uint32)[..., None], sj.view(np.uint32)[..., None]], -1)



@dataclass
class TQDecodePlan:
    """One fast TurboQuant decode: the rotation (run first; the seed's tq_rotate_q), the split + reduce
    dispatches (what a timing row times), where the output lands and how the context was split."""

    rotate: list
    dispatches: list
    out: object  # [S, H, D] f32 buffer
    shape: tuple[int, int, int]
    partition_tokens: int
    num_partitions: int  # the most partitions of any sequence (each sequence's partials hold its own)
    layout: fd.Layout
    paged: bool = False  # plan_paged: the paged records, one split + one reduce for the batch
    looped: bool = False  # the looped kernel (attention/split_looped.wgsl.j2; paged only), else the unrolled one
    qk: str = "f32"  # "i8": the int8-query variant (paged only)

    def describe(self) -> str:
        L = self.layout
        return (f"{self.num_partitions} partition(s) of {self.partition_tokens} tokens, {L.workgroup} threads "
                f"({L.row_groups} rows x {L.lanes} lanes, {L.unroll} tokens a row per step), "
                + ("paged records, one split dispatch" if self.paged else "per-sequence caches")
                + (", int8 query" if self.qk == "i8" else "")
                + fd.looped_note(self.looped, L))


class TQFastDecode:
    """Compiles and dispatches the fast TurboQuant decode on one runtime."""

    def __init__(self, rt):
        self.rt = rt
        self._fast = fd.FastDecode(rt)  # the subgroup probe and the loop-budget check

    def layout(self, head_size: int, group: int, subgroups: bool | None = None, unroll: int = 2,
               rows: int = 0, lanes: int = 16) -> fd.Layout:
        return self._fast.layout(TQ_FORMAT, head_size, group, subgroups, unroll, rows, lanes)

    def kernel(self, head_size: int, group: int, scatter: bool | None = None, **kw):
        """scatter None: fast_decode.SCATTER where a row has 2+ lanes (render's scatter)."""
        lay = self.layout(head_size, group, **kw)
        sc = fd.SCATTER and lay.lanes > 1 if scatter is None else scatter
        return self.rt.compile(SPLIT, **render(head_size, group, lay, scatter=sc)), lay

    def plan(self, caches, q, context_lens, scale: float, qjl_scale="reference", *, partition_tokens: int | None = None,
             subgroups: bool | None = None, unroll: int = 2, rows: int = 0, lanes: int = 16,
             scatter: bool | None = None) -> TQDecodePlan:
        """Decode of one query per sequence (q [S, H, D] f32) at its last position, attending over positions
        [0, context_lens[s]) of `caches[s]` (TQCache, kvviz.families.turboquant.kernels; None or length 0: no tokens,
        output 0)."""
        q = require_f32("q", q, "[num_seqs, num_heads, head_size]", 3)
        S, H, D = q.shape
        lens = [int(x) for x in np.asarray(context_lens).reshape(-1)]
        if len(caches) != S or len(lens) != S:
            raise InvalidInput(f"q has {S} sequences, {len(caches)} caches and {len(lens)} context lengths were given")
        live = [c for c, n in zip(caches, lens) if c is not None and n > 0]
        if not live:
            raise InvalidInput("no sequence has a context: nothing to attend to")
        kvh = live[0].n_kv_heads
        params = live[0].params
        for s, (c, n) in enumerate(zip(caches, lens)):
            if n < 0:
                raise InvalidInput(f"sequence {s} has a negative context length {n}")
            if c is None or n == 0:
                continue
            if c.n_kv_heads != kvh or c.head_size != D or c.params != params:
                raise InvalidInput(f"sequence {s}'s cache ({c.n_kv_heads} KV heads, head size {c.head_size}, seed "
                                   f"{c.seed}, layer {c.layer}) differs from the batch's ({kvh}, {D}, {params.seed}, "
                                   f"{params.layer})")
            if n > c.cache_cap or not c.written[:n].all():
                raise InvalidInput(f"sequence {s}: positions [0, {n}) are not all written in its cache of "
                                   f"{c.cache_cap} positions", "Compress every position the query attends to first.")
        tqk.check_gqa(H, kvh)
        G = H // kvh
        why = unsupported(D, G)
        if why:
            raise UnsupportedShape(f"fast TurboQuant decode: {why}", "The seed flash_attention_tq takes this shape.")
        if not np.isfinite(scale) or scale <= 0:
            raise InvalidInput(f"the attention scale must be a positive finite number, got {scale}")
        qs = float(np.float32(tqk.resolve_qjl_scale(qjl_scale, D)))
        if unroll not in (1, 2, 4):
            raise InvalidInput(f"unroll must be 1, 2 or 4 tokens a row group per step, got {unroll}")
        kern, lay = self.kernel(D, G, scatter, subgroups=subgroups, unroll=unroll, rows=rows, lanes=lanes)
        mcl = max(lens)
        # each sequence's split writes its OWN partials buffer: no two splits share a written buffer, so wgpu
        # puts no barrier between them and they overlap; partitions are sized for the whole batch (~480 workgroups
        # over every live sequence's KV heads, fast_decode.plan_partitions)
        pt, P = fd.split_context(partition_tokens, fd.plan_partitions(len(live), kvh, mcl, lay.tokens_per_step),
                                 lay.tokens_per_step, mcl)
        fd.check_grid(self.rt, "fast TurboQuant decode",
                      (("partitions", P), ("KV heads", kvh), ("query heads", H), ("sequences", S)))
        self._fast._check_loops(pt, lay, P, fd.chunked_reduce_loops(P) + reduce_butterfly_loops(D))
        rot, qrot, q_cap = tqk.TurboQuantKernels(self.rt).rotate_q_dispatches(q, params, live[0].signs)
        q_region = q_cap * H * D
        out = self.rt.empty(S * H * D * 4, "fast_decode_tq_out")  # zero-filled: a sequence without tokens is 0
        c = [float(x) for x in params.centroids]
        sl2 = float(scale) * LOG2E
        red = self.rt.compile(REDUCE)
        splits, reduces = [], []
        for s, (cache, n) in enumerate(zip(caches, lens)):
            if cache is None or n == 0:
                continue
            ps = math.ceil(n / pt)
            # this sequence's partials [H, ps, D + 2]: its own buffer (zero-filled: l = 0, skipped)
            partials = self.rt.empty(H * ps * (D + 2) * 4, f"fast_decode_tq_partials_{s}")
            imm = kern.pack(H, kvh, cache.cache_cap, n, s, pt, ps, q_region, sl2, qs * sl2, *c)
            splits.append(Dispatch(kern, [qrot, cache.k, cache.v, partials], (ps, kvh, 1), imm))
            # the reduces all write `out` (ordered after every split; H workgroups each, small)
            reduces.append(red.dispatch((H, 1, 1), [partials, live[0].signs, out], H, D, ps,
                                        params.sign_off, s, float(tqf.inv_sqrt_d(D))))
        ds = splits + reduces
        return TQDecodePlan(rot, ds, out, (S, H, D), pt, P, lay)

    def paged_kernel(self, head_size: int, group: int, block_size: int = 0, prefetch: bool | None = None,
                     scatter: bool | None = None, looped: bool | None = None, i8: bool = False, **kw):
        """The paged split kernel (render(..., paged=True)); prefetch None: fast_decode.PREFETCH where a lane's
        words of a step fit fast_decode.PREFETCH_MAX_WORDS, as the other paged fast decodes. looped None:
        fast_decode.use_looped (not when prefetch or scatter is given; never for i8, the int8-query variant, which is
        unrolled). Returns (kernel, layout, looped)."""
        lay = self.layout(head_size, group, **kw)
        if i8:
            if looped:
                raise InvalidInput("the looped TurboQuant decode is the exact f32-query one: the qk='i8' variant is "
                                   "unrolled", "Leave looped unset (or False) with qk='i8'.")
            looped = False
        looped = fd.use_looped(self.rt, looped, prefetch, scatter,
                               wide=fd.wide_layout(lay, self._fast.lane_cap(kw.get("subgroups"), kw.get("lanes", 16))))
        if looped:
            limit = int(self.rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)
            lay, prefetch, sc = fd.looped_layout(lay, group, limit), False, False
        else:
            if prefetch is None:
                prefetch = fd.PREFETCH and paged_step_words(head_size, lay) <= fd.PREFETCH_MAX_WORDS
            sc = fd.SCATTER and lay.lanes > 1 if scatter is None else scatter
        defines = render(head_size, group, lay, True, block_size, prefetch, sc, looped, i8)
        return self.rt.compile(PAGED_SPLIT, **defines), lay, looped

    def plan_paged(self, k, v, num_kv_heads: int, q, batch, scale: float, params: tqf.TQParams,
                   qjl_scale="reference", *, signs=None, partition_tokens: int | None = None,
                   subgroups: bool | None = None, unroll: int = 2, rows: int = 0, lanes: int = 16,
                   prefetch: bool | None = None, const_block: bool = True, scatter: bool | None = None,
                   looped: bool | None = None, qk: str = "f32") -> TQDecodePlan:
        """Decode of one query per sequence (q [S, H, D] f32) at its last position over the PAGED seed-configuration
        records: `k` / `v` GPU buffers of [num_blocks, num_kv_heads, block_size, WK | WV] u32 (paged_words; written by
        tq_general_compress through the batch's slot mapping), read through batch.block_tables for positions
        [0, context_lens[s]) (0: no tokens, output 0). params: the rotation's head size, seed and layer; signs: a
        buffer of params.signs_buffer() (uploaded when None). One rotation, ONE split dispatch (grid (partitions,
        KV heads, sequences)) and ONE reduce (grid (H, S)) for the whole batch. qk "i8": the int8-query variant (the
        query rotated on the host by format.rotate_q_parts and quantised, query_records_i8; no rotation dispatch)."""
        if qk not in fd.QK_VARIANTS:
            raise InvalidInput(f"fast TurboQuant decode variant qk={qk!r}: one of {fd.QK_VARIANTS}")
        i8 = qk == "i8"
        if i8 and not symmetric_codebook(params.centroids):
            raise UnsupportedShape("the int8-query TurboQuant decode takes a codebook symmetric about 0",
                                   "Use qk='f32' (the default) for this codebook.")
        q, G = fd.check_query(q, batch, num_kv_heads, scale)
        S, H, D = q.shape
        kvh = int(num_kv_heads)
        if params.head_size != D:
            raise InvalidInput(f"q has head size {D}, the TurboQuant parameters {params.head_size}")
        why = unsupported(D, G)
        if why:
            raise UnsupportedShape(f"fast TurboQuant decode: {why}", "The seed flash_attention_tq takes this shape.")
        if unroll not in (1, 2, 4):
            raise InvalidInput(f"unroll must be 1, 2 or 4 tokens a row group per step, got {unroll}")
        batch.validate()
        lens = np.asarray(batch.context_lens, np.int64)
        bt = np.ascontiguousarray(batch.block_tables, dtype=np.uint32)
        if bt.ndim != 2 or bt.shape[0] != S or bt.shape[1] < 1:
            raise InvalidInput(f"block_tables must be [{S}, max_blocks] with max_blocks >= 1, got {bt.shape}")
        # the prefetching loads of a sequence without tokens read its block-table entry 0 (never used)
        if S and int(bt[:, 0].max()) >= batch.num_blocks:
            s = int(np.argmax(bt[:, 0]))
            raise InvalidInput(f"block table of sequence {s} names block {int(bt[s, 0])} in entry 0, but the pool has "
                               f"{batch.num_blocks} blocks", "Block ids must be < num_blocks (unused entries 0).")
        wk, wv = paged_words(D)
        for name, buf, w in (("K", k, wk), ("V", v, wv)):
            need = batch.num_blocks * kvh * batch.block_size * w * 4
            if buf.size < need:
                raise InvalidInput(f"fast TurboQuant decode: the {name} cache holds {buf.size} bytes, the batch's "
                                   f"{batch.num_blocks} blocks of {kvh} KV heads x {batch.block_size} records of {w} "
                                   f"words need {need}")
        qs = float(np.float32(tqk.resolve_qjl_scale(qjl_scale, D)))
        kern, lay, looped = self.paged_kernel(D, G, batch.block_size if const_block else 0, prefetch, scatter, looped,
                                              i8, subgroups=subgroups, unroll=unroll, rows=rows, lanes=lanes)
        mcl = int(lens.max(initial=0))
        pt, P = fd.split_context(partition_tokens, self._fast.planned_tokens(S, kvh, mcl, lay, G, looped),
                                 lay.tokens_per_step, mcl)
        fd.check_grid(self.rt, "fast TurboQuant decode", (("partitions", P), ("KV heads", kvh * lay.chunks),
                                                          ("query heads", H), ("sequences", S)))
        self._fast._check_loops(pt, lay, P, fd.chunked_reduce_loops(P) + reduce_butterfly_loops(D), G, looped)
        if signs is None:
            signs = self.rt.upload(params.signs_buffer(), "tq_signs")
        if i8:
            q_rot, q_jl, _ = tqf.rotate_q_parts(q, params)
            rot, qrot, q_cap = [], self.rt.upload(query_records_i8(q_rot, q_jl), "tq_query_i8"), 0
        else:
            rot, qrot, q_cap = tqk.TurboQuantKernels(self.rt).rotate_q_dispatches(q, params, signs)
        partials = self.rt.empty(S * H * P * (D + 2) * 4, "fast_decode_tq_paged_partials")  # zero-filled: l = 0
        out = self.rt.empty(S * H * D * 4, "fast_decode_tq_paged_out")
        sl2 = float(scale) * LOG2E
        imm = kern.pack(H, kvh, batch.block_size, bt.shape[1], pt, P, q_cap * H * D, sl2, qs * sl2,
                        *[float(x) for x in params.centroids])
        bufs = [qrot, k, v, self.rt.upload(bt, "block_tables"), self.rt.upload(lens.astype(np.uint32), "context_lens"),
                partials]
        ds = [Dispatch(kern, bufs, (P, kvh * lay.chunks, S), imm),
              self.rt.compile(REDUCE).dispatch((H, S, 1), [partials, signs, out], H, D, P, params.sign_off, 0,
                                               float(tqf.inv_sqrt_d(D)))]
        return TQDecodePlan(rot, ds, out, (S, H, D), pt, P, lay, True, looped, qk)

    def decode_paged(self, k, v, num_kv_heads: int, q, batch, scale: float, params: tqf.TQParams,
                     qjl_scale="reference", **kw) -> np.ndarray:
        """Run the paged fast decode: [num_seqs, num_heads, head_size] f32."""
        plan = self.plan_paged(k, v, num_kv_heads, q, batch, scale, params, qjl_scale, **kw)
        self.rt.run(plan.rotate + plan.dispatches)
        return self.read(plan)

    def read(self, plan: TQDecodePlan) -> np.ndarray:
        return self.rt.read(plan.out, np.float32, plan.shape)

    def decode(self, caches, q, context_lens, scale: float, qjl_scale="reference", **kw) -> np.ndarray:
        """Run the fast decode: [num_seqs, num_heads, head_size] f32."""
        plan = self.plan(caches, q, context_lens, scale, qjl_scale, **kw)
        self.rt.run(plan.rotate + plan.dispatches)
        return self.read(plan)


def decode_traffic(caches, context_lens, num_heads: int, head_size: int, num_partitions: int) -> tuple[int, float]:
    """(unique bytes, flops) of the split + reduce: every context token's K record (polar + QJL words + norm
    word) and V record (polar words + norm word) of each KV head read once, the rotated query (q_rot, q_jl)
    read, the partials written and read back, the signs and the output; flops = 2 x D x (QK + PV) per
    (token, query head)."""
    D = head_size
    lens = [int(x) for x in np.asarray(context_lens).reshape(-1)]
    kvh = next((c.n_kv_heads for c, n in zip(caches, lens) if c is not None and n), 0)
    tokens = sum(lens)
    S = len(lens)
    rec = tqf.key_bytes_per_vector(D) + tqf.value_bytes_per_vector(D)
    kv = tokens * kvh * rec
    q = sum(1 for n in lens if n) * num_heads * 2 * D * 4
    partials = 2 * S * num_heads * num_partitions * (D + 2) * 4
    out = S * num_heads * D * 4 + D * 4
    return int(kv + q + partials + out), float(4 * D * num_heads * tokens)


def paged_words(head_size: int) -> tuple[int, int]:
    """(WK, WV): u32 words of a key and of a value record of the paged seed-configuration cache (the general
    layout at bits 2 / v_bits 2 without outliers: keys [polar D/16 | jl D/32 | norms], values [polar D/16 | norm])."""
    return tqf.key_bytes_per_vector(head_size) // 4, tqf.value_bytes_per_vector(head_size) // 4


def paged_step_words(head_size: int, lay: fd.Layout) -> int:
    """Words a lane loads a step (the prefetch's extra registers): per token its polar words of K and V, its QJL
    word(s) and the two norm words."""
    wpl = lay.dims_per_lane // 16
    return lay.unroll * (2 * wpl + max(1, wpl // 2) + 2)


def decode_traffic_paged(batch, num_heads: int, num_kv_heads: int, head_size: int, num_partitions: int) -> tuple[int, float]:
    """(unique bytes, flops) of the paged split + reduce: every context token's K and V record of each KV head
    read once, the block-table entries, the rotated query (q_rot, q_jl) read, the partials written and read back,
    the signs and the output; flops = 2 x D x (QK + PV) per (token, query head)."""
    D = head_size
    lens = np.asarray(batch.context_lens, np.int64)
    tokens = int(lens.sum())
    S = len(lens)
    wk, wv = paged_words(D)
    kv = tokens * num_kv_heads * (wk + wv) * 4
    tables = int(sum(-(-int(n) // batch.block_size) for n in lens)) * 4 * num_kv_heads
    q = S * num_heads * 2 * D * 4
    partials = 2 * S * num_heads * num_partitions * (D + 2) * 4
    out = S * num_heads * D * 4 + D * 4
    return int(kv + tables + q + partials + out), float(4 * D * num_heads * tokens)
