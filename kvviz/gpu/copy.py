"""Device copy: the practical bandwidth limit every kernel is compared with.

Two measurements, both from GPU timestamps:
  copy_buffer  - copy_buffer_to_buffer (the driver's DMA/copy path), between two timestamps written
                 by the encoder (feature timestamp-query-inside-encoders) or, without it, by an empty
                 compute pass before and after;
  copy_shader  - a vec4 compute copy (shaders/copy/copy_vec4.wgsl): what a streaming shader reaches.
Bytes moved = read + write = 2 x size.
And the device-side moves the forward hands on without a read-back: copy_dispatch (a whole result into the
activations) and gather_dispatch (a column block of rows, e.g. a layer's K out of its fused q|K|V rows).
"""
from __future__ import annotations

import logging

import numpy as np

from kvviz.gpu.kernel_spec import KernelSpec, Struct, ro, rw
from kvviz.gpu.runtime import Dispatch, GpuRuntime
from kvviz.gpu.timing import TimingResult

log = logging.getLogger("kvviz.gpu.copy")

COPY_VEC4 = KernelSpec("copy/copy_vec4.wgsl", bindings=ro("src") + rw("dst"), immediates=Struct("Params", "n_vec4 stride"))
GATHER_ROWS = KernelSpec("copy/gather_rows.wgsl", bindings=ro("src") + rw("dst"),
                         immediates=Struct("Params", "rows width ld offset gx"))
KERNELS = (COPY_VEC4, GATHER_ROWS)


def _buffers(rt: GpuRuntime, nbytes: int, binding: bool):
    nbytes = nbytes // 16 * 16
    src = rt.empty(nbytes, "copy_src", binding=binding)
    dst = rt.empty(nbytes, "copy_dst", binding=binding)
    # Fill the source so the copy moves real data (some drivers shortcut untouched pages).
    rt.write(src, np.arange(nbytes // 4, dtype=np.uint32))
    return src, dst, nbytes


def copy_dispatch(rt: GpuRuntime, src, dst, nbytes: int) -> Dispatch:
    """The first `nbytes` (a multiple of 16) of `src` into `dst`, on the device: one dispatch of the copy shader."""
    if nbytes % 16:
        raise ValueError(f"the copy shader moves 16-byte vectors: {nbytes} bytes is not a multiple of 16")
    n_vec4 = nbytes // 16
    groups = max(1, min(rt.max_grid, -(-n_vec4 // 256)))
    return rt.compile(COPY_VEC4).dispatch((groups, 1, 1), [src, dst], n_vec4=n_vec4, stride=groups * 256)


def gather_dispatch(rt: GpuRuntime, src, dst, rows: int, width: int, ld: int, offset: int = 0) -> Dispatch:
    """Words offset..offset+width-1 of each of `rows` rows of `ld` words in `src` into `dst` as [rows, width]
    (32-bit words, so f32 moves bit for bit): a column block of a row-major matrix made contiguous on the device,
    without a read-back. One dispatch, a workgroup a row over a 2-D grid (rows past one grid dimension included)."""
    rows, width, ld, offset = int(rows), int(width), int(ld), int(offset)
    if width < 1 or offset < 0 or offset + width > ld:
        raise ValueError(f"gather: columns {offset}..{offset + width - 1} are not inside rows of {ld} words")
    gx = max(1, min(rows, rt.max_grid))
    gy = max(1, -(-rows // gx))
    if gy > rt.max_grid:
        raise ValueError(f"gather: {rows} rows exceed a {rt.max_grid} x {rt.max_grid} grid")
    return rt.compile(GATHER_ROWS).dispatch((gx, gy, 1), [src, dst], rows=rows, width=width, ld=ld, offset=offset,
                                            gx=gx)


def copy_shader_dispatches(rt: GpuRuntime, nbytes: int) -> tuple[list[Dispatch], int]:
    nbytes = min(nbytes, rt.max_binding)
    src, dst, nbytes = _buffers(rt, nbytes, True)
    kern = rt.compile(COPY_VEC4)
    n_vec4 = nbytes // 16
    groups = min(rt.max_grid, -(-n_vec4 // 256))
    stride = groups * 256
    return [kern.dispatch((groups, 1, 1), [src, dst], n_vec4=n_vec4, stride=stride)], nbytes


def time_copy_shader(rt: GpuRuntime, nbytes: int, runs: int = 20, warmup: int = 3):
    d, n = copy_shader_dispatches(rt, nbytes)
    return rt.time(d, runs=runs, warmup=warmup), 2 * n


def time_copy_buffer(rt: GpuRuntime, nbytes: int, runs: int = 20, warmup: int = 3) -> tuple[TimingResult, int]:
    """copy_buffer_to_buffer timed between a timestamp before and one after the copy."""
    src, dst, n = _buffers(rt, min(nbytes, rt.max_buffer), False)

    def record(enc, tw=None):
        if tw is None:
            enc.copy_buffer_to_buffer(src, 0, dst, 0, n)
            return
        qs, i0, i1 = tw["query_set"], tw["beginning_of_pass_write_index"], tw["end_of_pass_write_index"]
        if "timestamp-query-inside-encoders" in rt.features:
            from wgpu.backends.wgpu_native.extras import write_timestamp

            write_timestamp(enc, qs, i0)
            enc.copy_buffer_to_buffer(src, 0, dst, 0, n)
            write_timestamp(enc, qs, i1)
        else:
            log.debug("copy_buffer_to_buffer timed between empty compute passes (no timestamps inside encoders)")
            enc.begin_compute_pass(timestamp_writes={"query_set": qs, "end_of_pass_write_index": i0}).end()
            enc.copy_buffer_to_buffer(src, 0, dst, 0, n)
            enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": i1}).end()

    return rt.time(record=record, runs=runs, warmup=warmup), 2 * n


def measure_copy(rt: GpuRuntime, nbytes: int, runs: int = 20, warmup: int = 3):
    """Both copies; returns (reference GB/s = the faster one, [(name, variant, timing, bytes)])."""
    ct, cb = time_copy_buffer(rt, nbytes, runs, warmup)
    st, sb = time_copy_shader(rt, nbytes, runs, warmup)
    rows = [("copy_buffer", "copy_buffer_to_buffer", ct, cb), ("copy_shader", "wgsl vec4", st, sb)]
    # The faster copy is the reference: the copy engine behind copy_buffer_to_buffer can be far slower
    # than a shader copy (on the H200 it is; docs/benchmarks.md, "How kvviz times a kernel").
    return max(ct.gbps(cb), st.gbps(sb)), rows
