"""Fast writers of the llama.cpp block types (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4) and of NVFP4
shaders/ggml/write_fast.wgsl (the type as a define, the per-block helpers of ggml/common.wgsl)
and shaders/fp4/nvfp4_write_fast.wgsl; the same words as the first-wave writers ggml/write.wgsl and
fp4/nvfp4_write.wgsl and the oracles kvviz/families/ggml/oracle.py (gguf.quants) and kvviz/families/fp4/oracle.py
(tests/test_fast_write_ggml.py).

Against the first-wave writers (one 64-thread workgroup per (token, KV head, K|V), loops of stride 64,
workgroup memory and barriers between the block parameters, the codes and the words):
  - a lane owns whole 32-element blocks (NVFP4: groups of 4 x 16 elements, or 1 group with the scale words put
    together by subgroup shuffles, the default where subgroups allow: NVFP4_GROUPS_PER_LANE) of a (token, KV head) row, K and
    V one after the other; R = 64 / L rows a workgroup; a lane builds its words in registers (the byte
    offsets are constants once the loops are unrolled) and stores them itself. No block statistic crosses
    lanes (a block's amax, min / max and iq4_nl's 16 scale trials all lie in its lane): no lane-group
    reduction, no barrier and no workgroup memory, but for iq4_nl's table;
  - where the blocks' bytes end inside a word (q8_0 34 B, q4_0 / iq4_nl 18, q5_0 22, mxfp4 17), a lane takes one
    block and the word it shares with the next block's lane comes over by subgroupShuffleDown (`exchange`, the
    default where the word-aligned unit of 2 or 4 blocks fits the smallest subgroup wgpu guarantees); otherwise
    a lane owns the fewest blocks that span whole u32 words (q8_0: 2 blocks = 68 bytes = 17 words, q4_0 / q5_0
    / iq4_nl: 2, q4_1 / q5_1: 1, mxfp4: 4). A lane a block with the exchange measured faster than whole words
    a lane on the H200 at the anchor for q8_0, q4_0, q5_0 and mxfp4 (docs/benchmarks.md);
  - the next block's (NVFP4: group's) 8 vec4s are loaded before a block is quantised (not iq4_nl, whose trials
    want the registers): measured faster for q8_0 and NVFP4 (docs/benchmarks.md);
  - iq4_nl: the nearest of the 16 values (each of the 16 trials x 32 values, and the codes) is one load from
    a workgroup table indexed by floor(2 id x) (IQ4_TABLE entries, built by the workgroup, one barrier),
    not a 16-value search;
  - every type's divisions (d, id; iq4_nl's 17+ a block) are exact by a float estimate corrected on the
    exact integer remainder (common/quant.wgsl div_fast), not a 25-step loop: the same bits;
  - q8_0's roundf as trunc(q + copysign(0.5 - 2^-25, q)) (Q8_TRUNC; or on the bits of q + 1.5 * 2^23 with a tie
    fix); mxfp4's exponent by a formula (no 256-entry private table; tests: against kvviz/families/ggml/format.py
    log2_up_table and gguf) and its codes as the nearest doubled E2M1 value on the bits (not a 16-value argmin
    search; the same codes);
  - 16-B loads (8 vec4s a block), codes 4 at a time, whole-word stores;
  - NVFP4: scales and codes from one product each (max|x| * (1/s_t * 1/6), |x| * (1/s_t * 1/e4m3)),
    encoded on the float bits, branch-free; a group with a value within 32 ulp of a rounding boundary (or
    a subnormal) is redone exactly after the lane's loop (div_fast twice a value, as the first-wave writer);
  - the records staged through workgroup memory and stored by consecutive threads (STAGE; not iq4_nl): a lane's
    own stores would write 4-byte words a block apart, a sector each (much slower on the H200);
  - a 2-D grid (fast_write.grid_2d): more than 65535 workgroups take one dispatch; the input is split
    only where it exceeds one storage binding (fast_write.input_chunks).
`blocks_per_lane` (a multiple of the type's smallest word-aligned block count) gives a lane more blocks (and
turns the exchange off): the tests run every type at the default, with and without the exchange, and at twice
the blocks a lane.
"""
from __future__ import annotations


from kvviz.errors import InvalidInput, UnsupportedShape
from kvviz.families.ggml.format import BLOCK, TYPES, GgmlType
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime
from kvviz.attention import writers as fw
_TOKENS = ro("key_in", "val_in", "slots")
# `zero` is 0 at run time: products are xored with it so that no driver fuses them into an add (ggml_write.wgsl).
WRITE_GGML = KernelSpec("ggml/write_fast.wgsl", bindings=_TOKENS + rw("k_cache", "v_cache"),
                        immediates=Struct("P", "kvh hd bs wpt rows gx zero"))
WG = 64
# iq4_nl's nearest-value table in workgroup memory (write_ggml.wgsl iq4_table): entries floor(2a) = -272 .. 271
IQ4_TABLE = 544


def min_blocks_per_lane(t: GgmlType) -> int:
    """The fewest consecutive blocks whose bytes are whole u32 words (34 B: 2, 17 B: 4, 20 B: 1, ...)."""
    n = 1
    while (n * t.block_bytes) % 4:
        n += 1
    return n


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# q8_0's roundf as trunc(q + copysign(0.5 - 2^-25, q)) (write_ggml.wgsl Q8_TRUNC): the same words, fewer operations.
# With the staged stores it measured faster on one H200 and no different on another; without the staging it makes
# no difference (the stores are the limit). Kept: it is never slower.
Q8_TRUNC = True


# The records staged through workgroup memory and stored by consecutive threads (write_ggml.wgsl and
# write_nvfp4.wgsl STAGE), not by each lane at its block's bytes: every type but iq4_nl (measured slower: its
# table shares the workgroup memory; write_ggml.wgsl says why).
STAGE = True
NO_STAGE = ("iq4_nl",)


def stage_defines(stage: bool, lanes: int, wpr: int) -> dict:
    """STAGE and the workgroup-memory sizes of its records (R = 64 / lanes rows of wpr words; 1 without it)."""
    return dict(STAGE=1 if stage else 0, WPR=wpr, SO_LEN=(WG // lanes) * wpr if stage else 1,
                SD_LEN=WG // lanes if stage else 1)


def ggml_spec(t: GgmlType, nb_lane: int | None = None, lanes: int = 1, exchange: bool = False,
              q8_trunc: bool | None = None, head_size: int = 128, stage: bool | None = None) -> KernelSpec:
    """exchange: a lane a block, the word two blocks share handed over by a subgroup shuffle (write_ggml.wgsl XCH);
    q8_trunc: q8_0's roundf variant (Q8_TRUNC; default the module's); stage (default: STAGE but NO_STAGE): the
    records stored through workgroup memory by consecutive threads."""
    d = {k: v for k, v in t.defines().items() if k != "LOG2_UP"}   # mxfp4's exponent: a formula (mxfp4_e)
    nb = 1 if exchange else (nb_lane or min_blocks_per_lane(t))
    nwl = -(-nb * t.block_bytes // 4) + (1 if exchange else 0)   # exchange: a spare word for the shifted bytes
    trunc = Q8_TRUNC if q8_trunc is None else q8_trunc
    st = (STAGE and t.name not in NO_STAGE) if stage is None else stage
    return WRITE_GGML.define(**d, **stage_defines(st, lanes, t.words_per_token(head_size)),
                             NQ=8 if t.name == "q8_0" else 4, NB=nb, LANES=lanes,
                             NWL=nwl, NW1=min(nwl, 16), NW2=nwl - min(nwl, 16), IQ4_TN=IQ4_TABLE if t.name == "iq4_nl" else 1,
                             XCH=1 if exchange else 0, Q8_TRUNC="true" if trunc else "false",
                             NEXT_FIRST="return subgroupShuffleDown(v, 1u);" if exchange else "return 0u;")


KERNELS = {"fast_write_ggml": tuple(ggml_spec(t) for t in TYPES.values())}


def lanes_for(units: int, per_lane: int) -> int:
    L = _pow2_at_least(-(-units // per_lane))
    if L > WG:
        raise UnsupportedShape(f"fast ggml writer: {units} blocks a row need {L} lanes (at most {WG})")
    return L


def ggml_dispatches(rt: GpuRuntime, t: GgmlType | str, key, value, slots, k_buf, v_buf, block_size: int, *,
                    blocks_per_lane: int | None = None, exchange: bool | None = None,
                    q8_trunc: bool | None = None, stage: bool | None = None) -> list[Dispatch]:
    """The ggml records of `t` (kvviz/families/ggml/format.py: the token's ggml row padded to whole words) of K and V
    into the paged caches k_buf / v_buf [num_blocks, kv_heads, block_size, wpt] through `slots`.
    exchange (default: where subgroups allow, unless blocks_per_lane is given): a lane a block, the words two
    blocks share handed over by a subgroup shuffle, instead of the fewest blocks whose bytes are whole words."""
    t = TYPES[t] if isinstance(t, str) else t
    key, value, sm = fw.check_rows(key, value, slots)
    T, kvh, D = key.shape
    if D % BLOCK:
        raise UnsupportedShape(f"fast ggml writer: head_size {D} is not a multiple of {BLOCK}")
    base = min_blocks_per_lane(t)
    nbl = blocks_per_lane or base
    if nbl % base:
        raise InvalidInput(f"fast ggml writer: {t.name} takes blocks_per_lane in multiples of {base}, got {nbl}")
    fits = fw.subgroups_available(rt) and base <= fw.smallest_subgroup(rt)   # a word-aligned unit in a subgroup
    if exchange is None:   # the default: a lane a block wherever it can
        exchange = blocks_per_lane is None and base > 1 and fits
    elif exchange and not fits:
        raise InvalidInput(f"fast ggml writer: the block exchange needs subgroups of at least {base} lanes on this adapter",
                           "Leave exchange unset: the writer then takes whole words a lane.")
    if exchange:
        nbl = 1
    L = lanes_for(D // BLOCK, nbl)
    kern = rt.compile(ggml_spec(t, nbl, L, bool(exchange), q8_trunc, D, stage))
    wpt = t.words_per_token(D)
    return fw.row_dispatches(rt, kern, key, value, sm, [k_buf, v_buf],
                              lambda rows, gx: kern.pack(kvh, D, block_size, wpt, rows, gx, 0), WG // L)


__all__ = ["KERNELS", "ggml_dispatches", "min_blocks_per_lane"]
