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
  - software-pipelined loads (prefetch; fast_decode.step_loads, the loads of the other fast decodes, with the
    KIVI walk and rows): each quantised step issues the NEXT step's block-table reads and K / V words (codes,
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
  - the row groups merge through workgroup memory (fast_decode.merge_tree), row group 0 writes the
    partition's [m, l, acc] to partials and the fast decode's reduce combines the partitions (an empty
    sequence gives 0).

Shapes: bits 2 / 4; the padded head size (a multiple of 16, the method pads) up to 256; GQA 1..16; a block
size with D*bs a multiple of 128 (every (scale, zero) vec4 of a lane's side words then lies in one block;
bs >= 8 always qualifies). Anything else raises UnsupportedShape (the method then keeps the first-wave path).

Tolerance against the oracle (method_attention / through_f32_decode over the same words): 2e-5 *
max(1, max |V^|) absolute, V^ = the dequantised values (fast_decode.f32_tolerance: f32 accumulation in
another order, exp2, the folded scale / zero).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.families.kivi import format as kl
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
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
KERNELS = (SPLIT, REDUCE)


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


def _shifts(bits: int, i: int) -> str:
    """The shifts of vec4 i's 4 codes within their word (a lane owning whole words)."""
    epw = 32 // bits
    base = bits * ((4 * i) % epw)
    return "vec4<u32>(" + ", ".join(f"{base + bits * c}u" for c in range(4)) + ")"


def _codes(bits: int, w: str, i: int, aligned: bool = True) -> str:
    """vec4<f32> of the i-th 4 codes of a lane. aligned: its code words are named {w}_0, {w}_1, ...; else
    vec4 i has its own word {w}_i and the per-lane shifts csh{i} (prologue)."""
    if aligned:
        word = (4 * i) // (32 // bits)
        return f"vec4<f32>((vec4<u32>({w}_{word}) >> {_shifts(bits, i)}) & vec4<u32>({(1 << bits) - 1}u))"
    return f"vec4<f32>((vec4<u32>({w}_{i}) >> csh{i}) & vec4<u32>({(1 << bits) - 1}u))"


def _join(parts, sep=" + "):
    return sep.join(parts) if parts else "0.0"


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


def render(bits: int, head_size: int, group: int, lay: fd.Layout, tg: int, block_size: int = 0,
           prefetch: bool = False, scatter: bool = False) -> dict:
    """The {{...}} values of kivi/decode_fast.wgsl. prefetch: software pipelining of the quantised loop
    (fast_decode.step_loads, as fast_decode.render and fast_decode_ggml.render do): each step issues the NEXT
    step's block-table reads and K / V loads (the next key group's first step at a group's last) before its
    own arithmetic, the prologue loads the first step's, the step closes by rotating them in; same
    arithmetic, bit-identical outputs (tests/test_fast_decode_kivi.py). The key groups' (scale, zero) loads
    and the residual window's f32 rows are not pipelined (the module docstring says why). scatter: fast_decode's
    reduce-scatter softmax (fast_decode.scatter_softmax, L >= 2) in both loops; the owners also keep the V
    zeros' sums (zs)."""
    D, G, L, RG, U = head_size, group, lay.lanes, lay.row_groups, lay.unroll
    if scatter and L < 2:
        raise InvalidInput("the scatter softmax needs L >= 2 lanes a row")
    dpl = lay.dims_per_lane
    nv = dpl // 4
    epw = 32 // bits
    aligned = dpl % epw == 0  # the lane owns whole code words (else one word a vec4, layout() says when)
    wpl = dpl // epw if aligned else 0
    KW = kl.kw(D, bits)
    stride = D + 2
    R = GROUP // tg
    I, J, K = "  ", "    ", "      "
    pro, grp, qstep, rstep, fold, write = [], [], [], [], [], []
    # ---- prologue: the G query slices (pre-scaled by scale*log2 e), the group-scaled copies, the states
    for g in range(G):
        for i in range(nv):
            pro.append(fd.query_line(g, i, D, "p.scale_log2", I))
            pro.append(f"{I}var qk{g}_{i} = vec4<f32>(0.0);")
        pro.append(f"{I}var bz{g} = 0.0;  // this lane's share of sum_c q_c z_c for the current key group")
        if not scatter:
            pro.append(f"{I}var m{g} = EMPTY;")
            pro.append(f"{I}var l{g} = 0.0;")
            pro.append(f"{I}var zs{g} = 0.0;  // sum p * (V zero), added to every channel after the loops")
        for i in range(nv):
            pro.append(f"{I}var a{g}_{i} = vec4<f32>(0.0);")
    if not aligned:  # vec4 i of this lane: its code word and the shifts of its 4 codes in it
        for i in range(nv):
            pro.append(f"{I}let cwi{i} = (lane * DPL + {4 * i}u) / {epw}u;")
            pro.append(f"{I}let csh{i} = vec4<u32>({bits}u * ((lane * DPL + {4 * i}u) % {epw}u)) + "
                       f"vec4<u32>(0u, {bits}u, {2 * bits}u, {3 * bits}u);")
    # ---- per key group: its (scale, zero) pairs for this lane's channels, folded into the query
    grp.append(f"{J}let gj = gb + gslot;")
    grp.append(f"{J}let gv = gj < g1;  // a row group past the last group masks its logits")
    grp.append(f"{J}let gc = min(gj, g1 - 1u);")
    grp.append(f"{J}let so = 2u * D * gc + 2u * lane * DPL;  // stream word of this lane's first (scale, zero) pair")
    for i in range(nv):  # 4 channels = 8 stream words, in one block (D*bs % 128 == 0, so8 % 8 == 0)
        grp.append(f"{J}let sw{i} = so + {8 * i}u;")
        grp.append(f"{J}let sb{i} = (info[bt + sw{i} / p.ws] * p.num_kv_heads + kvh) * p.kstride + kside + sw{i} % p.ws;")
        grp.append(f"{J}let ksc{i} = bitcast<vec4<f32>>(vec4<u32>(kc[sb{i}], kc[sb{i} + 2u], kc[sb{i} + 4u], kc[sb{i} + 6u]));")
        grp.append(f"{J}let kzr{i} = bitcast<vec4<f32>>(vec4<u32>(kc[sb{i} + 1u], kc[sb{i} + 3u], kc[sb{i} + 5u], kc[sb{i} + 7u]));")
    for g in range(G):
        for i in range(nv):
            grp.append(f"{J}qk{g}_{i} = q{g}_{i} * ksc{i};")
        grp.append(f"{J}bz{g} = {_join([f'dot(q{g}_{i}, kzr{i})' for i in range(nv)])};")
    grp.append(f"{J}let gt = gc * 32u + sub * TG;  // this row group's first token of the group")

    sc_post = []

    def softmax(out, J, mask, vvals, vscale, vzero):
        """Online-softmax update of the G heads over U tokens whose logits s{g}_{u} are computed: all-lane (the
        logits reduced and masked before), or scatter (lane partials; mask(u) the WGSL condition of token u)."""
        if scatter:
            def own(f, i):
                return f and fd.own_select([f(u) for u in range(U)], f"uo{i}")

            sc_pro, sc_step, post = fd.scatter_softmax(
                G, U, L, lambda g, u: f"s{g}_{u}", "0.0",
                lambda i, r: f"select(MASKED, {r}, {mask(f'uo{i}')})", lambda i: own(vscale, i), I, J,
                extras=[("zs", (lambda i: own(vzero, i)) if vzero else None)])
            if not sc_post:
                pro.extend(sc_pro)
                sc_post.extend(post)
            out += sc_step
            for g in range(G):
                out += fd.pv_accumulate(g, nv, U, J, vvals)
            return
        for g in range(G):
            out += fd.online_update(g, U, J)
            if vzero:
                out.append(f"{J}zs{g} = zs{g} * al{g} + {_join([f'p{g}_{u} * {vzero(u)}' for u in range(U)])};")
            else:
                out.append(f"{J}zs{g} = zs{g} * al{g};")
            for u in range(U):
                out.append(f"{J}let w{g}_{u} = {f'p{g}_{u} * {vscale(u)}' if vscale else f'p{g}_{u}'};")
            out += fd.pv_accumulate(g, nv, U, J, vvals)

    def reduce_lanes(out, J, s):
        out += fd.lane_allreduce(s, L, J)

    # ---- one step over quantised tokens: U consecutive tokens of the row group's TG
    # block_size > 0: a constant (token -> block and offset by shift and mask for powers of two, as
    # fast_decode.render does; measured faster there on the H200), else the immediate
    bsx = f"{block_size}u" if block_size > 0 else "p.block_size"

    def rows(u, stage, sfx):  # token u's K and V rows: its key group's step ("first": clamped, g1 may be 0)
        tok = {"step": f"gt + st * U + {u}u", "first": f"min(gf + {u}u, tlast)", "next": f"gn + {u}u"}[stage]
        tt, blk, o, kr, vr = (f"{n}{u}{sfx}" for n in ("tt", "blk", "o", "kr", "vr"))
        return [(tt, tok), (blk, f"info[bt + {tt} / {bsx}] * p.num_kv_heads + kvh"), (o, f"{tt} % {bsx}"),
                (kr, f"{blk} * p.kstride + {o} * KW"), (vr, f"({blk} * {bsx} + {o}) * VW")], (kr, vr)

    def words(u, r):  # every load of the step before any arithmetic
        kr, vr = r
        out = []
        for wname, buf, base in (("kw", "kc", kr), ("vw", "vc", vr)):
            if aligned:
                out += [(f"{wname}{u}_{w}", f"{buf}[{base} + lw + {w}u]") for w in range(wpl)]
            else:
                out += [(f"{wname}{u}_{i}", f"{buf}[{base} + cwi{i}]") for i in range(nv)]
        return out + [(f"vs{u}", f"bitcast<f32>(vc[{vr} + KW])"), (f"vz{u}", f"bitcast<f32>(vc[{vr} + KW + 1u])")]

    first, loaded, rotate = fd.step_loads(U, bsx, words, prefetch, I, K, rows)
    if prefetch:
        # the first step's tokens: row group rg's share of group g0 + gslot (a group below g1 when g1 > 0;
        # with no quantised group, tokens clamped to tlast: in bounds, never used), and the next step's: the
        # same group's next U tokens, or at its last step the next sweep's group (clamped like gc)
        pro.append(f"{I}let gf = min(g0 + gslot, max(g1, 1u) - 1u) * 32u + sub * TG;  // the first step's tokens")
        pro.extend(first)
        qstep.append(f"{K}let gn = select(gt + (st + 1u) * U, min(gb + GPS + gslot, g1 - 1u) * 32u + sub * TG, "
                     f"st + 1u == TG / U);  // the next step's tokens")
    qstep += loaded
    for u in range(U):
        for i in range(nv):
            qstep.append(f"{K}let kq{u}_{i} = {_codes(bits, f'kw{u}', i, aligned)};")
    for g in range(G):
        for u in range(U):
            s = f"s{g}_{u}"
            qstep.append(f"{K}var {s} = {_join([f'dot(qk{g}_{i}, kq{u}_{i})' for i in range(nv)])} + bz{g};")
            if scatter:
                continue
            reduce_lanes(qstep, K, s)
            qstep.append(f"{K}{s} = select(MASKED, {s}, gv);")
    for u in range(U):
        for i in range(nv):
            qstep.append(f"{K}let vq{u}_{i} = {_codes(bits, f'vw{u}', i, aligned)};")
    softmax(qstep, K, lambda u: "gv", lambda u, i: f"vq{u}_{i}", lambda u: f"vs{u}", lambda u: f"vz{u}")
    qstep += rotate  # the prefetched words become the next step's
    # ---- one step over residual f32 rows: U tokens a row group, RG row groups interleaved
    for u in range(U):
        rstep.append(f"{J}let tt{u} = tb + rg * U + {u}u;")
        rstep.append(f"{J}let rr{u} = res_off + min(tt{u}, t1 - 1u) - nq;")
        rstep.append(f"{J}let rk{u} = (rr{u} * 2u * p.num_kv_heads + kvh) * D + lane * DPL;")
        rstep.append(f"{J}let rv{u} = rk{u} + p.num_kv_heads * D;")
    for u in range(U):
        for which, base in (("rkv", f"rk{u}"), ("rvv", f"rv{u}")):
            for i in range(nv):
                rstep.append(f"{J}let {which}{u}_{i} = vec4<f32>(res[{base} + {4 * i}u], res[{base} + {4 * i + 1}u], "
                             f"res[{base} + {4 * i + 2}u], res[{base} + {4 * i + 3}u]);")
    for g in range(G):
        for u in range(U):
            s = f"s{g}_{u}"
            rstep.append(f"{J}var {s} = {_join([f'dot(q{g}_{i}, rkv{u}_{i})' for i in range(nv)])};")
            if scatter:
                continue
            reduce_lanes(rstep, J, s)
            rstep.append(f"{J}{s} = select(MASKED, {s}, tt{u} < t1);")
    softmax(rstep, J, lambda u: f"tb + rg * U + {u} < t1", lambda u, i: f"rvv{u}_{i}", None, None)
    # ---- after the loops: the V zeros' share, the same for every channel
    fold += sc_post
    for g in range(G):
        for i in range(nv):
            fold.append(f"{I}a{g}_{i} = a{g}_{i} + vec4<f32>(zs{g});")
    merge = fd.merge_tree(G, nv, stride, RG, I)
    write += fd.partial_writes(G, nv, J)
    return {
        "BITS": str(bits), "D": str(D), "G": str(G), "L": str(L), "RG": str(RG), "U": str(U), "WG": str(lay.workgroup),
        "KW": str(KW), "VW": str(KW + 2), "TG": str(tg), "R": str(R), "GPS": str(RG // R),
        "DPL": str(dpl), "WPL": str(wpl), "STRIDE": str(stride), "SHARED": str(max(1, RG // 2) * G * stride),
        **fd.subgroup_defines(L, scatter),
        "PROLOGUE": "\n".join(pro), "GROUP": "\n".join(grp), "QSTEP": "\n".join(qstep), "RSTEP": "\n".join(rstep),
        "FOLD": "\n".join(fold), "MERGE": "\n".join(merge), "WRITE": "\n".join(write),
    }


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

    def describe(self) -> str:
        L = self.layout
        return (f"{self.num_partitions} partition(s) of {self.partition_tokens} tokens, {L.workgroup} threads "
                f"({L.row_groups} rows x {L.lanes} lanes, {self.tokens_per_group_row} tokens of a key group a row, "
                f"{L.unroll} tokens a step{', prefetch' if self.prefetch else ''}{fd.wide_note(self.dispatches)})")


class KiviFastDecode:
    """Compiles and dispatches the fast KIVI decode on one runtime."""

    def __init__(self, rt):
        self.rt = rt
        self._fast = fd.FastDecode(rt)  # the subgroup probe and the layout chooser

    def layout(self, bits: int, head_size: int, group: int, subgroups: bool | None = None, unroll: int = 2,
               rows: int = 0, lanes: int = 16) -> fd.Layout:
        """Lanes owning whole code words (fast_decode.choose_layout for 32/bits codes a word); where that
        leaves a lane more than 16 channels and a split into more lanes of 4-channel multiples exists (head 80,
        112: 16 codes a word do not divide D/L), that split: a lane's vec4 then reads the code word holding it
        (two vec4s may share a word) with a per-lane shift."""
        lay = self._fast.layout(code_format(bits), head_size, group, subgroups, unroll, rows, lanes)
        if lay.dims_per_lane > 16:
            alt = self._fast.layout(SPLIT4, head_size, group, subgroups, unroll, rows, lanes)
            if alt.lanes > lay.lanes:
                return alt
        return lay

    def plan(self, bits: int, k, v, res, num_kv_heads: int, q, batch, scale: float, recent: int | None = None, *,
             seq_plan: kl.Plan | None = None, info=None, partition_tokens: int | None = None,
             subgroups: bool | None = None, unroll: int = 2, rows: int = 0, lanes: int = 16,
             prefetch: bool | None = None, scatter: bool | None = None) -> KiviDecodePlan:
        """Dispatches of one decode (q [S, H, D] f32, D the padded head size the cache was written at) over the
        KIVI buffers k, v, res (GPU buffers in kvviz/families/kivi/format.py's layout). The quantised / residual split is
        `seq_plan` (kvviz.families.kivi.format.plan(batch.context_lens, recent)) or computed from `recent`; `info`: the
        method's buffer (seq_plan.seq_info() then the block tables), uploaded here when None. prefetch: the
        software-pipelined loads (render); None: where a lane's words of a step fit (use_prefetch). scatter: the
        reduce-scatter softmax (render); None: fast_decode.SCATTER where a row has 2+ lanes."""
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
        mcl = int(batch.max_context_len)
        # whole key groups a partition
        pt, P = fd.split_context(partition_tokens, fd.plan_partitions(S, num_kv_heads, mcl, GROUP), GROUP, mcl)
        tg = choose_tg(lay.row_groups, pt)
        if tg % lay.unroll:
            raise InvalidInput(f"unroll {lay.unroll} does not divide the {tg} tokens a row group takes of a key group")
        fd.check_grid(self.rt, "fast KIVI decode", (("partitions", P), ("KV heads", num_kv_heads), ("sequences", S)))
        residual_max = int(max((np.asarray(seq_plan.context_lens) - np.asarray(seq_plan.n_q)).max(initial=0), 0))
        self._check_loops(pt, lay, tg, P, residual_max)
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
        pf = use_prefetch(bits, lay, prefetch)
        sc = fd.SCATTER and lay.lanes > 1 if scatter is None else scatter
        kern = self.rt.compile(SPLIT, **render(bits, D, G, lay, tg, int(batch.block_size), pf, sc))
        partials = self.rt.empty(S * H * P * (D + 2) * 4, "fast_decode_kivi_partials")
        out = self.rt.empty(S * H * D * 4, "fast_decode_kivi_out")
        imm = kern.pack(num_kv_heads, H, bs, bt.shape[1], 4 * S, kstride, kl.ws(D, bs), pt, P, float(scale) * LOG2E)
        d = [Dispatch(kern, [self.rt.upload(q, "q"), k, v, res, info, partials], (P, num_kv_heads, S), imm),
             self.rt.compile(fd.reduce_spec(P)).dispatch((H, S, 1), [partials, out], H, D, P)]
        return KiviDecodePlan(d, out, (S, H, D), pt, P, lay, tg, pf)

    def _check_loops(self, pt: int, lay: fd.Layout, tg: int, P: int, residual: int) -> None:
        """Loop iterations of one invocation (each loop charged iterations + 2, kvviz/gpu/loop_budget.py):
        the sweeps over key groups with their TG/U steps, the residual loop, and the reduce's loops over P."""
        limit = self.rt.loop_limit
        if limit is None:
            return
        gps = lay.row_groups // (GROUP // tg)
        sweeps = math.ceil(pt / GROUP / gps)
        res_steps = math.ceil(min(pt, residual + GROUP) / lay.tokens_per_step)
        split = sweeps + 2 + sweeps * (tg // lay.unroll + 2) + res_steps + 2
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
