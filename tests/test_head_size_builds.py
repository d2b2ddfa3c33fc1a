"""Every kernel of every method at every head size from 32 to 256 in steps of 8: generated shaders that stay small.

The kernels a method compiles for a head size (its writers, dequantiser and decodes, and the report's f32 fast decode)
are enumerated by running the method's quantise, attend and timed kernels on SourceRuntime: a runtime that compiles
nothing, records every WGSL kernel asked for (the source the front end would see: includes resolved, defines applied,
marked loops unrolled) and answers reads with zeros. No GPU is needed, so the whole sweep runs here:
  - on a software rasteriser's profile (lavapipe: subgroups of 8, the looped decodes) and on a hardware one (subgroups of
    32, lanes capped at 16, the unrolled decodes), no head size may give a kernel larger than the power-of-two head
    sizes 32..256 give it (the shapes the kernels were laid out and measured for; GROWTH of slack), nor one over
    MAX_LINES lines. Before the lanes walked odd heads with padding, the decode at head 100 was 3851 lines against 800
    at 128 (one lane a row, every head and vec4 unrolled), int4's writer 1032 lines at head 168 against 480 at 128,
    KIVI's token writer 1491 at 232; lavapipe's build time grows with their size (minutes for the largest).
  - the build time itself is measured, not asserted (timings are printed, never asserted): test_build_the_largest
    builds the largest kernel of each method (its largest head size) on this adapter in a fresh process (with Mesa's
    shader cache off when MESA_SHADER_CACHE_DISABLE=true says so), one workgroup over zeroed buffers (lavapipe compiles a pipeline at its first dispatch), and
    prints each build's seconds (wall and the process's CPU time: the latter holds on a busy machine);
    docs/benchmarks.md keeps the figures.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from kvviz.errors import UnsupportedShape
from kvviz.families.registry import get_method, registry
from kvviz.gpu.runtime import AdapterSummary, Kernel
from kvviz.methods.context import GpuContext
from kvviz.paging import make_batch

HEADS = tuple(range(32, 257, 8))
REFERENCE_HEADS = (32, 64, 128, 256)
GROWTH = 1.25  # the most a kernel's source may exceed its largest at REFERENCE_HEADS
MAX_LINES = 2000
PROFILES = {  # name: (subgroup size, software rasteriser)
    "software": (8, True),
    "hardware": (32, False),
}


class FakeBuffer:
    def __init__(self, size: int):
        self.size = int(size)

    def destroy(self):
        pass


# A spec's rendered source is a function of the spec alone while the shader files stay as they are, and the methods
# ask for the same specs at many head sizes: each is rendered once a process.
_RENDERED: dict = {}


def rendered(spec) -> str:
    src = _RENDERED.get(spec)
    if src is None:
        src = _RENDERED[spec] = spec.rendered()
    return src


class SourceRuntime:
    """Compiles nothing: records every WGSL kernel asked for ({key: (kernel spec, defines, source)}), reads zeros."""

    def __init__(self, subgroup: int = 8, software: bool = True, shared: int = 32768, loop_limit: int | None = 65535):
        self.kernels = {}
        self.features = frozenset({"immediates", "shader-f16", "subgroup", "subgroup-barrier", "timestamp-query"})
        self.limits = {"max-compute-workgroup-storage-size": shared, "max-immediate-size": 128,
                       "max-storage-buffer-binding-size": 1 << 30, "max-buffer-size": 1 << 31,
                       "max-compute-workgroups-per-dimension": 65535, "min-storage-buffer-offset-alignment": 256,
                       "max-compute-invocations-per-workgroup": 256}
        self.summary = AdapterSummary("source only", "none", "CPU" if software else "DiscreteGPU", "", "", software,
                                      tuple(sorted(self.features)), self.limits, loop_limit)
        self.loop_limit = loop_limit
        self._kvviz_subgroup_size = subgroup  # the fast decodes' subgroup probe, answered
        self.adapter = types.SimpleNamespace(info={"subgroup_min_size": 4})
        self.max_grid, self.max_binding, self.max_buffer, self.offset_alignment = 65535, 1 << 30, 1 << 31, 256
        self.has_timestamps = True

    def compile(self, kspec, frontend: str = "", **defines):
        spec = kspec.shader(frontend, **defines)
        if spec.language == "wgsl":
            self.kernels[spec.key()] = (kspec, dict(defines), rendered(spec))
        return Kernel(spec.name, None, None, tuple("" for _ in kspec.bindings), kspec.immediate_size, spec, kspec)

    def upload(self, array, label, binding=True):
        return FakeBuffer(np.asarray(array).nbytes)

    def empty(self, nbytes, label, binding=True):
        return FakeBuffer(nbytes)

    def read(self, buf, dtype=np.float32, shape=None, offset=0, nbytes=None):
        if shape is not None:
            return np.zeros(shape, dtype)
        return np.zeros((nbytes if nbytes is not None else buf.size - offset) // np.dtype(dtype).itemsize, dtype)

    def read_spans(self, buf, spans, dtype=np.uint8):
        return np.zeros(sum(n for _, n in spans) // np.dtype(dtype).itemsize, dtype)

    def write(self, buf, array, offset=0):
        pass

    def run(self, dispatches):
        pass

    def check_size(self, *args, **kw):
        pass

    def check_alive(self):
        pass

    @contextlib.contextmanager
    def shared_inputs(self, *arrays):
        yield


@functools.lru_cache(maxsize=None)  # the sweeps below and largest_head ask for the same cells; callers only read
def method_kernels(method_id: str, D: int, profile: str = "software") -> dict | None:
    """{key: (kernel spec, defines, source)} of every WGSL kernel `method_id` compiles at head size D on `profile`: its
    quantise (writers, dequantiser), attend and timed kernels over 8/2 heads, and the report's f32 fast decode; None
    where the method refuses the head size."""
    from kvviz.attention import split_decode as fd

    sub, software = PROFILES[profile]
    rt = SourceRuntime(sub, software, loop_limit=65535 if software else None)
    ctx = GpuContext(rt)
    m = get_method(method_id)
    try:
        m.check(8, 2, D, 16)
    except UnsupportedShape:
        return None
    batch = make_batch([37, 100], 16, policy="scattered", seed=0)
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal((batch.num_tokens, 2, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((2, 8, D)).astype(np.float32)
    qkv = m.quantize(ctx, batch, k, v)
    m.attend(ctx, qkv, batch, q, D ** -0.5)
    m.timed_kernels(ctx, batch, k, v, q, D ** -0.5, qkv=qkv)
    ctx.fast.plan(fd.F32, rt.empty(1 << 24, "k"), rt.empty(1 << 24, "v"), 2, q, batch, D ** -0.5)
    return rt.kernels


def sweep(method_id: str, profile: str) -> dict:
    """{shader path: {head size: lines of its largest source there}} over HEADS."""
    out: dict = {}
    for D in HEADS:
        for kspec, _, src in (method_kernels(method_id, D, profile) or {}).values():
            by_d = out.setdefault(kspec.path, {})
            by_d[D] = max(by_d.get(D, 0), src.count("\n") + 1)
    return out


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("method_id", sorted(registry()))
def test_sources_stay_small_at_every_head_size(method_id, profile):
    sizes = sweep(method_id, profile)
    assert sizes, f"{method_id} took no head size from 32 to 256"
    for path, by_d in sizes.items():
        ref = max((n for D, n in by_d.items() if D in REFERENCE_HEADS), default=0)
        worst = max(by_d, key=by_d.get)
        assert ref, f"{method_id} ({profile}): {path} is compiled at none of the head sizes {REFERENCE_HEADS}"
        assert by_d[worst] <= GROWTH * ref and by_d[worst] <= MAX_LINES, (
            f"{method_id} ({profile}): {path} is {by_d[worst]} lines at head size {worst}, at most {ref} at "
            f"{REFERENCE_HEADS}")


# -------------------------------------------------------------------------------------- build times on this adapter
BUILD_SCRIPT = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_head_size_builds import method_kernels
from kvviz.gpu.runtime import GpuRuntime, Dispatch
rt = GpuRuntime()
out = []
for method_id, D in json.loads(sys.argv[2]):
    for key, (kspec, defines, src) in method_kernels(method_id, D, "software" if rt.summary.is_software else "hardware").items():
        bufs = [rt.empty(1 << 16, "zeros") for _ in kspec.bindings]
        for b in bufs:
            rt.write(b, np.zeros(1 << 14, np.uint32))
        t, c = time.perf_counter(), time.process_time()
        kern = rt.compile(kspec, **defines)
        rt.run([Dispatch(kern, bufs, (1, 1, 1), bytes(kern.immediate_size))])
        out.append([method_id, D, kspec.path, src.count("\n") + 1, time.perf_counter() - t, time.process_time() - c])
print(json.dumps(out))
"""


def largest_head(method_id: str) -> int:
    """The head size at which `method_id`'s kernels are largest, all together (software profile)."""
    best, size = HEADS[0], -1
    for D in HEADS:
        ks = method_kernels(method_id, D)
        n = sum(src.count("\n") for _, _, src in ks.values()) if ks else -1
        if n > size:
            best, size = D, n
    return best


@pytest.mark.gpu
@pytest.mark.slow
def test_build_the_largest(rt):
    """Builds each method's kernels at its largest head size (and the vLLM sizes 100 and 120 that took minutes) in a
    fresh process, through kvviz's kernel cache as the app does (a build is compiled once per machine); prints every
    build's time (not asserted: an honest number, never a pass mark). The build times without the cache, as
    docs/benchmarks.md gives them: MESA_SHADER_CACHE_DISABLE=true python -m pytest -s -p no:cacheprovider -n 0
    tests/test_head_size_builds.py::test_build_the_largest"""
    cases = sorted({(m, largest_head(m)) for m in registry()} | {("int8_token", 120), ("f16", 100)})
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", BUILD_SCRIPT, os.path.dirname(__file__), json.dumps(cases)], env=env,
                       capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert {(m, D) for m, D, *_ in rows} == set(cases)  # every case built at least one kernel
    print(f"\n{'method':14s} {'head':>4s} {'kernel':40s} {'lines':>5s} {'build s':>7s} {'CPU s':>6s}  (load {os.getloadavg()[0]:.1f})")
    for m, D, path, lines, s, cpu in sorted(rows, key=lambda r: -r[5]):
        print(f"{m:14s} {D:4d} {path:40s} {lines:5d} {s:7.2f} {cpu:6.2f}")
