"""Kernels of the vLLM-style FP8 caches (methods vllm_fp8_e4m3 / vllm_fp8_e5m2, kvviz/families/fp8_vllm/method.py):
FP8 codes with a scale that is not the token's own: one per tensor (K and V each) or one per KV head,
calibrated once from the K/V seen (amax over the calibration rows / fp8_max, as engines calibrate) or
given, then frozen. Values beyond the calibrated range saturate; the writer counts them.

Family "fp8_vllm" (kvviz/families/catalogue.py): shaders shaders/fp8_vllm/{amax,scale,write,dequant}.wgsl
(they include common/quant.wgsl: the same correctly rounded division and saturating FP8 encoder as the
fp8_* methods), bit format kvviz/families/fp8/format.py, numpy reference kvviz/families/fp8/oracle.py (`vllm_*`), tests
tests/test_fp8_vllm.py.

Side buffer `ScaleBuffers` of one cache (u32 words, index which * kv_heads + head, which 0 = K, 1 = V):
  amax   [2 * kvh]  calibration maxima (|x| bits; per-tensor mode uses index which * kvh only)
  scales [2 * kvh]  float32 scale bits the writer and the dequantiser read
  sat    [2 * kvh]  saturated elements written so far, per head (also in per-tensor mode)
  tensor [4]        per-tensor mode: [0, 0, K scale, V scale], the layout the fast decode reads
                    (fp8_vllm_tensor.wgsl copies the calibrated scales there)
The format (mantissa bits, bias, max, saturation threshold) travels in the immediates: no defines.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvviz.attention import records as qk
from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime
from kvviz.paging import PAD_SLOT

AMAX = KernelSpec("fp8_vllm/amax.wgsl", bindings=ro("key_in", "val_in", "slots") + rw("amax"),
                  immediates=Struct("P", "kvh hd per_head"))
SCALE = KernelSpec("fp8_vllm/scale.wgsl", bindings=rw("amax", "scales"), immediates=Struct("P", "n fmax:f32"))
WRITE = KernelSpec("fp8_vllm/write.wgsl",
                   bindings=ro("key_in", "val_in", "slots") + rw("k_cache", "v_cache") + ro("scales") + rw("sat"),
                   immediates=Struct("P", "kvh hd bs wpt mbits bias max_bits max_code sat_bits per_head"))
DEQUANT = KernelSpec("fp8_vllm/dequant.wgsl",
                     bindings=ro("k_cache", "v_cache", "scales", "items") + rw("k_out", "v_out"),
                     immediates=Struct("P", "kvh hd bs wpt win0 mbits bias per_head"))
TENSOR = KernelSpec("fp8_vllm/tensor.wgsl", bindings=ro("scales") + rw("tensor"), immediates=Struct("P", "kvh"))
KERNELS = (AMAX, SCALE, WRITE, DEQUANT, TENSOR)


@dataclass
class ScaleBuffers:
    """The calibration / scale / saturation side buffers of one cache (see the module doc)."""

    kvh: int
    amax: object
    scales: object
    sat: object
    tensor: object = None

    @classmethod
    def allocate(cls, rt: GpuRuntime, kvh: int, given: tuple[float, float] | None = None, label: str = "fp8_vllm"):
        """Zeroed amax and saturation counters; scales from `given` (K, V) or zero (set by calibrate)."""
        s = np.zeros(2 * kvh, np.float32)
        if given is not None:
            s[:kvh], s[kvh:] = np.float32(given[0]), np.float32(given[1])
        t = np.zeros(4, np.float32)
        if given is not None:
            t[2], t[3] = np.float32(given[0]), np.float32(given[1])
        return cls(kvh, rt.upload(np.zeros(2 * kvh, np.uint32), f"{label}_amax"), rt.upload(s.view(np.uint32), f"{label}_scales"),
                   rt.upload(np.zeros(2 * kvh, np.uint32), f"{label}_saturated"), rt.upload(t.view(np.uint32), f"{label}_tensor"))

    def read(self, rt: GpuRuntime) -> dict:
        """{"amax": [2, kvh] f32, "scales": [2, kvh] f32, "saturated": [2, kvh] int64} from the GPU."""
        n = 2 * self.kvh
        amax = rt.read(self.amax, np.uint32, nbytes=4 * n).view(np.float32).reshape(2, self.kvh)
        sc = rt.read(self.scales, np.uint32, nbytes=4 * n).view(np.float32).reshape(2, self.kvh)
        sat = rt.read(self.sat, np.uint32, nbytes=4 * n).astype(np.int64).reshape(2, self.kvh)
        return {"amax": amax.copy(), "scales": sc.copy(), "saturated": sat}


def calibration_slots(slot_mapping: np.ndarray, token_pos: np.ndarray | None, calib_tokens: int) -> np.ndarray:
    """The slots the amax kernel reads: the batch's, with every row at a position >= calib_tokens marked
    PAD_SLOT (calib_tokens 0: every real row)."""
    sm = np.asarray(slot_mapping, np.int64).copy()
    if calib_tokens > 0 and token_pos is not None:
        sm[np.asarray(token_pos, np.int64) >= calib_tokens] = PAD_SLOT
    return sm


def calibrate_dispatches(rt: GpuRuntime, bufs: ScaleBuffers, key, value, calib_slots, fmt, per_head: bool) -> list[Dispatch]:
    """amax over the rows whose calib_slots entry is not PAD_SLOT, then scales = max(amax / fmax, 2^-126)."""
    out: list[Dispatch] = []
    kvh, D = key.shape[1], key.shape[2]
    if key.shape[0]:
        amax = rt.compile(AMAX)
        imm = amax.pack(kvh, D, int(per_head))
        out += qk.token_dispatches(rt, amax, key, value, calib_slots, [bufs.amax], lambda n: imm)
    sc = rt.compile(SCALE)
    out.append(sc.dispatch((1, 1, 1), [bufs.amax, bufs.scales], imm=sc.pack(2 * kvh, float(fmt.max))))
    if not per_head and bufs.tensor is not None:
        tk = rt.compile(TENSOR)
        out.append(tk.dispatch((1, 1, 1), [bufs.scales, bufs.tensor], imm=tk.pack(kvh)))
    return out


def write_dispatches(rt: GpuRuntime, qc, bufs: ScaleBuffers, key, value, slots, fmt, per_head: bool) -> list[Dispatch]:
    """The writer over token rows key/value [T, kvh, D] into the u32 cache `qc` (records of D/4 words)."""
    kvh, D = key.shape[1], key.shape[2]
    if not key.shape[0]:
        return []
    kern = rt.compile(WRITE)
    imm = kern.pack(kvh, D, qc.block_size, D // 4, fmt.mbits, fmt.bias, fmt.max_bits, fmt.max_code, fmt.sat_bits,
                    int(per_head))
    return qk.token_dispatches(rt, kern, key, value, slots, [qc.k, qc.v, bufs.scales, bufs.sat], lambda n: imm)


def dequant_dispatches(ctx, qc, bufs: ScaleBuffers, f32c, batch, fmt, per_head: bool, items=None) -> list[Dispatch]:
    """Dequantise the batch's used blocks (or `items`) of `qc` into the f32 paged cache `f32c`."""
    kern = ctx.rt.compile(DEQUANT)
    D = qc.head_size
    return qk.dequant_dispatches(
        ctx, kern, [qc.k, qc.v, bufs.scales], f32c, batch,
        lambda w0: kern.pack(qc.num_kv_heads, D, qc.block_size, D // 4, w0, fmt.mbits, fmt.bias, int(per_head)),
        items=items,
    )
