"""Numbers with units (kvviz.units): SI prefixes, axis ticks, tick texts; CSV cells (kvviz.tables); the kernel
detail's verdict (kvviz.bench.detail). Qt-free and GPU-free."""
import csv
import io
import math

import pytest

from kvviz import units
from kvviz.bench.detail import BANDWIDTH, FIXED_COST, INSTRUCTIONS, lab_slot, verdict
from kvviz.tables import Table, compare_name, compare_table, csv_float, header_name, partitions_of, series_name


@pytest.mark.parametrize("x, unit, text", [
    (0.0015, "s", "1.5 ms"), (2.0, "s", "2 s"), (5.6e-8, "s", "56 ns"), (56724.5418e-6, "s", "56.7 ms"),
    (999.9, "B", "1 kB"), (1536000, "B", "1.54 MB"), (4.174e12, "B/s", "4.17 TB/s"), (46.5e12, "FLOP/s", "46.5 TFLOP/s"),
    (0, "s", "0 s"), (4.4e-4, "", "4.4e-4"), (0.25, "", "0.25"), (1234.5, "", "1234"), (123456, "", "1.23e5"),
])
def test_si(x, unit, text):
    assert units.si(x, unit) == text


def test_si_of_missing_values_and_of_times_and_bytes():
    assert units.si(None) == "-" and units.si(float("nan"), "s") == "-"
    assert units.time_us(2e6) == "2 s" and units.time_us(0.5) == "500 ns" and units.nbytes(33554432) == "33.6 MB"


def test_linear_ticks_are_round_steps_inside_the_range():
    step, major, mstep, minor = units.linear_ticks(0.0, 4.4e-4, 5)
    assert step == pytest.approx(1e-4) and major[0] == 0.0 and len(major) == 5
    assert all(0 <= v <= 4.4e-4 for v in major + minor)
    assert not set(round(v, 12) for v in major) & set(round(v, 12) for v in minor)  # minor ticks are the others
    for lo, hi, n in ((0, 2.3e6, 6), (-3, 7, 4), (13.2, 13.9, 5), (1, 1e5, 3)):
        step, major, _, _ = units.linear_ticks(lo, hi, n)
        assert 1 <= len(major) - 1 <= n and round(step / 10 ** math.floor(math.log10(step)), 6) in (1, 2, 2.5, 5)


def test_a_linear_axis_carries_one_prefix_in_its_title():
    step, major, _, _ = units.linear_ticks(0, 2.3, 6)  # 2.3 s of timeline, given in seconds
    f, suffix, letter = units.common_prefix(major, "s")
    assert suffix == "s" and units.tick_texts(major, step, f) == ["0", "0.5", "1", "1.5", "2"]
    step, major, _, _ = units.linear_ticks(0, 2.3e-3, 6)
    f, suffix, letter = units.common_prefix(major, "s")
    assert suffix == "ms" and letter == "" and units.tick_texts(major, step, f)[-1] == "2"
    # a unitless axis of small values: one power of ten in the title, not "5e-05" on a tick
    step, major, _, _ = units.linear_ticks(0, 4.4e-4, 5)
    f, suffix, letter = units.common_prefix(major, "")
    assert suffix == "\u00d710\u207b\u2074" and units.tick_texts(major, step, f) == ["0", "1", "2", "3", "4"]
    # counts: k on the ticks, nothing in the title
    step, major, _, _ = units.linear_ticks(0, 45000, 5)
    f, suffix, letter = units.common_prefix(major, "")
    assert (suffix, letter) == ("", "k") and units.tick_texts(major, step, f, letter) == ["0", "10k", "20k", "30k", "40k"]


@pytest.mark.parametrize("lo, hi, room", [(math.log10(0.5), 0.0, 3), (-1, 3, 8), (-9, 3, 6), (-0.4, 0.1, 10), (2, 2.2, 4)])
def test_log_ticks_never_label_more_than_there_is_room_for(lo, hi, room):
    labelled, minor = units.log_ticks(lo, hi, room)
    assert 2 <= len(labelled) <= max(room, 9) and all(lo - 1e-9 <= v <= hi + 1e-9 for v in labelled)
    assert not set(round(v, 9) for v in labelled) & set(round(v, 9) for v in minor)
    if hi - lo > 1:
        assert len(labelled) <= room


def test_log_ticks_of_half_a_decade_do_not_label_every_minor_tick():
    labelled, minor = units.log_ticks(math.log10(0.5), 0.0, 3)  # the roofline's "0.50.60.70.80.91"
    assert units.log_tick_texts(labelled) == ["0.5", "1"] and len(minor) == 4


def test_log_tick_texts_with_units_and_powers_of_ten():
    labelled, _ = units.log_ticks(-1, 3, 8)
    assert units.log_tick_texts(labelled, "FLOP/s", 1e9) == ["100 MFLOP/s", "1 GFLOP/s", "10 GFLOP/s", "100 GFLOP/s",
                                                            "1 TFLOP/s"]
    labelled, _ = units.log_ticks(-9, 3, 6)
    texts = units.log_tick_texts(labelled)
    assert texts[0] == "10\u207b\u2079" and all("e" not in t for t in texts)  # one style for the whole axis
    assert units.log_tick_texts([math.log10(2e-6), -5.0]) == ["2\u00b710\u207b\u2076", "10\u207b\u2075"]


# ------------------------------------------------------------------------------------------ CSV
def test_csv_floats_are_short_and_read_back_exactly():
    for x in (56724.5418, 0.1 + 0.2, 7.355213165283203e-05, 1 / 3, 2 ** 0.5 * 1e8, 123456789012.5, 1e-300, -0.0):
        cell = csv_float(x)
        assert float(cell) == x and repr(float(cell)) == cell and len(cell) <= len(f"{x:.17g}") + 2


def test_timings_carry_no_float_noise():
    """Statistics of timestamp differences are rounded to the picosecond: a median of two samples or a
    tick count times a clock period gives 26288.726, not 26288.726000000002."""
    from kvviz.gpu.timing import TimingResult

    period = 0.833  # ns per tick (a clock whose period has no exact binary form)
    ticks = [31558931, 31558933, 31558940, 31558927]
    t = TimingResult.from_samples([k * period / 1e3 for k in ticks], "gpu-timestamps")
    for v in (t.median_us, t.min_us, t.p90_us, *t.samples_us):
        assert v == round(v, 6) and len(repr(v).split(".")[1]) <= 6


def test_table_csv_is_strict_with_units_in_the_header(tmp_path):
    t = Table("m", ["sequence", "kl", "median_us", "label"],
              [[0, 0.1 + 0.2, float("nan"), "a,b"], [1, 56724.541800000006, 3.5, "x"]], units={"kl": "nats", "median_us": "us"})
    path = tmp_path / "m.csv"
    t.write_csv(path)
    rows = list(csv.reader(io.StringIO(path.read_text()), strict=True))
    assert rows[0] == ["sequence", "kl_nats", "median_us", "label"]  # median_us already says its unit
    assert rows[1] == ["0", "0.30000000000000004", "", "a,b"] and rows[2] == ["1", "56724.541800000006", "3.5", "x"]
    assert [float(c) for c in rows[2][1:3]] == [56724.541800000006, 3.5]  # exactly the values written
    assert header_name("kl", "") == "kl"


def test_comparison_rows_are_named_by_method_and_options():
    rows = [{"method": "turboquant", "name": "turboquant", "label": "TQ", "options": {"qjl_scale": "reference"},
             "kl_mean": 0.119, "bits_per_element": 3.06},
            {"method": "turboquant", "name": "turboquant qjl_scale=unbiased", "label": "TQ",
             "options": {"qjl_scale": "unbiased"}, "kl_mean": 0.084, "bits_per_element": 3.06},
            {"method": "kivi", "label": "KIVI", "options": {"bits": 2, "context_len": 4096}, "kl_mean": 0.02}]
    t = compare_table(rows)
    names = list(t.column("name"))
    assert names == ["turboquant", "turboquant qjl_scale=unbiased", "kivi bits=2"]  # a stored row without a name
    assert len(set(names)) == len(names)
    assert list(t.column("options"))[1] == "qjl_scale=unbiased" and "kl_mean_nats" in t.headers()
    assert compare_name({"method": "f16"}) == "f16"


def test_one_sweep_series_per_kernel():
    assert series_name("fast_decode_int8 (4 partitions)") == series_name("fast_decode_int8 (1 partition)") == \
        "fast_decode_int8"
    assert series_name("paged_attn_q8") == "paged_attn_q8" and partitions_of("fast_decode_f32 (16 partitions)") == 16


# ---------------------------------------------------------------------------------- kernel detail
def test_the_verdict_of_a_kernel():
    assert verdict(30.0, 20.0, 0.9, 0.01)[0] == FIXED_COST  # within 2x the floor, whatever it moves
    v, why = verdict(500.0, 20.0, 0.72, 0.01)
    assert v == BANDWIDTH and "72%" in why
    assert verdict(500.0, 20.0, 0.1, 0.8)[0] == INSTRUCTIONS
    v, why = verdict(500.0, 20.0, 0.05, float("nan"))
    assert v == INSTRUCTIONS and "neither roof" in why and "FMA" not in why
    assert verdict(500.0, float("nan"), 0.6, float("nan"))[0] == BANDWIDTH  # no floor measured: the roofs decide
    assert lab_slot("paged_attn_q8") == "int8_seed.decode" and lab_slot("no such kernel") is None
