"""The tile fast decode: a paged decode in three phases over workgroup memory (shaders/fast/decode_tile.wgsl),
for the caches of 4 codes a word (int8 on the seed layout, which int8_token shares; FP8 e4m3 / e5m2 with a
per-token or per-tensor scale). Family "fast" (kvviz/kernels/families.py); numpy reference: the method's own,
through kvviz/oracles/paged.decode (tests/test_fast_decode_tile.py).

Why a second kernel beside the split one (fast_decode.py). The split kernel keeps, in every lane, its slice of
the G queries and of the G accumulators plus two steps of prefetched words: about 100 registers, so few warps
fit a compute unit, and each warp's step is a chain (load -> dot -> lane sums -> softmax -> P.V). On the H200
its int8 decode took about the time of its f16 decode although it reads half the bytes: it is bound by that
chain's latency, not by bytes. Here a lane holds almost nothing across tokens:
  A. logits: LA lanes share a token record, each loading every LA-th code word (a lane group's loads are
     contiguous), the queries come from workgroup memory; the partial dots are summed by shuffles and the
     logit (base 2, times the token's K scale) is stored in workgroup memory;
  B. per head the partition's max, then the weights p = 2^(s - m) * (V scale) in place and l = sum p:
     no online rescaling, each exp2 computed once;
  C. P.V with a lane per code word (4 dims) and RC token rows in flight, each weight read from workgroup
     memory; the rows' accumulators are summed at the end.
The partition's state [m, l, acc] is the split kernel's, so fast/decode_reduce.wgsl combines it.

Arithmetic against the oracle: the same products as the split kernel (codes converted exactly, the scale on
the logit and on the weight), summed in another order: the f32 kernels' tolerance.
"""
from __future__ import annotations

import numpy as np

from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch
from kvviz.kernels import fast_decode as fd
from kvviz.paging import PagedBatch

TILE = KernelSpec(
    "fast/decode_tile.wgsl",
    bindings=ro("q", "kc", "vc", "block_tables", "context_lens", "tensor") + rw("partials"),
    immediates=Struct("P", "num_kv_heads num_heads block_size max_blocks partition_tokens num_partitions scale_log2:f32"),
)
KERNELS = (TILE,)

WG = 128  # threads of a workgroup
PTM_MAX = 1024  # the longest partition workgroup memory is sized for
LANES_A = 8  # lanes a token in phase A (tools/fast_decode_tune.py --tile-lanes)
UNROLL_A = 2  # tokens a lane group loads per phase-A step
UNROLL_C = 4  # tokens a row loads per phase-C step
NAN = "bitcast<f32>(0x7fc00000u)"


def unsupported(fmt: fd.CacheFormat, head_size: int, group: int) -> str:
    """Why the tile kernel cannot take this shape ("" when it can)."""
    if fmt.elems_per_word != 4 or fmt.group_size:
        return f"the tile decode reads caches of 4 codes a word (int8, FP8); {fmt.name} is not one"
    cw = head_size // 4
    if head_size % 4 or cw & (cw - 1) or not 16 <= cw <= WG:
        return f"head size {head_size}: the tile decode needs head_size / 4 a power of two in 16..{WG}"
    if not 1 <= group <= 16:
        return f"a GQA group of {group} query heads per KV head is outside 1..16"
    return ""


def shared_bytes(head_size: int, group: int, ptm: int) -> int:
    """Workgroup memory of the kernel: queries, [token][head] logits, token rows, [head][thread] partials."""
    return 4 * (group * head_size + group * ptm + ptm + group * WG)


def partition_capacity(head_size: int, group: int, limit: int) -> int:
    """The longest partition (a multiple of 128, at most PTM_MAX) whose workgroup memory fits `limit` bytes;
    with room for the phase-C merge of one head at a time, RC x D floats (0: the shape does not fit)."""
    rc = WG // (head_size // 4)
    ptm = PTM_MAX
    while ptm >= 128 and shared_bytes(head_size, group, ptm) > limit:
        ptm -= 128
    return ptm if ptm >= 128 and group * ptm >= rc * head_size else 0


def lanes_a(head_size: int, subgroup: int, most: int = LANES_A) -> int:
    """Lanes a token in phase A: at most `most` and the subgroup size, leaving each lane at least 2 words."""
    la = 1
    while la * 2 <= min(most, subgroup) and head_size // 4 // (la * 2) >= 2:
        la *= 2
    return la


def render(fmt: fd.CacheFormat, head_size: int, group: int, block_size: int, ptm: int, la: int,
           ua: int = UNROLL_A, uc: int = UNROLL_C, magic: bool = True) -> dict:
    """The {{...}} values of fast/decode_tile.wgsl."""
    D, G = head_size, group
    CW = D // 4
    wpla = CW // la
    LC, RC = CW, WG // CW
    I, J = "  ", "    "
    ks = {"token": "bitcast<f32>(kc[r{u} + CW])", "tensor": "ks_t"}.get(fmt.scale)
    vs = {"token": "bitcast<f32>(vc[rows[i] + CW])", "tensor": "vs_t"}.get(fmt.scale)

    def cvt(w):  # a code word -> its 4 values (without scale), exactly
        if fmt.fp8:
            return f"fp8x4({w})"
        return f"i8x4({w})" if magic else f"vec4<f32>(unpack4xI8({w}))"

    scales = []
    if fmt.scale == "tensor":
        scales += [f"{I}let ks_t = bitcast<f32>(tensor[2u]);", f"{I}let vs_t = bitcast<f32>(tensor[3u]);"]
    # ---- A: UA tokens of each lane group, every load first, then the dots (the lane's query slices in registers)
    qreg = [f"{I}let q{g}_{k} = qs[{g * CW}u + la + {k * la}u];" for g in range(G) for k in range(wpla)]
    a = []
    for u in range(ua):
        a.append(f"{J}let ia{u} = i0 + tg + {u * (WG // la)}u;")
        a.append(f"{J}let r{u} = rows[min(ia{u}, n - 1u)];")
    for u in range(ua):
        for k in range(wpla):
            a.append(f"{J}let kw{u}_{k} = kc[r{u} + la + {k * la}u];")
        if fmt.scale == "token":
            a.append(f"{J}let ks{u} = {ks.format(u=u)};")
    for u in range(ua):
        for k in range(wpla):
            a.append(f"{J}let kv{u}_{k} = {cvt(f'kw{u}_{k}')};")
    for u in range(ua):
        for g in range(G):
            s = f"s{g}_{u}"
            a.append(f"{J}var {s} = " + " + ".join(f"dot(q{g}_{k}, kv{u}_{k})" for k in range(wpla)) + ";")
            a += fd.lane_allreduce(s, la, J)
        scale = {"token": f" * ks{u}", "tensor": " * ks_t"}.get(fmt.scale, "")
        a.append(f"{J}if (ia{u} < n) {{")
        for g in range(G):  # lane g % LA stores head g's logit
            own = f"la == {g % la}u" if la > 1 else "true"
            a.append(f"{J}  if ({own}) {{ wl[ia{u} * G + {g}u] = s{g}_{u}{scale}; }}")
        a.append(f"{J}}}")
    # ---- B: max, weights, l (a tree over workgroup memory; G values a thread)
    b = []
    for g in range(G):
        b.append(f"{I}var m{g} = EMPTY;")
    b.append(f"{I}for (var i = li; i < n; i = i + WG) {{")
    for g in range(G):
        b.append(f"{J}m{g} = max(m{g}, wl[i * G + {g}u]);")
    b.append(f"{I}}}")
    b += _tree(G, "m", "max({a}, {b})", I)
    for g in range(G):
        b.append(f"{I}var l{g} = 0.0;")
    b.append(f"{I}for (var i = li; i < n; i = i + WG) {{")
    if vs:
        b.append(f"{J}let vs = {vs};")
    for g in range(G):
        b.append(f"{J}let p{g} = exp2(wl[i * G + {g}u] - m{g});")
        b.append(f"{J}l{g} = l{g} + p{g};")
        b.append(f"{J}wl[i * G + {g}u] = p{g}{' * vs' if vs else ''};")
    b.append(f"{I}}}")
    if la > 1:  # a driver that ran phase A with the wrong lanes summed the wrong partial dots: say NaN
        for g in range(G):
            b.append(f"{I}l{g} = l{g} + select(0.0, {NAN}, bad);")
    b += _tree(G, "l", "{a} + {b}", I)  # its last barrier also publishes the weights to phase C
    # ---- C: P.V, UC tokens of a row per step
    cpro = [f"{I}var a{g} = vec4<f32>(0.0);" for g in range(G)]
    c = []
    for u in range(uc):
        c.append(f"{J}let j{u} = i0 + {u * RC}u;")
        c.append(f"{J}let c{u} = min(j{u}, n - 1u);")
    for u in range(uc):
        c.append(f"{J}let vw{u} = vc[rows[c{u}] + lc];")
    for u in range(uc):
        c.append(f"{J}let vv{u} = {cvt(f'vw{u}')};")
        for g in range(G):
            c.append(f"{J}a{g} = fma(vec4<f32>(select(0.0, wl[c{u} * G + {g}u], j{u} < n)), vv{u}, a{g});")
    # ---- merge of the RC rows through wl (hc heads at a time, as many as wl holds), row 0 writes the state
    hc = min(G, (G * ptm) // (RC * D))
    mg = []
    for h0 in range(0, G, hc):
        heads = range(h0, min(G, h0 + hc))
        if h0:
            mg.append(f"{I}workgroupBarrier();")
        mg += [f"{I}wl[(rc * {hc}u + {g - h0}u) * D + 4u * lc + {k}u] = a{g}[{k}];" for g in heads for k in range(4)]
        mg.append(f"{I}workgroupBarrier();")
        mg.append(f"{I}if (rc == 0u) {{")
        for g in heads:
            mg.append(f"{J}let pb{g} = ((seq * p.num_heads + kvh * G + {g}u) * p.num_partitions + part) * (D + 2u);")
            mg.append(f"{J}if (lc == 0u) {{ partials[pb{g}] = m{g}; partials[pb{g} + 1u] = l{g}; }}")
            for k in range(4):
                tot = " + ".join(f"wl[({r * hc + g - h0}u) * D + 4u * lc + {k}u]" for r in range(RC))
                mg.append(f"{J}partials[pb{g} + 2u + 4u * lc + {k}u] = {tot};")
        mg.append(f"{I}}}")
    sg = {"SG_PARAM": "", "SG_GUARD": ""}
    if la > 1:
        sg = {"SG_PARAM": ", @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_invocation_id) sgi: u32",
              "SG_GUARD": f"let bad = sg_size < LA || (sgi & {la - 1}u) != la;"}
    return {
        "FORMAT": fmt.name + (f", {fmt.scale} scale" if fmt.scale != "none" else ""),
        "D": str(D), "G": str(G), "WG": str(WG), "CW": str(CW), "WPT": str(fmt.wpt(D)), "BS": str(block_size),
        "LA": str(la), "NA": str(WG // la), "UA": str(ua), "LC": str(LC), "RC": str(RC), "UC": str(uc),
        "PTM": str(ptm), "QS": str(G * CW), "WL": str(G * ptm), "RED": str(G * WG),
        "HELPERS": fd._helpers(fmt, magic and fmt.name == "int8"), **sg,
        "SCALES": "\n".join(scales), "QREG": "\n".join(qreg), "PHASE_A": "\n".join(a), "PHASE_B": "\n".join(b),
        "PHASE_C_PRO": "\n".join(cpro), "PHASE_C": "\n".join(c), "MERGE": "\n".join(mg),
    }


def _tree(G: int, name: str, op: str, I: str) -> list[str]:
    """WGSL reducing each thread's {name}{g} over the workgroup through `red` (op: "max({a}, {b})" or
    "{a} + {b}"); afterwards every thread holds the workgroup's value in {name}{g}."""
    J = I + "  "
    out = [f"{I}workgroupBarrier();"] + [f"{I}red[{g}u * WG + li] = {name}{g};" for g in range(G)]
    out.append(f"{I}for (var s = WG / 2u; s > 0u; s = s / 2u) {{")
    out.append(f"{J}workgroupBarrier();")
    out.append(f"{J}if (li < s) {{")
    for g in range(G):
        x = f"red[{g}u * WG + li]"
        out.append(f"{J}  {x} = {op.format(a=x, b=f'red[{g}u * WG + li + s]')};")
    out.append(f"{J}}}")
    out.append(f"{I}}}")
    out.append(f"{I}workgroupBarrier();")
    out += [f"{I}{name}{g} = red[{g}u * WG];" for g in range(G)]
    return out


class TileDecode:
    """Compiles and dispatches the tile decode on one runtime (a FastDecode gives the subgroup size, the unit
    tensor scales and the reduce)."""

    def __init__(self, fast: fd.FastDecode):
        self.fast = fast
        self.rt = fast.rt

    def capacity(self, head_size: int, group: int) -> int:
        limit = int(self.rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)
        return partition_capacity(head_size, group, limit)

    def plan(self, fmt: fd.CacheFormat, k, v, num_kv_heads: int, q, batch: PagedBatch, scale: float, *,
             tensor=None, partition_tokens: int | None = None, lanes: int = LANES_A, unroll_a: int = UNROLL_A,
             unroll_c: int = UNROLL_C, magic: bool = True) -> fd.FastDecodePlan:
        q, G = fd.check_query(q, batch, num_kv_heads, scale)
        S, H, D = q.shape
        why = unsupported(fmt, D, G)
        if why:
            raise UnsupportedShape(f"tile decode ({fmt.name}): {why}", "The split fast decode takes this shape.")
        ptm = self.capacity(D, G)
        if not ptm:
            raise DeviceLimitError(f"tile decode: head size {D} x GQA {G} does not fit this adapter's workgroup memory",
                                   "The split fast decode takes this shape.")
        if unroll_a not in (1, 2, 4) or unroll_c not in (1, 2, 4, 8, 16):
            raise InvalidInput(f"unroll_a must be 1, 2 or 4 and unroll_c 1, 2, 4, 8 or 16, got {unroll_a}, {unroll_c}")
        la = lanes_a(D, self.fast.subgroup_size, lanes)
        mcl = int(batch.max_context_len)
        planned = min(fd.plan_partitions(S, num_kv_heads, mcl, 128), ptm)
        pt, P = fd.split_context(partition_tokens, planned, 128, mcl)
        if pt > ptm:
            raise InvalidInput(f"tile decode: partitions of {pt} tokens exceed the {ptm} its workgroup memory holds")
        fd.check_grid(self.rt, "tile decode", (("partitions", P), ("KV heads", num_kv_heads), ("sequences", S)))
        limit = self.rt.loop_limit
        if limit is not None and pt // (WG // la * unroll_a) + 2 > limit:
            raise DeviceLimitError(f"tile decode: {pt // (WG // la * unroll_a) + 2} loop iterations exceed the adapter's "
                                   f"loop limit of {limit}")
        need = batch.num_blocks * num_kv_heads * batch.block_size * fmt.wpt(D) * 4
        for name, buf in (("K", k), ("V", v)):
            if buf.size < need:
                raise InvalidInput(f"tile decode: the {name} cache holds {buf.size} bytes, the batch's "
                                   f"{batch.num_blocks} blocks of {fmt.name} need {need}")
        kern = self.rt.compile(TILE, **render(fmt, D, G, batch.block_size, ptm, la, unroll_a, unroll_c, magic))
        bt = np.ascontiguousarray(batch.block_tables, dtype=np.uint32)
        partials = self.rt.empty(S * H * P * (D + 2) * 4, "tile_decode_partials")
        out = self.rt.empty(S * H * D * 4, "tile_decode_out")
        bufs = [self.rt.upload(q, "q"), k, v, self.rt.upload(bt, "block_tables"),
                self.rt.upload(batch.context_lens.astype(np.uint32), "context_lens"), self.fast._tensor(tensor), partials]
        imm = kern.pack(num_kv_heads, H, batch.block_size, bt.shape[1], pt, P, float(scale) * fd.LOG2E)
        d = [Dispatch(kern, bufs, (P, num_kv_heads, S), imm),
             self.rt.compile(fd.REDUCE).dispatch((H, S, 1), [partials, out], H, D, P)]
        lay = fd.Layout(la, WG // la, unroll_a, D // la)
        return fd.FastDecodePlan(d, out, (S, H, D), pt, P, lay, "tile")

    def decode(self, fmt: fd.CacheFormat, k, v, num_kv_heads: int, q, batch: PagedBatch, scale: float, **kw) -> np.ndarray:
        plan = self.plan(fmt, k, v, num_kv_heads, q, batch, scale, **kw)
        self.rt.run(plan.dispatches)
        return self.rt.read(plan.out, np.float32, plan.shape)
