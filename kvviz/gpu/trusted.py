"""Shader modules created without naga's runtime checks (index clamps, loop-bounding counters).

wgpu-native 29 exports `wgpuDeviceCreateShaderModuleTrusted(device, descriptor, runtimeChecks)`; wgpu-py
0.32 declares it (wgpu/resources/wgpu.h) but does not wrap it, so the descriptor is built here the way
wgpu-py's `GPUDevice.create_shader_module` builds it for WGSL. With no checks an out-of-bounds index or an
endless loop is undefined behaviour on the GPU: kvviz keeps checks on by default and in every test, and
offers the unchecked module only as a measured variant (`checks=False` of the fast decode, named in its
timing rows), for kernels whose indices the host validated before dispatch.
"""
from __future__ import annotations

RUNTIME_CHECKS_OFF = ("KVVIZ_RUNTIME_CHECKS", "off")  # a ShaderSpec define: compile without runtime checks


def available() -> bool:
    try:
        from wgpu.backends.wgpu_native._api import lib

        return hasattr(lib, "wgpuDeviceCreateShaderModuleTrusted")
    except Exception:  # noqa: BLE001 (another backend, an older wgpu-native: the variant is absent)
        return False


def create_wgsl_module(device, code: str, label: str, checks: int = 0):
    """A GPUShaderModule of WGSL `code` with the given WGPUShaderRuntimeChecks flags (0: none)."""
    from wgpu.backends.wgpu_native._api import GPUShaderModule, ffi, lib, new_struct_p, to_c_string_view

    source = new_struct_p("WGPUShaderSourceWGSL *", code=to_c_string_view(code))
    source[0].chain.next = ffi.NULL
    source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
    desc = new_struct_p("WGPUShaderModuleDescriptor *", nextInChain=ffi.cast("WGPUChainedStruct *", source),
                        label=to_c_string_view(label))
    module_id = lib.wgpuDeviceCreateShaderModuleTrusted(device._internal, desc, int(checks))
    if module_id == ffi.NULL:
        raise RuntimeError("wgpuDeviceCreateShaderModuleTrusted returned no module")
    return GPUShaderModule(label, module_id, device)
