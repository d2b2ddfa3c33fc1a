"""The causal (chunked) prefill attention over the paged cache: a block of query positions of each sequence
attends over the sequence's cached K/V up to its own position, reading the packed codes of the cache in place.
Family "prefill" (kvviz/families/catalogue.py): one kernel, shaders/attention/prefill_kernel.wgsl, included by one
shell per cache layout that supplies the layout's load functions (the formats' own dequantisation code):
  attention/prefill.wgsl      f32, f16, int8 (seed / per token), FP8 per token / tensor / KV head, int4 groups
                              (attention/prefill_formats.wgsl.j2 over the fast decode's attention/cache_formats.wgsl.j2)
  ggml/prefill.wgsl           llama.cpp's block types (ggml/value.wgsl, the dequantiser's element function)
  fp4/prefill.wgsl            NVFP4 (fp4/nvfp4_value.wgsl)
  kivi/prefill.wgsl           KIVI: key groups, value records, the f32 window (kivi/value.wgsl)
  turboquant/prefill.wgsl     TurboQuant: codes, QJL bits and norms, rotated back in workgroup memory
numpy reference kvviz/attention/prefill_oracle.py (exact causal attention in float64 over the dequantised cache);
tests tests/test_prefill.py.

Batch convention (vLLM's chunked prefill): `batch` is the sequences' paged batch after the chunk was written, its
context_lens the positions each sequence holds; q [sum(q_lens), H, D] holds the chunk's queries, sequence after
sequence, q_lens[s] of them for sequence s at positions context_lens[s] - q_lens[s] .. context_lens[s] - 1. Query t
attends to positions 0 .. its own.

The kernel (attention/prefill_kernel.wgsl says how): tiles of BQ query positions x the G query heads of one KV head
(R = BQ G rows; every K/V value loaded once for all of them: GQA shared) walk their keys BK at a time with an online
softmax (base 2, the query pre-scaled by scale * log2 e; each score soft-capped where the model caps its attention
logits, Gemma 2), K and V dequantised into workgroup memory once per tile.
The keys may be split into partitions (then attention/split_reduce*.wgsl combines them, as for the fast decode):
to fill the device when few tiles exist, and to keep every invocation under a software rasteriser's loop limit
(lavapipe: 65535 loop iterations an invocation, kvviz/gpu/loop_budget.py). Tile sizes follow the adapter's workgroup
memory. Shapes refused (UnsupportedShape): a head size that is not a multiple of 4 or is over 256, a GQA group over
64; grids and buffers past the adapter's limits raise DeviceLimitError.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvviz.attention import split_decode as fd
from kvviz.attention.arith import SOFTMAX_PER_LOGIT
from kvviz.errors import DeviceLimitError, InvalidInput, UnsupportedShape, require_f32
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import DeviceRows, Dispatch, GpuRuntime
from kvviz.gpu.templates import render_defines
from kvviz.paging import PagedBatch

LOG2E = fd.LOG2E
MAX_HEAD_SIZE = 256  # the reduce's lanes own at most 4 dims of 64 (attention/split_reduce.wgsl)
MAX_GROUP = 64  # query heads of one KV head a tile holds at one query a tile

_IMM = Struct("P", "num_kv_heads num_heads max_blocks bt_off partition_tokens num_partitions scale_log2:f32 "
                   "cap_log2:f32")
_BASE = ro("q", "kc", "vc", "block_tables", "tiles") + rw("out")


def spec(path: str, extra: tuple[str, ...] = ()) -> KernelSpec:
    """The kernel spec of a prefill shell: the kernel's bindings, then the shell's extra ones (read-only)."""
    return KernelSpec(path, bindings=_BASE + ro(*extra), immediates=_IMM)


PREFILL = spec("attention/prefill.wgsl", ("tensor",))
GGML = spec("ggml/prefill.wgsl")
NVFP4 = spec("fp4/prefill.wgsl", ("tensor",))
KIVI = spec("kivi/prefill.wgsl", ("res", "info"))
TURBOQUANT = spec("turboquant/prefill.wgsl", ("chans", "signs", "codebook"))
KERNELS = (PREFILL, GGML, NVFP4, KIVI, TURBOQUANT)

# Invocations of a workgroup (RT x CT): 128 on a GPU; 64 on a software rasteriser, where a workgroup runs on one CPU
# thread in SIMD batches and fewer invocations idle in a barrier phase (the softmax's rows): measured faster on
# lavapipe at a SmolLM2-shaped prefill of 512 queries.
WORKGROUP = 128
WORKGROUP_SOFTWARE = 64
COLS = 16  # CT: invocations sharing a row (they split its keys, then its dims)


@dataclass(frozen=True)
class Variant:
    """How the kernel runs a tile (attention/prefill_kernel.wgsl): `spread`, the online softmax in every invocation
    from the scores it holds (else one invocation a row over the scores in workgroup memory); `vec4_scores`, Q K^T
    into vec4 accumulators summed once a tile (else a dot() a step); `workgroup` invocations (0: WORKGROUP, or
    WORKGROUP_SOFTWARE on a software adapter) of which `cols` share a row."""

    name: str
    spread: bool
    vec4_scores: bool
    workgroup: int = 0
    cols: int = COLS


# The variants `kvviz bench --prefill-variants` times side by side, each a measured default where it is one
# (docs/benchmarks.md, "Causal prefill"). "rows" is the first kernel: the tile's softmax runs in R invocations, twice
# over BK scores in workgroup memory, while the rest of the workgroup waits at a barrier. "spread" spreads that
# softmax over every invocation's registers and accumulates the scores in vec4s (four independent FMAs a step where
# a dot() is a multiply, three dependent FMAs and an add): the GPU default, faster than "rows" for every cache on the
# H200. On a software rasteriser "rows" stays the default: it measured faster there at a SmolLM2-shaped prefill (a
# CPU runs every invocation's copy of the spread softmax one after another, with no latency to hide), and the
# spread softmax's unrolled register code compiles about twice as long under lavapipe's LLVM. "spread-64x8" gives
# each invocation 4 x 4 scores and 4 rows x 4 vec4s of the output (at 32 rows by 32 keys and head 128): 2 FMAs a
# workgroup-memory load in the score loop where the 128-invocation tile's 4 x 2 scores have 1.33, with half the
# invocations to hide latency; slower than both on the H200, kept to be timed on other GPUs.
VARIANTS = {v.name: v for v in (Variant("spread", True, True), Variant("spread-64x8", True, True, 64, 8),
                                Variant("rows", False, False))}
DEFAULT_VARIANT = "spread"
DEFAULT_VARIANT_SOFTWARE = "rows"
ROWS_TARGET = 32  # R, the rows of a tile, where the group allows: BQ = ceil(32 / G) queries
BK_CHOICES = (32, 16, 8)  # keys a tile, the largest whose workgroup memory fits the adapter
# Workgroups the planner aims for before it splits keys into partitions: two per SM of an H200 (132 SMs).
TARGET_WORKGROUPS = 264
MIN_PARTITION = 512  # the shortest partition the planner makes on its own: each adds its partials and their reduce


@dataclass(frozen=True)
class Layout:
    """The tile sizes of one (head size, group, adapter)."""

    bq: int  # query positions a tile
    group: int  # G
    bk: int  # keys a K/V tile
    head_size: int
    key_scratch: int = 0  # floats of workgroup memory a shell keeps per key of a tile (TurboQuant's rotations)
    workgroup: int = WORKGROUP
    variant: Variant = VARIANTS[DEFAULT_VARIANT]

    @property
    def rows(self) -> int:
        return self.bq * self.group

    @property
    def cols(self) -> int:
        return self.variant.cols

    @property
    def dv4(self) -> int:
        return self.head_size // 4

    @property
    def tm(self) -> int:
        return -(-self.rows // (self.workgroup // self.cols))

    @property
    def tn(self) -> int:
        return -(-self.bk // self.cols)

    @property
    def nd4(self) -> int:
        return -(-self.dv4 // self.cols)

    @property
    def rowstat(self) -> int:
        """Floats of the kernel's rowstat: (alpha, then m and l) a row, or a partial max / sum a row and column."""
        return max(2 * self.rows, self.rows * self.cols) if self.variant.spread else 2 * self.rows

    def shared_bytes(self) -> int:
        qst = self.dv4 + 1
        return 4 * (4 * self.rows * qst + 4 * self.bk * qst + self.rows * (self.bk + 1) + self.rowstat
                    + self.bk * self.key_scratch)

    def describe(self) -> str:
        return (f"tiles of {self.bq} queries x {self.group} heads by {self.bk} keys, {self.workgroup} threads "
                f"({self.tm} rows x {self.tn} keys / {self.nd4} vec4s a thread), variant {self.variant.name}")


def unsupported(head_size: int, group: int) -> str:
    """Why the prefill cannot take the shape ("" when it can)."""
    if head_size <= 0 or head_size % 4:
        return f"head size {head_size} is not a multiple of 4 (the kernel moves vec4s)"
    if head_size > MAX_HEAD_SIZE:
        return f"head size {head_size} is over {MAX_HEAD_SIZE}"
    if group < 1 or group > MAX_GROUP:
        return f"a GQA group of {group} query heads per KV head is outside 1..{MAX_GROUP}"
    return ""


def choose_layout(head_size: int, group: int, shared_limit: int, key_scratch: int = 0,
                  workgroup: int = WORKGROUP, variant: Variant | None = None) -> Layout:
    """BQ = ceil(ROWS_TARGET / G) (one query a tile from G = 32 on), and the largest BK whose workgroup memory fits
    `shared_limit` (key_scratch: a shell's floats per key); BQ halves while even BK = 8 does not fit. variant:
    the kernel's (default DEFAULT_VARIANT)."""
    variant = variant or VARIANTS[DEFAULT_VARIANT]
    why = unsupported(head_size, group)
    if why:
        raise UnsupportedShape(f"prefill: {why}")
    bq = max(1, -(-ROWS_TARGET // group))
    if group > workgroup:
        raise UnsupportedShape(f"prefill: a GQA group of {group} query heads is over the workgroup's {workgroup} "
                               "invocations (one a row's softmax)")
    while True:
        for bk in BK_CHOICES:
            lay = Layout(bq, group, bk, head_size, key_scratch, workgroup, variant)
            if lay.shared_bytes() <= shared_limit:
                return lay
        if bq == 1:
            need = Layout(1, group, 8, head_size, key_scratch, workgroup, variant).shared_bytes()
            raise DeviceLimitError(f"prefill: a tile of {group} heads at head size {head_size} needs {need} bytes of "
                                   f"workgroup memory, the adapter allows {shared_limit}")
        bq //= 2


def sizes(lay: Layout, block_size: int, split: bool) -> dict:
    """The kernel's {{...}} sizes (attention/prefill_kernel.wgsl)."""
    R, qst = lay.rows, lay.dv4 + 1
    return {
        "D": lay.head_size, "DV4": lay.dv4, "G": lay.group, "BQ": lay.bq, "R": R, "BK": lay.bk, "BSZ": block_size,
        "WG": lay.workgroup, "CT": lay.cols, "TM": lay.tm, "TN": lay.tn, "ND4": lay.nd4, "QST": qst, "PST": lay.bk + 1,
        "SPLIT": "true" if split else "false", "QS": R * qst, "KVS": lay.bk * qst, "PS": R * (lay.bk + 1),
        "RS": lay.rowstat, "TMND4": lay.tm * lay.nd4, "TMTN": lay.tm * lay.tn, "K_TILE": "", "V_TILE": "",
        "SPREAD": "true" if lay.variant.spread else "false", "SV4": "true" if lay.variant.vec4_scores else "false",
    }


def loop_cost(lay: Layout, partition_tokens: int, per_key: int = 0, per_tile: int = 0) -> int:
    """Loop-limiter decrements of the costliest invocation (thread 0: it also runs a row's softmax) over one
    partition of `partition_tokens` keys, counted as kvviz/gpu/loop_budget.py counts (every loop iterations + 2, the
    marked register-tile loops expanded, so none): the query load, and per key tile its K and V loads, the score
    loop over the head's vec4s, the row's two softmax loops (not in a spread variant: its softmax is the unrolled
    register tile) and the P.V loop over the tile's keys. per_key: a format's loader loops per key loaded (K and V);
    per_tile: the loops of a format's K_TILE / V_TILE code a tile."""
    def loop(n: int) -> int:
        return max(0, int(n)) + 2

    tiles = -(-int(partition_tokens) // lay.bk)
    load = loop(-(-lay.bk * lay.dv4 // lay.workgroup)) + 2 * lay.bk * per_key
    per = 2 * load + loop(lay.dv4) + (1 if lay.variant.spread else 3) * loop(lay.bk) + per_tile
    return loop(-(-lay.rows * lay.dv4 // lay.workgroup)) + loop(tiles) + tiles * per


@dataclass
class PrefillPlan:
    """What one prefill runs: its dispatches, where the output [NQ, H, D] lands, how it tiled and split."""

    dispatches: list
    out: object
    shape: tuple[int, int, int]
    layout: Layout
    num_tiles: int
    partition_tokens: int
    num_partitions: int
    label: str
    head_size: int = 0  # the head size the caller reads back (a padded head cut back: KIVI); 0: shape[2]

    def describe(self) -> str:
        split = (f", keys in {self.num_partitions} partitions of {self.partition_tokens}"
                 if self.num_partitions > 1 else "")
        return f"{self.label}: {self.num_tiles} query tiles, {self.layout.describe()}{split}"


def query_lens(batch: PagedBatch, q_lens) -> np.ndarray:
    """q_lens as int64 [num_seqs], each chunk within its sequence's cached positions (InvalidInput otherwise)."""
    lens = np.asarray(q_lens, dtype=np.int64).reshape(-1)
    if lens.shape != (batch.num_seqs,):
        raise InvalidInput(f"q_lens must give one chunk length per sequence ({batch.num_seqs}), got {lens.shape[0]}")
    ctx = np.asarray(batch.context_lens, dtype=np.int64)
    if (lens < 0).any() or (lens > ctx).any():
        s = int(np.argmax((lens < 0) | (lens > ctx)))
        raise InvalidInput(f"sequence {s}: a chunk of {int(lens[s])} queries does not fit its {int(ctx[s])} cached "
                           "positions (the chunk's own K/V are written before it attends)")
    return lens


def check_inputs(q, batch: PagedBatch, q_lens, num_kv_heads: int, scale: float, softcap: float = 0.0):
    """(q as f32 [NQ, H, D], q_lens, G), or InvalidInput / UnsupportedShape naming what is wrong. q DeviceRows (already
    on the device) is checked by its shape alone: its values are never on the host."""
    if isinstance(q, DeviceRows):
        if len(q.shape) != 3:
            raise InvalidInput(f"q must be [num_queries, num_heads, head_size], got shape {q.shape}")
    else:
        q = require_f32("q", q, "[num_queries, num_heads, head_size]", 3)
    NQ, H, D = q.shape
    lens = query_lens(batch, q_lens)
    if int(lens.sum()) != NQ:
        raise InvalidInput(f"q holds {NQ} queries, the chunk lengths sum to {int(lens.sum())}")
    if num_kv_heads <= 0 or H % num_kv_heads:
        raise InvalidInput(f"{H} query heads do not divide into {num_kv_heads} KV heads")
    if not np.isfinite(scale) or scale <= 0:
        raise InvalidInput(f"the attention scale must be a positive finite number, got {scale}")
    if not np.isfinite(softcap) or softcap < 0:
        raise InvalidInput(f"the attention soft-cap must be 0 (none) or a positive finite number, got {softcap}")
    why = unsupported(D, H // num_kv_heads)
    if why:
        raise UnsupportedShape(f"prefill: {why}", "The decode loop (one decode a query) takes this shape.")
    return q, lens, H // num_kv_heads


def make_tiles(batch: PagedBatch, lens: np.ndarray, bq: int) -> np.ndarray:
    """[tiles, 4] u32: (sequence, first query row, its position, queries) of every BQ-query tile."""
    out = []
    row = 0
    for s, n in enumerate(lens):
        first = int(batch.context_lens[s]) - int(n)
        for t in range(0, int(n), bq):
            out.append((s, row + t, first + t, min(bq, int(n) - t)))
        row += int(n)
    return np.asarray(out, dtype=np.uint32).reshape(-1, 4)


class Prefill:
    """Compiles and dispatches the prefill kernel on one runtime."""

    def __init__(self, rt: GpuRuntime, workgroup: int | None = None, variant: str | None = None):
        """workgroup: the invocations of a workgroup (default the variant's, else WORKGROUP, WORKGROUP_SOFTWARE on a
        software adapter); variant: a name of VARIANTS (default DEFAULT_VARIANT, DEFAULT_VARIANT_SOFTWARE on a
        software adapter)."""
        self.rt = rt
        self._zero = None
        software = bool(getattr(getattr(rt, "summary", None), "is_software", False))
        variant = variant or (DEFAULT_VARIANT_SOFTWARE if software else DEFAULT_VARIANT)
        if variant not in VARIANTS:
            raise InvalidInput(f"prefill: no variant {variant!r}", f"The variants: {', '.join(VARIANTS)}.")
        self.variant = VARIANTS[variant]
        self.workgroup = workgroup or self.variant.workgroup or (WORKGROUP_SOFTWARE if software else WORKGROUP)
        cols = self.variant.cols
        if self.workgroup % cols or self.workgroup > 1024:
            raise InvalidInput(f"prefill: a workgroup of {self.workgroup} invocations is not a multiple of {cols} up to 1024")

    def layout(self, head_size: int, group: int, key_scratch: int = 0) -> Layout:
        limit = int(self.rt.limits.get("max-compute-workgroup-storage-size", 16384) or 16384)
        return choose_layout(head_size, group, limit, key_scratch, self.workgroup, self.variant)

    def dummy(self):
        """A one-word buffer for an extra binding a format does not read."""
        if self._zero is None:
            self._zero = self.rt.upload(np.zeros(4, np.uint32), "prefill_unused")
        return self._zero

    def split(self, lay: Layout, n_tiles: int, num_kv_heads: int, max_len: int, partition_tokens: int | None,
              per_key: int = 0, per_tile: int = 0) -> tuple[int, int]:
        """(partition_tokens, partitions): `partition_tokens` as asked, else the whole context in one partition when
        the grid has TARGET_WORKGROUPS tiles x KV heads, else enough partitions (of at least MIN_PARTITION keys) to
        reach it; then shortened until an invocation fits the adapter's loop limit. A multiple of BK."""
        bk = lay.bk
        max_len = max(1, int(max_len))
        if partition_tokens is not None:
            if int(partition_tokens) <= 0:
                raise InvalidInput(f"partition_tokens must be positive, got {partition_tokens}")
            pt = int(partition_tokens)
        else:
            parts = max(1, math.ceil(TARGET_WORKGROUPS / max(1, n_tiles * num_kv_heads)))
            pt = max(MIN_PARTITION, math.ceil(max_len / parts))
        pt = min(-(-pt // bk) * bk, -(-max_len // bk) * bk)
        limit = self.rt.loop_limit
        if limit is not None:
            while partition_tokens is None and pt > bk and loop_cost(lay, pt, per_key, per_tile) > limit:
                pt = max(bk, (pt // 2) // bk * bk)
            need = loop_cost(lay, pt, per_key, per_tile)
            if need > limit:
                raise DeviceLimitError(
                    f"prefill: partitions of {pt} keys need {need} loop iterations an invocation, over this adapter's "
                    f"loop limit of {limit} (its result would be silently wrong)",
                    "Use shorter partitions (partition_tokens), or leave them to the planner.")
        return pt, -(-max_len // pt)

    def plan(self, kspec: KernelSpec, defines, k, v, extra: list, num_kv_heads: int, q, batch: PagedBatch, q_lens,
             scale: float, *, label: str, record_words: int = 0, block_tables=None, bt_off: int = 0,
             max_blocks: int | None = None, partition_tokens: int | None = None, per_key: int = 0,
             per_tile=0, key_scratch: int = 0, softcap: float = 0.0) -> PrefillPlan:
        """Dispatches of one prefill: the shell `kspec` with its format `defines` (a dict, or a function of the
        Layout: a shell whose code depends on the tile sizes; per_tile likewise: its loops a tile, for the loop
        budget; key_scratch: its workgroup floats a key), over caches k, v (u32 words of
        [num_blocks, kv_heads, block_size, record_words] where record_words > 0: checked against the batch's
        blocks) and the shell's `extra` buffers. block_tables: a buffer holding the block tables from word bt_off,
        max_blocks entries a sequence (KIVI's info), default the batch's, uploaded. softcap: the attention logits'
        soft-cap (scale q.k -> softcap tanh(scale q.k / softcap) before the softmax; 0: none). q: f32 [NQ, H, D] on the
        host (uploaded) or DeviceRows (bound in place: a forward on the device hands its queries over without a
        read-back)."""
        q, lens, G = check_inputs(q, batch, q_lens, num_kv_heads, scale, softcap)
        NQ, H, D = q.shape
        lay = self.layout(D, G, key_scratch)
        if callable(defines):
            defines = defines(lay)
        if callable(per_tile):
            per_tile = per_tile(lay)
        tiles = make_tiles(batch, lens, lay.bq)
        out = self.rt.empty(max(1, NQ * H * D) * 4, "prefill_out")
        if not len(tiles):
            return PrefillPlan([], out, (NQ, H, D), lay, 0, 0, 0, label)
        fd.check_grid(self.rt, "prefill", (("query tiles", len(tiles)), ("KV heads", num_kv_heads)))
        for name, buf in (("K", k), ("V", v)):
            if buf.size > self.rt.max_binding:
                raise DeviceLimitError(f"prefill: the {name} cache ({buf.size / 2**20:.1f} MiB) is over the adapter's "
                                       f"storage binding limit of {self.rt.max_binding / 2**20:.1f} MiB",
                                       "Use a smaller block pool.")
        if record_words:
            need = batch.num_blocks * num_kv_heads * batch.block_size * record_words * 4
            for name, buf in (("K", k), ("V", v)):
                if buf.size < need:
                    raise InvalidInput(f"prefill: the {name} cache holds {buf.size} bytes, the batch's "
                                       f"{batch.num_blocks} blocks of {label} need {need}")
        max_len = int(np.max(np.asarray(batch.context_lens)[lens > 0]))
        pt, P = self.split(lay, len(tiles), num_kv_heads, max_len, partition_tokens, per_key, per_tile)
        fd.check_grid(self.rt, "prefill", (("partitions", P),) + ((("queries (the reduce's grid)", NQ),) if P > 1 else ()))
        kern = self.rt.compile(kspec, **{**{k_: str(v_) for k_, v_ in sizes(lay, batch.block_size, P > 1).items()},
                                         **defines})
        if block_tables is None:
            bt = np.ascontiguousarray(batch.block_tables, dtype=np.uint32)
            block_tables, max_blocks = self.rt.upload(bt, "block_tables"), bt.shape[1]
        elif max_blocks is None:
            max_blocks = batch.block_tables.shape[1]
        tb = self.rt.upload(tiles, "prefill_tiles")
        imm = kern.pack(num_kv_heads, H, max_blocks, bt_off, pt, P, float(scale) * LOG2E, float(softcap) * LOG2E)
        grid = (len(tiles), num_kv_heads, P)
        q_in = q.buffer if isinstance(q, DeviceRows) else self.rt.upload(q, "q")
        if P == 1:
            d = [Dispatch(kern, [q_in, k, v, block_tables, tb, out, *extra], grid, imm)]
        else:
            nbytes = NQ * H * P * (D + 2) * 4
            self.rt.check_size(nbytes, "prefill partials", True)
            partials = self.rt.empty(nbytes, "prefill_partials")
            reduce = fd.reduce_spec(P)
            limit = self.rt.loop_limit
            if limit is not None and fd.reduce_loops(P, reduce) > limit:
                raise DeviceLimitError(f"prefill: {P} partitions need {fd.reduce_loops(P, reduce)} loop iterations in "
                                       f"the reduce, over this adapter's loop limit of {limit}")
            d = [Dispatch(kern, [q_in, k, v, block_tables, tb, partials, *extra], grid, imm),
                 self.rt.compile(reduce).dispatch((H, NQ, 1), [partials, out], H, D, P)]
        return PrefillPlan(d, out, (NQ, H, D), lay, len(tiles), pt, P, label)

    def read(self, plan: PrefillPlan) -> np.ndarray:
        NQ, H, D = plan.shape
        if not NQ:
            return np.zeros((0, H, D), np.float32)
        out = self.rt.read(plan.out, np.float32, plan.shape)
        return out[..., : plan.head_size] if plan.head_size else out

    def run(self, plan: PrefillPlan) -> np.ndarray:
        self.rt.run(plan.dispatches)
        return self.read(plan)


# ---------------------------------------------------------------------------------- kvviz's packed formats
@dataclass(frozen=True)
class RecordFormat:
    """One cache format of attention/prefill.wgsl: a fast-decode CacheFormat, and where a 4-codes-a-word format's
    scale lives ("token": the record's scale word; "tensor": tensor[2 + K|V]; "head": tensor[K|V * kv heads + h])."""

    cache: fd.CacheFormat
    scale: str = ""

    @property
    def scale_mode(self) -> str:
        return self.scale or self.cache.scale

    @property
    def name(self) -> str:
        s = self.scale_mode
        return self.cache.name + (f" ({s} scale)" if s not in ("none", "") else "") + (
            f" (group {self.cache.group_size})" if self.cache.group_size else "")


F32 = RecordFormat(fd.F32)
F16 = RecordFormat(fd.F16)
INT8 = RecordFormat(fd.INT8)


def record_format(cache: fd.CacheFormat, per_head: bool = False) -> RecordFormat:
    return RecordFormat(cache, "head" if per_head else "")


def format_unsupported(fmt: RecordFormat, head_size: int) -> str:
    c = fmt.cache
    if head_size % c.elems_per_word:
        return f"head size {head_size} is not a multiple of the {c.elems_per_word} codes a word of {c.name}"
    if c.group_size and (c.group_size % 4 or head_size % c.group_size):
        return f"group size {c.group_size} is not a multiple of 4 dividing head size {head_size}"
    return ""


def render_formats(fmt: RecordFormat, head_size: int) -> dict:
    """The {{...}} values of attention/prefill.wgsl for one format (its LOADERS from attention/prefill_formats.wgsl.j2)."""
    return {"FORMAT": fmt.name, "WPT": str(fmt.cache.wpt(head_size)),
            **render_defines("attention/prefill_formats.wgsl.j2", fmt=fmt.cache, scale=fmt.scale_mode, D=head_size)}


def plan_records(pf: Prefill, fmt: RecordFormat, k, v, num_kv_heads: int, q, batch: PagedBatch, q_lens, scale: float, *,
                 tensor=None, partition_tokens: int | None = None, softcap: float = 0.0) -> PrefillPlan:
    """The prefill over a cache of `fmt` records (buffers k, v of [num_blocks, kv_heads, block_size, wpt] u32, or
    f32 for the f32 cache); tensor: the per-tensor / per-head scale words where fmt has them; softcap: the logits'
    soft-cap (Prefill.plan)."""
    shape = tuple(q.shape) if isinstance(q, DeviceRows) else np.shape(q)
    D = shape[-1] if len(shape) == 3 else 0
    why = format_unsupported(fmt, D) if D else ""
    if why:
        raise UnsupportedShape(f"prefill ({fmt.name}): {why}")
    if fmt.scale_mode in ("tensor", "head") and tensor is None:
        raise InvalidInput(f"prefill ({fmt.name}): the format's scales need their tensor buffer")
    return pf.plan(PREFILL, render_formats(fmt, D) if D else {}, k, v, [tensor if tensor is not None else pf.dummy()],
                   num_kv_heads, q, batch, q_lens, scale, label=f"prefill {fmt.name}",
                   record_words=fmt.cache.wpt(D) if D else 0, partition_tokens=partition_tokens, softcap=softcap)


def representative_defines(head_size: int) -> dict:
    """{shell path: its format defines} for one representative format of each shell (the kernel-spec checks render
    every shell once)."""
    return {PREFILL.path: render_formats(record_format(fd.int4_format(32)), head_size),
            GGML.path: {"TYPE": "4", "BPB": "24", "HDR": "4", "QH": "1", "WPT": str(head_size // 32 * 6)},
            NVFP4.path: {"WPT": str((head_size // 16 + 3) // 4 + head_size // 8)},
            KIVI.path: {"BITS": "2", "KSTRIDE": str(16 * head_size * 2 // 32 + head_size)},
            TURBOQUANT.path: render_turboquant([_TQ_EXAMPLE], [_TQ_EXAMPLE], 9, 5, choose_layout(head_size, 2, 16384,
                                                                                             head_size))}


# one instance of a 64-dim rotation at 2 bits (the keys' QJL words after the codes) for representative_defines
_TQ_EXAMPLE = {"n_ch": 64, "P": 64, "bits": 2, "chan_off": 0, "sign_off": 0, "cb_off": 0, "code_off": 0, "jl_off": 4,
               "norm_off": 6, "inv": 0x3E000000, "qjl": 0x3CA06D3B}


def render_turboquant(k_instances: list[dict], v_instances: list[dict], wpk: int, wpv: int, lay: Layout) -> dict:
    """The {{...}} values of turboquant/prefill.wgsl: its tile code (turboquant/prefill.wgsl.j2) for the instances of
    K and V, each a dict of n_ch, P, bits, chan_off, sign_off, cb_off, code_off, jl_off, norm_off, inv and qjl (the
    f32 bits of 1 / sqrt P and of the QJL scale), at the layout's tile size."""
    pmax = max(i["P"] for i in list(k_instances) + list(v_instances))
    return {"WPK": str(wpk), "WPV": str(wpv), "PMAX": str(pmax), "SCR": str(lay.bk * pmax),
            **render_defines("turboquant/prefill.wgsl.j2", k_instances=list(k_instances), v_instances=list(v_instances))}


def turboquant_tile_loops(lay: Layout, k_instances: list[dict], v_instances: list[dict]) -> int:
    """Loop-limiter decrements of turboquant/prefill.wgsl's tile code a K and V tile (loop_cost's per_tile), counted
    as loop_cost counts them: per instance its passes over the tile's P (or n_ch) coordinates, a workgroup a step, and
    the WHTs' log2 P strides of P / 2 butterflies."""
    def loop(n):
        return max(0, int(n)) + 2

    def over(n):
        return loop(-(-lay.bk * int(n) // lay.workgroup))

    def wht(P):
        stages = int(P).bit_length() - 1
        return loop(stages) + stages * over(P // 2)

    total = 0
    for keys, insts in ((True, k_instances), (False, v_instances)):
        for i in insts:
            total += (over(i["P"]) + wht(i["P"]) if keys else 0) + over(i["P"]) + wht(i["P"]) + over(i["n_ch"])
    return total


def prefill_traffic(batch: PagedBatch, q_lens, num_heads: int, num_kv_heads: int, head_size: int, kv_bytes: float,
                    plan: PrefillPlan | None = None) -> tuple[int, float]:
    """(unique bytes, flops) of one prefill: every cached position up to each sequence's last query read once per
    KV head (`kv_bytes`: its K and V records of one KV head), the queries read and the output written (and the
    partials written and read back when split); flops = 2 (FMA) x D x (QK + PV) for every (query, head, key it
    sees) plus the softmax (kvviz/attention/arith.py's counting)."""
    lens = np.asarray(q_lens, np.int64)
    ctx = np.asarray(batch.context_lens, np.int64)
    keys = int(np.where(lens > 0, ctx, 0).sum())
    seen = int(sum(n * (c - n) + n * (n + 1) // 2 for n, c in zip(lens.tolist(), ctx.tolist())))
    NQ = int(lens.sum())
    nbytes = keys * num_kv_heads * kv_bytes + 2 * NQ * num_heads * head_size * 4
    if plan is not None and plan.num_partitions > 1:
        nbytes += 2 * NQ * num_heads * plan.num_partitions * (head_size + 2) * 4
    return int(nbytes), float(seen * num_heads * (4 * head_size + SOFTMAX_PER_LOGIT))
