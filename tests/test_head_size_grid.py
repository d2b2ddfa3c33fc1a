"""The head sizes of vLLM's attention tests (64, 80, 96, 112, 120, 128, 192, 256) through the report's core
(kvviz.analysis.session.Session.compute: what `kvviz report --set head_size=D --set method=M` runs, timings included),
on the GPU (lavapipe in CI).

Each cell is either within its method's oracle (kvviz.families.registry.reference: the method's output against its
numpy reference over the same quantiser, at the tolerance the reference states) or a refusal of the documented kind:
UnsupportedShape naming the rule and the nearest head sizes that work (the llama.cpp types' also what llama.cpp does
with such a model). Small contexts (a ragged pair, 37 and 9 tokens) keep it quick; one Session a worker reuses its
kernels across head sizes.

Which cells: int4_group, whose group size follows the head size (groups of 32, or the largest multiple of 8 dividing
the head), at all eight; every other method at 120 (not a multiple of 32 nor of 16: refused by the llama.cpp types and
NVFP4, padded by KIVI and TurboQuant) and 256 (the largest); the methods that refuse some sizes also at 96 (a multiple
of 32 that is not a power of two, which they take), NVFP4 also at 80 (a multiple of 16, not of 32). The kernels
themselves meet every one of the eight sizes in tests/test_conformance.py (test_vllm_head_sizes). Run with -s to print
the cells and their time; FULL_GRID below gives the whole grid of docs/benchmarks.md:
    python -m pytest -s -p no:cacheprovider -n 0 tests/test_head_size_grid.py
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from kvviz.analysis.session import Session, SessionConfig
from kvviz.errors import UnsupportedShape
from kvviz.families.registry import reference, registry

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

VLLM_HEAD_SIZES = (64, 80, 96, 112, 120, 128, 192, 256)
CONTEXT = (37, 9)
EVERY_SIZE = ("int4_group",)  # the method whose layout follows the head size at every one of them
RULE_SIZES = (120, 256)  # where the methods' rules give different answers (see the module's docstring)
GGML = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4")
EXTRA = {**{t: (96,) for t in GGML}, "nvfp4": (80, 96)}  # beside 120, which they refuse: sizes they take
FULL_GRID = False  # True: every method at every size (the table in docs/benchmarks.md)


def head_sizes(method_id: str) -> tuple[int, ...]:
    if FULL_GRID or method_id in EVERY_SIZE:
        return VLLM_HEAD_SIZES
    return tuple(sorted(RULE_SIZES + EXTRA.get(method_id, ())))


def run_cell(session: Session, method_id: str, D: int) -> str:
    cfg = SessionConfig(method=method_id, head_size=D, context_lens=CONTEXT, num_heads=8, num_kv_heads=2,
                        timing_runs=1)
    try:
        res = session.compute(cfg)
    except UnsupportedShape as exc:
        text = exc.describe()
        assert f"head_size {D}" in text and "nearest head size" in text, text  # the rule and the sizes that work
        if method_id in GGML:
            assert "llama.cpp itself refuses" in text, text
        return "refused: " + str(exc).split(":", 1)[-1].split(";")[0].strip()
    ref, tol = reference(method_id)(res.method, res.batch, res.key, res.value, res.q, res.scale)
    assert res.out_q.shape == (len(CONTEXT), 8, D) and np.isfinite(res.out_q).all()
    err = np.abs(res.out_q.astype(np.float64) - ref)
    assert (err <= tol).all(), f"{method_id} at head size {D}: max error {err.max():.3g} over its tolerance"
    return "ok"


@pytest.mark.parametrize("method_id", sorted(registry()))
def test_vllm_head_sizes(session, method_id):
    cells = []
    for D in head_sizes(method_id):
        t = time.perf_counter()
        cells.append((D, run_cell(session, method_id, D), time.perf_counter() - t))
    print(f"\n{method_id}: " + "; ".join(f"{D} {what} ({s:.1f} s)" for D, what, s in cells)
          + f"; {sum(s for *_, s in cells):.1f} s in all")
