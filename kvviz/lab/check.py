"""Bring your own kernel: compile a user's shader for a slot, run the slot's pipeline with it in the
built-in's place, check the output against the slot's numpy oracle and time it beside the built-in.

Used by `kvviz bench --kernel SLOT=FILE`, `kvviz kernel new` (its output passes as written) and the
window's Kernel lab. Qt-free. The oracles are imported by name here, as `kvviz bench` does: this module is
part of the lab and bench path, not of the window's compute path.

What is checked (per slot, see kvviz/lab/slots.py): the pipeline's checked output (a cache's rows for
writers and dequantisers, the attention output for decodes) element by element against the oracle within
the slot's tolerance; `bad` counts the elements outside it and `heat` says where (a small map over rows x
channels: token rows x (K|V, KV head, dim) for caches, (sequence, head) x dim for decodes). Writers must
also leave the cache slots no token maps to as they were (`untouched`: words changed there, the
out-of-bounds writes robust buffer access cannot catch).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvviz.attention import arith, paged_oracle as op, prefill as pf, prefill_oracle as po, records as qk, split_decode as fd
from kvviz.attention.int8_records import unpack_records
from kvviz.attention.traffic import decode_bytes
from kvviz.errors import DeviceLostError, InvalidInput, KvvizError, ShaderCompileError, UnsupportedShape
from kvviz.families.int8 import kernels as int8_kernels
from kvviz.families.f16 import oracle as o16
from kvviz.families.fp8 import oracle as o8f
from kvviz.families.int8 import oracle as o8
from kvviz.families.int4 import oracle as o4
from kvviz.families.ggml import oracle as ogg
from kvviz.families.fp4 import oracle as ofp4
from kvviz.families.kivi import format as layout, oracle as okv
from kvviz.families import prefill_oracles as pfo
from kvviz.families.registry import get_method
from kvviz.gpu.kernel_spec import READ_WRITE
from kvviz.gpu.runtime import STORAGE_RO, STORAGE_RW
from kvviz.gpu.shaders import (
    FRONTEND_GLSLANG,
    FRONTEND_WGSL,
    ShaderSpec,
    declarations,
    render_wgsl_defines,
    unroll_loops,
)
from kvviz.lab.slots import EXACT_FAMILIES, PREFILL_CHUNK, Slot, siblings, slot as get_slot
from kvviz.lab.loop_check import LoopCheck, NotWrappable, wrap_glsl, wrap_wgsl
from kvviz.lab.source import (
    Diagnostic,
    KernelCompileError,
    SourceInfo,
    driver_code,
    parse_glslang,
    parse_naga,
    resolve,
    workgroup_bytes,
    workgroup_size,
)
from kvviz.paging import PAD_SLOT

log = logging.getLogger("kvviz.lab")

SENTINEL = np.uint32(0x7FBADBAD)  # what unused cache slots hold before a writer runs (a NaN as f32)


@dataclass
class UserKernel:
    slot: Slot
    name: str  # the file name shown in messages
    text: str
    rendered: str
    where: list  # (file, line) of every rendered line
    kernel: object  # kvviz.gpu.runtime.Kernel
    frontend: str


def read_text(path: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise InvalidInput(f"kernel file {path} does not exist", "Give the path of a .wgsl or .comp file "
                           "(kvviz kernel new SLOT FILE writes one).")
    try:
        return p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"kernel file {path} cannot be read: {exc}") from None


def language_of(name: str, slot: Slot) -> str:
    if name.endswith(".wgsl"):
        return "wgsl"
    if name.endswith((".comp", ".glsl")):
        return "glsl"
    return slot.language


_LINE_TAG = re.compile(r"/\*@L(\d+)\*/")


def _untag(src: str, where: list) -> tuple[str, list]:
    """`src` without compile_user's line tags, and the (file, line) of each of its lines: a line without a tag
    (from a define's value or an unrolled block's brace) takes the nearest tagged line above it."""
    lines, out_where, last = [], [], 0
    for ln in src.split("\n"):
        tags = _LINE_TAG.findall(ln)
        if tags:
            last = int(tags[-1])
        lines.append(_LINE_TAG.sub("", ln))
        out_where.append(where[min(last, len(where) - 1)] if where else None)
    return "\n".join(lines), out_where


def compile_user(rt, slot: Slot, text: str, name: str, frontend: str = "", defines=None) -> UserKernel:
    """Compile a user's shader for `slot`: includes resolved, its WGSL placeholders filled with the built-in's
    values (`defines`: the built-in's at the shape being run; default the slot spec's fixed ones) and its
    `// @unroll` loops expanded (kvviz.gpu.shaders.unroll_loops, as for the built-in kernels), its
    declarations checked against the slot's contract, then compiled and validated. KernelCompileError with
    file:line:column diagnostics when any of that fails."""
    rendered, where = resolve(text, name)
    lang = language_of(name, slot)
    if lang == "wgsl":
        try:
            # every line tagged with its index, so lines the defines and the unrolling add or copy still map to
            # the user's file and line in diagnostics
            tagged = "\n".join(f"{ln}/*@L{i}*/" for i, ln in enumerate(rendered.split("\n")))
            tagged = render_wgsl_defines(tagged, slot.spec.defines if defines is None else defines, name)
            rendered, where = _untag(unroll_loops(tagged, name), where)  # `// @unroll` loops, as built-ins get them
        except ShaderCompileError as exc:
            raise KernelCompileError(str(exc), [Diagnostic(name, 0, 0, str(exc))]) from None
    fe = FRONTEND_WGSL if lang == "wgsl" else (frontend or FRONTEND_GLSLANG)
    try:
        slot.spec.check(declarations(rendered, lang), name)
    except ShaderCompileError as exc:
        lines = [l.strip() for l in str(exc).splitlines()[1:] if l.strip()]
        raise KernelCompileError(f"{name} does not meet the contract of slot {slot.id}:\n  " + "\n  ".join(lines),
                                 [Diagnostic(name, 0, 0, l) for l in lines],
                                 f"Declare the bindings and immediates `kvviz kernel list {slot.id}` lists.") from None
    digest = hashlib.sha256(f"{fe}\n{rendered}".encode()).hexdigest()[:12]
    spec = ShaderSpec(f"user/{digest}/{Path(name).name}", slot.spec.entry, fe if lang == "glsl" else "", ())
    access = [STORAGE_RW if (fe == FRONTEND_GLSLANG or b.access == READ_WRITE) else STORAGE_RO for b in slot.spec.bindings]
    try:
        k = rt.kernel(spec, access, slot.spec.immediate_size, _source=rendered)
    except DeviceLostError:
        raise
    except ShaderCompileError as exc:
        parse = parse_naga if fe != FRONTEND_GLSLANG else parse_glslang
        diags = parse(str(exc), where, rendered)
        what = "failed validation" if "failed to validate" in str(exc) else "failed to compile"
        raise KernelCompileError(f"{name} {what} ({fe}):\n  " + "\n  ".join(map(str, diags)), diags) from None
    except KvvizError:
        raise
    k = dataclasses.replace(k, kspec=slot.spec)
    k.source = rendered  # kvviz.gpu.timing.source_hash hashes the user's text
    k.loop_check = _loop_check(rt, slot, spec, access, rendered, lang, name)
    return UserKernel(slot, name, text, rendered, where, k, fe)


def _loop_check(rt, slot: Slot, spec: ShaderSpec, access: list, rendered: str, lang: str, name: str):
    """The loop-limit check of the user's kernel (kvviz/lab/loop_check.py: a second build, which the check runs)
    on an adapter that bounds loop iterations; None elsewhere, and where that build fails (said in the log: the
    kernel as written compiled, so the check's own code is at fault, and the kernel is checked without it)."""
    if getattr(rt, "loop_limit", None) is None:
        return None
    binding = len(slot.spec.bindings)
    try:
        wrapped = wrap_wgsl(rendered, slot.spec.entry, binding) if lang == "wgsl" else wrap_glsl(rendered, binding)
        wspec = dataclasses.replace(spec, path=spec.path.replace("user/", "user-loop-check/", 1))
        kern = rt.kernel(wspec, access + [STORAGE_RW], slot.spec.immediate_size, _source=wrapped)
        return LoopCheck.create(rt, dataclasses.replace(kern, kspec=slot.spec), binding)
    except DeviceLostError:
        raise
    except (NotWrappable, KvvizError) as exc:
        log.warning("kernel lab: %s is checked without the loop-limit check (%s)", name,
                    str(exc).strip().splitlines()[0])
        return None


def load_user(rt, slot_id: str, path: str, frontend: str = "") -> UserKernel:
    s = get_slot(slot_id)
    return compile_user(rt, s, read_text(path), str(path), frontend)


# ------------------------------------------------------------------------------ results
@dataclass
class CheckResult:
    slot: str
    kernel: str  # "built-in" or the user's file
    max_err: float | None
    bad: int  # elements outside the tolerance
    total: int
    where: list  # the first (row, col) outside the tolerance
    heat: np.ndarray  # bad-element counts on a small rows x cols map
    rows: str  # what the map's rows are
    cols: str
    untouched: int | None  # words changed in cache slots no token maps to (None: not checked)
    tolerance: str
    grids: list = field(default_factory=list)
    # invocations that ran out of the adapter's loop iterations (kvviz/lab/loop_check.py); None: not checked (an
    # adapter without a loop limit, a built-in kernel)
    loop_limited: int | None = None
    loop_limit: int | None = None

    @property
    def within_tolerance(self) -> bool:
        return self.max_err is not None and self.bad == 0 and not self.untouched

    @property
    def ok(self) -> bool:
        return self.within_tolerance and not self.loop_limited

    @property
    def verdict(self) -> str:
        """OK, or what failed: the oracle check, the loop limit, or both."""
        if self.ok:
            return "OK"
        why = [w for w, bad in (("the oracle check", not self.within_tolerance), ("the loop limit", self.loop_limited))
               if bad]
        return "FAILED " + " and ".join(why)

    def summary(self) -> str:
        if self.max_err is None:
            return f"{self.kernel}: no result"
        s = (f"{self.kernel}: max error {self.max_err:.3g}, {self.bad} of {self.total} elements outside the tolerance"
             + (f" (first at {self.rows} x {self.cols} {self.where[:3]})" if self.bad else ""))
        if self.untouched:
            s += f"; {self.untouched} words changed in cache slots no token maps to (writes out of bounds of its slots)"
        if self.loop_limited:
            s += (f"; {self.loop_limited} invocations ran into this adapter's loop limit ({self.loop_limit} iterations "
                  "an invocation, after which every loop ends early): a loop that does not end, or one longer than "
                  "this adapter runs, so this output proves nothing")
        return s + (" - OK" if self.ok else " - FAILED")

    def to_json(self) -> dict:
        return {"slot": self.slot, "kernel": self.kernel, "ok": self.ok, "max_err": self.max_err, "bad": self.bad,
                "total": self.total, "where": [list(map(int, w)) for w in self.where], "rows": self.rows,
                "cols": self.cols, "untouched": self.untouched, "tolerance": self.tolerance,
                "loop_limited": self.loop_limited, "loop_limit": self.loop_limit,
                "heat": self.heat.astype(int).tolist()}


@dataclass
class LabTiming:
    name: str
    impl: str  # "user" or the built-in's impl
    timing: object  # TimingResult
    bytes: int
    flops: float


@dataclass
class LabRun:
    check: CheckResult
    timings: list  # LabTiming: the user's kernel (when given) and the built-in
    info: SourceInfo | None


def heat_map(bad: np.ndarray, max_rows: int = 48, max_cols: int = 64) -> np.ndarray:
    """Counts of bad elements of a [rows, cols] mask binned onto at most max_rows x max_cols cells."""
    R, C = bad.shape
    rb, cb = max(1, -(-R // max_rows)), max(1, -(-C // max_cols))
    pad = np.zeros((-(-R // rb) * rb, -(-C // cb) * cb), np.int64)
    pad[:R, :C] = bad
    return pad.reshape(pad.shape[0] // rb, rb, pad.shape[1] // cb, cb).sum((1, 3))


def compare(slot: Slot, kernel: str, got, ref, tol, rows: str, cols: str, bad=None, untouched=None) -> CheckResult:
    got = np.asarray(got, np.float64).reshape(np.shape(ref)[0], -1)
    ref = np.asarray(ref, np.float64).reshape(got.shape)
    err = np.abs(got - ref)
    if bad is None:
        bad = ~(err <= np.broadcast_to(np.asarray(tol, np.float64).reshape(-1) if np.ndim(tol) == 0 else
                                       np.asarray(tol, np.float64).reshape(got.shape), got.shape))
    bad = np.asarray(bad, bool).reshape(got.shape)
    fin = np.isfinite(err)
    max_err = float(err[fin].max(initial=0.0)) if fin.all() else float("inf")
    where = [tuple(map(int, w)) for w in np.argwhere(bad)[:10]]
    return CheckResult(slot.id, kernel, max_err, int(bad.sum()), int(bad.size), where, heat_map(bad), rows, cols,
                       untouched, slot.tolerance)


# ------------------------------------------------------------------------------ the cases
def _resolve(kernel, dispatches, slot: Slot):
    """A user kernel given as a factory of the built-in's defines (a template slot): compiled with the values
    the built-in dispatch of the slot uses at this shape."""
    if kernel is None or not callable(kernel):
        return kernel
    for d in dispatches:
        if d.kernel.spec.path == slot.spec.path and d.kernel.spec.entry == slot.spec.entry:
            return kernel(d.kernel.spec.defines)
    raise KvvizError(f"slot {slot.id}: its pipeline dispatched no {slot.spec.name}")


def _swap(dispatches, slot: Slot, kernel):
    """The dispatches with the user's kernel in the slot's place (and its loop-limit check buffer bound after
    the slot's buffers, reset for the run that follows)."""
    if kernel is None:
        return list(dispatches)
    lc = getattr(kernel, "loop_check", None)
    if lc is not None:
        lc.reset()
    out, n = [], 0
    for d in dispatches:
        if d.kernel.spec.path == slot.spec.path and d.kernel.spec.entry == slot.spec.entry:
            if lc is not None:
                d = dataclasses.replace(d, kernel=lc.kernel, buffers=list(d.buffers) + [lc.buffer])
            else:
                d = dataclasses.replace(d, kernel=kernel)
            n += 1
        out.append(d)
    if not n:
        raise KvvizError(f"slot {slot.id}: its pipeline dispatched no {slot.spec.name}")
    return out


def _is_slot(d, slot: Slot, kernel) -> bool:
    k = kernel
    if k is None:
        return d.kernel.spec.path == slot.spec.path and d.kernel.spec.entry == slot.spec.entry
    lc = getattr(k, "loop_check", None)
    return d.kernel is k or (lc is not None and d.kernel is lc.kernel)


def _as_written(d, kernel):
    """A dispatch of the user's loop-checked kernel as the user's kernel as written (what is timed)."""
    lc = getattr(kernel, "loop_check", None)
    if lc is None or d.kernel is not lc.kernel:
        return d
    return dataclasses.replace(d, kernel=kernel, buffers=list(d.buffers)[:-1])


def _fill_unused(rt, buf, shape_bshw, real_slots, block_size):
    """Cache words [nb, kvh, bs, w]: SENTINEL where no token maps, 0 where one does."""
    nb, kvh, bs, w = shape_bshw
    words = np.full((nb, kvh, bs, w), SENTINEL, np.uint32)
    words[real_slots // block_size, :, real_slots % block_size] = 0
    rt.write(buf, words)
    return words


def _untouched(rt, buf, shape, real_slots, block_size, dtype=np.uint32) -> int:
    nb, kvh, bs, w = shape
    got = rt.read(buf, np.uint32, nbytes=nb * kvh * bs * w * 4).reshape(nb, kvh, bs, w)
    used = np.zeros((nb, bs), bool)
    used[real_slots // block_size, real_slots % block_size] = True
    return int(np.count_nonzero(got.transpose(0, 2, 1, 3)[~used] != SENTINEL))


def _dequant_oracle(m, batch, x, key=None, value=None, which: int = 0):
    """The method family's numpy dequantised rows of x [tokens, kvh, D] (`key`, `value` and `which` (0 K,
    1 V): a family whose scales come from the whole batch)."""
    fam = m.family
    D = x.shape[-1]
    if fam == "f16":
        return o16.dequantize(o16.quantize(x))
    if fam == "fp8_vllm":
        s = o8f.vllm_method_scales(m, batch, key, value)[which]
        return o8f.vllm_dequantize(o8f.vllm_quantize(x, s, m.fmt)[0], s, m.fmt)
    if fam == "int8":
        return o8.dequantize(*o8.quantize(x))
    if fam == "int4":
        G = m.group_for(D) if hasattr(m, "group_for") else m.group_size
        return o4.dequantize_groups(*o4.quantize_groups(x, G), G)
    if fam == "fp8":
        codes, scales = o8f.quantize(x, m.fmt, m.scale_mode, batch.slot_mapping)
        return o8f.dequantize(codes, scales, m.fmt)
    if fam == "ggml":
        return ogg.dequantize(ogg.quantize(x, m.fmt), D, m.fmt)
    if fam == "fp4":
        st = ofp4.tensor_scale(x[np.asarray(batch.slot_mapping) != PAD_SLOT])
        return ofp4.dequantize(*ofp4.quantize(x, st), st)
    raise InvalidInput(f"no dequantised-rows oracle for method family {fam!r}")


def _fused_tol(ref: np.ndarray) -> np.ndarray:
    """[rows, kvh, D]: 2^-22 (|ref| + 2 max|ref| of the head vector)."""
    a = np.abs(ref.astype(np.float64))
    return 2.0 ** -22 * (a + 2 * a.max(-1, keepdims=True))


def _record_values(m, records: np.ndarray, D: int) -> np.ndarray:
    """The method's numpy dequantisation of its cache records [..., wpt] u32 -> [..., D] float64 (the value
    the fast decode must read from each record; per-token scales only)."""
    u = m.unpack(records, D)
    fam = m.family
    if fam == "f16":
        return np.asarray(u["codes"], np.float64)
    if fam == "fp8" and not m.per_tensor:
        return o8f.dequantize(u["code_bits"], u["scale"], m.fmt).astype(np.float64)
    if fam == "int4":
        return o4.dequantize_groups(u["codes"], u["scale"], u["zero"], m.group_for(D)).astype(np.float64)
    raise InvalidInput(f"no numpy record dequantiser for method {m.id} (family {fam!r})")


def _decode_cache(ctx, slot: Slot, batch, key, value, H: int):
    """The cache a fast decode slot reads, written by its method's built-in writer: (CacheFormat, K buffer,
    V buffer, tensor-scale buffer or None, (K, V) float64 [num_blocks, kvh, block_size, D]: the cache read
    back and dequantised in numpy, what the oracle attends over)."""
    rt, pk = ctx.rt, ctx.paged
    T, kvh, D = key.shape
    bs = batch.block_size
    if slot.method is None:  # the f32 baseline cache, written by the baseline writer
        cache = pk.allocate("f32", batch.num_blocks, kvh, bs, D)
        rt.run(pk.write_dispatches(cache, key, value, batch.slot_mapping))
        vals = tuple(pk.read(cache, w).astype(np.float64) for w in ("k", "v"))
        return fd.F32, cache.k, cache.v, None, vals

    m = get_method(slot.method)
    fmt = m.fast_cache_format(D)
    why = "the method has no fast decode format" if fmt is None else fd.unsupported(fmt, D, H // kvh)
    if why or fmt.name != slot.fmt:
        raise UnsupportedShape(f"slot {slot.id}: the fast decode cannot read {slot.method}'s cache at head size {D}, "
                               f"{H} heads over {kvh} KV heads: {why or f'its format is {fmt.name}'}")
    if slot.method == "int8_seed":  # the seed writer's q8 paged cache
        cache = pk.allocate("q8", batch.num_blocks, kvh, bs, D)
        rt.run(pk.write_dispatches(cache, key, value, batch.slot_mapping))
        vals = tuple(op.dequantize_cache_int8(pk.read(cache, w)).astype(np.float64) for w in ("k", "v"))
        return fmt, cache.k, cache.v, None, vals
    if hasattr(m, "writer_impl"):
        m.writer_impl = "fast"
    _, _, qc, _, wd, _ = m._build(ctx, batch, key, value)
    rt.run(wd)
    w = m.wpt(D)
    vals = []
    for which in ("K", "V"):
        full = qk.read_cache(rt, qc, which)
        recs = full[:, :, : bs * w].reshape(full.shape[0], full.shape[1], bs, w)
        vals.append(_record_values(m, recs, D))
    return fmt, qc.k, qc.v, qc.extra.get("tensor"), tuple(vals)


def _kivi_case(ctx, slot: Slot, kernel_name: str, batch, key, value, kernel):
    """KIVI (the slot's options) with `kernel` in the slot: the f32 cache rows after the writer kernels and the
    built-in dequantiser against kvviz.families.kivi.oracle.dequantize_cache; writer slots also count the words the
    kernel changed where the built-in writer writes nothing (K, V and the residual buffer prefilled with
    SENTINEL; the built-in's unwritten words found by running it first over the same prefill).
    Returns (CheckResult, ([timed dispatches], kernel), base dispatches, unique bytes, flops)."""
    rt = ctx.rt
    m = get_method(slot.method, **dict(slot.options))
    m.writer_impl = "fast" if slot.impl == "fast" else "first-wave"
    key_p, value_p, qc, f32c, wd, dd, row_res = m._prepare(ctx, batch, key, value)
    T, kvh, D = key_p.shape
    bs = batch.block_size
    sm = np.asarray(batch.slot_mapping).astype(np.int64)
    real = sm != PAD_SLOT
    rs = sm[real]
    plan = qc.extra["plan"]
    if "key_groups" in slot.id and not any(int(n) >= layout.GROUP for n in plan.n_q):
        raise UnsupportedShape(f"slot {slot.id}: no sequence of this shape holds a whole {layout.GROUP}-token key group "
                               f"(recent {m.recent}), so the key-group writer has nothing to write",
                               f"Use a context of at least {layout.GROUP + m.recent} tokens.")
    bufs = [(qc.k, int(np.prod(qc.shape("K")))), (qc.v, int(np.prod(qc.shape("V")))),
            (qc.extra["res"], max(1, plan.total_res) * 2 * kvh * D)]
    untouched = None
    if slot.case == "kivi-writer":
        for b, n in bufs:
            rt.write(b, np.full(n, SENTINEL, np.uint32))
        rt.run(wd)
        unused = [rt.read(b, np.uint32, nbytes=n * 4) == SENTINEL for b, n in bufs]
        for b, n in bufs:
            rt.write(b, np.full(n, SENTINEL, np.uint32))
    kernel = _resolve(kernel, wd + dd, slot)
    run = _swap(wd + dd, slot, kernel)
    rt.run(run)
    if slot.case == "kivi-writer":
        untouched = int(sum(np.count_nonzero(rt.read(b, np.uint32, nbytes=n * 4)[u] != SENTINEL)
                            for (b, n), u in zip(bufs, unused)))
    kf, vf = okv.dequantize_cache(batch, key_p, value_p, m.bits, m.recent)
    gots, refs, tols = [], [], []
    for which, rf in (("k", kf), ("v", vf)):
        g = ctx.paged.read(f32c, which)[rs // bs, :, rs % bs]
        r = np.asarray(rf, np.float64)[rs // bs, :, rs % bs]
        gots.append(g.reshape(len(rs), -1))
        refs.append(r.reshape(len(rs), -1))
        tols.append(_fused_tol(r).reshape(len(rs), -1))
    res = compare(slot, kernel_name, np.concatenate(gots, 1), np.concatenate(refs, 1), np.concatenate(tols, 1),
                  "token rows", "K|V x KV head x dim", untouched=untouched)
    timed = [d for d in run if _is_slot(d, slot, kernel)]
    # unique bytes of the kernel in the slot (what it must read and write), flops at the kivi rates
    KW = layout.kw(D, m.bits)
    n_q = int(sum(int(plan.n_q[s]) for s in range(batch.num_seqs)))
    n_res = int(plan.total_res)
    groups = int(sum(int(plan.n_q[s]) // layout.GROUP for s in range(batch.num_seqs)))
    if slot.case == "kivi-dequant":
        k_lay, v_lay = m.layouts_for_batch(batch, D)
        stored = int(round(len(rs) * kvh * (k_lay.bytes_per_token_per_head + v_lay.bytes_per_token_per_head)))
        nblk = sum(len(b) for b in batch.seq_blocks)
        nbytes = stored + 2 * nblk * kvh * bs * D * 4
        flops = arith.dequant_flops(batch, kvh, D, arith.DEQUANT_PER_ELEMENT["kivi"])
    elif "key_groups" in slot.id:  # the quantised K rows in; their code words and per-channel side words out
        nbytes = n_q * kvh * D * 4 + n_q * 4 * 2 + groups * 16 + n_q * kvh * KW * 4 + groups * kvh * 2 * D * 4
        flops = arith.writer_flops(batch, kvh, D, arith.WRITER_PER_ELEMENT["kivi"]) / 2 * (n_q / max(1, len(rs)))
    else:  # V of every row and K of the residual rows in; V records, residual rows and zeroed code slots out
        nbytes = (T * kvh * D * 4 + n_res * kvh * D * 4 + 2 * T * 4 + n_q * kvh * (KW + 2) * 4
                  + n_res * kvh * (2 * D + 2 * KW + 2) * 4)
        flops = arith.writer_flops(batch, kvh, D, arith.WRITER_PER_ELEMENT["kivi"]) / 2 * (n_q / max(1, len(rs)))
    return res, (timed, kernel), wd + dd, nbytes, flops


def prefill_queries(batch, q) -> tuple[np.ndarray, np.ndarray]:
    """(queries [NQ, H, D], chunk lengths) of the lab's prefill over `batch`: the last min(context, PREFILL_CHUNK)
    positions of every sequence, random normal queries (seed 0) of q's heads and head size."""
    lens = np.minimum(np.asarray(batch.context_lens, np.int64), PREFILL_CHUNK)
    H, D = np.shape(q)[1:]
    return np.random.default_rng(0).standard_normal((int(lens.sum()), H, D)).astype(np.float32), lens


def _prefill_case(ctx, slot: Slot, kernel_name: str, batch, key, value, q, kernel):
    """The prefill of the slot's shell over its method's cache (written by the method's writer; the f32 baseline
    writer's without a method) with `kernel` in the slot, against kvviz.attention.prefill_oracle.causal over the
    family's numpy dequantised cache. Returns (CheckResult, timed dispatches, base dispatches, bytes, flops, kernel)."""
    rt = ctx.rt
    T, kvh, D = key.shape
    qp, lens = prefill_queries(batch, q)
    H = qp.shape[1]
    scale = float(1.0 / np.sqrt(D))
    m, qkv = None, None
    if slot.method is None:
        cache = ctx.paged.allocate("f32", batch.num_blocks, kvh, batch.block_size, D)
        rt.run(ctx.paged.write_dispatches(cache, key, value, batch.slot_mapping))
        plan = pf.plan_records(ctx.prefill, pf.F32, cache.k, cache.v, kvh, qp, batch, lens, scale)
        kv_bytes = 2 * D * 4
    else:
        m = get_method(slot.method, **dict(slot.options))
        qkv = m.quantize(ctx, batch, key, value)
        plan = m.prefill_plan(ctx, qkv, batch, qp, lens, scale)
        if plan is None:
            raise UnsupportedShape(f"slot {slot.id}: {slot.method} has no prefill at head size {D}, {H} heads over {kvh}")
        kl, vl = m.layouts(D, batch.block_size)
        kv_bytes = kl.bytes_per_token_per_head + vl.bytes_per_token_per_head
    kernel = _resolve(kernel, plan.dispatches, slot)
    run = _swap(plan.dispatches, slot, kernel)
    rt.run(run)
    out = ctx.prefill.read(plan)
    fk, fv = pfo.method_caches(m, batch, key, value, qkv)
    ref = po.causal(qp, fk, fv, batch.block_tables, batch.context_lens, lens, batch.block_size, scale)
    res = compare(slot, kernel_name, out.reshape(-1, D), ref.reshape(-1, D), po.tolerance(float(np.abs(fv).max(initial=0))),
                  "(query, head)", "dim")
    nbytes, flops = pf.prefill_traffic(batch, lens, H, kvh, D, kv_bytes, plan)
    return res, [d for d in run if _is_slot(d, slot, kernel)], plan.dispatches, nbytes, flops, kernel


def run_case(ctx, slot: Slot, kernel, inputs, kernel_name: str, time_runs: int = 0, warmup: int = 2,
             builtin_timing: bool = True):
    """Run the slot's pipeline with `kernel` (None: the built-in) in the slot; returns (CheckResult,
    [LabTiming], grids)."""
    rt = ctx.rt
    batch, key, value, q = inputs
    T, kvh, D = key.shape
    H = q.shape[1]
    scale = float(1.0 / np.sqrt(D))
    sm = np.asarray(batch.slot_mapping).astype(np.int64)
    real = sm != PAD_SLOT
    rs = sm[real]
    bs = batch.block_size
    untouched = None
    if slot.case in ("paged-writer", "paged-decode"):
        pk = ctx.paged
        fmt = slot.fmt
        cache = pk.allocate(fmt, batch.num_blocks, kvh, bs, D)
        if slot.case == "paged-writer" and slot.impl == "fast":  # the seed layout's fast writer (same bytes)
            wd = int8_kernels.int8_dispatches(rt, key, value, batch.slot_mapping, cache.k, cache.v, bs, seed=True)
        else:
            wd = pk.write_dispatches(cache, key, value, batch.slot_mapping)
        if slot.case == "paged-writer":
            for buf in (cache.k, cache.v):
                _fill_unused(rt, buf, cache.shape, rs, bs)
            kernel = _resolve(kernel, wd, slot)
            run = _swap(wd, slot, kernel)
            rt.run(run)
            untouched = sum(_untouched(rt, b, cache.shape, rs, bs) for b in (cache.k, cache.v))
            kc, vc = pk.read(cache, "k"), pk.read(cache, "v")
            nbytes = __import__("kvviz.attention.traffic", fromlist=["x"]).writer_bytes(cache, batch, key)
            flops = arith.writer_flops(batch, kvh, D, 0.0 if fmt == "f32" else 2.0)
            if fmt == "f32":
                got = np.concatenate([c[rs // bs, :, rs % bs].reshape(len(rs), -1) for c in (kc, vc)], 1)
                ref = np.concatenate([x[real].reshape(len(rs), -1) for x in (key, value)], 1)
                res = compare(slot, kernel_name, got, ref, 0.0, "token rows", "K|V x KV head x dim", untouched=untouched)
            else:
                ulps = op.division_ulps(rt.summary)
                gots, refs, bads = [], [], []
                for c, x in ((kc, key), (vc, value)):
                    gc, gs = unpack_records(c[rs // bs, :, rs % bs])
                    rc, rsc, pre = op.quantize_int8_per_token(x[real])
                    diff = np.abs(gc.astype(np.int32) - rc.astype(np.int32))
                    sbad = op.ulp_diff_f32(gs, rsc) > ulps
                    bads.append(((diff > 1) | ((diff == 1) & ~op.tie_mask(pre)) | sbad[..., None]).reshape(len(rs), -1))
                    gots.append((gc.astype(np.float64) * gs[..., None]).reshape(len(rs), -1))
                    refs.append((rc.astype(np.float64) * rsc[..., None]).reshape(len(rs), -1))
                res = compare(slot, kernel_name, np.concatenate(gots, 1), np.concatenate(refs, 1), 0.0, "token rows",
                              "K|V x KV head x dim", bad=np.concatenate(bads, 1), untouched=untouched)
            timed = [d for d in run if _is_slot(d, slot, kernel)]
            base = wd
        else:
            rt.run(wd)
            dd, outs = pk.decode_dispatches(cache, q, batch, scale)
            kernel = _resolve(kernel, dd, slot)
            run = _swap(dd, slot, kernel)
            rt.run(run)
            out = pk._collect(outs, batch.num_seqs, H * D, (H, D))
            if fmt == "q8":
                kf, vf = op.dequantize_cache_int8(pk.read(cache, "k")), op.dequantize_cache_int8(pk.read(cache, "v"))
            else:
                kf, vf = pk.read(cache, "k").astype(np.float64), pk.read(cache, "v").astype(np.float64)
            ref = op.decode(q, kf, vf, batch.block_tables, batch.context_lens, bs, scale)
            tol = 2e-5 * max(1.0, float(np.abs(vf).max(initial=0)))
            res = compare(slot, kernel_name, out.reshape(-1, D), ref.reshape(-1, D), tol, "(sequence, head)", "dim")
            timed = [d for d in run if _is_slot(d, slot, kernel)]
            base = dd

            if slot.role == "reduce":
                parts = max(d.grid[2] for d in dd)
                nbytes = batch.num_seqs * H * parts * (D + 2) * 4 + batch.num_seqs * H * D * 4 + batch.num_seqs * 4
                flops = arith.reduce_flops(batch.num_seqs, H, D, parts)
            else:
                nbytes = decode_bytes(cache, batch, q)
                flops = arith.decode_flops(batch, H, D)
    elif slot.case in ("method-writer", "method-dequant"):
        m = get_method(slot.method)
        if hasattr(m, "writer_impl"):  # a method with a fast and a first-wave writer runs the one of the slot
            m.writer_impl = "fast" if slot.impl == "fast" else "first-wave"
        key_, value_, qc, f32c, wd, dd = m._build(ctx, batch, key, value)
        rec = (qc.num_blocks, kvh, bs, m.wpt(D))
        if slot.case == "method-writer":
            for buf in (qc.k, qc.v):
                _fill_unused(rt, buf, rec, rs, bs)
        kernel = _resolve(kernel, wd + dd, slot)
        run = _swap(wd + dd, slot, kernel)
        rt.run(run)
        if slot.case == "method-writer":
            untouched = sum(_untouched(rt, b, rec, rs, bs) for b in (qc.k, qc.v))
        gots, refs, tols = [], [], []
        for i, (which, x) in enumerate((("k", key), ("v", value))):
            f = ctx.paged.read(f32c, which)
            g = f[rs // bs, :, rs % bs]
            r = np.asarray(_dequant_oracle(m, batch, x, key, value, i), np.float64)[real]
            gots.append(g.reshape(len(rs), -1))
            refs.append(r.reshape(len(rs), -1))
            tols.append((np.zeros_like(r) if m.family in EXACT_FAMILIES else _fused_tol(r)).reshape(len(rs), -1))
        res = compare(slot, kernel_name, np.concatenate(gots, 1), np.concatenate(refs, 1), np.concatenate(tols, 1),
                      "token rows", "K|V x KV head x dim", untouched=untouched)
        timed = [d for d in run if _is_slot(d, slot, kernel)]
        base = wd + dd
        fam = m.family
        if slot.case == "method-writer":
            nbytes, flops = m._writer_bytes(batch, key), arith.writer_flops(batch, kvh, D, arith.WRITER_PER_ELEMENT.get(fam, 0.0))
        else:
            nbytes, flops = m._dequant_bytes(batch, kvh, D), arith.dequant_flops(batch, kvh, D, arith.DEQUANT_PER_ELEMENT.get(fam, 0.0))
    elif slot.case == "fast-decode":
        fmt, kbuf, vbuf, tensor, (kf, vf) = _decode_cache(ctx, slot, batch, key, value, H)
        # a reduce slot runs its own reduce at any partition count (the decode picks one of two by the count)
        plan = ctx.fast.plan(fmt, kbuf, vbuf, kvh, q, batch, scale, tensor=tensor,
                             reduce=slot.spec if slot.role == "reduce" else None)
        kernel = _resolve(kernel, plan.dispatches, slot)
        run = _swap(plan.dispatches, slot, kernel)
        rt.run(run)
        out = rt.read(plan.out, np.float32, plan.shape)
        ref = op.decode(q, kf, vf, batch.block_tables, batch.context_lens, bs, scale)
        tol = 2e-5 * max(1.0, float(np.abs(vf).max(initial=0)))
        res = compare(slot, kernel_name, out.reshape(-1, D), ref.reshape(-1, D), tol, "(sequence, head)", "dim")
        timed = [d for d in run if _is_slot(d, slot, kernel)]
        base = plan.dispatches
        P = plan.num_partitions
        if slot.role == "reduce":
            nbytes = batch.num_seqs * H * P * (D + 2) * 4 + batch.num_seqs * H * D * 4
            flops = arith.reduce_flops(batch.num_seqs, H, D, P)
        else:
            nbytes, _ = fd.decode_traffic(fmt, batch, H, kvh, D, P)
            flops = arith.decode_flops(batch, H, D)
    elif slot.case == "prefill":
        res, timed, base, nbytes, flops, kernel = _prefill_case(ctx, slot, kernel_name, batch, key, value, q, kernel)
    elif slot.case in ("kivi-writer", "kivi-dequant"):
        res, timed, base, nbytes, flops = _kivi_case(ctx, slot, kernel_name, batch, key, value, kernel)
        kernel = timed[1]
        timed = timed[0]
    else:
        raise KvvizError(f"slot {slot.id}: unknown case {slot.case!r}")
    lc = getattr(kernel, "loop_check", None)
    if lc is not None:  # read after the checked run; the kernel as written is timed
        res.loop_limited, res.loop_limit = lc.invocations(), lc.limit
        timed = [_as_written(d, kernel) for d in timed]
    res.grids = [tuple(d.grid) for d in timed]
    timings = []
    if time_runs:
        timings.append(LabTiming(kernel_name, "user" if kernel is not None else slot.impl,
                                 rt.time(timed, runs=time_runs, warmup=warmup), int(nbytes), float(flops)))
        if kernel is not None and builtin_timing:
            bt = [d for d in base if _is_slot(d, slot, None)]
            timings.append(LabTiming(f"built-in {slot.spec.path}", slot.impl, rt.time(bt, runs=time_runs, warmup=warmup),
                                     int(nbytes), float(flops)))
    return res, timings


def source_info(slot: Slot, user: UserKernel | None, grids) -> SourceInfo:
    if user is not None:
        text, rendered, lang, name, fe = user.text, user.rendered, language_of(user.name, slot), user.name, user.frontend
    else:
        sh = slot.spec.shader(slot.frontend)
        rendered = sh.rendered()
        text, lang, name, fe = rendered, slot.language, sh.path, sh.resolved_frontend
    code, kind = driver_code(rendered, lang, name, fe)
    g = " + ".join(str(x) for x in grids) or "(not run)"
    return SourceInfo(text, code, kind, workgroup_size(rendered, lang), workgroup_bytes(rendered, lang),
                      slot.spec.immediate_size, g)


def lab_run(ctx, slot_id: str, inputs, *, path: str | None = None, text: str | None = None, name: str | None = None,
            runs: int = 5, warmup: int = 2, info: bool = True) -> LabRun:
    """One Kernel lab step: compile the user's file (or text), check it against the slot's oracle, time it
    beside the built-in. A compile error raises KernelCompileError; a device loss DeviceLostError."""
    s = get_slot(slot_id)
    user = None
    kernel = None
    if path is not None or text is not None:
        name = name or str(path)
        src = read_text(path) if text is None else text
        if s.template:  # compiled with the built-in's values at this shape, once the pipeline is built
            made = []

            def kernel(defines):
                made.append(compile_user(ctx.rt, s, src, name, ctx.frontend, defines))
                return made[-1].kernel
        else:
            user = compile_user(ctx.rt, s, src, name, ctx.frontend)
            kernel = user.kernel
    res, timings = run_case(ctx, s, kernel, inputs, name if kernel is not None else "built-in", runs, warmup)
    if s.template and kernel is not None:
        user = made[-1]
    if kernel is not None and runs:
        for sib in siblings(slot_id):  # the slot's other built-in implementations (seed / first-wave / fast)
            try:
                _, st = run_case(ctx, sib, None, inputs, f"built-in {sib.spec.path}", runs, warmup)
            except KvvizError as exc:  # a shape the sibling does not take: said in the log, not a failure
                log.info("kernel lab: %s not timed beside %s: %s", sib.id, slot_id, exc)
                continue
            timings += st
    return LabRun(res, timings, source_info(s, user, res.grids) if info else None)
