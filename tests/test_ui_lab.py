"""The Kernel lab panel in the window (pytest-qt, offscreen): a file opened in the lab runs, each save
recompiles it and adds timing rows, a syntax error lists its line and column and marks the line, a wrong kernel shows
the failed check, the roofline tab and the report's roofline have the run's kernels. Apart from tests/test_lab.py so
that the lab's Qt-free tests run where Qt is not installed (the GPU machine)."""
import os

import pytest

from ui_windows import settings  # noqa: F401  (fixture)

pytestmark = pytest.mark.gpu


def _lab_window(qtbot, settings, session):
    from ui_windows import open_window

    win = open_window(qtbot, settings, session)
    assert win.docks["kernel_lab"].widget() is not None and win.timing.tabs.indexOf(win.roofline) >= 0  # installed
    return win


def test_lab_panel_watches_and_reruns(qtbot, tmp_path, settings, session):
    """Open a file in the lab: a run; edit it (in place, then the way editors that rename a new file over the
    old one do): each save recompiles it and adds timing rows; a syntax error lists its line and column and
    marks the line; a wrong kernel shows the failed check; the roofline tab has the run's kernels."""
    from ui_windows import WAIT

    win = _lab_window(qtbot, settings, session)
    lab = win.lab
    lab.set_slot("f32.writer")  # no file yet: the built-in's source and the SPIR-V glslang makes of it
    assert "reshape_and_cache" in lab.source.toPlainText() and "OpEntryPoint" in lab.driver.toPlainText()
    assert lab.facts["workgroup size"].text() == "128 x 1 x 1"
    lab.set_slot("int8_token.dequantise")
    path = tmp_path / "mine.wgsl"
    lab.new_file(str(path))
    qtbot.waitUntil(lambda: len(lab.runs) == 1, timeout=WAIT)
    assert lab.last.check.ok and lab.table.rowCount() == 2  # the user kernel and the built-in
    assert lab.facts["workgroup size"].text() == "64 x 1 x 1" and lab.facts["immediates"].text() == "20 bytes"
    assert "not shown" in lab.driver_kind.text()
    src = path.read_text()
    # 1. edited in place
    path.write_text(src.replace("for (var i = lid.x; i < n; i = i + 64u)", "for (var i = lid.x; i < n; i += 64u)"))
    qtbot.waitUntil(lambda: len(lab.runs) == 2, timeout=WAIT)
    assert lab.table.rowCount() == 4 and lab.last.check.ok
    # 2. saved by writing a new file and renaming it over the old one
    needle = "let v = f32(code) * bitcast<f32>(load_w(which, rec + p.hd / 4u));"
    tmp = tmp_path / "mine.wgsl.swp"
    tmp.write_text(src.replace(needle, "let v = -f32(code) * bitcast<f32>(load_w(which, rec + p.hd / 4u));"))
    os.replace(tmp, path)
    qtbot.waitUntil(lambda: len(lab.runs) == 3, timeout=WAIT)
    assert not lab.last.check.ok and lab.last.check.bad > 0 and "FAILED" in lab.check_label.text()
    assert lab.heat_img.image is not None and lab.heat_img.image.max() > 0
    # 3. a syntax error: its line and column, the line marked in the source view; the window stays up
    lines = src.splitlines()
    at = next(i for i, l in enumerate(lines) if needle in l)
    lines.insert(at, "    let oops = ;")
    path.write_text("\n".join(lines) + "\n")
    qtbot.waitUntil(lambda: lab.errors.count() > 0, timeout=WAIT)
    d = lab.diagnostics[0]
    assert (d.file, d.line, d.column) == (str(path), at + 1, len("    let oops = ") + 1)
    assert f":{at + 1}:{d.column}:" in lab.errors.item(0).text()
    assert lab.source.textCursor().blockNumber() == at and lab.source.extraSelections()
    assert len(lab.runs) == 3 and win.isVisible()
    # 4. fixed again: a new run and timing rows
    path.write_text(src)
    qtbot.waitUntil(lambda: len(lab.runs) == 4, timeout=WAIT)
    assert lab.last.check.ok and lab.errors.count() == 0 and lab.table.rowCount() == 8
    for _, run in lab.runs:
        print([(t.name, round(t.timing.median_us, 1)) for t in run.timings])
    # the roofline tab: every timed kernel of the window's run that states FLOPs is a point
    qtbot.waitUntil(lambda: win.roofline.ceilings is not None, timeout=WAIT)
    assert win.roofline.table.rowCount() == len(win.roofline.points) > 0
    assert {r[-1] for r in win.roofline.table_data.rows} <= {"memory", "compute"}
    # the report's roofline: the same points and the ceilings the tab measured
    from kvviz.report.roofline import write_roofline

    name, table = write_roofline(str(tmp_path), win.results)
    svg = (tmp_path / name).read_text()
    assert svg.count("<circle") == sum(1 for p in win.roofline.points if p.flops > 0) and "f32 FMA" in svg
    assert [r[0] for r in table.rows] == [p.kernel for p in win.roofline.points]
    assert any(a.text() == "Kernel lab" for m in win.menuBar().actions() if m.menu() for a in m.menu().actions())
    win.close()
