"""The fast ggml decode: split-K ("flash-decoding") paged attention that reads llama.cpp block-type caches
(q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4; kvviz/families/ggml/format.py) in place, without the dequantise pass
and the f32 copy of the cache the first-wave path makes. Shaders ggml/decode_fast.wgsl (split, rendered
here) + fast_decode's reduce (reduce_spec), unchanged; numpy reference: the method's own
(kvviz/families/ggml/oracle.py: gguf's dequantisation through the f32 decode's arithmetic in float64); tests
tests/test_fast_decode_ggml.py. Reuses fast_decode's pieces (layout rules, merge_tree, plan_partitions, the
subgroup probe, the loop-budget check, the reduce).

Record: a token's record (one KV head) is its ggml row (D/32 blocks of 34 / 18 / 20 / 22 / 24 / 18 / 17
bytes, byte for byte as ggml lays them out) padded to whole u32 words; paged [num_blocks, kv_heads,
block_size, wpt] u32. Blocks are not word aligned, so:
  - lanes: L lanes share a token row (the most of 16, 8, 4, 2, 1 up to the subgroup size; 1 without
    subgroups: the fallback, no shuffles), lane l owns DPL = D/L consecutive dims that lie inside ONE
    32-element block (DPL 4, 8, 16, 32) or are whole blocks (DPL a multiple of 32, e.g. the one-lane
    layout): a lane never spans part of two blocks;
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

Shapes it cannot take (head size other than 32, 64, 128, 256, a GQA group outside 1..16, an unknown
type) raise UnsupportedShape from plan(); the methods then keep the first-wave path (ggml_blocks.py).
"""
from __future__ import annotations


import numpy as np

from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.ggml import format as fg
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
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
# head sizes whose lanes split inside 32-element blocks at any power-of-two lane count (96, 160, ... would
# leave one lane a row of the whole head: the first-wave path keeps them)
HEAD_SIZES = (32, 64, 128, 256)
# fast_decode's layout rules for 4-byte code words (the lane split is ours: _lanes)
_FMT = fd.CacheFormat("ggml", 4)


def tolerance(max_abs_v: float) -> float:
    """2e-5 x max(1, max |V^|): the f32 fast decodes' bound (fast_decode.f32_tolerance)."""
    return fd.f32_tolerance(max_abs_v)


def _lanes(head_size: int, most: int) -> int:
    return fd.block_lanes(head_size, most, 32)


def unsupported(type_name: str, head_size: int, group: int) -> str:
    """Why this decode cannot take the shape ("" when it can)."""
    if type_name not in TYPES:
        return f"the ggml type {type_name!r} has no fast decode (types: {', '.join(TYPES)})"
    if head_size <= 0 or head_size % fg.BLOCK:
        return f"head size {head_size} is not a multiple of 32 (llama.cpp's block)"
    if head_size > 256:
        return f"head size {head_size} is over 256 (the unrolled per-lane state would spill registers)"
    if head_size not in HEAD_SIZES:
        return (f"head size {head_size} has no power-of-two lane split inside 32-element blocks (heads "
                f"{', '.join(map(str, HEAD_SIZES))}): one lane a row would hold the whole head")
    if group < 1 or group > 16:
        return f"a GQA group of {group} query heads per KV head is outside 1..16"
    return ""


# ---------------------------------------------------------------------------------- code generation
def _iq4_words() -> list[int]:
    b = np.array(fg.IQ4_NL_VALUES, np.int8).view(np.uint8)
    return [int(x) for x in b.view(np.uint32)]


def _helpers(t: fg.GgmlType) -> str:
    if t.name == "iq4_nl":
        w = _iq4_words()
        return f"""// 4 iq4_nl codes -> their values (kvalues_iq4nl, signed bytes 4 a word, picked by selects)
fn iq4v(c: vec4<u32>) -> vec4<f32> {{
  let hi = c >> vec4<u32>(2u);
  let w = select(select(vec4<u32>({w[0]}u), vec4<u32>({w[1]}u), hi == vec4<u32>(1u)),
                 select(vec4<u32>({w[2]}u), vec4<u32>({w[3]}u), hi == vec4<u32>(3u)), hi >= vec4<u32>(2u));
  let b = w << ((vec4<u32>(3u) - (c & vec4<u32>(3u))) * vec4<u32>(8u));
  return vec4<f32>(bitcast<vec4<i32>>(b) >> vec4<u32>(24u));
}}"""
    if t.name == "mxfp4":
        return """// 4 MXFP4 codes -> the doubled E2M1 values (gguf's kvalues: 0 1 2 3 4 6 8 12, bit 3 the sign)
fn mxv(c: vec4<u32>) -> vec4<f32> {
  let v = vec4<f32>((vec4<u32>(0xC8643210u) >> ((c & vec4<u32>(7u)) * vec4<u32>(4u))) & vec4<u32>(15u));
  return select(v, -v, (c & vec4<u32>(8u)) != vec4<u32>(0u));
}
// E8M0 e -> 2^(e-128) (ggml_e8m0_to_fp32_half: the scale of the doubled values)
fn e8m0h(e: u32) -> f32 {
  return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << (e & 1u), e < 2u));
}"""
    return ""


def prefetch_words(t: fg.GgmlType, lay: fd.Layout) -> int:
    """u32 words a lane loads for one step (K and V, U tokens): what the prefetch holds twice."""
    dpl = lay.dims_per_lane
    nseg = max(1, dpl // 32)
    n = min(dpl, 32)
    ncw = (n if t.name == "q8_0" else min(n, 16)) // 4  # code words (render's count: 4-bit codes share bytes)
    per_seg = 1 + ncw + 1 + (2 if t.qh else 0)  # header, codes, the extra word for the shift, q5's qh words
    return 2 * lay.unroll * nseg * per_seg


def render(t: fg.GgmlType, head_size: int, group: int, lay: fd.Layout, block_size: int = 0,
           prefetch: bool = False, scatter: bool = False) -> dict:
    """The {{...}} values of ggml/decode_fast.wgsl for one type and shape. block_size > 0 renders the block
    size as a constant (fast_decode.render's const_block); 0 reads it from the immediates. prefetch: each
    step issues the next step's block-table reads and word loads before its arithmetic (fast_decode.render's
    software pipelining; same arithmetic, bit-identical outputs). scatter: fast_decode's reduce-scatter softmax
    (fast_decode.scatter_softmax; L >= 2): the owners broadcast p, each lane applies its own blocks' V scales."""
    D, G, L, RG, U = head_size, group, lay.lanes, lay.row_groups, lay.unroll
    if scatter and L < 2:
        raise InvalidInput("the scatter softmax needs L >= 2 lanes a row")
    dpl = lay.dims_per_lane
    nv = dpl // 4
    n = min(dpl, 32)  # elements of one segment (the lane's part of one block)
    nseg = max(1, dpl // 32)
    stride = D + 2
    q8, mx, iq = t.name == "q8_0", t.name == "mxfp4", t.name == "iq4_nl"
    nbytes = n if q8 else min(n, 16)  # code bytes of a segment
    ncw = nbytes // 4
    code_hdr = t.header + (4 if t.qh else 0)
    pro, step, merge, write = [], [], [], []
    I, J = "  ", "    "
    # ---- prologue: the lane's byte offsets, the G query slices (pre-scaled), the online-softmax states
    for k in range(nseg):
        pro.append(f"{I}let hb{k} = ((lane * DPL) / 32u + {k}u) * BPB;  // byte offset of the lane's block {k}")
        pro.append(f"{I}let dw{k} = hb{k} / 4u;")
        pro.append(f"{I}let ds{k} = (hb{k} % 4u) * 8u;")
        cb = f"hb{k} + {code_hdr}u + e0" if q8 else f"hb{k} + {code_hdr}u + (e0 % 16u)"
        pro.append(f"{I}let cb{k} = {cb};")
        pro.append(f"{I}let cw{k} = cb{k} / 4u;")
        pro.append(f"{I}let cl{k} = min(cw{k} + {ncw}u, WPT - 1u);  // the extra word, inside the record")
        pro.append(f"{I}let sr{k} = (cb{k} % 4u) * 8u;")
        pro.append(f"{I}let sl{k} = (32u - sr{k}) & 31u;")
        pro.append(f"{I}let hm{k} = select(0u, 0xFFFFFFFFu, sr{k} != 0u);")
        if t.qh:
            pro.append(f"{I}let hq{k} = hb{k} + {t.header}u;")
            pro.append(f"{I}let qw{k} = hq{k} / 4u;")
            pro.append(f"{I}let ql{k} = min(qw{k} + 1u, WPT - 1u);")
            pro.append(f"{I}let qsr{k} = (hq{k} % 4u) * 8u;")
            pro.append(f"{I}let qsl{k} = (32u - qsr{k}) & 31u;")
            pro.append(f"{I}let qhm{k} = select(0u, 0xFFFFFFFFu, qsr{k} != 0u);")
    if not q8 and n <= 16:
        pro.append(f"{I}let ns = vec4<u32>(select(0u, 4u, e0 >= 16u)) + vec4<u32>(0u, 8u, 16u, 24u);  // nibble of each byte")
    if t.qh:
        pro.append(f"{I}let eb = vec4<u32>(e0) + vec4<u32>(0u, 1u, 2u, 3u);  // element in the block (qh bit)")

    def seg(i):
        """(segment, element offset inside the segment) of the lane's vec4 i."""
        k = (4 * i) // 32 if n == 32 else 0
        return k, 4 * i - 32 * k

    for g in range(G):
        for i in range(nv):
            pro.append(fd.query_line(g, i, D, "p.scale_log2", I))
        if t.has_min:  # sum of the (pre-scaled) query over each of the lane's segments: the min's term of the logit
            for k in range(nseg):
                parts = [f"q{g}_{i}" for i in range(nv) if seg(i)[0] == k]
                pro.append(f"{I}let qs{g}_{k} = dot({' + '.join(parts)}, vec4<f32>(1.0));")
        if not scatter:
            pro.append(f"{I}var m{g} = EMPTY;")
            pro.append(f"{I}var l{g} = 0.0;")
        for i in range(nv):
            pro.append(f"{I}var a{g}_{i} = vec4<f32>(0.0);")
    # ---- one step: U tokens per row group; every load before any arithmetic
    bsx = f"{block_size}u" if block_size > 0 else "p.block_size"

    def words(u, r):  # token u's words at row r (its blocks' headers, q5's qh words, the code words + 1)
        out = []
        for x, buf in (("k", "kc"), ("v", "vc")):
            for k in range(nseg):
                out.append((f"{x}h{u}_{k}", f"{buf}[{r} + dw{k}]"))
                if t.qh:
                    out += [(f"{x}q{u}_{k}_0", f"{buf}[{r} + qw{k}]"), (f"{x}q{u}_{k}_1", f"{buf}[{r} + ql{k}]")]
                out += [(f"{x}w{u}_{k}_{j}", f"{buf}[{r} + cw{k} + {j}u]") for j in range(ncw)]
                out.append((f"{x}w{u}_{k}_{ncw}", f"{buf}[{r} + cl{k}]"))
        return out

    first, loaded, rotate = fd.step_loads(U, bsx, words, prefetch, I, J)
    pro += first
    for u in range(U):
        step.append(f"{J}let tt{u} = tb + rg * U + {u}u;")
    step += loaded
    for u in range(U):
        for x in "kv":
            for k in range(nseg):
                h = f"{x}h{u}_{k}"
                if mx:
                    step.append(f"{J}let {x}d{u}_{k} = e8m0h(({h} >> ds{k}) & 0xFFu);")
                elif t.has_min:  # (d, m) one aligned word: blocks of 20 / 24 bytes start at multiples of 4
                    step.append(f"{J}let {x}dm{u}_{k} = unpack2x16float({h});")
                    step.append(f"{J}let {x}d{u}_{k} = {x}dm{u}_{k}.x;")
                    step.append(f"{J}let {x}m{u}_{k} = {x}dm{u}_{k}.y;")
                else:
                    step.append(f"{J}let {x}d{u}_{k} = unpack2x16float({h} >> ds{k}).x;")
                if t.qh:
                    step.append(f"{J}let {x}qh{u}_{k} = ({x}q{u}_{k}_0 >> qsr{k}) | (({x}q{u}_{k}_1 << qsl{k}) & qhm{k});")
                for j in range(ncw):
                    w = f"{x}w{u}_{k}"
                    step.append(f"{J}let {x}c{u}_{k}_{j} = ({w}_{j} >> sr{k}) | (({w}_{j + 1} << sl{k}) & hm{k});")

    def vec(x, u, i):
        """The lane's i-th vec4 of codes of token u (values without the block's scale / min)."""
        k, j = seg(i)
        if q8:
            # unpack4xI8: the 2^23 trick of fast_decode (I8X4_MAGIC_WGSL) measured slower here on the H200
            # for q8_0, unlike in the int8 cache's decode, where it is faster
            return f"vec4<f32>(unpack4xI8({x}c{u}_{k}_{j // 4}))"
        if n == 32:
            word, sh = (j % 16) // 4, ("vec4<u32>(0u, 8u, 16u, 24u)" if j < 16 else "vec4<u32>(4u, 12u, 20u, 28u)")
        else:
            word, sh = j // 4, "ns"
        raw = f"((vec4<u32>({x}c{u}_{k}_{word}) >> {sh}) & vec4<u32>(15u))"
        if t.qh:
            raw = f"({raw} | (((vec4<u32>({x}qh{u}_{k}) >> (eb + vec4<u32>({j}u))) & vec4<u32>(1u)) << vec4<u32>(4u)))"
        if mx:
            return f"mxv({raw})"
        if iq:
            return f"iq4v({raw})"
        off = {"q4_0": 8.0, "q5_0": 16.0}.get(t.name)
        return f"(vec4<f32>({raw}) - vec4<f32>({off}))" if off else f"vec4<f32>({raw})"

    for u in range(U):
        for i in range(nv):
            step.append(f"{J}let kv{u}_{i} = {vec('k', u, i)};")
    for g in range(G):
        for u in range(U):
            s = f"s{g}_{u}"
            terms = []
            for k in range(nseg):
                dots = " + ".join(f"dot(q{g}_{i}, kv{u}_{i})" for i in range(nv) if seg(i)[0] == k)
                terms.append(f"kd{u}_{k} * ({dots})")
                if t.has_min:
                    terms.append(f"km{u}_{k} * qs{g}_{k}")
            step.append(f"{J}var {s} = {' + '.join(terms)};")
            if scatter:
                continue
            step += fd.lane_allreduce(s, L, J)
            step.append(f"{J}{s} = select(MASKED, {s}, tt{u} < t1);")
    post = []
    if scatter:  # p{g}_{u} comes from its owner (the V scales are per lane: each lane's own blocks')
        sc_pro, sc_step, post = fd.scatter_softmax(
            G, U, L, lambda g, u: f"s{g}_{u}", "0.0", lambda i, r: f"select(MASKED, {r}, tb + rg * U + uo{i} < t1)",
            lambda i: None, I, J)
        pro += sc_pro
        step += sc_step
        step += [f"{J}let p{g}_{u} = w{g}_{u};" for g in range(G) for u in range(U)]
    for u in range(U):
        for i in range(nv):
            step.append(f"{J}let vv{u}_{i} = {vec('v', u, i)};")
    for g in range(G):
        if not scatter:
            step += fd.online_update(g, U, J)
        for u in range(U):
            for k in range(nseg):
                step.append(f"{J}let w{g}_{u}_{k} = p{g}_{u} * vd{u}_{k};")
                if t.has_min:
                    step.append(f"{J}let pm{g}_{u}_{k} = p{g}_{u} * vm{u}_{k};")
        for i in range(nv):
            k = seg(i)[0]
            acc = f"a{g}_{i} * al{g}"
            for u in range(U):
                acc = f"fma(vec4<f32>(w{g}_{u}_{k}), vv{u}_{i}, {acc})"
            if t.has_min:
                acc = f"{acc} + vec4<f32>({' + '.join(f'pm{g}_{u}_{k}' for u in range(U))})"
            step.append(f"{J}a{g}_{i} = {acc};")
    step += rotate  # the prefetched words become the next step's
    # ---- merge of the row groups (fast_decode's tree), row group 0 writes the partition's state
    merge += post + fd.merge_tree(G, nv, stride, RG, I)
    write += fd.partial_writes(G, nv, J)
    return {
        "FORMAT": t.name, "D": str(D), "G": str(G), "L": str(L), "RG": str(RG), "U": str(U), "WG": str(lay.workgroup),
        "WPT": str(t.words_per_token(D)), "BPB": str(t.block_bytes), "DPL": str(dpl), "STRIDE": str(stride),
        "SHARED": str(max(1, RG // 2) * G * stride),
        "HELPERS": _helpers(t),
        **fd.subgroup_defines(L, scatter),
        "PROLOGUE": "\n".join(pro), "STEP": "\n".join(step), "MERGE": "\n".join(merge), "WRITE": "\n".join(write),
    }


# ---------------------------------------------------------------------------------- launcher
GgmlDecodePlan = fd.SiblingPlan  # label: the type name


class GgmlFastDecode(fd.SiblingDecode):
    """Compiles and dispatches the fast ggml decode on one runtime."""

    name = "fast ggml decode"

    def layout(self, head_size: int, group: int, subgroups: bool | None = None, unroll: int = 2, rows: int = 0,
               lanes: int = 16) -> fd.Layout:
        return self._layout(_FMT, _lanes, head_size, group, subgroups, unroll, rows, lanes,
                            f"no lane split of head size {head_size} inside 32-element blocks")

    def kernel(self, type_name: str, head_size: int, group: int, block_size: int = 0, prefetch: bool | None = None,
               scatter: bool | None = None, **kw):
        """prefetch None: where a lane's words of a step fit fast_decode.PREFETCH_MAX_WORDS (prefetch_words).
        scatter None: fast_decode.SCATTER where a row has 2+ lanes."""
        lay = self.layout(head_size, group, **kw)
        t = fg.TYPES[type_name]
        if prefetch is None:
            prefetch = fd.PREFETCH and prefetch_words(t, lay) <= fd.PREFETCH_MAX_WORDS
        if scatter is None:
            scatter = fd.SCATTER and lay.lanes > 1
        return self.rt.compile(SPLIT, **render(t, head_size, group, lay, block_size, prefetch, scatter)), lay

    def plan(self, type_name: str, k, v, num_kv_heads: int, q, batch: PagedBatch, scale: float, *,
             partition_tokens: int | None = None, subgroups: bool | None = None, unroll: int = 2, rows: int = 0,
             lanes: int = 16, const_block: bool = True, prefetch: bool | None = None,
             scatter: bool | None = None) -> GgmlDecodePlan:
        """Dispatches of one decode (q [S, H, D] f32, one query per sequence) over the ggml caches `k`, `v`
        (GPU buffers of [num_blocks, kv_heads, block_size, wpt] u32 words, the method's writer's)."""
        q, G = fd.check_query(q, batch, num_kv_heads, scale)
        S, H, D = q.shape
        why = unsupported(type_name, D, G)
        if why:
            raise UnsupportedShape(f"fast ggml decode: {why}", "The first-wave decode (dequantise + f32) takes this shape.")
        if unroll not in (1, 2, 4):
            raise InvalidInput(f"unroll must be 1, 2 or 4 tokens a row group per step, got {unroll}")
        kern, lay = self.kernel(type_name, D, G, batch.block_size if const_block else 0, subgroups=subgroups,
                                unroll=unroll, rows=rows, lanes=lanes, prefetch=prefetch, scatter=scatter)
        return self._launch(kern, lay, k, v, [], num_kv_heads, q, batch, scale, partition_tokens,
                            fg.TYPES[type_name].words_per_token(D), type_name)

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
