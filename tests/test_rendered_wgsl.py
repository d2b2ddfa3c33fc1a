"""The fast decodes' generated WGSL is the code whose hashes tests/data/rendered_wgsl_sha256.json records.

What it guards: the five split-K decodes (kvviz/attention/split_decode.py and the ggml, KIVI, TurboQuant and NVFP4
families' decode.py) render their unrolled code from Jinja2 templates (shaders/**/*.wgsl.j2: the split kernels'
skeleton and shared macros, the formats' load / dequantise code). A change to a template, to the shared macros or
to what a render() picks that alters the WGSL a kernel compiles, and so its arithmetic or its speed, fails here for
the cases it touches: 87 shapes and variants spanning the five renderers (every cache format and ggml type, both
KIVI bit widths with and without whole code words a lane, TurboQuant's per-sequence and paged layouts, NVFP4's lane
splits; scatter and all-lane softmax, prefetch and bt_ahead, constant and immediate block sizes, lazy rescale, the
2^23 and f16-pair code conversions, the int8 query, f16 P.V with several flush periods, one to 32 lanes a row,
odd head sizes and GQA groups), recorded from the f-string generators the templates replaced; then the lanes that
walk a head with padding (unrolled) and the looped code (TurboQuant's paged records included, a GQA group in chunks).

The compared text is the shader as the front end sees it (includes resolved, defines applied, loops unrolled),
normalised: whitespace collapsed, blank lines and comment-only lines dropped, so comments and layout may change
but code may not. A deliberate change to the generated code re-records the hashes of the same cases:
    python tests/test_rendered_wgsl.py --record
Runs without a GPU.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from kvviz.attention import split_decode as fd
from kvviz.families.fp4 import decode as f4d
from kvviz.families.ggml import decode as fgd
from kvviz.families.ggml import format as fg
from kvviz.families.kivi import decode as fkd
from kvviz.families.turboquant import decode as fqd

FIXTURE = Path(__file__).parent / "data" / "rendered_wgsl_sha256.json"


def normalise(src: str) -> str:
    """Lines with their whitespace collapsed; blank and comment-only lines dropped."""
    lines = (" ".join(line.split()) for line in src.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("//"))


def cache_format(name: str) -> fd.CacheFormat:
    """"f32", "f16", "int8", "fp8_e4m3_token" / "fp8_e5m2_tensor" ..., "int4_g32" ..."""
    if name.startswith("fp8_"):
        _, kind, scale = name.split("_")
        return fd.fp8_format(kind, scale == "tensor")
    if name.startswith("int4_g"):
        return fd.int4_format(int(name[len("int4_g"):]))
    return {"f32": fd.F32, "f16": fd.F16, "int8": fd.INT8}[name]


def rendered(p: dict) -> str:
    """The shader of case `p` as the front end sees it. p["r"]: which render(); p["lay"]: (lanes, row groups,
    unroll, dims a lane, and chunks of the GQA group for the looped code); p["looped"]: the looped code."""
    lay = fd.Layout(*p["lay"])
    looped = p.get("looped", False)
    if p["r"] == "split":
        spec, defines = fd.SPLIT, fd.render(cache_format(p["fmt"]), p["D"], p["G"], lay, p["qk"], p["pv"], p["flush"],
                                            p["bs"], p["prefetch"], p["lazy"], p["magic"], p["scatter"], looped)
    elif p["r"] == "ggml":
        spec, defines = fgd.SPLIT, fgd.render(fg.TYPES[p["type"]], p["D"], p["G"], lay, p["bs"], p["prefetch"], p["scatter"],
                                              looped)
    elif p["r"] == "kivi":
        spec, defines = fkd.SPLIT, fkd.render(p["bits"], p["D"], p["G"], lay, p["tg"], p["bs"], p["prefetch"], p["scatter"],
                                              looped)
    elif p["r"] == "tq":
        spec = fqd.PAGED_SPLIT if p["paged"] else fqd.SPLIT
        defines = fqd.render(p["D"], p["G"], lay, p["paged"], p["bs"], p["prefetch"], p["scatter"], looped)
    elif p["r"] == "fp4":
        spec, defines = f4d.SPLIT, f4d.render(p["D"], p["G"], lay, p["bs"], p["prefetch"], p["scatter"], looped)
    else:
        raise ValueError(p["r"])
    return spec.shader(**defines).rendered()


def digest(p: dict, monkeypatch) -> str:
    # the magic int8 conversion's route is a module switch (tools/fast_decode_tune.py --i8-f16)
    monkeypatch.setattr(fd, "I8X4_VIA_F16", p.get("via_f16", True))
    return hashlib.sha256(normalise(rendered(p)).encode()).hexdigest()


CASES = json.loads(FIXTURE.read_text())["cases"]


def _id(p: dict) -> str:
    what = {"split": p.get("fmt"), "ggml": p.get("type"), "kivi": f"{p.get('bits')}bit",
            "tq": "paged" if p.get("paged") else "per-seq", "fp4": "nvfp4"}[p["r"]]
    return f"{p['r']}-{what}-D{p['D']}-G{p['G']}-L{p['lay'][0]}-U{p['lay'][2]}" + ("-looped" if p.get("looped") else "")


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{_id(c['params'])}" for i, c in enumerate(CASES)])
def test_generated_wgsl_is_unchanged(case, monkeypatch):
    """The normalised shader of each recorded case hashes to its recorded sha256."""
    assert digest(case["params"], monkeypatch) == case["sha256"], (
        f"the WGSL rendered for {case['params']} changed; if the change is meant, re-record with "
        "`python tests/test_rendered_wgsl.py --record`")


def test_the_cases_span_every_renderer():
    assert {c["params"]["r"] for c in CASES} == {"split", "ggml", "kivi", "tq", "fp4"}


def _record() -> None:
    """Re-record the hashes of the fixture's cases from the current templates."""
    data = json.loads(FIXTURE.read_text())
    with pytest.MonkeyPatch.context() as mp:
        for c in data["cases"]:
            c["sha256"] = digest(c["params"], mp)
    write_fixture(data)


def write_fixture(data: dict) -> None:
    """The fixture with one case a line (reviewable diffs)."""
    head = {k: v for k, v in data.items() if k != "cases"}
    lines = [json.dumps(c, sort_keys=True) for c in data["cases"]]
    body = json.dumps(head, indent=1)[:-2] + ',\n "cases": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"
    FIXTURE.write_text(body)


if __name__ == "__main__":
    if sys.argv[1:] == ["--record"]:
        _record()
    else:
        sys.exit(pytest.main([__file__, "-q"]))
