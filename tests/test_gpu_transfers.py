"""Uploads and read-backs of the GPU runtime: both upload paths (the queue's staging for small arrays, the
reused MAP_WRITE staging for large ones) and the gathered read of scattered spans, byte for byte."""
import numpy as np
import pytest

import kvviz.gpu.runtime as gpu_runtime

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("nbytes", [1, 3, 4, 4099, gpu_runtime.SMALL_WRITE, gpu_runtime.SMALL_WRITE + 8])
def test_write_then_read_is_the_same_bytes(rt, nbytes):
    rng = np.random.default_rng(nbytes)
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    buf = rt.empty(nbytes + 64, "transfer-test")
    rt.write(buf, np.full(nbytes + 64, 0xAB, np.uint8))
    rt.write(buf, data, offset=32)
    back = rt.read(buf, np.uint8)
    assert np.array_equal(back[32 : 32 + nbytes], data)
    assert (back[:32] == 0xAB).all()
    # an unaligned size is padded with zeros up to the next word, never past it
    end = 32 + nbytes + (-nbytes) % 4
    assert (back[32 + nbytes : end] == 0).all() and (back[end : nbytes + 64] == 0xAB).all()


@pytest.mark.parametrize("chunk", [None, 64])
def test_read_spans_gathers_in_order(rt, monkeypatch, chunk):
    if chunk is not None:  # a staging buffer smaller than the spans: groups and a span read in parts
        monkeypatch.setattr(gpu_runtime, "STAGING_CHUNK", chunk)
    words = (np.arange(4096, dtype=np.uint64) * 2654435761 % (2**32)).astype(np.uint32)
    buf = rt.upload(words, "spans-test")
    spans = [(400, 40), (0, 8), (4000, 200), (1024, 0), (12000, 4), (16, 16)]
    got = rt.read_spans(buf, spans, np.uint32)
    raw = words.view(np.uint8)
    want = np.concatenate([raw[o : o + n] for o, n in spans]).view(np.uint32)
    assert np.array_equal(got, want)
    assert rt.read_spans(buf, [], np.uint32).size == 0


@pytest.mark.parametrize("chunk", [None, 64])
def test_read_gather_reads_several_buffers_each_in_its_order(rt, monkeypatch, chunk):
    """Spans of three buffers (one read whole, one with no span, one scattered) come back one array a buffer, in
    each buffer's span order and dtype, whether they share one staging map or are split over many."""
    if chunk is not None:
        monkeypatch.setattr(gpu_runtime, "STAGING_CHUNK", chunk)
    a = np.arange(300, dtype=np.float32) * 0.5 - 7.0
    b = (np.arange(1000, dtype=np.uint64) * 40503 % (2**32)).astype(np.uint32)
    ba, bb, bc = rt.upload(a, "gather-a"), rt.upload(b, "gather-b"), rt.upload(b[::-1].copy(), "gather-c")
    spans_b = [(800, 12), (0, 4), (3996, 4), (400, 400)]
    got_a, got_empty, got_b = rt.read_gather([(ba, [(0, a.nbytes)], np.float32), (bc, [], np.uint32),
                                              (bb, spans_b, np.uint32)])
    assert np.array_equal(got_a, a)
    assert got_empty.size == 0 and got_empty.dtype == np.uint32
    raw = b.view(np.uint8)
    assert np.array_equal(got_b, np.concatenate([raw[o:o + n] for o, n in spans_b]).view(np.uint32))


def test_read_spans_refuses_unaligned_spans(rt):
    buf = rt.empty(64, "spans-test")
    with pytest.raises(ValueError, match="4-byte aligned"):
        rt.read_spans(buf, [(2, 8)])


def test_submitted_passes_run_in_order_before_a_read(rt):
    """Passes submitted without waiting (GpuRuntime.submit) run in the queue's order, and a read after them sees
    what the last one wrote: each pass here doubles the word and adds its own number, so any other order or a
    pass left out gives another value."""
    from kvviz.gpu.runtime import STORAGE_RW
    from kvviz.gpu.shaders import ShaderSpec

    src = """
struct P { add: u32 }
var<immediate> p: P;
@group(0) @binding(0) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(1)
fn main() { o[0] = o[0] * 2u + p.add; }
"""
    kern = rt.kernel(ShaderSpec("tests/submit_order_probe.wgsl"), [STORAGE_RW], 4, _source=src)
    buf = rt.upload(np.zeros(1, np.uint32), "submit-order")
    want = 0
    for i in range(1, 9):
        rt.submit([kern.dispatch((1, 1, 1), [buf], imm=np.uint32(i).tobytes())])
        want = want * 2 + i
    assert int(rt.read(buf, np.uint32)[0]) == want


def test_bind_groups_are_reused_and_dropped_with_their_buffers(rt):
    """A dispatch of a kernel over the same buffers reuses its bind group; a new buffer (even one at a dropped
    buffer's id) gets its own, and dropping a buffer drops the bind groups over it (they would hold its memory)."""
    import gc

    from kvviz.gpu.copy import COPY_VEC4

    kern = rt.compile(COPY_VEC4)
    src = rt.upload(np.arange(64, dtype=np.uint32), "bind-group-src")

    def copy_into(dst):
        d = kern.dispatch((1, 1, 1), [src, dst], n_vec4=16, stride=256)
        rt.run([d])
        return rt._bind_group(d)

    dst = rt.empty(256, "bind-group-dst")
    first = copy_into(dst)
    assert copy_into(dst) is first and np.array_equal(rt.read(dst, np.uint32), np.arange(64))
    held = len(rt._groups)
    for i in range(20):  # new buffers, some at the ids of dropped ones: each copy lands in its own buffer
        del dst
        gc.collect()
        dst = rt.empty(256, "bind-group-dst")
        rt.write(dst, np.zeros(64, np.uint32))
        copy_into(dst)
        assert np.array_equal(rt.read(dst, np.uint32), np.arange(64))
    rt._bind_group(kern.dispatch((1, 1, 1), [src, dst], n_vec4=16, stride=256))  # purges the dropped buffers' groups
    assert len(rt._groups) <= held


@pytest.mark.parametrize("rows,ld,offset,width", [(1, 1, 0, 1), (1, 9, 4, 5), (5, 7, 0, 7), (37, 13, 6, 1),
                                                  (37, 13, 0, 5), (45, 384, 256, 64), (3, 130, 1, 129)])
@pytest.mark.parametrize("grid", [None, 7])
def test_gather_rows_is_the_slice(rt, monkeypatch, rows, ld, offset, width, grid):
    """gather_dispatch moves src[:, offset:offset + width] of a [rows, ld] matrix into a buffer of its own, word for
    word (NaN payloads and signed zeros included: it moves 32-bit words, not floats); with a grid limit of 7 the rows
    lie on a 2-D grid."""
    from kvviz.gpu.copy import gather_dispatch

    if grid is not None:
        monkeypatch.setitem(rt.limits, "max-compute-workgroups-per-dimension", grid)
    rng = np.random.default_rng(rows * 1000 + ld)
    words = rng.integers(0, 2**32, (rows, ld), dtype=np.uint64).astype(np.uint32)
    words[0, 0] = 0x7FC00001  # a NaN with a payload
    src = rt.upload(words, "gather-src")
    dst = rt.empty(rows * width * 4 + 8, "gather-dst")
    rt.write(dst, np.full(rows * width + 2, 0xDEADBEEF, np.uint32))
    rt.run([gather_dispatch(rt, src, dst, rows, width, ld, offset)])
    back = rt.read(dst, np.uint32)
    assert np.array_equal(back[:rows * width].reshape(rows, width), words[:, offset:offset + width])
    assert (back[rows * width:rows * width + 2] == 0xDEADBEEF).all()


def test_gather_rows_refuses_columns_outside_the_rows(rt):
    from kvviz.gpu.copy import gather_dispatch

    buf = rt.empty(64, "gather-bad")
    with pytest.raises(ValueError):
        gather_dispatch(rt, buf, buf, 2, 5, 8, 4)
