"""Can kvviz reach tensor cores through wgpu? Prints whether the adapter offers wgpu's "cooperative-matrix" feature
(coop_mat8x8 / coop_mat16x16 in WGSL under `enable wgpu_cooperative_matrix;`) and whether a device can be opened with
it. On the H200 (wgpu-py 0.32, wgpu-native 29.0.1.1, NVIDIA 580.159.04, 2026-12-02, tools/device-session13b.sh) the
adapter offers it, but wgpu marks it experimental and refuses the device: "Some experimental features,
EXPERIMENTAL_COOPERATIVE_MATRIX, were requested, but experimental features are not enabled". wgpu-native's C API has
no switch for experimental features (WGPUDeviceExtras holds only a trace path), so no WGSL kernel here can use the
tensor cores. Run it on the device: python3 tools/coop_matrix_probe.py
"""
import wgpu

import kvviz.gpu.runtime as R
from kvviz.errors import GpuUnavailable

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
info = adapter.info
print(f"{info.get('device')} ({info.get('backend_type')}, driver {info.get('description')}), "
      f"wgpu-py {wgpu.__version__}, wgpu-native {wgpu.backends.wgpu_native.__version__}")
offered = "cooperative-matrix" in adapter.features
print("adapter offers cooperative-matrix:", offered)
if offered:
    R.WANTED_FEATURES = R.WANTED_FEATURES + ("cooperative-matrix",)
    try:
        rt = R.GpuRuntime()
        print("device opened with cooperative-matrix:", "cooperative-matrix" in rt.features)
    except GpuUnavailable as exc:
        print("device with cooperative-matrix refused:", " ".join(str(exc).split()))
