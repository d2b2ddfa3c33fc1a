"""Kernel specs: a kernel's shader, entry point, named bindings and immediates, declared once.

    WRITER = KernelSpec(
        "int8/write.wgsl",
        bindings=ro("key_in", "val_in", "slots") + rw("k_cache", "v_cache"),
        immediates=Struct("P", "kvh hd bs wpt"),
    )
    kern = rt.compile(WRITER)                    # compiled once per runtime, checked against the shader
    kern.dispatch(grid, [k, v, slots, kc, vc], kvh=2, hd=64, bs=16, wpt=17)

When a spec is compiled, the shader's own declarations (kvviz.gpu.shaders.declarations: the
`@group(0) @binding(i) var<storage, ...>` / `layout(set = 0, binding = i) [readonly] buffer` lines and
the `var<immediate>` struct / push_constant block) must match it: the same bindings in the same
order with the same names and access, the same immediates fields and types. A mismatch is a
ShaderCompileError naming both sides. Parameters passed in a storage buffer (`array<u32, N>`) are
declared with `buffers=(("params", Struct(...)),)`, so their size is checked too.
"""
from __future__ import annotations

import dataclasses
import struct as _struct
from dataclasses import dataclass, field

import numpy as np

from kvviz.errors import ShaderCompileError
from kvviz.gpu.shaders import Declared, ShaderSpec

READ = "read"
READ_WRITE = "read_write"

_PACK = {"u32": "I", "i32": "i", "f32": "f"}


def _f32_bits(v) -> int:
    """The float32 bits of v (rounded to nearest; beyond the f32 range: infinity)."""
    with np.errstate(over="ignore"):
        return int(np.array([v], np.float32).view(np.uint32)[0])


@dataclass(frozen=True)
class Binding:
    """One storage buffer of bind group 0: the shader's name for it and its declared access."""

    name: str
    access: str = READ  # READ or READ_WRITE


def ro(*names: str) -> tuple[Binding, ...]:
    return tuple(Binding(n, READ) for n in names)


def rw(*names: str) -> tuple[Binding, ...]:
    return tuple(Binding(n, READ_WRITE) for n in names)


@dataclass(frozen=True)
class Struct:
    """A struct of 32-bit fields that packs itself, little-endian, in declaration order.

    `fields` is "name name:f32 ..." (u32 unless a type is given) or ((name, type), ...). `words`
    pads the packed struct with zero words to that many (a params buffer `array<u32, N>`).
    """

    name: str
    fields: object
    words: int = 0

    def __post_init__(self):
        if isinstance(self.fields, str):
            parsed = []
            for tok in self.fields.split():
                n, _, t = tok.partition(":")
                parsed.append((n, t or "u32"))
            object.__setattr__(self, "fields", tuple(parsed))
        else:
            object.__setattr__(self, "fields", tuple((str(n), str(t)) for n, t in self.fields))
        for n, t in self.fields:
            if t not in _PACK:
                raise ValueError(f"struct {self.name}: field {n} has type {t!r}; expected one of {tuple(_PACK)}")
        if self.words and self.words < len(self.fields):
            raise ValueError(f"struct {self.name}: {len(self.fields)} fields do not fit {self.words} words")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.fields)

    @property
    def size(self) -> int:
        return 4 * max(len(self.fields), self.words)

    def pack(self, *values, **named) -> bytes:
        """Pack the fields, given in order or by name (not both); every field is required."""
        if values and named:
            raise TypeError(f"{self.name}.pack: give the fields in order or by name, not both")
        if named:
            unknown = sorted(set(named) - set(self.names))
            missing = [n for n in self.names if n not in named]
            if unknown or missing:
                raise TypeError(f"{self.name}.pack: unknown fields {unknown}, missing fields {missing}")
            values = tuple(named[n] for n in self.names)
        if len(values) != len(self.fields):
            raise TypeError(f"{self.name}.pack takes {len(self.fields)} fields ({', '.join(self.names)}), got {len(values)}")
        fmt = "<" + "".join("I" if t == "f32" else _PACK[t] for _, t in self.fields)
        vals = [_f32_bits(v) if t == "f32" else int(v) for v, (_, t) in zip(values, self.fields)]
        try:
            data = _struct.pack(fmt, *vals)
        except _struct.error as exc:
            raise ValueError(f"{self.name}.pack{tuple(vals)}: {exc}") from exc
        return data + bytes(self.size - len(data))

    def array(self, *values, **named) -> np.ndarray:
        """The packed struct as u32 words (for a params storage buffer)."""
        return np.frombuffer(self.pack(*values, **named), np.uint32).copy()


@dataclass(frozen=True)
class KernelSpec:
    """A kernel as its family declares it. `defines` are fixed ones; `shader()` adds per-use ones."""

    path: str  # relative to shaders/
    entry: str = "main"
    bindings: tuple[Binding, ...] = ()
    immediates: Struct | None = None
    buffers: tuple[tuple[str, Struct], ...] = ()  # (binding name, struct) of params storage buffers
    defines: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return f"{self.path}:{self.entry}"

    @property
    def immediate_size(self) -> int:
        return self.immediates.size if self.immediates else 0

    def define(self, **defines) -> "KernelSpec":
        """This kernel with more fixed defines (say a method's bit width)."""
        merged = dict(self.defines)
        merged.update({k: str(v) for k, v in defines.items()})
        return dataclasses.replace(self, defines=tuple(sorted(merged.items())))

    def shader(self, frontend: str = "", **defines) -> ShaderSpec:
        merged = dict(self.defines)
        merged.update({k: str(v) for k, v in defines.items()})
        return ShaderSpec(self.path, self.entry, frontend, tuple(sorted(merged.items())))

    def check(self, declared: Declared, where: str) -> None:
        """Raise ShaderCompileError where the shader's declarations differ from this spec."""
        problems = []
        if declared.entries and self.entry not in declared.entries:
            problems.append(f"entry point {self.entry!r} is not among the shader's ({', '.join(declared.entries)})")
        spec_b = {i: (b.name, b.access) for i, b in enumerate(self.bindings)}
        for i in sorted(set(spec_b) | set(declared.bindings)):
            s, d = spec_b.get(i), declared.bindings.get(i)
            if s != d:
                fmt = lambda x: f"{x[0]} ({x[1]})" if x else "nothing"  # noqa: E731
                problems.append(f"binding {i}: the spec says {fmt(s)}, the shader declares {fmt(d)}")
        if tuple(self.immediates.fields if self.immediates else ()) != tuple(declared.immediates or ()):
            fmt = lambda f: "{" + ", ".join(f"{n}: {t}" for n, t in f) + "}" if f else "none"  # noqa: E731
            problems.append(
                f"immediates: the spec says {fmt(self.immediates.fields if self.immediates else ())}, "
                f"the shader declares {fmt(declared.immediates)}"
            )
        names = [b.name for b in self.bindings]
        for bname, st in self.buffers:
            if bname not in names:
                problems.append(f"params struct {st.name} is bound to {bname!r}, which the spec does not bind")
                continue
            n = declared.array_sizes.get(names.index(bname))
            if n is not None and n * 4 != st.size:
                problems.append(f"binding {bname}: the shader declares {n} words, the params struct {st.name} packs {st.size // 4}")
        if problems:
            raise ShaderCompileError(
                f"Kernel spec {self.name} does not match {where}:\n  " + "\n  ".join(problems),
                "Make the spec in the kernel family's launcher (kvviz/families/catalogue.py names it) and the shader's declarations agree.",
            )
