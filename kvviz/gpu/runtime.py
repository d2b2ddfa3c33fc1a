"""The wgpu runtime: one adapter, one device, buffers, pipelines, dispatches and their GPU timings.

Qt-free. Kernel launchers (kvviz.attention, kvviz.families) build on `GpuRuntime`; they never touch wgpu directly
except through the objects it hands out.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import wgpu

from kvviz.errors import DeviceLimitError, DeviceLostError, GpuUnavailable, ShaderCompileError
from kvviz.gpu.kernel_spec import READ_WRITE, KernelSpec, Struct, ro, rw
from kvviz.gpu.pipeline_cache import (
    ANNOUNCE_AFTER_S,
    BuildWatch,
    KernelIndex,
    Listener,
    adapter_identity,
    configure_driver_cache,
    kernel_digest,
)
from kvviz.gpu.shaders import FRONTEND_GLSLANG, ShaderSpec, compile_shader, declarations
from kvviz.gpu.timing import MAX_WARMUP_SPANS, TimingResult, kernel_sources

WARMUP_BATCH_MAX = 1024  # passes in one warm-up submit (2 timestamps each: within wgpu's 4096-query sets)

log = logging.getLogger("kvviz.gpu")

# Features used when the adapter offers them. Timestamps for honest GPU times; immediates for the
# seeds' push constants; subgroup(+barrier) only because naga's GLSL front end demands them for
# barrier(); shader-f16 for later kernels.
WANTED_FEATURES = (
    "timestamp-query",
    "timestamp-query-inside-encoders",
    "immediates",
    "subgroup",
    "subgroup-barrier",
    "shader-f16",
)

STORAGE_RW = "storage"
STORAGE_RO = "read-only-storage"

# The start-up self-check of the loop limit (family "probe").
LOOP_PROBE = KernelSpec("probe/loop_limit.wgsl", bindings=ro("ones") + rw("counts"), immediates=Struct("P", "n_a n_b"))
PROBES = (LOOP_PROBE,)

# Staging buffers are reused and never larger than this; bigger transfers go in chunks.
STAGING_CHUNK = 64 << 20
# Uploads up to this size go through the queue's own staging (queue.write_buffer), which does not wait for the GPU;
# bigger ones map a staging buffer of ours, a wait for the work queued before (they are weights and caches, written
# once, where a second copy in the queue's staging would cost memory).
SMALL_WRITE = 16 << 20
# Bind groups kept for reuse (a dispatch of the same kernel over the same buffers: a model's layers every chunk)
BIND_GROUPS = 4096


@dataclass(frozen=True)
class AdapterSummary:
    name: str
    backend: str
    adapter_type: str
    vendor: str
    driver: str
    is_software: bool
    features: tuple[str, ...]
    limits: dict
    loop_limit: int | None = None  # loop iterations one invocation may run (None: no bound found)

    def line(self) -> str:
        sw = " [SOFTWARE RASTERISER: times are CPU times, not GPU times]" if self.is_software else ""
        return f"{self.name} ({self.backend}, {self.adapter_type}){sw}"

    def to_json(self) -> dict:
        keys = (
            "max-storage-buffer-binding-size",
            "max-buffer-size",
            "max-compute-workgroups-per-dimension",
            "max-immediate-size",
            "max-compute-workgroup-storage-size",
            "min-storage-buffer-offset-alignment",
        )
        return {
            "name": self.name,
            "backend": self.backend,
            "adapter_type": self.adapter_type,
            "vendor": self.vendor,
            "driver": self.driver,
            "is_software": self.is_software,
            "features": list(self.features),
            "limits": {k: self.limits.get(k) for k in keys},
            "loop_limit": self.loop_limit,
        }


_LOST_MARKERS = ("device is lost", "device lost", "devicelost", "device_lost")


def _is_loss(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return any(m in msg for m in _LOST_MARKERS)


class _DeviceLossWatcher(logging.Handler):
    """wgpu-py only logs device loss on the `wgpu` logger, without saying which device: every
    runtime's watcher hears it, so the line only makes each runtime *suspect* a loss, and the next
    check_alive() asks its own device whether it still answers (another runtime's device being
    destroyed must not mark this one lost)."""

    def __init__(self, runtime: "GpuRuntime"):
        super().__init__(level=logging.ERROR)
        # A weak reference: the `wgpu` logger lives for the whole process and must not keep every
        # runtime (and its device, pipelines and buffers) alive after the session dropped it.
        self._runtime = weakref.ref(runtime)

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        rt = self._runtime()
        if rt is not None and "lost" in msg.lower():
            rt.loss_suspected = msg


@dataclass
class Kernel:
    """A compiled compute pipeline plus what a dispatch needs to know about it."""

    name: str
    pipeline: object
    bind_group_layout: object
    bindings: tuple[str, ...]
    immediate_size: int
    spec: ShaderSpec
    kspec: KernelSpec | None = None
    digest: str = ""  # kvviz.gpu.pipeline_cache.kernel_digest: what the kernel index knows it by

    def pack(self, *values, **named) -> bytes:
        """The immediates of one dispatch, packed by the kernel spec's struct."""
        if self.kspec is None or self.kspec.immediates is None:
            raise TypeError(f"{self.name} declares no immediates")
        return self.kspec.immediates.pack(*values, **named)

    def dispatch(self, grid, buffers, *imm_values, imm: bytes | None = None, **imm_named) -> "Dispatch":
        """A Dispatch of this kernel: `buffers` in binding order (a list) or by binding name (a
        dict); the immediates' fields in order or by name (or already packed, `imm`)."""
        names = [b.name for b in self.kspec.bindings] if self.kspec else None
        if isinstance(buffers, dict):
            if names is None or sorted(buffers) != sorted(names):
                raise TypeError(f"{self.name} binds {names}, got {sorted(buffers)}")
            buffers = [buffers[n] for n in names]
        elif len(buffers) != len(self.bindings):
            raise TypeError(f"{self.name} binds {len(self.bindings)} buffers ({names}), got {len(buffers)}")
        if imm is None:
            imm = self.pack(*imm_values, **imm_named) if (imm_values or imm_named) else b""
        if self.immediate_size and len(imm) != self.immediate_size:
            raise TypeError(f"{self.name} needs {self.immediate_size} bytes of immediates")
        return Dispatch(self, list(buffers), tuple(int(g) for g in grid), imm)


@dataclass
class Dispatch:
    """One dispatch: a kernel, its buffers (binding -> buffer or (buffer, offset, size)), its grid."""

    kernel: Kernel
    buffers: Sequence
    grid: tuple[int, int, int]
    immediates: bytes = b""


@dataclass(frozen=True)
class DeviceRows:
    """A float32 result left on the device: `buffer` holds an array of `shape` (C order) from byte 0, and the work
    that writes it is submitted. A consumer on the device reads it there; `read` brings it to the host."""

    buffer: object
    shape: tuple

    def read(self, rt: "GpuRuntime") -> np.ndarray:
        return rt.read(self.buffer, np.float32, self.shape, nbytes=int(np.prod(self.shape)) * 4)


@dataclass
class _StagingPool:
    device: object
    read: list = field(default_factory=list)
    write: list = field(default_factory=list)

    def get(self, kind: str, size: int):
        pool = self.read if kind == "read" else self.write
        for buf in pool:
            if buf.size >= size:
                return buf
        usage = (
            wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
            if kind == "read"
            else wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC
        )
        size = max(size, 1 << 20)
        buf = self.device.create_buffer(size=size, usage=usage, label=f"kvviz-staging-{kind}")
        pool.append(buf)
        return buf


class GpuRuntime:
    """One wgpu device with helpers for buffers, pipelines and timed dispatches.

    Thread-safety: one runtime may be used from a worker thread; calls are serialised by a lock.
    """

    def __init__(self, power_preference: str = "high-performance"):
        self.driver_cache = configure_driver_cache()  # before the driver starts: it reads where its cache is then
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference=power_preference)
        except Exception as exc:  # wgpu raises RuntimeError when no driver is present
            raise GpuUnavailable(f"No wgpu adapter: {exc}") from exc
        if adapter is None:
            raise GpuUnavailable("No wgpu adapter was found.")
        self.adapter = adapter
        feats = [f for f in WANTED_FEATURES if f in adapter.features]
        limits = dict(adapter.limits)
        try:
            self.device = adapter.request_device_sync(required_features=feats, required_limits=limits)
        except Exception as exc:
            raise GpuUnavailable(f"Could not open the device: {exc}") from exc
        self.queue = self.device.queue
        self.features = frozenset(feats)
        self.limits = dict(self.device.limits)
        info = adapter.info
        name = info.get("device") or info.get("description") or "unknown adapter"
        atype = str(info.get("adapter_type", ""))
        is_sw = atype.upper() == "CPU" or any(
            s in name.lower() for s in ("llvmpipe", "lavapipe", "swiftshader", "software")
        )
        self.summary = AdapterSummary(
            name=name,
            backend=str(info.get("backend_type", "")),
            adapter_type=atype,
            vendor=str(info.get("vendor", "")),
            driver=str(info.get("description", "")),
            is_software=is_sw,
            features=tuple(sorted(feats)),
            limits=self.limits,
        )
        self.lost_reason: str | None = None
        self.loss_suspected: str | None = None
        self._watcher = _DeviceLossWatcher(self)
        logging.getLogger("wgpu").addHandler(self._watcher)
        weakref.finalize(self, logging.getLogger("wgpu").removeHandler, self._watcher)
        self._lock = threading.RLock()
        self._staging = _StagingPool(self.device)
        self._kernels: dict[tuple, Kernel] = {}
        self._shared: dict | None = None  # shared_inputs(): (address, nbytes, binding) -> buffer
        self._shared_ranges: list[tuple[int, int]] = []
        # (layout, (id(buffer), offset, size) ...) -> (bind group, weak references to its buffers): a hit only while
        # every buffer is the same live object (an id is reused only after its object is gone). A bind group holds
        # its buffers' memory on the device, so an entry goes as soon as one of them is dropped (the next
        # dispatch removes the entries whose buffers' weak references have called back into _stale).
        self._groups: collections.OrderedDict = collections.OrderedDict()
        self._stale: list = []
        # Kernels built before on this adapter (the driver's cache has their machine code), and what was built here.
        ident = adapter_identity(info)
        if self.driver_cache.off and "mesa" in self.summary.driver.lower():
            self.kernel_index = KernelIndex(None, ident)  # nothing survives a run: every kernel is a first build
        else:
            self.kernel_index = KernelIndex.for_adapter(ident)
        self.kernel_builds = {"new": 0, "known": 0}  # pipelines built by this runtime: first builds, and built before
        self._first_runs: dict[str, str] = {}  # digest -> name: first builds not yet dispatched
        self._watch: BuildWatch | None = None
        self.timestamp_period_ns = self._timestamp_period()
        self.loop_limit = self._loop_limit()
        self.summary = dataclasses.replace(self.summary, loop_limit=self.loop_limit)
        lim = self.summary.to_json()["limits"]
        log.info(
            "adapter %s; features %s; limits: storage binding %.0f MiB, buffer %.0f MiB, %s workgroups per "
            "dimension, %s bytes of immediates; loop limit %s; missing features %s",
            self.summary.line(), ", ".join(self.summary.features) or "none",
            (lim["max-storage-buffer-binding-size"] or 0) / 2**20, (lim["max-buffer-size"] or 0) / 2**20,
            lim["max-compute-workgroups-per-dimension"], lim["max-immediate-size"],
            "none" if self.loop_limit is None else self.loop_limit,
            ", ".join(f for f in WANTED_FEATURES if f not in feats) or "none",
        )

    # Iterations the probe asks for; an adapter that runs them all is taken to have no loop bound.
    LOOP_PROBE_ITERATIONS = 1 << 20

    def _loop_limit(self) -> int | None:
        """The loop limit, probed once an adapter + driver + wgpu: a later run reads the answer from the kernel
        index (the probe's build and its million iterations are most of a software adapter's opening)."""
        stored = self.kernel_index.probe("loop_limit")
        v = None if stored is None else stored["value"]
        if stored is not None and (v is None or (type(v) is int and v > 0)):
            log.info("loop limit of %s: %s (probed by an earlier run on this adapter and driver)", self.summary.name,
                     "none found" if stored["value"] is None else f"{stored['value']} iterations per invocation")
            return stored["value"]
        limit = self._probe_loop_limit()
        self.kernel_index.record_probe("loop_limit", limit)
        return limit

    def _probe_loop_limit(self) -> int | None:
        """Start-up self-check: the most loop iterations one invocation may run, None if unbounded.

        Software rasterisers bound them (llvmpipe: 65535 per invocation over all its loops, then
        every loop exits early and results are silently wrong); kernels check their own counts
        against this before dispatch (kvviz.gpu.loop_budget).
        """
        kern = self.compile(LOOP_PROBE)
        ones = self.upload(np.ones(8, np.uint32), "loop-probe-ones")
        counts = self.empty(64 * 8, "loop-probe-counts")
        n = self.LOOP_PROBE_ITERATIONS
        self.run([kern.dispatch((1, 1, 1), [ones, counts], n_a=n, n_b=0)])
        ran = int(self.read(counts, np.uint32).reshape(64, 2)[:, 0].min())
        ones.destroy()
        counts.destroy()
        limit = None if ran >= n else ran
        log.info("loop limit of %s: %s", self.summary.name, "none found" if limit is None else f"{limit} iterations per invocation")
        return limit

    # ------------------------------------------------------------------ info
    @property
    def has_timestamps(self) -> bool:
        return "timestamp-query" in self.features

    @property
    def max_binding(self) -> int:
        return int(self.limits["max-storage-buffer-binding-size"])

    @property
    def max_buffer(self) -> int:
        return int(self.limits["max-buffer-size"])

    @property
    def max_grid(self) -> int:
        return int(self.limits["max-compute-workgroups-per-dimension"])

    @property
    def offset_alignment(self) -> int:
        return int(self.limits["min-storage-buffer-offset-alignment"])

    def _timestamp_period(self) -> float:
        # wgpu-native resolves raw ticks; the queue's period converts them to nanoseconds.
        try:
            from wgpu.backends.wgpu_native._ffi import lib

            return float(lib.wgpuQueueGetTimestampPeriod(self.queue._internal))
        except Exception:  # pragma: no cover - other backends
            return 1.0

    def check_alive(self) -> None:
        if self.loss_suspected and not self.lost_reason:
            msg, self.loss_suspected = self.loss_suspected, None
            if not self._device_answers():
                self.lost_reason = msg
        if self.lost_reason:
            raise DeviceLostError(f"GPU device lost: {self.lost_reason}")

    def _device_answers(self) -> bool:
        """A submit and a mapped read on this device: False if it is lost."""
        try:
            enc = self.device.create_command_encoder()
            self.queue.submit([enc.finish()])
            buf = self.device.create_buffer(size=4, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            buf.map_sync(wgpu.MapMode.READ, 0, 4)
            buf.unmap()
            buf.destroy()
            return True
        except Exception:
            return False

    @contextlib.contextmanager
    def _guard(self, what: str):
        """Turn wgpu's 'parent device is lost' errors into DeviceLostError and remember the loss."""
        self.check_alive()
        try:
            yield
        except DeviceLostError:
            raise
        except Exception as exc:
            if _is_loss(exc) or (exc.__cause__ is not None and _is_loss(exc.__cause__)):
                self.lost_reason = f"{what}: {str(exc).strip().splitlines()[-1]}"
                raise DeviceLostError(f"GPU device lost during {what}.") from exc
            raise

    def close(self) -> None:
        logging.getLogger("wgpu").removeHandler(self._watcher)
        try:
            self.device.destroy()
        except Exception:
            pass

    # --------------------------------------------------------------- buffers
    def check_size(self, nbytes: int, what: str, binding: bool = True) -> None:
        limit = self.max_binding if binding else self.max_buffer
        if nbytes > limit:
            kind = "storage binding" if binding else "buffer"
            raise DeviceLimitError(
                f"{what} needs {nbytes / 2**20:.1f} MiB, over the adapter's {kind} limit of "
                f"{limit / 2**20:.1f} MiB ({self.summary.name})."
            )

    def empty(self, nbytes: int, label: str, binding: bool = True):
        nbytes = max(4, (int(nbytes) + 3) // 4 * 4)
        self.check_size(nbytes, label, binding)
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        with self._lock, self._guard("a buffer allocation"):
            return self.device.create_buffer(size=nbytes, usage=usage, label=label)

    def upload(self, array: np.ndarray, label: str, binding: bool = True):
        data = np.ascontiguousarray(array)
        key = self._shared_key(data, binding)
        if key is not None and key in self._shared:
            return self._shared[key]
        buf = self.empty(data.nbytes, label, binding)
        self.write(buf, data)
        if key is not None:
            self._shared[key] = buf
        return buf

    @contextlib.contextmanager
    def shared_inputs(self, *arrays: np.ndarray):
        """Within: uploads of the memory of `arrays` (read-only inputs such as a batch's K and V), or of a
        contiguous view into it, are made once; later uploads of the same bytes return that buffer, so the
        kernels of one computation read one copy. Copies (gathered rows) are uploaded as usual."""
        saved = self._shared, self._shared_ranges
        self._shared = {} if saved[0] is None else dict(saved[0])
        self._shared_ranges = list(saved[1])
        for a in arrays:
            a = np.asarray(a)
            if a.flags.c_contiguous and a.nbytes:
                start = a.__array_interface__["data"][0]
                self._shared_ranges.append((start, start + a.nbytes))
        try:
            yield
        finally:
            self._shared, self._shared_ranges = saved

    def _shared_key(self, data: np.ndarray, binding: bool):
        if self._shared is None or not data.nbytes:
            return None
        start = data.__array_interface__["data"][0]
        if any(lo <= start and start + data.nbytes <= hi for lo, hi in self._shared_ranges):
            return start, data.nbytes, bool(binding)
        return None

    def write(self, buf, array: np.ndarray, offset: int = 0) -> None:
        """Copy `array` into `buf` at byte `offset` through a reused MAP_WRITE staging buffer."""
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        n = raw.nbytes
        if n == 0:
            return
        pad = (-n) % 4
        with self._lock, self._guard("an upload"):
            if n <= SMALL_WRITE:
                # The queue's own staging: no map round trip, so a step's small inputs do not wait
                # for the GPU to finish the work queued before them.
                mem = raw if not pad else np.concatenate([raw, np.zeros(pad, np.uint8)])
                self.queue.write_buffer(buf, offset, mem)
                return
            for start in range(0, n, STAGING_CHUNK):
                chunk = raw[start : start + STAGING_CHUNK]
                size = chunk.nbytes + (pad if start + STAGING_CHUNK >= n else 0)
                stage = self._staging.get("write", size)
                stage.map_sync(wgpu.MapMode.WRITE, 0, size)
                mem = np.zeros(size, np.uint8)
                mem[: chunk.nbytes] = chunk
                stage.write_mapped(mem, 0)
                stage.unmap()
                enc = self.device.create_command_encoder()
                enc.copy_buffer_to_buffer(stage, 0, buf, offset + start, size)
                self.queue.submit([enc.finish()])

    def read(self, buf, dtype=np.float32, shape=None, offset: int = 0, nbytes: int | None = None) -> np.ndarray:
        """Read `nbytes` of `buf` from `offset` through a reused MAP_READ staging buffer."""
        total = buf.size - offset if nbytes is None else int(nbytes)
        out = np.empty(total, np.uint8)
        with self._lock, self._guard("a read-back"):
            for start in range(0, total, STAGING_CHUNK):
                size = min(STAGING_CHUNK, total - start)
                size4 = (size + 3) // 4 * 4
                stage = self._staging.get("read", size4)
                enc = self.device.create_command_encoder()
                enc.copy_buffer_to_buffer(buf, offset + start, stage, 0, size4)
                self.queue.submit([enc.finish()])
                stage.map_sync(wgpu.MapMode.READ, 0, size4)
                # the mapped memory itself (copy=False), copied once into `out` before the unmap invalidates it
                out[start : start + size] = np.frombuffer(stage.read_mapped(0, size4, copy=False), np.uint8)[:size]
                stage.unmap()
        self.check_alive()
        arr = out.view(dtype)
        return arr.reshape(shape) if shape is not None else arr

    def copy(self, src, dst, nbytes: int, src_offset: int = 0, dst_offset: int = 0) -> None:
        """Copy `nbytes` (a multiple of 4) of `src` into `dst` on the device, queued after the work before it."""
        if nbytes <= 0:
            return
        with self._lock, self._guard("a device copy"):
            enc = self.device.create_command_encoder()
            enc.copy_buffer_to_buffer(src, int(src_offset), dst, int(dst_offset), int(nbytes))
            self.queue.submit([enc.finish()])

    def read_spans(self, buf, spans, dtype=np.uint8) -> np.ndarray:
        """The byte spans [(offset, nbytes), ...] of `buf`, concatenated in order: each group of spans
        that fits the staging buffer is gathered by copies in one submit and read by one map, so a
        sequence scattered over many blocks costs one round trip, not one a block."""
        return self.read_gather([(buf, spans, dtype)])[0]

    def read_gather(self, parts) -> list[np.ndarray]:
        """Byte spans of several buffers read back together: parts [(buffer, [(offset, nbytes), ...], dtype)] ->
        one array a part, its spans concatenated in order. Every span that fits goes into one staging buffer
        (copies in one submit, one map), so reading many small buffers after a piece of work costs one round
        trip; a span larger than the staging buffer is read in pieces of it."""
        pieces = []  # (buffer, offset, nbytes, part, byte position in the part's array)
        sizes = []
        for j, (buf, spans, _) in enumerate(parts):
            pos = 0
            for o, n in spans:
                o, n = int(o), int(n)
                if o % 4 or n % 4:
                    raise ValueError(f"read_spans: span ({o}, {n}) is not 4-byte aligned")
                for at in range(0, n, STAGING_CHUNK):
                    size = min(STAGING_CHUNK, n - at)
                    pieces.append((buf, o + at, size, j, pos + at))
                pos += n
            sizes.append(pos)
        outs = [np.empty(n, np.uint8) for n in sizes]
        with self._lock, self._guard("a read-back"):
            i = 0
            while i < len(pieces):
                j, total = i, 0
                while j < len(pieces) and total + pieces[j][2] <= STAGING_CHUNK:
                    total += pieces[j][2]
                    j += 1
                self._gather_into(pieces[i:j], total, outs)
                i = j
        self.check_alive()
        return [out.view(dtype) for out, (_, _, dtype) in zip(outs, parts)]

    def _gather_into(self, pieces, total: int, outs: list) -> None:
        """Copy `pieces` (buffer, offset, nbytes, part, position) back to back into the read staging buffer (one
        submit), map it once and copy each piece to its place in outs[part]."""
        stage = self._staging.get("read", total)
        enc = self.device.create_command_encoder()
        at = 0
        for buf, o, n, _, _ in pieces:
            enc.copy_buffer_to_buffer(buf, o, stage, at, n)
            at += n
        self.queue.submit([enc.finish()])
        stage.map_sync(wgpu.MapMode.READ, 0, total)
        mapped = np.frombuffer(stage.read_mapped(0, total, copy=False), np.uint8)
        at = 0
        for _, _, n, j, pos in pieces:
            outs[j][pos:pos + n] = mapped[at:at + n]
            at += n
        del mapped
        stage.unmap()

    # ------------------------------------------------------------- pipelines
    def compile(self, kspec: KernelSpec, frontend: str = "", **defines) -> Kernel:
        """Compile (once, cached) the kernel a family declared, after checking its spec against the
        shader's own declarations (bindings, access, immediates).

        Through glslang every binding of the layout is read_write: naga's SPIR-V front end ignores
        glslang's NonWritable decorations and infers LOAD|STORE (measured with wgpu 0.32), and the
        layout must agree with it. naga's WGSL and GLSL front ends keep the declared access.
        """
        spec = kspec.shader(frontend, **defines)
        key = ("spec", kspec, spec.key())
        with self._lock:
            if key in self._kernels:
                return self._kernels[key]
            src = spec.rendered()
            kspec.check(declarations(src, spec.language, spec.defines), f"shaders/{spec.path}")
            everything_rw = spec.resolved_frontend == FRONTEND_GLSLANG
            access = [STORAGE_RW if (everything_rw or b.access == READ_WRITE) else STORAGE_RO for b in kspec.bindings]
            k = dataclasses.replace(self.kernel(spec, access, kspec.immediate_size, _source=src), kspec=kspec)
            self._kernels[key] = k
            return k

    def kernel(self, spec: ShaderSpec, bindings: Sequence[str], immediate_size: int = 0, _source: str | None = None) -> Kernel:
        """Compile (once, cached) a compute pipeline with an explicit layout.

        `bindings` lists the access of each binding 0..n-1 (STORAGE_RW or STORAGE_RO). The layout
        is explicit because `layout="auto"` drops the immediates range, and because naga's SPIR-V
        front end infers access itself and the layout must agree with it. Kernel families declare
        their kernels as KernelSpecs and go through `compile`.
        """
        # a source given with the spec is part of what the kernel is (the spec alone names a file's)
        key = (spec.key(), tuple(bindings), immediate_size, _source)
        with self._lock, self._guard(f"compiling {spec.name}"):
            if key in self._kernels:
                return self._kernels[key]
            if immediate_size and "immediates" not in self.features:
                raise ShaderCompileError(
                    f"{spec.name} needs push constants (immediates), which this adapter lacks."
                )
            if immediate_size > int(self.limits.get("max-immediate-size", 0) or 0):
                raise DeviceLimitError(
                    f"{spec.name} needs {immediate_size} bytes of immediates; the adapter allows "
                    f"{self.limits.get('max-immediate-size')}."
                )
            src = spec.rendered() if _source is None else _source
            digest = kernel_digest(spec.resolved_frontend, spec.entry, src, spec.defines, bindings, immediate_size)
            first = not self.kernel_index.known(digest)
            with self._first_build({digest: spec.name} if first else {}, counted=False):
                k = self._build(spec, src, bindings, immediate_size, digest)
            self.kernel_builds["new" if first else "known"] += 1
            if first:
                self._first_runs[digest] = spec.name
            log.info("pipeline %s: %s", spec.name, "a first build on this adapter" if first else
                     "built in an earlier run on this adapter")
            self._kernels[key] = k
            return k

    def _build(self, spec: ShaderSpec, src: str, bindings: Sequence[str], immediate_size: int, digest: str) -> Kernel:
        module = compile_shader(self.device, spec, src)
        entries = [
            {
                "binding": i,
                "visibility": wgpu.ShaderStage.COMPUTE,
                "buffer": {"type": access},
            }
            for i, access in enumerate(bindings)
        ]
        try:
            bgl = self.device.create_bind_group_layout(entries=entries, label=spec.name)
            layout = self.device.create_pipeline_layout(
                bind_group_layouts=[bgl], immediate_size=immediate_size, label=spec.name
            )
            pipe = self.device.create_compute_pipeline(
                layout=layout, compute={"module": module, "entry_point": spec.entry}, label=spec.name
            )
        except Exception as exc:
            raise ShaderCompileError(f"Pipeline for {spec.name} failed to validate:\n{exc}") from exc
        return Kernel(spec.name, pipe, bgl, tuple(bindings), immediate_size, spec, digest=digest)

    # ------------------------------------------------------------ first builds
    @contextlib.contextmanager
    def announce_first_builds(self, listener: Listener, after_s: float | None = None):
        """While inside, a first build (a kernel new to this adapter: its pipeline, and its first dispatch, where
        a driver such as lavapipe compiles it) that lasts longer than `after_s` (ANNOUNCE_AFTER_S) calls
        `listener(kernels built so far, kernel now building, its seconds)` from a timer thread, about every
        second until it ends. The window's compute says "building kernels for head size D (first use)" so."""
        prev, self._watch = self._watch, BuildWatch(listener, after_s)
        try:
            yield self._watch
        finally:
            self._watch = prev

    @contextlib.contextmanager
    def _first_build(self, kernels: dict, counted: bool = True):
        """Around building `kernels` (digest -> name; nothing to do when empty): announce it while it lasts
        (announce_first_builds) and, when `counted` (the first dispatch, the end of a build), record them in
        the kernel index once it succeeded."""
        if not kernels:
            yield
            return
        names = ", ".join(sorted({n.split(":", 1)[0] for n in kernels.values()}))
        watch = self._watch
        t0 = time.perf_counter()
        with watch.building(names, counted) if watch is not None else contextlib.nullcontext():
            yield
        dt = time.perf_counter() - t0
        if counted:
            for digest, name in kernels.items():
                self._first_runs.pop(digest, None)
                self.kernel_index.record(digest, name, dt)
        if dt > ANNOUNCE_AFTER_S:
            log.info("first build of %s on this adapter: %.1f s (%s)", names, dt, self.driver_cache.line())

    def _first_dispatches(self, dispatches: Sequence[Dispatch]) -> dict:
        """The kernels of `dispatches` built here for the first time and not dispatched yet (digest -> name)."""
        if not self._first_runs:
            return {}
        return {d.kernel.digest: d.kernel.name for d in dispatches if d.kernel.digest in self._first_runs}

    def _bind_group(self, d: Dispatch):
        while self._stale:
            self._groups.pop(self._stale.pop(), None)
        spans = [b if isinstance(b, tuple) else (b, 0, b.size) for b in d.buffers]
        key = (id(d.kernel.bind_group_layout), tuple((id(b), off, size) for b, off, size in spans))
        hit = self._groups.get(key)
        if hit is not None and all(r() is b for r, (b, _, _) in zip(hit[1], spans)):
            self._groups.move_to_end(key)
            return hit[0]
        entries = [{"binding": i, "resource": {"buffer": b, "offset": off, "size": size}}
                   for i, (b, off, size) in enumerate(spans)]
        group = self.device.create_bind_group(layout=d.kernel.bind_group_layout, entries=entries)
        gone = self._stale.append
        self._groups[key] = (group, [weakref.ref(b, lambda _, key=key: gone(key)) for b, _, _ in spans])
        self._groups.move_to_end(key)
        while len(self._groups) > BIND_GROUPS:
            self._groups.popitem(last=False)
        return group

    def _check_grid(self, d: Dispatch) -> None:
        for g in d.grid:
            if g > self.max_grid:
                raise DeviceLimitError(
                    f"{d.kernel.name}: grid {d.grid} exceeds {self.max_grid} workgroups per dimension."
                )

    def _record(self, cpass, dispatches: Sequence[Dispatch], groups) -> None:
        for d, bg in zip(dispatches, groups):
            cpass.set_pipeline(d.kernel.pipeline)
            cpass.set_bind_group(0, bg)
            if d.kernel.immediate_size:
                cpass.set_immediates(0, d.immediates, 0, len(d.immediates))
            if all(g > 0 for g in d.grid):
                cpass.dispatch_workgroups(*d.grid)

    # ------------------------------------------------------------- dispatch
    def run(self, dispatches: Sequence[Dispatch]) -> None:
        """Record the dispatches in one compute pass, submit, and wait for completion."""
        self.submit(dispatches, wait=True)

    def submit(self, dispatches: Sequence[Dispatch], wait: bool = False) -> None:
        """Record the dispatches in one compute pass and submit them; without `wait`, return at once. The queue
        runs passes in their order, so a later read (or run) sees what these wrote, and waits for them: a pass
        whose results only later passes read needs no wait of its own (a chunk's cache writes before its
        attention). An error of the device then shows at that later wait."""
        with self._lock, self._guard("a dispatch"), self._first_build(self._first_dispatches(dispatches)):
            for d in dispatches:
                self._check_grid(d)
            try:
                groups = [self._bind_group(d) for d in dispatches]
                enc = self.device.create_command_encoder()
                cpass = enc.begin_compute_pass()
                self._record(cpass, dispatches, groups)
                cpass.end()
                self.queue.submit([enc.finish()])
            except wgpu.GPUValidationError as exc:
                if _is_loss(exc):
                    raise
                raise ShaderCompileError(f"Dispatch failed validation: {exc}") from exc
            if wait:
                self._wait()

    def _wait(self) -> None:
        # on_submitted_work_done_sync() raises TypeError in wgpu-py 0.32.0; a tiny read waits instead.
        if not hasattr(self, "_fence"):
            self._fence = self.empty(4, "kvviz-fence")
        self.read(self._fence, np.uint32)

    def time(
        self,
        dispatches: Sequence[Dispatch] | None = None,
        runs: int = 20,
        warmup: int = 3,
        record: Callable | None = None,
        isolate: bool = False,
        warmup_ms: float = 500.0,
    ) -> TimingResult:
        """GPU time of one compute pass holding `dispatches`, from timestamp queries.

        Warm-up passes are submitted first and discarded (at least `warmup` of them and at least
        `warmup_ms` of wall time, so the GPU reaches its working clocks); then `runs` passes, each
        with a begin and an end timestamp, go back to back in one submit (on an H200 their times
        agreed with wall-clock throughput to 1%). `isolate=True` submits and waits for each run
        on its own: cold-GPU numbers. Without the timestamp feature, falls back to wall-clock time
        of submit + wait per run and says so in `TimingResult.method`.

        Every pass keeps when it began and ended (`starts_us`, `warmup_spans_us`, on the device's
        timestamp clock; the warm-up passes are timestamped too, the last MAX_WARMUP_SPANS kept), and
        the result names the kernels timed with their source hashes (`kernels`).
        """
        dispatches = list(dispatches or [])
        if self._first_dispatches(dispatches):
            self.run(dispatches)  # a first run builds the new kernels (lavapipe compiles them now), outside the timing
        with self._lock, self._guard("a timed run"):
            for d in dispatches:
                self._check_grid(d)
            groups = [self._bind_group(d) for d in dispatches]
            sources = kernel_sources(dispatches)

            def one_pass(enc, tw=None):
                cpass = enc.begin_compute_pass(timestamp_writes=tw) if tw else enc.begin_compute_pass()
                self._record(cpass, dispatches, groups)
                cpass.end()

            rec = record or one_pass
            stamps = self.has_timestamps
            period = self.timestamp_period_ns
            # Warm up by time as well as by count: an idle GPU runs at low clocks and a
            # latency-bound kernel measured cold reads several times slower on an H200 than warm
            # (wall-clock throughput confirms it: the clocks, not the timer).
            if self.summary.is_software:
                warmup_ms = 0.0  # a CPU rasteriser has no GPU clocks to ramp up
            t_start = time.perf_counter()
            t_end = t_start + warmup_ms / 1e3
            done = 0
            n = min(max(1, warmup), WARMUP_BATCH_MAX) if warmup_ms > 0 else max(1, warmup)
            warm = collections.deque(maxlen=MAX_WARMUP_SPANS)  # (start, end) in ns on the timing clock
            wq = None
            while done < warmup or time.perf_counter() < t_end:
                if stamps and wq is None:
                    # room for the largest batch below: the set is made once
                    wq = self._timestamp_slots(WARMUP_BATCH_MAX if warmup_ms > 0 else n, "kvviz-warmup-timestamps")
                enc = self.device.create_command_encoder()
                t0 = time.perf_counter_ns()
                for j in range(n):
                    if stamps:
                        rec(enc, {"query_set": wq[0], "beginning_of_pass_write_index": 2 * j,
                                  "end_of_pass_write_index": 2 * j + 1})
                    else:
                        rec(enc)
                if stamps:
                    ticks = self._resolve_timestamps(enc, wq, n)
                    warm.extend((int(a), int(b)) for a, b in ticks)
                else:
                    self.queue.submit([enc.finish()])
                    self._wait()
                    warm.append((t0, time.perf_counter_ns()))
                done += n
                # Keep the GPU busy, not idling between tiny submits: with 3 passes a submit and a wait after
                # each, a short kernel keeps an H200 at a low duty cycle and its first timing in a process reads
                # slow (docs/benchmarks.md, "Why the warm-up is long"). Grow the batch until a submit lasts ~20 ms of wall
                # time.
                if warmup_ms > 0 and (time.perf_counter_ns() - t0) < 20e6:
                    n = min(2 * n, WARMUP_BATCH_MAX)
                if time.perf_counter() - t_start > 4 * max(warmup_ms, 250.0) / 1e3:
                    break  # a pathological device: never spin for long
            if wq is not None:
                wq[0].destroy()
            if not stamps:
                samples, starts = [], []
                for _ in range(runs):
                    t0 = time.perf_counter_ns()
                    enc = self.device.create_command_encoder()
                    rec(enc)
                    self.queue.submit([enc.finish()])
                    self._wait()
                    samples.append((time.perf_counter_ns() - t0) / 1e3)
                    starts.append(t0)
                log.info("%s has no timestamp-query: timing by wall clock (submit + wait)", self.summary.name)
                res = _timing_result(samples, starts, warm, 1.0, done, sources, "wall-clock (no timestamp-query)")
                log.debug("timed %s: %s", _names(dispatches), res.to_json())
                return res
            qs = self._timestamp_slots(runs, "kvviz-timestamps")
            enc = self.device.create_command_encoder()
            for i in range(runs):
                tw = {
                    "query_set": qs[0],
                    "beginning_of_pass_write_index": 2 * i,
                    "end_of_pass_write_index": 2 * i + 1,
                }
                rec(enc, tw)
                if isolate:
                    self.queue.submit([enc.finish()])
                    self._wait()
                    enc = self.device.create_command_encoder()
            ticks = self._resolve_timestamps(enc, qs, runs)
            qs[0].destroy()
            # Differences in ticks first (exact integers), then nanoseconds: the samples keep full precision.
            dt_us = (ticks[:, 1].astype(np.float64) - ticks[:, 0]) * period / 1e3
            res = _timing_result(list(dt_us), [int(t) for t in ticks[:, 0]], warm, period, done, sources, "gpu-timestamps")
            log.debug("timed %s: %s", _names(dispatches), res.to_json())
            return res

    def _timestamp_slots(self, passes: int, label: str):
        """A timestamp query set for `passes` passes (a begin and an end each) and its resolve buffers."""
        qs = self.device.create_query_set(type="timestamp", count=2 * passes, label=label)
        resolve_buf = self.device.create_buffer(
            size=16 * passes, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
        )
        return qs, resolve_buf, self.empty(16 * passes, label)

    def _resolve_timestamps(self, enc, slots, passes: int) -> np.ndarray:
        """Resolve the query set at the end of `enc`, submit it, wait and return the ticks [passes, 2]."""
        qs, resolve_buf, out = slots
        enc.resolve_query_set(qs, 0, 2 * passes, resolve_buf, 0)
        enc.copy_buffer_to_buffer(resolve_buf, 0, out, 0, 16 * passes)
        self.queue.submit([enc.finish()])
        return self.read(out, np.uint64, nbytes=16 * passes).reshape(passes, 2)  # the set may hold more


def _timing_result(samples_us, starts, warm, period_ns: float, warmup_runs: int, sources, method: str) -> TimingResult:
    """A TimingResult whose start times count from the earliest kept timestamp (warm-up included).
    `starts` and `warm` are integer clock ticks of `period_ns` each; they are made relative in
    integers first, so a clock counting from the epoch (1e18 ns) keeps sub-ns offsets."""
    base = min([int(s) for s in starts] + [int(a) for a, _ in warm])
    us = lambda t: (int(t) - base) * period_ns / 1e3  # noqa: E731
    return TimingResult.from_samples(
        samples_us, method,
        starts_us=[us(s) for s in starts],
        warmup_spans_us=[(us(a), us(b)) for a, b in warm],
        warmup_runs=warmup_runs, origin_ns=base * period_ns, kernels=sources,
    )


def _names(dispatches) -> str:
    names = list(dict.fromkeys(d.kernel.name for d in dispatches))
    return " + ".join(names) if names else "a recorded pass"


# ------------------------------------------------------------------ opening the GPU ahead of its first use
_EARLY: dict = {}


def open_early() -> None:
    """Start opening the default GpuRuntime on a thread of its own; `take_early` hands it over.

    The window's launcher calls it before it imports the window's modules: the adapter, the device and the
    loop probe are then ready (or nearly) by the first compute. Most of opening a device is the driver's own
    work (lavapipe sets up LLVM and compiles the probe), which runs beside the imports. Idempotent."""
    if "thread" in _EARLY:
        return

    def run() -> None:
        try:
            _EARLY["rt"] = GpuRuntime()
        except BaseException as exc:  # noqa: BLE001 - raised again by take_early, in the thread that uses the GPU
            _EARLY["exc"] = exc

    t = threading.Thread(target=run, name="kvviz-gpu-open", daemon=True)
    _EARLY["thread"] = t
    t.start()


def take_early() -> GpuRuntime | None:
    """The runtime `open_early` opened (waiting for it to be open), once; None when none was started. Raises
    what opening it raised (GpuUnavailable without a driver); a later call then finds none."""
    t = _EARLY.pop("thread", None)
    if t is None:
        return None
    t.join()
    exc, rt = _EARLY.pop("exc", None), _EARLY.pop("rt", None)
    if exc is not None:
        raise exc
    return rt
