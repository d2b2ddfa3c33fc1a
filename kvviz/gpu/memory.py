"""What the process holds: resident memory and live wgpu objects (buffers and their bytes).

Qt-free. The load tests use it to bound memory growth over many computes and long live decodes;
`snapshot()` is cheap (a /proc read and two dict walks), so it can also be logged by a long run.

Buffer counts come from two places: wgpu-py's own object tracker (`wgpu.diagnostics.object_counts`:
Python-side GPUBuffer objects alive and the bytes they were created with) and wgpu-native's hub
(`wgpu.diagnostics.wgpu_native_counts`: what the native library still holds, which includes
buffers Python has dropped but the device has not yet freed).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys
from dataclasses import dataclass


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, looked up once (find_library runs ldconfig); None where there is none (musl,
    not Linux)."""
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # pragma: no cover - a C library without malloc_trim
        return None


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the system, so RSS counts what is held rather than what freed
    allocations left scattered over the heap."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def rss_bytes() -> int:
    """Resident set size of this process, in bytes (Linux /proc; ru_maxrss elsewhere, an upper bound)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        import resource  # Unix only: imported where /proc is missing

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


@dataclass(frozen=True)
class MemorySnapshot:
    rss: int  # bytes
    buffers: int  # GPUBuffer objects alive in Python (all devices)
    buffer_bytes: int  # their sizes, summed
    native_buffers: int  # buffers wgpu-native still holds
    bind_groups: int  # bind groups wgpu-native still holds
    devices: int  # devices wgpu-native still holds
    objects: int  # every wgpu object alive in Python

    @property
    def rss_mb(self) -> float:
        return self.rss / 2**20

    @property
    def buffer_mb(self) -> float:
        return self.buffer_bytes / 2**20

    def line(self) -> str:
        return (f"RSS {self.rss_mb:.1f} MB, {self.buffers} GPU buffers ({self.buffer_mb:.1f} MB), "
                f"native: {self.native_buffers} buffers, {self.bind_groups} bind groups, {self.devices} device(s); "
                f"{self.objects} wgpu objects")


def snapshot(collect: bool = True) -> MemorySnapshot:
    """RSS and live wgpu objects now. collect=True runs the garbage collector first, so objects that
    only a reference cycle keeps alive do not count as held, and returns the heap's free pages, so a
    long process's fragmentation does not count as held either."""
    import wgpu

    if collect:
        gc.collect()
        _trim_heap()
    py = wgpu.diagnostics.object_counts.get_dict()
    try:
        native = wgpu.diagnostics.wgpu_native_counts.get_dict()
    except Exception:  # pragma: no cover - another backend
        native = {}

    def count(d, key):
        return int((d.get(key) or {}).get("count", 0))

    buf = py.get("Buffer") or {}
    return MemorySnapshot(
        rss=rss_bytes(),
        buffers=int(buf.get("count", 0)),
        buffer_bytes=int(buf.get("resource_mem", 0)),
        native_buffers=count(native, "Buffer"),
        bind_groups=count(native, "BindGroup"),
        devices=count(native, "Device"),
        objects=int((py.get("total") or {}).get("count", 0)),
    )
