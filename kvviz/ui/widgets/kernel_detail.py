"""The selected kernel in detail: its dispatches (grid, workgroup size, workgroup memory), bytes and FLOPs,
rates against the device's roofs, its median against the timing floor, and the verdict of what bounds it.
The numbers are kvviz.bench.detail's (Qt-free); this only shows them."""
from __future__ import annotations

import html
import math

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QScrollArea, QVBoxLayout, QWidget

from kvviz import units
from kvviz.bench.detail import BANDWIDTH, FIXED_COST, INSTRUCTIONS

VERDICT_COLORS = {BANDWIDTH: "#1f5fa0", INSTRUCTIONS: "#8a4a00", FIXED_COST: "#6b6b6b"}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "-"


def detail_rows(d) -> list[tuple[str, str]]:
    """(label, value) lines of a KernelDetail, as the view and its tests read them."""
    rows = []
    for disp in d.dispatches:
        wg = " x ".join(str(v) if v else "(named constant)" for v in disp.workgroup_size)
        inv = f", {disp.invocations:,} invocations" if disp.invocations else ""
        rows.append(("dispatch", f"{disp.kernel}: grid {' x '.join(map(str, disp.grid))} workgroups of {wg}{inv}; "
                                 f"workgroup memory {units.nbytes(disp.workgroup_bytes)}"))
    if not d.dispatches:
        rows.append(("dispatch", "not recorded (a copy timed without a shader of ours)"))
    rows += [
        ("median", f"{units.time_us(d.median_us, 4)} (min {units.time_us(d.min_us)}, p90 {units.time_us(d.p90_us)}; "
                   f"{d.timing_method})"),
        ("timing floor", f"{units.time_us(d.floor_us)}: the median is {d.times_floor:.1f}x the floor"
         if math.isfinite(d.times_floor) else "not measured"),
        ("unique bytes", units.nbytes(d.bytes)),
        ("FLOPs", units.si(d.flops, "FLOP") if d.flops else "0 (stated by the kernel)"),
        ("bandwidth", f"{units.si(d.gbps * 1e9, 'B/s')}: {_pct(d.share_of_copy)} of the shader copy "
                      f"({units.si(d.copy_gbps * 1e9, 'B/s')})"),
        ("compute", f"{units.si(d.gflops * 1e9, 'FLOP/s')}" + (f": {_pct(d.share_of_fma)} of the f32 FMA peak "
                                                               f"({units.si(d.ceilings.f32_gflops * 1e9, 'FLOP/s')})"
                                                               if d.ceilings is not None else
                                                               " (FMA peak not measured yet)")),
        ("roofline", (f"intensity {units.si(d.intensity, '', 3)} FLOP/B, on the {d.roof_side} side of the ridge "
                      f"({units.si(d.ceilings.ridge, '', 3)} FLOP/B); {units.si(d.gflops * 1e9, 'FLOP/s')} of "
                      f"{units.si(d.attainable_gflops * 1e9, 'FLOP/s')} attainable there "
                      f"({_pct(d.gflops / d.attainable_gflops)})")
         if d.ceilings is not None and math.isfinite(d.intensity) and d.attainable_gflops > 0
         else f"intensity {units.si(d.intensity, '', 3)} FLOP/B" if math.isfinite(d.intensity) else "-"),
    ]
    return rows


class KernelDetailView(QWidget):
    open_in_lab = Signal(str)  # the Kernel lab slot of the shown kernel

    def __init__(self, parent=None):
        super().__init__(parent)
        self.detail = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        top = QHBoxLayout()
        self.title = QLabel("Click a kernel in the table, the bars, the timeline or the roofline.")
        self.title.setWordWrap(True)
        self.title.setTextFormat(Qt.RichText)
        top.addWidget(self.title, 1)
        self.lab_button = QPushButton("Open in Kernel lab")
        self.lab_button.setToolTip("Show this kernel's built-in source in the Kernel lab, to bring your own")
        self.lab_button.clicked.connect(lambda: self.detail and self.detail.lab_slot
                                        and self.open_in_lab.emit(self.detail.lab_slot))
        self.lab_button.setEnabled(False)
        top.addWidget(self.lab_button, 0, Qt.AlignTop)
        lay.addLayout(top)
        self.body = QLabel("")
        self.body.setWordWrap(True)
        self.body.setTextFormat(Qt.RichText)
        self.body.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.body.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        scroll.setWidget(self.body)
        lay.addWidget(scroll, 1)

    def show_detail(self, d) -> None:
        self.detail = d
        if d is None:
            self.title.setText("The selected kernel is not in these results.")
            self.body.setText("")
            self.lab_button.setEnabled(False)
            return
        color = VERDICT_COLORS.get(d.verdict, "#333")
        self.title.setText(f"<b>{html.escape(d.kernel)}</b> [{html.escape(d.variant)}] - "
                           f"<span style='color:{color}; font-weight:bold'>bound by {html.escape(d.verdict)}</span>"
                           f"<br><span style='color:#444'>{html.escape(d.why)}</span>")
        rows = "".join(f"<tr><td style='padding-right:10px; color:#555'>{html.escape(k)}</td>"
                       f"<td>{html.escape(v)}</td></tr>" for k, v in detail_rows(d))
        self.body.setText(f"<table cellspacing='2'>{rows}</table>")
        self.lab_button.setEnabled(bool(d.lab_slot))
        self.lab_button.setToolTip(f"Kernel lab slot {d.lab_slot}" if d.lab_slot else
                                   "No Kernel lab slot times this kernel")
