"""Kernel lab slots beyond those of tests/test_lab.py: the fast decode over every cache format it
reads (f16, the int8 seed layout, FP8 E4M3 / E5M2 with per-token scales, int4 per group), the f16 method's
kernels, the vLLM FP8 writers and dequantisers, the seed layout's fast writer, the llama.cpp types' fast writers.

`kvviz kernel new` output passing its own slot's check is tests/test_lab.py::test_kernel_new_passes_its_slot,
parametrised over every slot (these included). Here: their contracts, and deliberately wrong kernels failing
the oracle check with the right count of bad elements, in the right place.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvviz.bench import BenchShape, make_inputs
from kvviz.cli import main
from kvviz.families.ggml import format as fg
from kvviz.attention import writers as fw
from kvviz.lab import check
from kvviz.lab.slots import slot, slots
from kvviz.families.ggml import oracle as og
from kvviz.paging import PAD_SLOT

pytestmark = pytest.mark.gpu

SHAPE = BenchShape("lab-test", (37, 20), 4, 2, 64, 16, "scattered")
DECODES = {"fast.decode_f32": (None, "f32"), "fast.decode_f16": ("f16", "f16"), "fast.decode_int8": ("int8_seed", "int8"),
           "fast.decode_fp8_e4m3": ("fp8_e4m3", "fp8_e4m3"), "fast.decode_fp8_e5m2": ("fp8_e5m2", "fp8_e5m2"),
           "fast.decode_int4": ("int4_group", "int4")}


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(SHAPE)


def wrong_run(ctx, inputs, tmp_path, sid: str, needle: str, replacement: str):
    """The slot's starting source with `needle` (which must be in it) replaced, run through the lab's check:
    (the check, real tokens, KV heads, head size)."""
    src = slot(sid).starting_source()
    assert needle in src
    path = tmp_path / "wrong.wgsl"
    path.write_text(src.replace(needle, replacement))
    batch, key, value, q = inputs
    real = int(np.count_nonzero(np.asarray(batch.slot_mapping) != PAD_SLOT))
    c = check.lab_run(ctx, sid, inputs, path=str(path), runs=1, warmup=0, info=False).check
    print(c.summary())
    return c, real, key.shape[1], key.shape[2]


def test_fast_decode_slots_cover_every_format():
    """One slot per cache format the fast decode reads, each over its method's cache, the template slot's
    contract with the method's CacheLayout for kc / vc and the conformance tests' tolerance."""
    from kvviz.attention import split_decode as fd
    from kvviz.families.registry import get_method

    s = slots()
    assert {k for k, v in s.items() if v.spec.path == fd.SPLIT.path} == set(DECODES)
    for sid, (mid, fmt) in DECODES.items():
        sl = s[sid]
        assert (sl.method, sl.fmt, sl.case, sl.role, sl.impl, sl.template) == (mid, fmt, "fast-decode", "decode", "fast", True)
        assert "2e-5 * max(1, max|V|)" in sl.tolerance and "kvviz.attention.paged_oracle.decode" in sl.oracle
        if mid:
            assert get_method(mid).fast_cache_format(64).name == fmt
            assert all("Words:" in b.layout for b in sl.buffers if b.name in ("kc", "vc")), sid
            assert get_method(mid).REFERENCE.replace(":", ".") in sl.oracle, sid  # the method's own oracle
    # the slot's method's other decode is timed beside a user's fast decode (the seed decode for int8)
    from kvviz.lab.slots import siblings

    assert [x.id for x in siblings("fast.decode_int8")] == ["int8_seed.decode"]
    assert "fast.decode_int8" in [x.id for x in siblings("int8_seed.decode")]
    # f16 has one writer, the fast one: a writer_fast slot and no first-wave slot
    assert "f16.writer" not in s and s["f16.writer_fast"].impl == "fast" and s["f16.dequantise"].method == "f16"
    # vLLM FP8: the side buffers are in the contract
    w = s["vllm_fp8_e4m3.writer"]
    assert [b.name for b in w.buffers][-2:] == ["scales", "sat"] and all(b.layout for b in w.buffers)
    assert "exact (0)" in w.tolerance and "vllm_quantize" in w.oracle


def test_kernel_new_writes_the_template(tmp_path):
    """A fast decode slot's starting file is the template, its placeholders kept (filled per format)."""
    path = tmp_path / "d.wgsl"
    assert main(["kernel", "new", "fast.decode_int8", str(path)]) == 0
    text = path.read_text()
    assert "{{WRITE}}" in text and "{{STEP}}" in text and "slot fast.decode_int8" in text


def _plus_one_on_sequence_0(src: str, G: int) -> str:
    """The split kernel with every output element of sequence 0 made one higher: each partition's
    accumulator gets its softmax sum l added, so the reduce's out = sum acc / sum l grows by exactly 1."""
    at = src.index("{{WRITE}}") + len("{{WRITE}}")
    adds = "\n".join(f"        partials[pb{g} + 2u + lane * DPL + d] = partials[pb{g} + 2u + lane * DPL + d] + l{g};"
                     for g in range(G))
    wrong = ("\n    if (seq == 0u) {  // deliberately wrong\n      for (var d = 0u; d < DPL; d = d + 1u) {\n"
             + adds + "\n      }\n    }")
    return src[:at] + wrong + src[at:]


@pytest.mark.parametrize("sid", sorted(DECODES))
def test_wrong_fast_decode_fails_with_the_right_count(ctx, inputs, tmp_path, sid):
    """Every output element of sequence 0 one too high: exactly num_heads x head_size elements are outside
    the tolerance, all in sequence 0's rows; the kernel was compiled for the slot's cache format."""
    batch, key, value, q = inputs
    S, H, D = q.shape
    G = H // key.shape[1]
    s = slot(sid)
    path = tmp_path / "wrong.wgsl"
    path.write_text(_plus_one_on_sequence_0(s.starting_source(), G))
    run = check.lab_run(ctx, sid, inputs, path=str(path), runs=1, warmup=0)
    c = run.check
    print(c.summary())
    assert not c.ok
    assert c.bad == H * D and c.total == S * H * D
    assert all(row < H for row, _ in c.where)  # rows are (sequence, head): sequence 0's are 0..H-1
    assert 0.99 < c.max_err < 1.01
    assert c.heat.sum() == c.bad
    assert f"// Format: {s.fmt}" in run.info.driver_code  # the user's template, filled for this format


def test_wrong_f16_writer_fails_with_the_right_count(ctx, inputs, tmp_path):
    """The f16 writer with the lowest mantissa bit of every K element 4i flipped: exactly real tokens x KV
    heads x head_size / 4 elements are off (the exact tolerance), all K, all channels 4i."""
    c, real, kvh, D = wrong_run(ctx, inputs, tmp_path, "f16.writer_fast", "k_cache[dst] = pack4(key_in[item]);",
                                "k_cache[dst] = pack4(key_in[item]) ^ vec2<u32>(1u, 0u);")
    assert not c.ok and not c.untouched
    assert c.bad == real * kvh * D // 4 and c.total == 2 * real * kvh * D
    assert all(col < kvh * D and col % 4 == 0 for _, col in c.where)  # K, element 4i of a head vector


def test_wrong_vllm_writer_fails(ctx, inputs, tmp_path):
    """The vLLM FP8 writer reading the K scale for V too: V's codes are off wherever the V scale differs
    (calibrated separately), so V elements fail and K ones do not."""
    s = slot("vllm_fp8_e4m3.writer")
    src = s.starting_source()
    needle = "let scale = bitcast<f32>(scales[which * p.kvh + g]);"
    assert needle in src
    path = tmp_path / "wrong.wgsl"
    path.write_text(src.replace(needle, "let scale = bitcast<f32>(scales[g]);"))
    batch, key, value, q = inputs
    kvh, D = key.shape[1], key.shape[2]
    c = check.lab_run(ctx, s.id, inputs, path=str(path), runs=1, warmup=0, info=False).check
    print(c.summary())
    assert not c.ok and c.bad > 0
    assert all(col >= kvh * D for _, col in c.where)  # V's columns only
    assert c.heat.shape[1] % 2 == 0 and c.heat[:, : c.heat.shape[1] // 2].sum() == 0  # no K element anywhere



def test_wrong_ggml_fast_writer_fails_with_the_right_count(ctx, inputs, tmp_path):
    """The q8_0 fast writer without the word two blocks share (a lane a block, where subgroups allow): block 1's
    d (bytes 34-35, in word 8) is never stored, so every element of block 1 of every head vector is off, K and V,
    and nothing else; without the exchange (no subgroups of 2) the template writes whole words and passes."""
    s = slot("q8_0.writer_fast")
    assert s.role == "writer" and s.impl == "fast" and s.method == "q8_0"
    c, real, kvh, D = wrong_run(ctx, inputs, tmp_path, s.id, "if (take && i + 1u == cnt) { ob[i] = ob[i] | nf; }",
                                "")
    batch, key, value, q = inputs
    if not (fw.subgroups_available(ctx.rt) and fw.smallest_subgroup(ctx.rt) >= 2):
        assert c.ok
        return
    assert not c.ok and not c.untouched
    # off: every element of block 1 (D = 64: blocks 0 and 1) whose true value is not 0 (d = 0 gives 0 there)
    rows = np.asarray(batch.slot_mapping) != PAD_SLOT
    t = fg.TYPES["q8_0"]
    want = sum(int(np.count_nonzero(og.dequantize(og.quantize(x[rows], t), D, t)[..., 32:])) for x in (key, value))
    assert c.bad == want and want > real * kvh * 30 and c.total == 2 * real * kvh * D
    assert all(col % D >= 32 for _, col in c.where)  # block 1 of a head vector, K or V


# ------------------------------------------------------------------------------ KIVI
KIVI = ("kivi.writer_tokens", "kivi.writer_key_groups", "kivi.writer_tokens_fast", "kivi.writer_key_groups_fast",
        "kivi.dequantise")


def test_kivi_slots():
    """KIVI's writer kernels (token and key-group, first-wave and fast) and its dequantiser are slots, run with
    recent 0 so both writer kernels have work at short contexts; a token kernel is timed beside token kernels."""
    from kvviz.lab.slots import KIVI_OPTIONS, siblings

    s = slots()
    for sid in KIVI:
        assert s[sid].method == "kivi" and s[sid].options == KIVI_OPTIONS, sid
        assert "kvviz.families.kivi.oracle dequantize_cache" in s[sid].oracle
    assert [x.id for x in siblings("kivi.writer_tokens")] == ["kivi.writer_tokens_fast"]
    assert [x.id for x in siblings("kivi.writer_key_groups_fast")] == ["kivi.writer_key_groups"]
    assert "keep their contents" in s["kivi.writer_tokens"].tolerance


def test_wrong_kivi_residual_copy_fails_with_the_right_count(ctx, inputs, tmp_path):
    """The token writer copying residual K rows one too high: exactly residual rows x KV heads x head size
    elements are off, all in K's columns."""
    from kvviz.families.kivi import format as layout
    s = slot("kivi.writer_tokens")
    src = s.starting_source()
    needle = "res[rk + d] = key_in[src + d];"
    assert needle in src
    path = tmp_path / "wrong.wgsl"
    path.write_text(src.replace(needle, "res[rk + d] = key_in[src + d] + 1.0;"))
    batch, key, value, q = inputs
    kvh, D = key.shape[1], key.shape[2]
    n_res = layout.plan(batch.context_lens, 0).total_res
    assert 0 < n_res < batch.num_tokens  # both residual and quantised rows at this shape
    c = check.lab_run(ctx, s.id, inputs, path=str(path), runs=1, warmup=0, info=False).check
    print(c.summary())
    assert not c.ok and not c.untouched
    assert c.bad == n_res * kvh * D and 0.99 < c.max_err < 1.01
    assert all(col < kvh * D for _, col in c.where)


def test_kivi_writer_outside_its_words_is_caught(ctx, inputs, tmp_path):
    """The token writer zeroing a residual row's K code words and the KW words after them. Those are the next
    residual row's code words (zeroed anyway) except after a sequence's last token (a slot no token maps to)
    and after a block's last offset (the block's side-stream words, which a sequence without key groups never
    writes): there, and only there, KW words per KV head change where the built-in writes nothing."""
    from kvviz.families.kivi import format as layout
    s = slot("kivi.writer_tokens")
    src = s.starting_source()
    needle = "if (w < kw) { k_cache[kdst + w] = 0u; }"
    assert needle in src
    path = tmp_path / "oob.wgsl"
    path.write_text(src.replace(needle, "if (w < kw) { k_cache[kdst + w] = 0u; k_cache[kdst + kw + w] = 0u; }"))
    batch, key, value, q = inputs
    kvh, D = key.shape[1], key.shape[2]
    bs = batch.block_size
    plan = layout.plan(batch.context_lens, 0)
    mapped = set(int(x) for x in batch.slot_mapping if x != PAD_SLOT)
    spill = 0  # residual rows whose next KW code words the built-in leaves unwritten
    for seq in range(batch.num_seqs):
        L, nq = int(batch.context_lens[seq]), int(plan.n_q[seq])
        for pos in range(nq, L):
            sl = batch.slot(seq, pos)
            if sl % bs == bs - 1:
                assert nq == 0  # the block's side words hold no key group of this sequence
                spill += 1
            elif pos == L - 1:
                assert sl + 1 not in mapped
                spill += 1
    assert spill >= 2
    c = check.lab_run(ctx, s.id, inputs, path=str(path), runs=1, warmup=0, info=False).check
    print(c.summary())
    assert c.bad == 0 and c.untouched == spill * kvh * (D * 2 // 32)
    assert not c.ok
