"""Which forward runs a model: the GPU forward (kvviz/forward/model.py) or the numpy one (kvviz/sources/llama_numpy.py,
the reference and the fallback).

  gpu    the GPU forward, or the reason it cannot run here as an error (one line: no adapter, a head size or a
         layer the kernels do not take, a tensor past the adapter's limits)
  numpy  the numpy forward
  auto   the GPU forward on a hardware adapter when the model fits its limits, else numpy, saying why. On a software
         rasteriser (lavapipe, llvmpipe: the CPU itself) numpy: the same cores run the numpy forward faster
         (docs/benchmarks.md, "The forward on the GPU").
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from kvviz.errors import DeviceLimitError, GpuUnavailable, InvalidInput, UnsupportedShape
from kvviz.forward.model import DEFAULT_CHUNK, GpuRunner, check_plan
from kvviz.forward.plan import plan_of
from kvviz.sources.llama_numpy import LlamaRunner

log = logging.getLogger("kvviz.forward")

FORWARDS = ("auto", "gpu", "numpy")


@dataclass(frozen=True)
class ForwardChoice:
    path: str  # "gpu" or "numpy"
    reason: str  # one line: why this path

    def line(self) -> str:
        return f"forward: {self.path} ({self.reason})"


def check_forward(forward: str) -> str:
    if forward not in FORWARDS:
        raise InvalidInput(f"--forward {forward!r}; choose one of {', '.join(FORWARDS)}")
    return forward


def check_fits(model, rt) -> None:
    """UnsupportedShape / DeviceLimitError where the GPU forward cannot hold or run `model` on `rt` (before any
    upload): the kernels' shapes, one weight row or one token's activations past a storage binding."""
    p = plan_of(model)
    check_plan(p, rt)
    limit = rt.max_binding
    widest = max(p.qkv_width, 2 * p.ffn, p.hidden, p.n_heads * p.head_size)
    if 4 * widest > limit:
        raise DeviceLimitError(f"one token's activations ({widest} floats) pass {rt.summary.name}'s storage-binding "
                               f"limit of {limit / 2**20:.1f} MiB")
    cols = max(p.hidden, p.n_heads * p.head_size, p.ffn)
    if 4 * cols > limit:
        raise DeviceLimitError(f"a weight row of {cols} floats passes {rt.summary.name}'s storage-binding limit")
    kv_row = 4 * p.n_kv_heads * p.head_size
    if kv_row * min(p.context_length, DEFAULT_CHUNK) > limit:
        raise DeviceLimitError(f"a KV cache of {min(p.context_length, DEFAULT_CHUNK)} positions passes "
                               f"{rt.summary.name}'s storage-binding limit")


def choose(model, rt, forward: str = "auto") -> ForwardChoice:
    """The path for `model` on runtime `rt` (None: no adapter). forward="gpu" raises where the GPU forward
    cannot run; "auto" falls back to numpy with the reason."""
    check_forward(forward)
    if forward == "numpy":
        return ForwardChoice("numpy", "asked for")
    if forward == "gpu":
        if rt is None:
            raise GpuUnavailable("--forward gpu: no wgpu adapter", "Use --forward numpy or auto.")
        check_fits(model, rt)
        return ForwardChoice("gpu", f"asked for, on {rt.summary.name}")
    if rt is None:
        return ForwardChoice("numpy", "no GPU adapter")
    if rt.summary.is_software:
        return ForwardChoice("numpy", "the adapter is a software rasteriser: numpy is faster on the same cores")
    try:
        check_fits(model, rt)
    except (UnsupportedShape, DeviceLimitError) as exc:
        return ForwardChoice("numpy", f"the GPU forward cannot run it here: {exc.one_line()}")
    return ForwardChoice("gpu", rt.summary.name)


def make_runner(model, rt=None, *, forward: str = "auto", record: bool = False):
    """(runner, ForwardChoice): a GpuRunner or a LlamaRunner for `model`, by `choose`."""
    choice = choose(model, rt, forward)
    log.info("%s", choice.line())
    if choice.path == "gpu":
        return GpuRunner(model, rt, record=record), choice
    return LlamaRunner(model, record=record), choice
