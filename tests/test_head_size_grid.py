"""The head sizes of vLLM's attention tests (64, 80, 96, 112, 120, 128, 192, 256) x every registered method, through
the report's core (kvviz.analysis.session.Session.compute: what `kvviz report --set head_size=D --set method=M` runs,
timings included), on the GPU (lavapipe in CI).

Each cell is either within its method's oracle (kvviz.families.registry.reference: the method's output against its
numpy reference over the same quantiser, at the tolerance the reference states) or a refusal of the documented kind:
UnsupportedShape naming the rule and the nearest head sizes that work (the llama.cpp types' also what llama.cpp does
with such a model). Small contexts (a ragged pair, 37 and 9 tokens) keep it quick; one Session a worker reuses its
kernels across head sizes. Run with -s to print the grid and its time (docs/benchmarks.md keeps them):
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


@pytest.fixture(scope="module")
def session(rt):
    return Session(rt)


def run_cell(session: Session, method_id: str, D: int) -> str:
    cfg = SessionConfig(method=method_id, head_size=D, context_lens=CONTEXT, num_heads=8, num_kv_heads=2,
                        timing_runs=1)
    try:
        res = session.compute(cfg)
    except UnsupportedShape as exc:
        text = exc.describe()
        assert f"head_size {D}" in text and "nearest head size" in text, text  # the rule and the sizes that work
        if method_id in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4"):
            assert "llama.cpp itself refuses" in text, text
        return "refused: " + str(exc).split(":", 1)[-1].split(";")[0].strip()
    ref, tol = reference(method_id)(res.method, res.batch, res.key, res.value, res.q, res.scale)
    assert res.out_q.shape == (len(CONTEXT), 8, D) and np.isfinite(res.out_q).all()
    err = np.abs(res.out_q.astype(np.float64) - ref)
    assert (err <= tol).all(), f"{method_id} at head size {D}: max error {err.max():.3g} over its tolerance"
    return "ok"


@pytest.mark.parametrize("method_id", sorted(registry()))
def test_every_vllm_head_size(session, method_id):
    cells = []
    for D in VLLM_HEAD_SIZES:
        t = time.perf_counter()
        cells.append((D, run_cell(session, method_id, D), time.perf_counter() - t))
    print(f"\n{method_id}: " + "; ".join(f"{D} {what} ({s:.1f} s)" for D, what, s in cells)
          + f"; {sum(s for *_, s in cells):.1f} s in all")
