"""What a method needs to run on the GPU: the runtime and the shared paged kernels."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvviz.gpu.runtime import GpuRuntime
from kvviz.gpu.shaders import FRONTEND_GLSLANG
from kvviz.attention.split_decode import FastDecode
from kvviz.attention.paged import PagedKernels
from kvviz.attention.prefill import Prefill


@dataclass
class GpuContext:
    rt: GpuRuntime
    frontend: str = FRONTEND_GLSLANG  # how GLSL kernels reach wgpu (glslang or naga-glsl)
    paged: PagedKernels = field(init=False)
    fast: FastDecode = field(init=False)  # the split-K decode over packed caches (kvviz/attention/split_decode.py)
    prefill: Prefill = field(init=False)  # the causal prefill over packed caches (kvviz/attention/prefill.py)

    def __post_init__(self):
        self.paged = PagedKernels(self.rt, self.frontend)
        self.fast = FastDecode(self.rt)
        self.prefill = Prefill(self.rt)
