"""Kernel slots: every replaceable kernel of kvviz with its written contract, as data.

A slot is one kernel a user may swap for their own: the f32 baseline writer / decode / reduce, the seed
int8 writer / decode, each per-token-record method's writer and dequantiser (f16 and vLLM FP8 included),
KIVI's two writer kernels and its dequantiser, the fast writers, the fast split-K decode over every cache
format it reads (f32, f16, the int8 seed layout, FP8 E4M3 / E5M2 per-token, int4 per group) with its reduce,
and the causal prefill in the shell of each cache layout.
Its contract says:
  - bindings: index, name, access, element type, shape, and how each buffer is laid out (a cache's
    layout is the method's CacheLayout, the block inspector's data, at the reference head size);
  - immediates: each field, its type and meaning (packed by the slot's KernelSpec struct);
  - what the dispatch grid means (one workgroup per what);
  - which numpy oracle checks it and how (what is compared, the tolerance).
A user kernel must declare the same bindings and immediates (KernelSpec.check, as for every built-in
kernel); `kvviz.lab.check` then runs the slot's pipeline with the user's kernel in the slot's place,
compares the checked output with the oracle and times it beside the built-in.

Qt-free. New kernels (the fast decode's, the fast writers) register a slot with `register`.
`render_markdown()` is docs/slots.md (tests/test_lab.py checks the file is current; `python -m
kvviz.lab.slots > docs/slots.md` writes it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kvviz.attention import paged as pk, prefill as pf, split_decode as fd
from kvviz.errors import InvalidInput
from kvviz.families.fp8 import kernels as fp8_kernels
from kvviz.families.ggml import writer as fwg
from kvviz.families.int4 import kernels as int4_kernels
from kvviz.families.int8 import kernels as int8_kernels
from kvviz.families.int8.method_seed import Int8PerTokenSeed
from kvviz.families.kivi import kernels as kivi_kernels
from kvviz.families.registry import get_method, registry
from kvviz.gpu.kernel_spec import READ_WRITE, KernelSpec
from kvviz.gpu.shaders import FRONTEND_GLSLANG
from kvviz.methods.records import PerTokenRecordMethod

REF_HEAD_SIZE = 128  # the head size and block size the contracts' layouts are written at
REF_BLOCK_SIZE = 16


@dataclass(frozen=True)
class BufferContract:
    binding: int
    name: str
    access: str  # "read" | "read_write"
    elem: str  # "f32", "u32", "vec4<u32>"
    shape: str
    layout: str


@dataclass(frozen=True)
class ImmediateField:
    name: str
    type: str
    meaning: str


@dataclass(frozen=True)
class Slot:
    id: str  # "<owner>.<role>": "f32.decode", "int8_token.writer"
    title: str
    role: str  # kvviz.gpu.timed.ROLES
    impl: str  # the built-in kernel's implementation (kvviz.gpu.timed.IMPLS)
    spec: KernelSpec  # the built-in kernel, fixed defines included
    method: str | None  # registry id of the method whose pipeline runs it (None: the paged f32 / seed kernels)
    case: str  # how kvviz.lab.check builds its pipeline: "paged-writer", "paged-decode", "method-writer", ...
    fmt: str = ""  # paged cache format ("f32" / "q8") of a paged case
    buffers: tuple[BufferContract, ...] = ()
    immediates: tuple[ImmediateField, ...] = ()
    grid: str = ""
    oracle: str = ""
    tolerance: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    timed_name: str = ""  # the built-in's row name in the window's timings and the run history
    # True: the built-in is compiled with defines chosen per shape (lanes, head size, generated code blocks):
    # `kernel new` writes it with its {{NAME}} placeholders, and a user kernel's placeholders are filled with
    # the built-in's values at the shape being run
    template: bool = False
    # the method's options the slot's pipeline runs with ((name, value), ...; () the method's defaults)
    options: tuple = ()

    @property
    def language(self) -> str:
        return "wgsl" if self.spec.path.endswith(".wgsl") else "glsl"

    @property
    def frontend(self) -> str:
        return "" if self.language == "wgsl" else FRONTEND_GLSLANG

    @property
    def suffix(self) -> str:
        return ".wgsl" if self.language == "wgsl" else ".comp"

    def starting_source(self) -> str:
        """The built-in kernel as a user's starting file: WGSL with its includes resolved and its defines
        applied (one self-contained file), GLSL with its includes resolved (glslang gets no defines here)."""
        sh = self.spec.shader(self.frontend)
        text = sh.source() if self.template else sh.rendered()
        head = "//"
        banner = (f"{head} kvviz kernel slot {self.id}: a copy of the built-in {self.spec.name} ({self.impl}).\n"
                  f"{head} Its contract: docs/slots.md, `kvviz kernel list`. Check and time it with\n"
                  f"{head}   kvviz bench --quick --no-methods --kernel {self.id}=<this file>\n")
        if self.template:
            chooser = ("kvviz/attention/split_decode.py" if "decode" in self.spec.path else
                       "kvviz/attention/prefill.py" if "prefill" in self.spec.path else "the family's kernels.py")
            banner += (f"{head} Its double-brace placeholders are filled with the built-in's values at the shape being run\n"
                       f"{head} ({chooser} chooses them).\n")
        if self.language == "glsl":
            lines = text.splitlines()
            at = next((i + 1 for i, l in enumerate(lines) if l.strip().startswith("#version")), 0)
            return "\n".join(lines[:at] + banner.rstrip("\n").splitlines() + lines[at:]) + "\n"
        return banner + text

    def to_json(self) -> dict:
        return {
            "id": self.id, "title": self.title, "role": self.role, "impl": self.impl, "method": self.method,
            "shader": self.spec.path, "entry": self.spec.entry, "language": self.language,
            "bindings": [b.__dict__ for b in self.buffers],
            "immediates": [f.__dict__ for f in self.immediates],
            "immediates_bytes": self.spec.immediate_size,
            "grid": self.grid, "oracle": self.oracle, "tolerance": self.tolerance, "notes": list(self.notes),
            "options": dict(self.options),
        }


# ------------------------------------------------------------------------------ the words of the contracts
_BUF = {
    "key": ("f32", "[num_tokens, num_kv_heads, head_size]", "token rows of K, row stride key_stride"),
    "value": ("f32", "[num_tokens, num_kv_heads, head_size]", "token rows of V, row stride value_stride"),
    "key_in": ("f32", "[rows, kv_heads, head_size]", "token rows of K, row-major"),
    "val_in": ("f32", "[rows, kv_heads, head_size]", "token rows of V, row-major"),
    "slot_mapping": ("u32", "[num_tokens]", "cache slot of each token (block * block_size + offset); 0xFFFFFFFF: padding, skip"),
    "slots": ("u32", "[rows]", "cache slot of each row (block * block_size + offset); 0xFFFFFFFF: padding row, skip"),
    "q": ("f32", "[num_seqs, num_heads, head_size]", "one query per sequence and head (row stride q_stride)"),
    "block_tables": ("u32", "[num_seqs, max_num_blocks_per_seq]", "physical block of each logical block (0 past the end)"),
    "context_lens": ("u32", "[num_seqs]", "tokens in each sequence"),
    "partials": ("f32", "[num_seqs, num_heads, num_partitions, head_size + 2]",
                 "per partition of 512 positions: max logit m, sum of e^(l - m), then sum of e^(l - m) v over head_size"),
    "out": ("f32", "[num_seqs, num_heads, head_size]", "the attention output"),
    "o": ("f32", "[num_seqs, num_heads, head_size]", "the attention output"),
    "items": ("vec4<u32>", "[work items]", "(physical block, sequence, logical block, 0) of every used block, by block"),
    "k_out": ("f32", "[window blocks, kv_heads, block_size, head_size]", "the f32 paged K cache, from block win0"),
    "v_out": ("f32", "[window blocks, kv_heads, block_size, head_size]", "the f32 paged V cache, from block win0"),
    "tensor": ("u32", "[4]", "per-tensor words (f32 bits): amax K, amax V, scale K, scale V"),
}
_IMM = {
    "key_stride": "floats between consecutive token rows of key", "value_stride": "floats between token rows of value",
    "num_kv_heads": "KV heads", "num_heads": "query heads", "head_size": "elements per head vector",
    "block_size": "tokens per cache block", "max_num_blocks_per_seq": "columns of block_tables",
    "q_stride": "floats between consecutive sequences of q", "max_context_len": "longest context in the batch",
    "scale": "softmax scale applied to q.k", "num_partitions": "partitions per (sequence, head) in partials",
    "kvh": "KV heads", "hd": "head size", "bs": "tokens per cache block", "wpt": "u32 words of one token's record",
    "win0": "first block of the bound f32 cache window (out index = block - win0)",
    "kstride": "u32 words of one (block, KV head) of the K cache: block_size * KW codes, then the side stream",
    "bt_off": "first word of the block tables in info", "mbs": "columns of the block tables in info",
    "rows": "(token, KV head) rows of this dispatch", "gx": "workgroups along x of the 2-D grid (w = y * gx + x)",
    "items": "work items of this dispatch (the grid covers them, 64 a workgroup)",
    "max_blocks": "columns of block_tables", "partition_tokens": "context positions per partition",
    "scale_log2": "softmax scale * log2(e) (the query is pre-scaled; exp2 in place of exp)",
    "cap_log2": "attention soft-cap * log2(e) (scores -> cap_log2 * tanh(score / cap_log2); 0: none)",
    "mbits": "FP8 mantissa bits", "bias": "FP8 exponent bias", "max_bits": "f32 bits of the FP8 format's largest value",
    "max_code": "FP8 code of the largest magnitude", "sat_bits": "f32 bits past which |x / scale| saturates",
    "per_head": "1: one scale per KV head, 0: one per tensor",
}
_F32_CACHE = "f32 [num_blocks, num_kv_heads, block_size, head_size]: element (block, head, offset, d)"


def _imm(spec: KernelSpec) -> tuple[ImmediateField, ...]:
    if spec.immediates is None:
        return ()
    return tuple(ImmediateField(n, t, _IMM.get(n, "")) for n, t in spec.immediates.fields)


def _buffers(spec: KernelSpec, caches: dict) -> tuple[BufferContract, ...]:
    """The spec's bindings with their types, shapes and layouts (`caches`: binding name -> (elem, shape, layout))."""
    out = []
    for i, b in enumerate(spec.bindings):
        elem, shape, layout = caches.get(b.name) or _BUF.get(b.name) or ("u32", "", "")
        out.append(BufferContract(i, b.name, "read_write" if b.access == READ_WRITE else "read", elem, shape, layout))
    return tuple(out)


def _layout_text(lay) -> str:
    fields = "; ".join(f"{f.name}: {f.count} x {f.dtype} ({f.bits} bits) per {f.per}" for f in lay.fields)
    return f"{lay.description} Fields: {fields}. Words: {lay.word_map}"


# ------------------------------------------------------------------------------ the registry
_SLOTS: dict[str, Slot] = {}


def register(slot: Slot) -> Slot:
    """Add a slot (a kernel module registers its own when it lands). The contract's bindings and immediates
    must be the spec's, in order."""
    names = tuple((b.name, b.access) for b in slot.buffers)
    want = tuple((b.name, "read_write" if b.access == READ_WRITE else "read") for b in slot.spec.bindings)
    if names != want:
        raise ValueError(f"slot {slot.id}: contract bindings {names} are not the spec's {want}")
    if tuple((f.name, f.type) for f in slot.immediates) != tuple(slot.spec.immediates.fields if slot.spec.immediates else ()):
        raise ValueError(f"slot {slot.id}: contract immediates differ from the spec's")
    _SLOTS[slot.id] = slot
    return slot


def _paged_slots() -> None:
    seed_lay = _layout_text(Int8PerTokenSeed().layouts(REF_HEAD_SIZE, REF_BLOCK_SIZE)[0])
    q8 = ("u32", "[num_blocks, num_kv_heads, block_size, head_size/4 + 1]", seed_lay)
    f32 = ("f32", "[num_blocks, num_kv_heads, block_size, head_size]", _F32_CACHE)
    decode_oracle = ("kvviz.attention.paged_oracle.decode in float64 over the oracle's cache contents; the checked output is "
                     "the attention output [num_seqs, num_heads, head_size] after the whole decode pipeline")
    decode_tol = "|out - ref| <= 2e-5 * max(1, max|V|) (f32 accumulation vs float64; tests/test_paged_conformance.py)"
    register(Slot(
        "f32.writer", "f32 baseline writer (reshape_and_cache_f32)", "writer", "baseline", pk.WRITER_F32, None,
        "paged-writer", "f32", _buffers(pk.WRITER_F32, {"key_cache": f32, "value_cache": f32}), _imm(pk.WRITER_F32),
        "(num_tokens, num_kv_heads, 1): one workgroup per (token, KV head) copies the head vector into its slot",
        "kvviz.attention.paged_oracle.write_cache_f32: the cache rows of every real token, K and V",
        "exact (0): a copy; slots no token maps to must keep their contents", timed_name="reshape_and_cache_f32",
    ))
    register(Slot(
        "f32.decode", "f32 baseline decode, partition pass (paged_attn_f32)", "decode", "baseline", pk.DECODE_F32, None,
        "paged-decode", "f32", _buffers(pk.DECODE_F32, {"kc": f32, "vc": f32}), _imm(pk.DECODE_F32),
        "(num_heads, num_seqs, num_partitions): one workgroup per (query head, sequence, partition of 512 positions) "
        "writes that partition's (m, s, acc) to partials; paged_attn_reduce combines them",
        decode_oracle, decode_tol, timed_name="paged_attn_f32",
    ))
    register(Slot(
        "f32.reduce", "decode reduce (paged_attn_reduce)", "reduce", "baseline", pk.REDUCE, None,
        "paged-decode", "f32", _buffers(pk.REDUCE, {}), _imm(pk.REDUCE),
        "(num_heads, num_seqs, 1): one workgroup per (query head, sequence) combines its partitions: "
        "M = max m_p, L = sum s_p e^(m_p - M), out = sum acc_p e^(m_p - M) / (L + 1e-6)",
        decode_oracle, decode_tol,
    ))
    register(Slot(
        "int8_seed.writer", "seed int8 writer (reshape_and_cache_q8)", "writer", "seed", pk.WRITER_Q8, "int8_seed",
        "paged-writer", "q8", _buffers(pk.WRITER_Q8, {"key_cache": q8, "value_cache": q8}), _imm(pk.WRITER_Q8),
        "(num_tokens, num_kv_heads, 1): one workgroup per (token, KV head) quantises the head vector into its slot",
        "kvviz.attention.paged_oracle.quantize_int8_per_token (the seed's float32 arithmetic): every real token's codes "
        "and scale, compared as dequantised values code * scale",
        "codes equal, or one code apart where x*127/amax is within float32 rounding of a .5 tie; scales within "
        "the adapter's division ULPs (0 on lavapipe, 3 on hardware); untouched slots kept",
        timed_name="reshape_and_cache_q8",
    ))
    register(Slot(
        "int8_seed.decode", "seed int8 decode (paged_attn_q8)", "decode", "seed", pk.DECODE_Q8, "int8_seed",
        "paged-decode", "q8", _buffers(pk.DECODE_Q8, {"kc": q8, "vc": q8}), _imm(pk.DECODE_Q8),
        "(num_heads, num_seqs, 1): one workgroup per (query head, sequence) walks the whole context",
        decode_oracle.replace("cache contents", "int8 cache (code * scale)"), decode_tol,
        ("the seed decode is refused past the adapter's loop limit (kvviz/gpu/loop_budget.py)",),
        timed_name="paged_attn_q8",
    ))


# the families whose dequantised value is one float32 operation on the code: compared exactly
EXACT_FAMILIES = ("int8", "fp8", "fp8_vllm", "f16")


def _dequant_rule(family: str) -> tuple[str, str]:
    if family == "f16":
        return "exact (0): the half widened to f32", "exact"
    if family in EXACT_FAMILIES:
        return "exact (0): one float32 multiply code * scale", "exact"
    return ("|got - ref| <= 2^-22 * (|ref| + 2 max|ref| of the token's head vector): code * scale + zero may be "
            "contracted into an fma by a driver (Vulkan allows it)", "fused")


# the side buffers of a family's writer / dequantiser (kvviz/families/fp8_vllm/kernels.py ScaleBuffers)
_SIDE_BUFFERS = {
    "fp8_vllm": {
        "scales": ("u32", "[2 * kv_heads]", "f32 scale bits, index which * kv_heads + head (which 0 K, 1 V); per-tensor "
                   "mode reads index which * kv_heads; written by the calibration kernels before the writer runs"),
        "sat": ("u32", "[2 * kv_heads]", "saturated elements written so far, per (K|V, KV head): the writer adds the "
                "elements whose x / scale has no finite FP8 code (atomicAdd)"),
    },
}
_WRITER_GRID = {
    "f16": "2-D (gx, gy, 1), workgroup w = y * gx + x: one invocation per (token row, KV head, vec4 of the head "
           "vector), 64 a workgroup, K and V together: items = rows x kv_heads x head_size / 4",
}
_WRITER_NOTES = {
    "fp8_vllm": ("the calibration kernels (fp8_vllm/amax.wgsl, fp8_vllm_scale.wgsl) run before the writer and "
                 "stay the built-in ones; the slot is the writer that encodes with the scales they leave",),
}


def _method_slots() -> None:
    for mid, cls in sorted(registry().items()):
        if not issubclass(cls, PerTokenRecordMethod) or cls.family not in DEQUANT_ORACLES:
            continue
        m = cls()
        lay = m.layouts(REF_HEAD_SIZE, REF_BLOCK_SIZE)[0]
        wpt = m.wpt(REF_HEAD_SIZE)
        cache = ("u32", f"[num_blocks, kv_heads, block_size, wpt] (wpt = {wpt} at head size {REF_HEAD_SIZE})",
                 _layout_text(lay))
        tol, _ = _dequant_rule(cls.family)
        oracle = (f"{DEQUANT_ORACLES[cls.family]}: the f32 cache rows of every real token, K and V, after the "
                  "writer and the dequantiser ran")
        ws, ds = m.writer_spec(), m.dequant_spec()
        bufs = {"k_cache": cache, "v_cache": cache, **_SIDE_BUFFERS.get(cls.family, {})}
        if cls.has_first_wave_writer:
            wid, wtitle, wimpl, wtimed = f"{mid}.writer", f"{m.label} writer", "first-wave", f"{mid} writer"
        else:  # the fast writer is the method's only writer (f16): a fast slot, beside no first-wave one
            wid, wtitle, wimpl, wtimed = f"{mid}.writer_fast", f"{m.label} fast writer", "fast", f"{mid} writer (fast)"
        register(Slot(
            wid, wtitle, "writer", wimpl, ws, mid, "method-writer",
            buffers=_buffers(ws, bufs), immediates=_imm(ws),
            grid=_WRITER_GRID.get(cls.family, "(rows, kv_heads, 2): one workgroup per (token row, KV head, K|V: z = 0 K, "
                                  "1 V) writes the row's record"),
            oracle=oracle + " (the built-in dequantiser reads what the writer wrote)",
            tolerance=tol + "; cache slots no row maps to must keep their contents", timed_name=wtimed,
            notes=_WRITER_NOTES.get(cls.family, ()),
        ))
        register(Slot(
            f"{mid}.dequantise", f"{m.label} dequantise", "dequantise", "first-wave", ds, mid, "method-dequant",
            buffers=_buffers(ds, bufs), immediates=_imm(ds),
            grid="(used blocks, kv_heads, 2): one workgroup per (work item = used physical block, KV head, K|V) "
                 "expands the block's records into the f32 cache window",
            oracle=oracle + " (the built-in writer wrote the records)", tolerance=tol, timed_name=f"{mid} dequantise",
        ))


def _fast_slots() -> None:
    """The fast kernels (kvviz/attention/writers.py, fast_decode.py) as slots of their own."""
    fast_writer = {"int8_token": int8_kernels.WRITE_INT8, "fp8_e4m3": fp8_kernels.WRITE_FP8, "fp8_e5m2": fp8_kernels.WRITE_FP8, "int4_group": int4_kernels.WRITE_INT4}
    for mid, spec in fast_writer.items():
        if mid not in registry():
            continue
        m = get_method(mid)
        base = _SLOTS[f"{mid}.writer"]
        register(Slot(
            f"{mid}.writer_fast", f"{m.label} fast writer", "writer", "fast", spec, mid, "method-writer",
            buffers=_buffers(spec, {b.name: (b.elem, b.shape, b.layout) for b in base.buffers}), immediates=_imm(spec)
            + (),
            grid="2-D (gx, gy, 1), workgroup w = y * gx + x: one workgroup per `rows` token rows (K and V together), "
                 "a lane group of LANES lanes per (token, KV head) row",
            oracle=base.oracle, tolerance=base.tolerance, timed_name=f"{mid} writer (fast)", template=True,
        ))
    # the llama.cpp block types' fast writer (kvviz/families/ggml/writer.py): the first-wave writer's bytes
    for mid in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4"):
        if mid not in registry() or f"{mid}.writer" not in _SLOTS:
            continue
        m = get_method(mid)
        base = _SLOTS[f"{mid}.writer"]
        register(Slot(
            f"{mid}.writer_fast", f"{m.label} fast writer", "writer", "fast", fwg.WRITE_GGML, mid, "method-writer",
            buffers=_buffers(fwg.WRITE_GGML, {b.name: (b.elem, b.shape, b.layout) for b in base.buffers}),
            immediates=_imm(fwg.WRITE_GGML),
            grid="2-D (gx, gy, 1), workgroup w = y * gx + x: 64 / LANES token rows a workgroup, K then V; a lane a "
                 "32-element block (XCH = 1: the word it shares with the next block's lane by subgroupShuffleDown) "
                 "or NB blocks that fill whole words",
            oracle=base.oracle, tolerance=base.tolerance, timed_name=f"{mid} writer (fast)", template=True,
        ))
    # the seed layout's fast writer (fast_write.int8_dispatches(seed=True)): the seed writer's bytes
    if "int8_seed" in registry():
        base = _SLOTS["int8_seed.writer"]
        q8 = next((b.elem, b.shape, b.layout) for b in base.buffers if b.name == "key_cache")
        register(Slot(
            "int8_seed.writer_fast", "seed int8 layout fast writer (write_int8, SEED=true)", "writer", "fast",
            int8_kernels.WRITE_INT8.define(SEED="true"), "int8_seed", "paged-writer", "q8",
            _buffers(int8_kernels.WRITE_INT8, {"k_cache": q8, "v_cache": q8}),
            _imm(int8_kernels.WRITE_INT8),
            "2-D (gx, gy, 1), workgroup w = y * gx + x: one workgroup per `rows` token rows (K and V together), "
            "a lane group of LANES lanes per (token, KV head) row",
            base.oracle, base.tolerance, timed_name="int8_seed writer (fast)", template=True,
        ))
    f32 = ("f32", "[num_blocks, num_kv_heads, block_size, head_size]", _F32_CACHE)
    part = ("f32", "[num_seqs, num_heads, num_partitions, head_size + 2]",
            "per partition: max logit m (base 2), sum of 2^(l - m), then sum of 2^(l - m) v over head_size")
    grid = ("(num_partitions, num_kv_heads, num_seqs): one workgroup per (partition, KV head, sequence) for the KV "
            "head's whole GQA group (the looped code a software rasteriser runs: y = KV heads x chunks of the group, "
            "G / chunks query heads a workgroup, where the group's state does not fit the workgroup memory at once)")
    checked = ("; the checked output is the attention output [num_seqs, num_heads, head_size] after the split kernel "
               "and the built-in reduce")
    oracle = "kvviz.attention.paged_oracle.decode in float64 over the f32 cache the baseline writer wrote" + checked
    tol = "|out - ref| <= 2e-5 * max(1, max|V|) (f32 accumulation vs float64)"
    bufs = {"kc": f32, "vc": f32, "partials": part,
            "tensor": ("u32", "[4]", "per-tensor words (f32 bits) [amax K, amax V, scale K, scale V]; formats without "
                       "per-tensor scales get [0, 0, 1.0, 1.0], which the kernel does not read")}
    register(Slot(
        "fast.decode_f32", "fast split-K decode over the f32 cache (decode_split)", "decode", "fast", fd.SPLIT, None,
        "fast-decode", "f32", _buffers(fd.SPLIT, bufs), _imm(fd.SPLIT),
        grid, oracle, tol, timed_name="fast_decode_f32", template=True,
    ))
    # The same template over every packed cache the fast decode reads in place (fast_decode.render fills it per
    # CacheFormat), each over the cache its method's built-in writer wrote. Tolerance: the fast decode's
    # conformance tests' (tests/test_fast_decode.py), with max|V| of the dequantised V cache.
    for fmt_name, mid, writer, deq in (
        ("f16", "f16", "the f16 fast writer (f16/write_fast.wgsl)", "the halves widened to f64"),
        ("int8", "int8_seed", "the seed int8 writer (reshape_and_cache_q8)",
         "kvviz.attention.paged_oracle.dequantize_cache_int8: code * scale"),
        ("fp8_e4m3", "fp8_e4m3", "the fp8_e4m3 fast writer (per-token scale)",
         "kvviz.families.fp8.oracle.dequantize: float32(fp8) * the token's scale"),
        ("fp8_e5m2", "fp8_e5m2", "the fp8_e5m2 fast writer (per-token scale)",
         "kvviz.families.fp8.oracle.dequantize: float32(fp8) * the token's scale"),
        ("int4", "int4_group", "the int4_group fast writer (per group)",
         "kvviz.families.int4.oracle.dequantize_groups: code * scale + zero per group"),
    ):
        if mid not in registry():
            continue
        m = get_method(mid)
        fmt = m.fast_cache_format(REF_HEAD_SIZE)
        lay = m.layouts(REF_HEAD_SIZE, REF_BLOCK_SIZE)[0]
        cache = ("u32", f"[num_blocks, num_kv_heads, block_size, wpt] (wpt = {fmt.wpt(REF_HEAD_SIZE)} at head size "
                 f"{REF_HEAD_SIZE})", _layout_text(lay))
        ref = m.REFERENCE.replace(":", ".")
        register(Slot(
            f"fast.decode_{fmt_name}", f"fast split-K decode over the {fmt_name} cache of {mid} (decode_split)",
            "decode", "fast", fd.SPLIT, mid, "fast-decode", fmt_name,
            _buffers(fd.SPLIT, {**bufs, "kc": cache, "vc": cache}), _imm(fd.SPLIT), grid,
            f"{ref}'s attention (kvviz.attention.paged_oracle.decode in float64) over the cache {writer} wrote, read back and "
            f"dequantised in numpy ({deq})" + checked,
            "|out - ref| <= 2e-5 * max(1, max|V|), V the dequantised V cache (f32 accumulation vs float64; the "
            "tolerance of tests/test_fast_decode.py for every format)",
            (f"the template is the same for every format: `kvviz kernel new` writes it with its placeholders, which are "
             f"filled with fast_decode.render()'s values for the {fmt_name} format at the shape being run",),
            timed_name=f"fast_decode_{fmt_name}", template=True,
        ))
    for sid, spec, what in (("fast.reduce", fd.REDUCE, "decode_reduce"),
                            ("fast.reduce_wide", fd.REDUCE_WIDE, "decode_reduce_wide, the fast decodes' from 9 partitions")):
        register(Slot(
            sid, f"fast decode reduce ({what})", "reduce", "fast", spec, None, "fast-decode", "f32",
            _buffers(spec, bufs), _imm(spec),
            "(num_heads, num_seqs, 1): one workgroup per (query head, sequence) combines its partitions", oracle, tol,
        ))


# The causal prefill's slots (kvviz/attention/prefill.py): each shell over the cache of one method, as the method's
# writer leaves it: (slot id, method or None for the f32 baseline cache, its options, the cache in words). The record
# formats' shell (attention/prefill.wgsl) runs over the f32 and the int8 caches here; its f16, FP8 and int4 loaders are
# the same template's (tests/test_prefill.py holds every one to the oracle).
PREFILL_SLOTS = (
    ("prefill.f32", None, (), "the f32 baseline cache (reshape_and_cache_f32)"),
    ("prefill.int8", "int8_seed", (), "the seed int8 cache (reshape_and_cache_q8)"),
    ("prefill.q8_0", "q8_0", (), "q8_0's cache (llama.cpp's block rows)"),
    ("prefill.nvfp4", "nvfp4", (), "NVFP4's cache and its tensor scales"),
    ("prefill.kivi", "kivi", (("bits", 2), ("recent", 16)), "KIVI 2-bit's cache (key groups, value records, the window)"),
    ("prefill.turboquant", "turboquant", (), "TurboQuant's paged records (the seed configuration)"),
)
PREFILL_CHUNK = 24  # the lab's prefill: the last min(context, 24) positions of every sequence


def _prefill_cache_source(mid) -> str:
    """Where the prefill oracle's cache comes from for a slot's method (kvviz/families/prefill_oracles.py)."""
    if mid is None:
        return "the K / V values themselves"
    if mid in ("int8_seed", "turboquant"):
        return "the records its writer wrote, read back; its rounding may differ from the numpy quantiser's"
    return "the family's numpy quantiser and dequantiser"


def _prefill_slots() -> None:
    """The prefill kernel over each cache layout, in the shell of that layout (kvviz/attention/prefill.py)."""
    specs = {None: pf.PREFILL, "int8_seed": pf.PREFILL, "q8_0": pf.GGML, "nvfp4": pf.NVFP4, "kivi": pf.KIVI,
             "turboquant": pf.TURBOQUANT}
    extra = {
        "tiles": ("vec4<u32>", "[query tiles]", "(sequence, first query row of q, its position, queries) of every tile of "
                  "BQ consecutive queries of one sequence"),
        "q": ("f32", "[num_queries, num_heads, head_size]", "the chunks' queries, sequence after sequence"),
        "out": ("f32", "[num_queries, num_heads, head_size], or [num_queries, num_heads, num_partitions, head_size + 2] "
                "(SPLIT)", "the attention output; with SPLIT, per partition of the keys: max logit m (base 2), "
                "sum of 2^(l - m), then sum of 2^(l - m) v, combined by the fast decode's reduce"),
        "tensor": ("u32", "[4] or [2 * num_kv_heads]", "scale words (f32 bits): per tensor [amax K, amax V, scale K, "
                   "scale V]; per KV head [K heads | V heads]; formats without them get a word they do not read"),
        "res": ("f32", "[residual rows, 2 (K, V), kv_heads, head_size]", "KIVI's float32 rows of positions >= n_q"),
        "info": ("u32", "[4 * num_seqs + block tables]", "per sequence (context_len, n_q, res_off, 0), then the block "
                 "tables from word bt_off (bound as block_tables too)"),
        "chans": ("u32", "[2 (K, V), kv_heads, head_size]", "the channel of each rotated coordinate of each instance"),
        "signs": ("f32", "[every instance's polar and QJL signs]", "the random signs of each instance's rotation"),
        "codebook": ("f32", "[every instance's centroids and boundaries]", "each instance's Lloyd-Max codebook"),
    }
    for sid, mid, opts, what in PREFILL_SLOTS:
        if mid is not None and mid not in registry():
            continue
        spec = specs[mid]
        if mid is None:
            cache = ("f32", "[num_blocks, num_kv_heads, block_size, head_size]", _F32_CACHE)
            name = "prefill over the f32 cache"
        else:
            m = get_method(mid, **dict(opts))
            lay = m.layouts(REF_HEAD_SIZE, REF_BLOCK_SIZE)
            cache = ("u32", "the method's cache (see its layout)", _layout_text(lay[0]) + " V: " + _layout_text(lay[1]))
            name = f"prefill over {m.label}"
        register(Slot(
            sid, f"causal prefill, {name} ({spec.path})", "prefill", "fast", spec, mid, "prefill", "",
            _buffers(spec, {**extra, "kc": cache, "vc": cache}), _imm(spec),
            "(query tiles, num_kv_heads, partitions): one workgroup per (tile of BQ queries, KV head, partition of "
            "partition_tokens keys) for the KV head's whole GQA group; a reduce combines the partitions when there "
            "are several",
            f"kvviz.attention.prefill_oracle.causal in float64 over {what} dequantised in numpy "
            f"(kvviz/families/prefill_oracles.py: {_prefill_cache_source(mid)}), for the last min(context, {PREFILL_CHUNK}) positions of every "
            "sequence as queries (random normal, seed 0); the checked output is the attention output [num_queries, "
            "num_heads, head_size] after the kernel (and the reduce)",
            "|out - ref| <= 2e-5 * max(1, max|V|), V the dequantised V cache (f32 accumulation vs float64; "
            "kvviz/attention/prefill_oracle.tolerance, tests/test_prefill.py)",
            ("the kernel attention/prefill_kernel.wgsl is one for every cache layout: the shell's load functions give "
             "it the dequantised values; `kvviz kernel new` writes the shell with its placeholders, filled with "
             "kvviz/attention/prefill.py's values at the shape being run",),
            timed_name=f"prefill_{sid.split('.', 1)[1]}", template=True, options=opts,
        ))


KIVI_OPTIONS = (("bits", 2), ("recent", 0))


def _kivi_slots() -> None:
    """KIVI's writer is two kernels (the token kernel: V codes and the residual rows; the key-group kernel:
    K codes per channel over 32-token groups), in a first-wave and a fast implementation, and one
    dequantiser. Each is a slot; the pipeline runs KIVI 2-bit with recent 0, so every whole 32-token group
    is quantised and both writer kernels run at short contexts."""
    if "kivi" not in registry():
        return
    m = get_method("kivi", **dict(KIVI_OPTIONS))
    k_lay, v_lay = m.layouts(REF_HEAD_SIZE, REF_BLOCK_SIZE)
    kw = REF_HEAD_SIZE * 2 // 32
    caches = {
        "k_cache": ("u32", f"[num_blocks, kv_heads, kstride] (kstride = block_size * KW + side words; KW = {kw} at head "
                    f"size {REF_HEAD_SIZE}, 2 bits)", _layout_text(k_lay)),
        "v_cache": ("u32", f"[num_blocks, kv_heads, block_size, KW + 2] (KW + 2 = {kw + 2} at head size {REF_HEAD_SIZE})",
                    _layout_text(v_lay)),
        "res": ("f32", "[residual rows, 2 (K, V), kv_heads, head_size]",
                "the float32 rows of positions >= n_q of each sequence, sequence by sequence (res_off in info)"),
        "row_res": ("u32", "[rows]", "residual row of each token row, 0xFFFFFFFF: a quantised (or padding) row"),
        "info": ("u32", "[4 * num_seqs + num_seqs * max_num_blocks_per_seq]",
                 "per sequence (context_len, n_q, res_off, 0), then the block tables from word bt_off"),
        "groups": ("vec4<u32>", "[key groups]", "(sequence, group, 0, 0) of every whole quantised 32-token key group"),
        "grows": ("u32", "[key groups, 32]", "the token rows of each group (indices into key_in)"),
        "key_g": ("f32", "[key groups * 32, kv_heads, head_size]", "the K rows of each group, gathered on the host"),
        "slots_g": ("u32", "[key groups * 32]", "the cache slot of each gathered row"),
    }
    oracle = ("kvviz.families.kivi.oracle dequantize_cache (KIVI 2-bit, recent 0: the oracle's K per channel over 32-token "
              "groups, V per token, the residual rows kept): the f32 cache rows of every real token, K and V, after "
              "the writer kernels and the dequantiser ran")
    tol = ("|got - ref| <= 2^-22 * (|ref| + 2 max|ref| of the token's head vector): code * scale + zero may be "
           "contracted into an fma by a driver (Vulkan allows it); residual rows exact")
    untouched = ("; words the built-in writer leaves unwritten (in K, V and the residual buffer) must keep their "
                 "contents")
    tok_grid = "(rows, kv_heads, 1): one workgroup per (token row, KV head) writes its V record or its residual K and V rows"
    kg_grid = ("(key groups, kv_heads, 1): one workgroup per (whole 32-token key group, KV head) writes the group's K "
               "codes and its per-channel (scale, zero) side words")
    fast_row = ("2-D (gx, gy, 1), workgroup w = y * gx + x: one workgroup per `rows` token rows, a lane group of LANES "
                "lanes per (token, KV head) row: its V record or its residual K and V rows")
    fast_kg = ("2-D (gx, gy, 1), workgroup w = y * gx + x: one workgroup per work item (key group, KV head), RS x NV4 "
               "threads (NV4 = head_size / 4, RS = 4 where that fits the adapter); the group's rows read in place "
               "through grows")
    for sid, title, impl, spec, grid, tmpl, timed in (
        ("kivi.writer_tokens", "KIVI token writer (V codes, residual rows)", "first-wave",
         kivi_kernels.KIVI_WRITE_TOK.define(BITS=2), tok_grid, False, "kivi writer (tokens + key groups)"),
        ("kivi.writer_key_groups", "KIVI key-group writer (K per channel)", "first-wave",
         kivi_kernels.KIVI_WRITE_KGROUP.define(BITS=2), kg_grid, False, "kivi writer (tokens + key groups)"),
        ("kivi.writer_tokens_fast", "KIVI fast token writer", "fast", kivi_kernels.WRITE_KIVI_TOK, fast_row, True,
         "kivi writer (tokens + key groups, fast)"),
        ("kivi.writer_key_groups_fast", "KIVI fast key-group writer", "fast", kivi_kernels.WRITE_KIVI_KGROUP, fast_kg, True,
         "kivi writer (tokens + key groups, fast)"),
    ):
        register(Slot(sid, title, "writer", impl, spec, "kivi", "kivi-writer", buffers=_buffers(spec, caches),
                      immediates=_imm(spec), grid=grid, oracle=oracle + " (the built-in dequantiser and the other "
                      "writer kernel are the built-in ones)", tolerance=tol + untouched, template=tmpl,
                      options=KIVI_OPTIONS,
                      notes=(f"the lab times this kernel alone; the window's and the bench's `{timed}` row times both "
                             "writer kernels together, so it is not this slot's pinned baseline",)))
    register(Slot("kivi.dequantise", "KIVI dequantise", "dequantise", "first-wave", kivi_kernels.KIVI_DEQUANT.define(BITS=2), "kivi",
                  "kivi-dequant", buffers=_buffers(kivi_kernels.KIVI_DEQUANT, caches), immediates=_imm(kivi_kernels.KIVI_DEQUANT),
                  grid="(used blocks, kv_heads, 2): one workgroup per (work item = used physical block, KV head, K|V) "
                       "expands the block's codes (and residual rows) into the f32 cache window",
                  oracle=oracle + " (the built-in writers wrote the cache)", tolerance=tol, timed_name="kivi dequantise",
                  options=KIVI_OPTIONS))


# family -> the numpy dequantised-rows oracle the method slots are checked against (kvviz/lab/check.py)
DEQUANT_ORACLES = {
    "int8": "kvviz.families.int8.oracle dequantize(quantize(x))",
    "int4": "kvviz.families.int4.oracle dequantize_groups(quantize_groups(x, G))",
    "fp8": "kvviz.families.fp8.oracle dequantize(quantize(x))",
    "fp8_vllm": ("kvviz.families.fp8.oracle vllm_dequantize(vllm_quantize(x, s), s) with s = vllm_method_scales (amax of the "
                 "calibration rows / fp8 max, computed in numpy)"),
    "f16": "kvviz.families.f16.oracle dequantize(quantize(x)) (numpy astype(float16), widened back)",
    "ggml": "kvviz.families.ggml.oracle dequantize(quantize(x)) (gguf's codes)",
    "fp4": "kvviz.families.fp4.oracle dequantize(quantize(x, tensor scale of the real rows))",
}

_loaded = False


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        _paged_slots()
        _method_slots()
        _kivi_slots()
        _fast_slots()
        _prefill_slots()


def slots() -> dict[str, Slot]:
    _load()
    return dict(_SLOTS)


def slot(slot_id: str) -> Slot:
    s = slots()
    if slot_id not in s:
        raise InvalidInput(f"unknown kernel slot {slot_id!r}", f"Known slots (kvviz kernel list): {', '.join(s)}")
    return s[slot_id]


def siblings(slot_id: str) -> list[Slot]:
    """The other built-in implementations of the same job (same method and role: the seed, first-wave and fast
    writers of a method; the f32 decode and the fast decode), timed beside a user kernel of this slot."""
    me = slot(slot_id)

    def job(s: Slot) -> str:  # KIVI's writer is two kernels: a token kernel is timed beside token kernels only
        return s.id.split(".", 1)[1].removesuffix("_fast") if s.case == "kivi-writer" else ""

    return [s for s in slots().values()
            if s.id != me.id and s.method == me.method and s.role == me.role and job(s) == job(me)]


# ------------------------------------------------------------------------------ rendering
def render_markdown() -> str:
    """docs/slots.md: every slot's contract."""
    L = ["# Kernel slots", "",
         "Generated from `kvviz/lab/slots.py` (`python -m kvviz.lab.slots > docs/slots.md`; tests/test_lab.py "
         "checks it is current). Every replaceable kernel is a slot with this contract; `kvviz kernel new SLOT FILE` "
         "writes the built-in kernel as a starting file, `kvviz bench --kernel SLOT=FILE` checks a user kernel "
         "against the slot's oracle and times it beside the built-in, and the window's Kernel lab does both on "
         "every save.", "",
         f"Layouts are written at head size {REF_HEAD_SIZE} and block size {REF_BLOCK_SIZE}. A user kernel must "
         "declare the same bindings (index, name, access) and immediates (field names and types, in order) as "
         "the slot: they are checked against its source before it is compiled.", "",
         "| slot | kernel | role | built-in | language |", "|---|---|---|---|---|"]
    for s in slots().values():
        L.append(f"| `{s.id}` | {s.title} | {s.role} | `{s.spec.path}` ({s.impl}) | {s.language.upper()} |")
    for s in slots().values():
        L += ["", f"## `{s.id}`: {s.title}", "",
              f"Built-in: `shaders/{s.spec.path}`, entry `{s.spec.entry}`, {s.impl}"
              + (f", method `{s.method}`" if s.method else "")
              + (" with " + ", ".join(f"`{k}={v}`" for k, v in s.options) if s.options else "") + ".", "",
              "| binding | name | access | type | shape | layout |", "|---|---|---|---|---|---|"]
        for b in s.buffers:
            L.append(f"| {b.binding} | `{b.name}` | {b.access} | {b.elem} | {b.shape} | {b.layout.replace('|', '/')} |")
        L.append("")
        if s.immediates:
            L.append(f"Immediates ({s.spec.immediate_size} bytes, in order): "
                     + "; ".join(f"`{f.name}: {f.type}` {f.meaning}".rstrip() for f in s.immediates) + ".")
        else:
            L.append("Immediates: none.")
        L += ["", f"Grid: {s.grid}.", "", f"Oracle: {s.oracle}.", "", f"Tolerance: {s.tolerance}."]
        for n in s.notes:
            L += ["", f"Note: {n}."]
    return "\n".join(L) + "\n"


def render_text(slot_id: str | None = None) -> str:
    """`kvviz kernel list` (all slots, one line each) or one slot's contract in full."""
    if slot_id is None:
        w = max(len(s.id) for s in slots().values())
        return "\n".join(f"{s.id:<{w}}  {s.role:<10} {s.impl:<10} {s.spec.path}" for s in slots().values())
    s = slot(slot_id)
    L = [f"{s.id}: {s.title}", f"  built-in: shaders/{s.spec.path}:{s.spec.entry} ({s.impl}, {s.language})"]
    if s.options:
        L.append(f"  method: {s.method} with " + ", ".join(f"{k}={v}" for k, v in s.options))
    L.append("  bindings:")
    for b in s.buffers:
        L.append(f"    {b.binding} {b.name} ({b.access}, {b.elem} {b.shape}): {b.layout}")
    L.append(f"  immediates ({s.spec.immediate_size} bytes): "
             + (", ".join(f"{f.name}: {f.type}" for f in s.immediates) or "none"))
    L += [f"  grid: {s.grid}", f"  oracle: {s.oracle}", f"  tolerance: {s.tolerance}"]
    return "\n".join(L)


if __name__ == "__main__":
    print(render_markdown(), end="")
