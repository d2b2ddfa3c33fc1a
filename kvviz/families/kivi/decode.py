"""The fast KIVI decode: split-K ("flash-decoding") attention over KIVI's paged cache (keys per channel over
groups of 32 tokens, values per token, 2 or 4 bits, the recent tokens in an f32 residual buffer), read in
place. Shaders kivi/decode_fast.wgsl (split, rendered here) + fast_decode.reduce_spec's reduce (the fast decode's
reduce, shared). Numpy reference: the method's own (kvviz/families/kivi/oracle.method_attention: the oracle's
dequantised caches through the f32 decode's arithmetic, float64); tests tests/test_fast_decode_kivi.py.
The first-wave path (kivi_dequant.wgsl into an f32 paged cache, then the f32 paged decode) stays as the
fallback and as a timed row beside this one.

Layout (kvviz/families/kivi/format.py; KW = D*bits/32 code words a token, WS = D*bs/16 side words a block):
K [num_blocks, kv_heads, bs*KW + WS] (codes, then the sequence's side stream: word 2D*g + 2c = scale, +1 =
zero of channel c for key group g, stream word o in the sequence's logical block o // WS at o % WS),
V [num_blocks, kv_heads, bs*(KW + 2)] (codes, f32 scale, f32 zero per token), res [rows, 2, kv_heads, D]
f32, and the method's `info` buffer: plan.seq_info() [S, 4] = (context_len, n_q, res_off, 0) followed by
the block tables.

What it does:
  - grid (partitions, KV heads, sequences); one workgroup serves the G query heads of a KV head, so every
    K/V word is loaded once for G heads; partitions are a multiple of 32 tokens (fast_decode.plan_partitions
    with a 32-token step: ~480 workgroups, 256..4096 tokens), so a key group never straddles partitions;
  - L lanes share a token row (fast_decode.choose_layout for 32/bits codes a word: a lane owns whole code
    words; where that leaves a lane over 16 channels, e.g. head 80 / 112 at 16 codes a word, a split into
    more lanes of 4-channel multiples, each vec4 reading the word that holds it; L = 1 without subgroups),
    the partial logits are summed by subgroupShuffleXor;
  - quantised keys: a row group takes TG tokens (32, 16 or 8) of one key group at a time (R = 32/TG row
    groups share a group, a sweep covers RG/R groups). Per group each lane reads its channels' (scale,
    zero) pairs once and FOLDS the dequantisation into the query: k = code*s + z, so
    q.k = sum_c (q_c s_c) code_c + sum_c q_c z_c; qk = q*s and the lane's bias sum q_c z_c (q pre-scaled by
    scale*log2 e) are computed once per group and every token's logit is dot(qk, codes) + bias: the codes
    go straight into the dot, no dequantised key, no f32 copy of the cache;
  - values per token: p*(code*s + z) = (p*s)*code + p*z. (p*s)*code is an FMA into the accumulator;
    p*z goes into ONE scalar per head (rescaled with the online max like the accumulator) that is added
    to every channel once after the loops. Chosen over folding z into each code (fma(code, s, z) per
    vec4) because that costs D/L FMAs a token and lane, the scalar G FMAs; the results differ by f32
    rounding only (the tolerance covers it);
  - software-pipelined loads (prefetch; the loads of the other fast decodes, attention/split_macros.wgsl.j2,
    with the KIVI walk and rows): each quantised step issues the NEXT step's block-table reads and K / V words (codes,
    V scale and zero) before its own arithmetic, at a key group's last step those of the next sweep's group,
    the prologue loads the first step's (clamped to a token that exists when the partition has no key
    group), and the step closes by rotating them in: the two dependent latencies (block table -> words)
    overlap a step's arithmetic; same arithmetic, bit-identical outputs. Default (plan's prefetch None,
    use_prefetch): on where a lane's words of a step (prefetch_words: U x (2 code words + 2), 8..24 at the
    subgroup layouts) fit fast_decode.PREFETCH_MAX_WORDS, as the ggml decode resolves it; off for the
    one-lane layout of a large head. Not pipelined: a key group's (scale, zero) loads (once per TG / U
    steps; 8 words a vec4 a lane, which a second copy would hold across the whole group) and the residual
    window's f32 rows (no block table, so one latency; 2 x DPL floats a token a lane, over the register
    budget the f32 fast decode's prefetch measured slower at; usually one partition's last few steps);
  - the residual window [n_q, L) (n_q a multiple of 32): a second loop in the same workgroup over the f32
    rows of the partition's part of [n_q, L) (the f32 fast decode's step: U tokens a row group), with
    the same online-softmax state; usually only the last partition of a sequence has residual rows;
  - the row groups merge through workgroup memory (the fast decode's tree), row group 0 writes the
    partition's [m, l, acc] to partials and the fast decode's reduce combines the partitions (an empty
    sequence gives 0).

Shapes: bits 2 / 4; the padded head size (a multiple of 16, the method pads) up to 256; GQA 1..16; a block
size with D*bs a multiple of 128 (every (scale, zero) vec4 of a lane's side words then lies in one block;
bs >= 8 always qualifies). Anything else raises UnsupportedShape (the method then keeps the first-wave path).

Tolerance against the oracle (method_attention / through_f32_decode over the same words): 2e-5 *
max(1, max |V^|) absolute, V^ = the dequantised values (fast_decode.f32_tolerance: f32 accumulation in
another order, exp2, the folded scale / zero).

A variant, off by default (plan's qk="i8"; fast_decode.QK_VARIANTS): the keys' logits by dot4I8Packed of an int8 query
with the K codes. A query quantised once on the host cannot serve, as the folded query qk = q*s has a scale per
channel and key group; so GROUP quantises qk itself, once per key group and query head (shaders/kivi/query_i8.wgsl):
  - m = max_c |qk_c| over the head (each lane's channels, then the row's L lanes by subgroupShuffleXor, as the partial
    logits are summed; L = 1 without subgroups); with m = f * 2^k, f in [0.5, 1) (k from m's f32 exponent bits), the
    step is 2^(k-7) and the codes clamp(round(qk_c * 2^(7-k)), -127, 127); 2^(7-k) and 2^(k-7) are built by bit
    operations, so the multiply by them is exact and the codes are the oracle's bit for bit (WGSL's round and numpy's
    rint both round half to even). m below 2^-119 (zero, subnormal, tiny) gives all-zero codes and step 0 (whether a
    GPU flushes a subnormal qk_c to zero then changes no code); an infinite m (q*s overflowed f32) a NaN step, so the
    output is refused as non-finite, as the exact kernel's is there;
  - the codes go 4 a word in the order the K codes' bytes come out of a code word: 4-bit, its even then its odd
    nibbles (w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F, as the int4 cache's int8 query); 2-bit, (w >> 2j) & 0x03030303
    for j = 0..3 (codes j, j+4, j+8, j+12); lanes that do not own whole code words (head 80 at 4 lanes) take a vec4's 4
    codes by pack4xU8 of its shifted codes, the query's in dim order. K's codes are 0..2^bits - 1, so the signed
    byte dot is the codes' dot;
  - a token's logit is f32(sum of the lane's dot4I8Packed) * step + bz, bz = sum_c q_c z_c in f32 as in the exact
    kernel; the lanes' sum, the softmax, P.V and the residual rows (the f32 query) are the exact kernel's code.
Unrolled kernels only (looped=True with qk="i8" is refused; looped None means False); the scatter and the all-lane
softmax, the prefetch, padded lanes, lanes that do not own whole code words and the one-lane layout all take it.
Oracle: oracle.attention_i8 (method_attention_i8 end to end): q pre-scaled by f32(scale*log2 e) and times the group's
scales in float32, one multiply each as the kernel makes them, requantised by oracle.requantize_query (the kernel's
codes and steps exactly), then the float64 attention over those codes: logit = step * (codes . K codes) + q . z, the
residual's q . k, softmax in base 2.
Tolerance against it: the f32 kernel's, 2e-5 * max(1, max |V^|) (tolerance()). The integer dot is exact (|dot| <= D *
127 * 15 < 2^24, so f32 of it is, and so is its product with the power-of-two step); what rounds is the bias's sum
and its addition, the lanes' sum, exp2, the softmax and P.V: steps the exact kernel takes on terms of the same size,
where it also rounds D products q_c s_c code_c and their sum. So the variant's error against its oracle is within the
exact kernel's bound. Where q*scale*log2 e itself is subnormal (|q| below ~1e-38) a GPU that flushes it to zero may
make other codes than the oracle; the logit terms involved are of that size. Against the exact-query oracle the
variant moves a logit (base 2) by the query's rounding, |code_c * step - qk_c| a channel times its K code: at most
step/2 (less than a step where a code clamps to 127), step <= m/64 (tests/test_fast_decode_kivi_i8.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.families.kivi import format as kl
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.templates import render_defines
from kvviz.gpu.runtime import Dispatch
from kvviz.attention import split_decode as fd
LOG2E = fd.LOG2E
GROUP = kl.GROUP

SPLIT = KernelSpec(
    "kivi/decode_fast.wgsl",
    bindings=ro("q", "kc", "vc", "res", "info") + rw("partials"),
    immediates=Struct("P", "num_kv_heads num_heads block_size max_blocks bt_off kstride ws partition_tokens "
                      "num_partitions scale_log2:f32"),
)
REDUCE = fd.REDUCE  # the partials are the fast decode's: [m, l, acc[D]] per (seq, head, partition)
# the int8-query variant's requantiser (kivi/query_i8.wgsl) on given rows: its codes checked bit for bit against the
# oracle's (oracle.requantize_query) where the decode cannot reach every exponent (zero, subnormal, f32's largest, inf)
QUERY_I8_PROBE = KernelSpec("kivi/query_i8_probe.wgsl", bindings=ro("x") + rw("out"), immediates=Struct("P", "rows row"))
KERNELS = (SPLIT, REDUCE, QUERY_I8_PROBE)


def code_format(bits: int) -> fd.CacheFormat:
    """The generator's record for the lane split: 32/bits codes a word (a lane owns whole code words)."""
    return fd.CacheFormat(f"kivi{bits}", 32 // bits)


# the lane split where lanes need not own whole code words: any 4 channels (a vec4) a lane
SPLIT4 = fd.CacheFormat("kivi-vec4", 4)


def tolerance(max_abs_v: float) -> float:
    """2e-5 x max(1, max |V^|): the f32 fast decodes' bound (fast_decode.f32_tolerance)."""
    return fd.f32_tolerance(max_abs_v)


def unsupported(bits: int, head_size: int, group: int, block_size: int) -> str:
    """Why this decode cannot take the shape ("" when it can); head_size is the padded one the kernels run at."""
    if bits not in kl.BITS:
        return f"bits {bits} is not one of {kl.BITS}"
    if head_size <= 0 or head_size % 16:
        return f"head size {head_size} is not a positive multiple of 16 (the method pads to one)"
    if head_size > 256:
        return f"head size {head_size} is over 256 (the unrolled per-lane state would spill registers)"
    if group < 1 or group > 16:
        return f"a GQA group of {group} query heads per KV head is outside 1..16"
    if block_size <= 0 or (head_size * block_size) % 128:
        return (f"block size {block_size} at head size {head_size}: D*bs = {head_size * block_size} is not a "
                "multiple of 128, so a lane's (scale, zero) vec4 could straddle two blocks of the side stream")
    return ""


def prefetch_words(bits: int, lay: fd.Layout) -> int:
    """u32 words a lane loads for one quantised step (U tokens: K and V code words, V's scale and zero): what
    the prefetch holds twice."""
    epw = 32 // bits
    dpl = lay.dims_per_lane
    per = dpl // epw if dpl % epw == 0 else dpl // 4  # whole code words, else one word a vec4
    return lay.unroll * (2 * per + 2)


def use_prefetch(bits: int, lay: fd.Layout, prefetch: bool | None = None) -> bool:
    """prefetch None (the default): on where a lane's words of a step fit fast_decode.PREFETCH_MAX_WORDS
    (prefetch_words; as fast_decode_ggml resolves it, and off when fast_decode.PREFETCH is); True / False
    force it."""
    if prefetch is None:
        return fd.PREFETCH and prefetch_words(bits, lay) <= fd.PREFETCH_MAX_WORDS
    return bool(prefetch)


def check_qk(qk: str) -> bool:
    """Whether `qk` asks for the int8-query variant (InvalidInput for one that is not in fast_decode.QK_VARIANTS)."""
    if qk not in fd.QK_VARIANTS:
        raise InvalidInput(f"fast KIVI decode variant qk={qk!r}: one of {fd.QK_VARIANTS}")
    return qk == "i8"


def render(bits: int, head_size: int, group: int, lay: fd.Layout, tg: int, block_size: int = 0,
           prefetch: bool = False, scatter: bool = False, looped: bool = False, qk: str = "f32") -> dict:
    """The {{...}} values of kivi/decode_fast.wgsl: its code rendered from the template kivi/decode_fast.wgsl.j2.
    prefetch: software pipelining of the quantised loop (the loads of fast_decode.render and
    fast_decode_ggml.render): each step issues the NEXT
    step's block-table reads and K / V loads (the next key group's first step at a group's last) before its
    own arithmetic, the prologue loads the first step's, the step closes by rotating them in; same
    arithmetic, bit-identical outputs (tests/test_fast_decode_kivi.py). The key groups' (scale, zero) loads
    and the residual window's f32 rows are not pipelined (the module docstring says why). scatter: fast_decode's
    reduce-scatter softmax (L >= 2) in both loops; the owners also keep the V
    zeros' sums (zs). looped: kivi/decode_looped.wgsl.j2's code instead (the state in workgroup memory, loops over
    a lane's vec4s and a step's tokens: its size does not grow with the head size; fast_decode.render's looped).
    A layout whose lanes walk more dims than the head (padded) reads a zero query and clamped words there.
    qk "i8": the int8-query variant (the module's docstring; check_qk), the unrolled kernel only."""
    D, G, L, RG, U = head_size, group, lay.lanes, lay.row_groups, lay.unroll
    i8 = check_qk(qk)
    if i8 and looped:
        raise InvalidInput("the looped KIVI decode is the exact f32-query one: the qk='i8' variant is unrolled",
                           "Leave looped unset (or False) with qk='i8'.")
    if scatter and L < 2:
        raise InvalidInput("the scatter softmax needs L >= 2 lanes a row")
    dpl = lay.dims_per_lane
    epw = 32 // bits
    aligned = dpl % epw == 0  # the lane owns whole code words (else one word a vec4, layout() says when)
    wpl = dpl // epw if aligned else 0
    KW = kl.kw(D, bits)
    R = GROUP // tg
    span = lay.span
    values = dict(
        bits=bits, D=D, G=G, L=L, RG=RG, U=U, dpl=dpl, nv=dpl // 4, stride=span + 2, epw=epw, aligned=aligned, wpl=wpl,
        scatter=scatter, prefetch=prefetch, pad=span > D, i8=i8,
        # a constant block size: token -> block and offset by shift and mask for powers of two, as the fast decode's
        # (measured faster there on the H200); else the immediate
        bsx=f"{block_size}u" if block_size > 0 else "p.block_size",
    )
    if looped:
        values.update(span=span, chunks=lay.chunks, G=G // lay.chunks)
    return {
        "BITS": str(bits), "D": str(D), "G": str(values["G"]), "L": str(L), "RG": str(RG), "U": str(U),
        "WG": str(lay.workgroup), "KW": str(KW), "VW": str(KW + 2), "TG": str(tg), "R": str(R), "GPS": str(RG // R),
        "DPL": str(dpl), "WPL": str(wpl), "STRIDE": str(D + 2),
        "SHARED": "1" if looped else str(max(1, RG // 2) * G * (span + 2)),
        "VARIANT": "looped" if looped else fd.variant_name(qk),
        **render_defines("kivi/decode_looped.wgsl.j2" if looped else "kivi/decode_fast.wgsl.j2", **values),
    }


def looped_loops(pt: int, lay: fd.Layout, tg: int, residual: int, group: int) -> int:
    """Loop iterations of one invocation of the looped kernel (kivi/decode_looped.wgsl.j2; each loop charged
    iterations + 2): its key-group sweeps (the group's scale loop, then TG / U steps of U tokens, each two loops over
    the lane's vec4s), the residual steps (the same), the query staging, zeroing, fold, merge and write."""
    nv = lay.dims_per_lane // 4
    step = lay.unroll + 2 + lay.unroll * 2 * (nv + 2)
    gps = lay.row_groups // (GROUP // tg)
    sweeps = math.ceil(pt / GROUP / gps)
    res_steps = math.ceil(min(pt, residual + GROUP) / lay.tokens_per_step)
    staging = math.ceil(group // lay.chunks * lay.span / 4 / lay.workgroup) + 2
    levels = max(0, lay.row_groups.bit_length() - 1)
    split = sweeps + 2 + sweeps * ((nv + 2) + tg // lay.unroll + 2 + tg // lay.unroll * step)
    return split + res_steps + 2 + res_steps * step + staging + 3 * (nv + 2) + levels + 2 + levels * (nv + 2)


def choose_tg(row_groups: int, partition_tokens: int) -> int:
    """Tokens of a key group one row group takes: 32 (the group's scales folded once for 32 tokens) unless
    a sweep of the workgroup (RG x TG tokens) would exceed the partition, then 16 or 8; at least 32 / RG so
    that R = 32 / TG row groups divide the workgroup."""
    tg = 32
    while tg > 8 and row_groups * tg > partition_tokens:
        tg //= 2
    return max(tg, GROUP // max(1, row_groups))


@dataclass
class KiviDecodePlan:
    """One fast KIVI decode: its dispatches (split + reduce), where the output lands, how it was split."""

    dispatches: list
    out: object  # [S, H, D] f32 buffer (D: the padded head size)
    shape: tuple[int, int, int]
    partition_tokens: int
    num_partitions: int
    layout: fd.Layout
    tokens_per_group_row: int  # TG
    prefetch: bool = False  # the software-pipelined loads (render's prefetch), as resolved (use_prefetch)
    looped: bool = False  # the looped kernel (kivi/decode_looped.wgsl.j2), else the unrolled one
    qk: str = "f32"  # "i8": the int8-query variant

    def describe(self) -> str:
        L = self.layout
        v = "" if self.qk == "f32" else f", {fd.variant_name(self.qk)}"
        return (f"{self.num_partitions} partition(s) of {self.partition_tokens} tokens, {L.workgroup} threads "
                f"({L.row_groups} rows x {fd.layout_lanes(L, self.shape[2])}, {self.tokens_per_group_row} tokens of a "
                f"key group a row, {L.unroll} tokens a step{', prefetch' if self.prefetch else ''}{v}"
                f"{fd.looped_note(self.looped, L)}{fd.wide_note(self.dispatches)})")


class KiviFastDecode:
    """Compiles and dispatches the fast KIVI decode on one runtime."""

    def __init__(self, rt):
        self.rt = rt
        self._fast = fd.FastDecode(rt)  # the subgroup probe and the layout chooser

    def layout(self, bits: int, head_size: int, group: int, subgroups: bool | None = None, unroll: int = 2,
               rows: int = 0, lanes: int = 16) -> fd.Layout:
        """Lanes owning whole code words (fast_decode.choose_layout for 32/bits codes a word); where that
        leaves a lane more than 16 channels and a split into more lanes of 4-channel multiples exists (head 80,
        112: 16 codes a word do not divide D/L), or one into as many lanes walking fewer dims (head 80 at 4 lanes:
        20 channels each, not 24 with padding), that split: a lane's vec4 then reads the code word holding it (two
        vec4s may share a word) with a per-lane shift."""
        lay = self._fast.layout(code_format(bits), head_size, group, subgroups, unroll, rows, lanes)
        if lay.dims_per_lane > 16:
            alt = self._fast.layout(SPLIT4, head_size, group, subgroups, unroll, rows, lanes)
            if alt.lanes > lay.lanes or (alt.lanes == lay.lanes and alt.span < lay.span):
                return alt
        return lay

    def plan(self, bits: int, k, v, res, num_kv_heads: int, q, batch, scale: float, recent: int | None = None, *,
             seq_plan: kl.Plan | None = None, info=None, partition_tokens: int | None = None,
             subgroups: bool | None = None, unroll: int = 2, rows: int = 0, lanes: int = 16,
             prefetch: bool | None = None, scatter: bool | None = None, looped: bool | None = None,
             qk: str = "f32") -> KiviDecodePlan:
        """Dispatches of one decode (q [S, H, D] f32, D the padded head size the cache was written at) over the
        KIVI buffers k, v, res (GPU buffers in kvviz/families/kivi/format.py's layout). The quantised / residual split is
        `seq_plan` (kvviz.families.kivi.format.plan(batch.context_lens, recent)) or computed from `recent`; `info`: the
        method's buffer (seq_plan.seq_info() then the block tables), uploaded here when None. prefetch: the
        software-pipelined loads (render); None: where a lane's words of a step fit (use_prefetch). scatter: the
        reduce-scatter softmax (render); None: fast_decode.SCATTER where a row has 2+ lanes. qk "i8": the int8-query
        variant (the module's docstring), against its own oracle (oracle.attention_i8); unrolled only (looped None
        then means False, True is refused); the default "f32" is the exact kernel."""
        if check_qk(qk):
            if looped:
                raise InvalidInput("the looped KIVI decode is the exact f32-query one: the qk='i8' variant is unrolled",
                                   "Leave looped unset (or False) with qk='i8'.")
            looped = False
        q, G = fd.check_query(q, batch, num_kv_heads, scale)
        S, H, D = q.shape
        bs = int(batch.block_size)
        why = unsupported(bits, D, G, bs)
        if why:
            raise UnsupportedShape(f"fast KIVI decode: {why}", "The first-wave path (dequantise + f32 decode) takes this shape.")
        if unroll not in (1, 2, 4):
            raise InvalidInput(f"unroll must be 1, 2 or 4 tokens a row group per step, got {unroll}")
        if seq_plan is None:
            if recent is None:
                raise InvalidInput("fast KIVI decode: give the method's plan (seq_plan) or its recent window")
            seq_plan = kl.plan(batch.context_lens, recent)
        if len(seq_plan.context_lens) != S or (np.asarray(seq_plan.context_lens) != np.asarray(batch.context_lens)).any():
            raise InvalidInput("fast KIVI decode: the plan's context lengths differ from the batch's")
        if (np.asarray(seq_plan.n_q) % GROUP).any():
            raise InvalidInput("fast KIVI decode: every quantised prefix must be whole 32-token key groups")
        lay = self.layout(bits, D, G, subgroups, unroll, rows, lanes)
        looped = fd.use_looped(self.rt, looped, prefetch, scatter,
                               wide=fd.wide_layout(lay, self._fast.lane_cap(subgroups, lanes)))
        if looped:
            limit = int(self.rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)
            lay = fd.looped_layout(lay, G, limit, lay.span)
        mcl = int(batch.max_context_len)
        residual_max = int(max((np.asarray(seq_plan.context_lens) - np.asarray(seq_plan.n_q)).max(initial=0), 0))
        # whole key groups a partition
        pt, P = fd.split_context(partition_tokens, self._planned_tokens(S, num_kv_heads, mcl, lay, G, residual_max, looped),
                                 GROUP, mcl)
        tg = choose_tg(lay.row_groups, pt)
        if tg % lay.unroll:
            raise InvalidInput(f"unroll {lay.unroll} does not divide the {tg} tokens a row group takes of a key group")
        fd.check_grid(self.rt, "fast KIVI decode", (("partitions", P), ("KV heads", num_kv_heads * lay.chunks),
                                                    ("sequences", S)))
        self._check_loops(pt, lay, tg, P, residual_max, G if looped else 0)
        KW = kl.kw(D, bits)
        kstride = kl.k_stride(D, bs, bits)
        nb = batch.num_blocks
        for name, buf, need in (("K", k, nb * num_kv_heads * kstride * 4),
                                ("V", v, nb * num_kv_heads * bs * (KW + 2) * 4),
                                ("residual", res, max(1, seq_plan.total_res) * 2 * num_kv_heads * D * 4)):
            if buf.size < need:
                raise InvalidInput(f"fast KIVI decode: the {name} buffer holds {buf.size} bytes, the batch needs {need}")
        bt = np.ascontiguousarray(batch.block_tables, dtype=np.uint32)
        if info is None:
            info = self.rt.upload(np.concatenate([seq_plan.seq_info().reshape(-1), bt.reshape(-1)]), "kivi_info")
        pf = not looped and use_prefetch(bits, lay, prefetch)
        sc = not looped and (fd.SCATTER and lay.lanes > 1 if scatter is None else scatter)
        kern = self.rt.compile(SPLIT, **render(bits, D, G, lay, tg, int(batch.block_size), pf, sc, looped, qk))
        partials = self.rt.empty(S * H * P * (D + 2) * 4, "fast_decode_kivi_partials")
        out = self.rt.empty(S * H * D * 4, "fast_decode_kivi_out")
        imm = kern.pack(num_kv_heads, H, bs, bt.shape[1], 4 * S, kstride, kl.ws(D, bs), pt, P, float(scale) * LOG2E)
        d = [Dispatch(kern, [self.rt.upload(q, "q"), k, v, res, info, partials], (P, num_kv_heads * lay.chunks, S), imm),
             self.rt.compile(fd.reduce_spec(P)).dispatch((H, S, 1), [partials, out], H, D, P)]
        return KiviDecodePlan(d, out, (S, H, D), pt, P, lay, tg, pf, looped, qk)

    def _planned_tokens(self, num_seqs: int, num_kv_heads: int, max_len: int, lay: fd.Layout, group: int,
                        residual: int, looped: bool) -> int:
        """fast_decode.plan_partitions' tokens a partition (whole key groups); for the looped kernel on an adapter
        with a loop limit, no more than its loops over a partition fit (looped_loops)."""
        pt = fd.plan_partitions(num_seqs, num_kv_heads * lay.chunks, max_len, GROUP)
        limit = self.rt.loop_limit
        if looped and limit is not None:
            while pt > GROUP and looped_loops(pt, lay, choose_tg(lay.row_groups, pt), residual, group) > limit:
                pt -= GROUP
        return pt

    def _check_loops(self, pt: int, lay: fd.Layout, tg: int, P: int, residual: int, looped_group: int = 0) -> None:
        """Loop iterations of one invocation (each loop charged iterations + 2, kvviz/gpu/loop_budget.py):
        the sweeps over key groups with their TG/U steps, the residual loop (the looped kernel's: looped_loops, its
        GQA group `looped_group`), and the reduce's loops over P."""
        limit = self.rt.loop_limit
        if limit is None:
            return
        gps = lay.row_groups // (GROUP // tg)
        sweeps = math.ceil(pt / GROUP / gps)
        res_steps = math.ceil(min(pt, residual + GROUP) / lay.tokens_per_step)
        split = sweeps + 2 + sweeps * (tg // lay.unroll + 2) + res_steps + 2
        if looped_group:
            split = looped_loops(pt, lay, tg, residual, looped_group)
        need = max(split, fd.reduce_loops(P))
        if need > limit:
            raise DeviceLimitError(f"fast KIVI decode: {need} loop iterations per invocation exceed this adapter's "
                                   f"loop limit of {limit}", "Use more partitions (shorter partition_tokens).")

    def read(self, plan: KiviDecodePlan) -> np.ndarray:
        return self.rt.read(plan.out, np.float32, plan.shape)

    def decode(self, bits: int, k, v, res, num_kv_heads: int, q, batch, scale: float, recent: int | None = None,
               **kw) -> np.ndarray:
        """Run the fast decode: [num_seqs, num_heads, head_size] f32 (the padded head size)."""
        plan = self.plan(bits, k, v, res, num_kv_heads, q, batch, scale, recent, **kw)
        self.rt.run(plan.dispatches)
        return self.read(plan)


def requantize_on_device(rt, qk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The int8-query variant's requantiser (shaders/kivi/query_i8.wgsl, as the decode runs it) over the rows of qk
    [n, D] float32 (D a multiple of 4): (codes int8 [n, D], factor f32 [n], step f32 [n]), as oracle.requantize_query
    returns them."""
    x = np.ascontiguousarray(qk, np.float32)
    n, D = x.shape
    if D % 4 or not n:
        raise InvalidInput(f"requantize_on_device takes [n, D] rows with n > 0 and D a multiple of 4, got {x.shape}")
    row = D // 4
    out = rt.empty(n * (row + 2) * 4, "kivi_query_i8_probe")
    kern = rt.compile(QUERY_I8_PROBE)
    rt.run([kern.dispatch((-(-n // 64), 1, 1), [rt.upload(x, "qk"), out], n, row)])
    words = rt.read(out, np.uint32, (n, row + 2))
    codes = np.ascontiguousarray(words[:, :row]).view(np.int8).reshape(n, D)
    return codes, words[:, row].view(np.float32), words[:, row + 1].view(np.float32)


def decode_traffic(batch, seq_plan: kl.Plan, bits: int, num_heads: int, num_kv_heads: int, head_size: int,
                   num_partitions: int) -> tuple[int, float]:
    """(unique bytes, flops) of the split + reduce: every quantised token's K codes and V record, the key
    groups' side words (2 f32 per channel per 32 tokens), the residual rows' K and V floats, the block-table
    entries and sequence info, q, the partials written and read back, the output; flops = 2 (multiply-add)
    x head_size x (QK + PV) for every (token, query head)."""
    D = head_size
    KW = kl.kw(D, bits)
    nq = int(np.sum(seq_plan.n_q))
    tokens = int(np.sum(batch.context_lens))
    kv = nq * num_kv_heads * (KW + (KW + 2)) * 4 + (nq // GROUP) * num_kv_heads * 2 * D * 4
    kv += seq_plan.total_res * 2 * num_kv_heads * D * 4
    tables = sum(-(-int(n) // batch.block_size) for n in batch.context_lens) * 4 * num_kv_heads + 16 * batch.num_seqs
    S = batch.num_seqs
    qo = 2 * S * num_heads * D * 4
    partials = 2 * S * num_heads * num_partitions * (D + 2) * 4
    return int(kv + tables + qo + partials), float(4 * D * num_heads * tokens)
