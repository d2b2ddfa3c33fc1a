"""Errors the user can act on. Each carries a `hint` that says what to do about it.

The window and the CLI show `str(err)` and `err.hint`; nothing here is Qt-specific.
"""
from __future__ import annotations

import contextlib

import numpy as np


class KvvizError(Exception):
    """Base class: a problem the user can understand and fix."""

    hint: str = ""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        if hint:
            self.hint = hint

    def describe(self) -> str:
        return f"{self}\n{self.hint}" if self.hint else str(self)

    def one_line(self) -> str:
        """Message and hint on one line (what the CLI prints for bad input before exiting 2)."""
        msg = " ".join(str(self).split())
        hint = " ".join(self.hint.split())
        if not hint or hint in msg:
            return msg
        return f"{msg.rstrip('.')}. {hint}" if msg else hint


class InvalidInput(KvvizError):
    """Shapes, dtypes or values a kernel cannot take (checked on the host, before any dispatch)."""

    hint = "Check the shapes and values of the input; nothing was dispatched."


class UnsupportedShape(InvalidInput):
    """A head size, block size or head ratio the kernel was not written for."""


class DeviceLimitError(KvvizError):
    """A tensor larger than the adapter allows (buffer size, binding size, grid size)."""

    hint = "Use fewer tokens, sequences or blocks, or a GPU with larger limits."


class ShaderCompileError(KvvizError):
    """The shader did not compile or the pipeline did not validate."""

    hint = "The shader source or its front end is broken; the compiler log is above."


class DeviceLostError(KvvizError):
    """The GPU device was lost (driver reset, out of memory, timeout)."""

    hint = "Restart the computation; kvviz will request a new device."


class NonFiniteResult(KvvizError):
    """A kernel or a metric produced NaN/Inf from finite inputs (an f32 overflow or an invalid operation):
    the run is invalid and none of its numbers are shown."""

    hint = ("The inputs were finite but an intermediate float32 result was not, so every number of this run "
            "would be meaningless; nothing is shown. Scale the inputs down (check the dump's units) or pick "
            "another method.")


class Cancelled(KvvizError):
    """The user cancelled a long computation; what was there before is kept."""

    hint = "Nothing was changed; run again when ready."

    def __init__(self, message: str = "Cancelled.", hint: str = ""):
        super().__init__(message, hint)


class GpuUnavailable(KvvizError):
    """No wgpu adapter could be found."""

    hint = "Install a Vulkan driver (on Debian: apt-get install mesa-vulkan-drivers libvulkan1)."


_known_finite: list = []  # (start, end) address ranges checked finite by `validated_once`


@contextlib.contextmanager
def validated_once(**arrays):
    """Check each named float array for NaN/Inf once; within the block, `check_finite` of that memory (or
    a view into it) is free, so a computation's kernels do not re-scan the same K and V."""
    ranges = []
    for name, arr in arrays.items():
        a = np.asarray(arr)
        check_finite(name, a)
        if a.flags.c_contiguous and a.nbytes:
            start = a.__array_interface__["data"][0]
            ranges.append((start, start + a.nbytes))
    _known_finite.extend(ranges)
    try:
        yield
    finally:
        for r in ranges:
            _known_finite.remove(r)


def _checked_already(a) -> bool:
    if not _known_finite or not a.nbytes:
        return False
    start = a.__array_interface__["data"][0]
    return any(lo <= start and start + a.nbytes <= hi for lo, hi in _known_finite)


def check_finite(name: str, arr) -> None:
    """Reject NaN/Inf before dispatch: the kernels would silently propagate them."""
    a = np.asarray(arr)
    if a.dtype.kind == "f" and not _checked_already(a) and not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))[0]
        raise InvalidInput(
            f"{name} contains NaN or Inf (first at index {tuple(int(i) for i in bad)})",
            "Replace non-finite values before quantising: a NaN poisons the whole token's scale.",
        )


def require_f32(name: str, a, shape_desc: str, ndim: int):
    """A float32, finite, C-contiguous array of rank `ndim`, or InvalidInput saying what is expected."""
    arr = np.asarray(a)
    if arr.dtype != np.float32:
        raise InvalidInput(f"{name} must be float32, got {arr.dtype}", f"Convert with .astype(np.float32); expected {shape_desc}.")
    if arr.ndim != ndim:
        raise InvalidInput(f"{name} must be {shape_desc}, got shape {arr.shape}")
    check_finite(name, arr)
    return np.ascontiguousarray(arr)
