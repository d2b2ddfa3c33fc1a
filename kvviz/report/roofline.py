"""The roofline drawn (Qt-free): the table and the SVG of kernels' points under the measured ceilings
(the model and the measurements are kvviz/bench/roofline.py)."""
from __future__ import annotations

import math
import os

from kvviz import units
from kvviz.bench.roofline import Ceilings, points_from_results
from kvviz.tables import Table


def roofline_table(points, c: Ceilings | None):
    rows = [[p.kernel, p.variant, p.bytes, p.flops, p.intensity, p.median_us, p.gflops, p.bound(c)] for p in points]
    return Table("roofline", ["kernel", "variant", "bytes", "flops", "flop_per_byte", "median_us", "gflops", "bound"],
                 rows, "Roofline: arithmetic intensity vs achieved GFLOP/s" + (
                     f" (copy {c.mem_gbps:.3g} GB/s, f32 FMA {c.f32_gflops:.3g} GFLOP/s)" if c else ""))


CHAR_W = 6.4  # pixels per character of the SVG's 11 px sans-serif text (a wide estimate: labels never touch)
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def _place_labels(points, taken, box):
    """Greedy placement of number labels (x, y, text) beside their points, right, left, above or below, never
    overlapping one another, a point, or leaving `box` (x0, y0, x1, y1): [(x, y, anchor, text)]; a label that
    fits nowhere is left out (the key below the chart names every point)."""
    placed = []
    boxes = list(taken)
    for x, y, text in points:
        w, h = CHAR_W * len(text) + 2, 12.0
        for dx, dy, anchor in ((7, 4, "start"), (-7, 4, "end"), (0, -8, "middle"), (0, 15, "middle")):
            x0 = x + dx if anchor == "start" else x + dx - w if anchor == "end" else x - w / 2
            rect = (x0, y + dy - 10, x0 + w, y + dy - 10 + h)
            if rect[0] < box[0] or rect[2] > box[2] or rect[1] < box[1] or rect[3] > box[3]:
                continue
            if any(rect[0] < b[2] and b[0] < rect[2] and rect[1] < b[3] and b[1] < rect[3] for b in boxes):
                continue
            placed.append((x + dx, y + dy, anchor, text))
            boxes.append(rect)
            break
    return placed


def roofline_svg(points, c: Ceilings | None, width: int = 720, height: int = 440) -> str:
    """A log-log roofline as SVG text (the report's figure and `kvviz roofline --svg`; Qt-free): the ceilings as
    lines, every kernel a numbered point, numbers beside the points where they fit without covering one another,
    and a key under the chart naming every number (the figure grows by its rows). Axes: decades labelled with
    SI prefixes (kvviz.units), the other mantissas as unlabelled minor ticks. Kernels with 0 FLOPs are listed,
    not drawn (log axes)."""
    pts = [p for p in points if p.flops > 0 and p.bytes > 0 and math.isfinite(p.gflops) and p.gflops > 0]
    xs = [p.intensity for p in pts] + ([c.ridge] if c else [])
    ys = [p.gflops for p in pts] + ([c.f32_gflops] + ([c.f16_gflops] if c and c.f16_gflops else []) if c else [])
    if not xs:
        xs, ys = [0.01, 100], [0.01, 100]
    lx0, lx1 = math.floor(math.log10(min(xs) / 2)), math.ceil(math.log10(max(xs) * 2))
    ly0, ly1 = math.floor(math.log10(min(ys) / 2)), math.ceil(math.log10(max(ys) * 2))
    L, R, T, B = 98, 20, 30, 52
    W, Hh = width - L - R, height - T - B
    key_lines = [f"{i + 1}  {p.kernel}" + (f" [{p.variant}]" if p.variant else "") for i, p in enumerate(pts)]
    key_cols = 2 if len(key_lines) > 8 else 1
    col_w = (width - 2 * 10) / key_cols
    max_chars = int(col_w / CHAR_W) - 1
    key_rows = -(-len(key_lines) // key_cols)
    ceil_lines = []
    if c:
        for peak, label, color in ((c.f32_gflops, "f32 FMA", "#c0392b"), (c.f16_gflops, "f16 FMA", "#8e44ad")):
            if peak:
                ceil_lines.append((peak, label, color))
    extra = 16 * (1 + len(ceil_lines) + key_rows) + 10
    total_h = height + extra

    def X(v):
        return L + W * (math.log10(v) - lx0) / (lx1 - lx0)

    def Y(v):
        return T + Hh * (1 - (math.log10(v) - ly0) / (ly1 - ly0))

    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}" viewBox="0 0 {width} {total_h}" '
         'font-family="sans-serif" font-size="11">',
         '<rect width="100%" height="100%" fill="white"/>']
    xl, xminor = units.log_ticks(lx0, lx1, max(2, int(W / 60)))
    yl, yminor = units.log_ticks(ly0, ly1, max(2, int(Hh / 28)))
    for v, t in zip(xl, units.log_tick_texts(xl)):
        x = L + W * (v - lx0) / (lx1 - lx0)
        s.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{T + Hh}" stroke="#ddd"/>'
                 f'<line x1="{x:.1f}" y1="{T + Hh}" x2="{x:.1f}" y2="{T + Hh + 5}" stroke="#444"/>'
                 f'<text x="{x:.1f}" y="{T + Hh + 17}" text-anchor="middle">{_esc(t)}</text>')
    for v in xminor:
        x = L + W * (v - lx0) / (lx1 - lx0)
        s.append(f'<line x1="{x:.1f}" y1="{T + Hh}" x2="{x:.1f}" y2="{T + Hh + 3}" stroke="#444"/>')
    for v, t in zip(yl, units.log_tick_texts(yl, "FLOP/s", 1e9)):
        y = T + Hh * (1 - (v - ly0) / (ly1 - ly0))
        s.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + W}" y2="{y:.1f}" stroke="#ddd"/>'
                 f'<line x1="{L - 5}" y1="{y:.1f}" x2="{L}" y2="{y:.1f}" stroke="#444"/>'
                 f'<text x="{L - 7}" y="{y + 4:.1f}" text-anchor="end">{_esc(t)}</text>')
    for v in yminor:
        y = T + Hh * (1 - (v - ly0) / (ly1 - ly0))
        s.append(f'<line x1="{L - 3}" y1="{y:.1f}" x2="{L}" y2="{y:.1f}" stroke="#444"/>')
    s.append(f'<rect x="{L}" y="{T}" width="{W}" height="{Hh}" fill="none" stroke="#444"/>')
    s.append(f'<text x="{L + W / 2}" y="{T + Hh + 36}" text-anchor="middle">arithmetic intensity, FLOP per unique byte '
             '(log scale)</text>')
    s.append(f'<text x="14" y="{T + Hh / 2}" transform="rotate(-90 14 {T + Hh / 2})" text-anchor="middle">'
             'achieved FLOP/s (log scale)</text>')
    s.append(f'<text x="{L}" y="{T - 10}" font-weight="bold">Roofline: each kernel (numbered as in the key) at its '
             'intensity and achieved rate</text>')
    s.append(f'<defs><clipPath id="plot"><rect x="{L}" y="{T}" width="{W}" height="{Hh}"/></clipPath></defs>')
    x0v, x1v = 10.0 ** lx0, 10.0 ** lx1
    y0v = 10.0 ** ly0
    for peak, _label, color in ceil_lines:
        ridge = peak / c.mem_gbps
        xa = max(x0v, y0v / c.mem_gbps)
        s.append(f'<polyline clip-path="url(#plot)" fill="none" stroke="{color}" stroke-width="2" '
                 f'points="{X(xa):.1f},{Y(max(y0v, c.mem_gbps * xa)):.1f} {X(min(ridge, x1v)):.1f},'
                 f'{Y(min(peak, c.mem_gbps * min(ridge, x1v))):.1f} {X(x1v):.1f},{Y(peak):.1f}"/>')
    marks = []
    for i, p in enumerate(pts):
        x, y = X(p.intensity), Y(p.gflops)
        s.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{COLORS[i % len(COLORS)]}" stroke="#333" '
                 f'stroke-width="0.6"><title>{_esc(key_lines[i])}</title></circle>')
        marks.append((x - 5, y - 5, x + 5, y + 5))
    for x, y, anchor, text in _place_labels([(X(p.intensity), Y(p.gflops), str(i + 1)) for i, p in enumerate(pts)],
                                            marks, (L + 2, T + 2, L + W - 2, T + Hh - 2)):
        s.append(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="#222">{_esc(text)}</text>')
    # under the chart: the ceilings, then the key of the numbers
    y = height + 6
    for peak, label, color in ceil_lines:
        s.append(f'<line x1="10" y1="{y - 4}" x2="34" y2="{y - 4}" stroke="{color}" stroke-width="2"/>'
                 f'<text x="40" y="{y}">{label} {units.si(peak * 1e9, "FLOP/s")}, shader copy '
                 f'{units.si(c.mem_gbps * 1e9, "B/s")} (ridge {units.si(c.ridge, "", 3)} FLOP/B)</text>')
        y += 16
    if c and c.is_software:
        s.append(f'<text x="10" y="{y}" fill="#b07000">software rasteriser: every time is a CPU time</text>')
    y += 16
    for i, line in enumerate(key_lines):
        col, row = divmod(i, key_rows) if key_rows else (0, 0)
        text = line if len(line) <= max_chars else line[:max_chars - 3] + "..."
        s.append(f'<text x="{10 + col * col_w:.1f}" y="{y + 16 * row}" fill="{COLORS[i % len(COLORS)]}">'
                 f'<tspan fill="#222">{_esc(text)}</tspan><title>{_esc(line)}</title></text>')
    zero = [p.kernel for p in points if not p.flops]
    if zero:
        s.append(f'<text x="10" y="{total_h - 6}" fill="#666">0 FLOPs (not drawn): {_esc(", ".join(zero))[:110]}</text>')
    s.append("</svg>")
    return "\n".join(s)


def _esc(t: str) -> str:
    return t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_roofline(out_dir: str, res, name: str = "roofline.svg"):
    """The report's roofline of a window run: `name` (SVG) in out_dir and its table. The compute ceiling is
    the one the window measured on the same device (res.roofline_ceilings, set by its Roofline tab); without it
    the points are drawn without ceilings and `bound` is "-"."""
    pts = points_from_results(res)
    c = getattr(res, "roofline_ceilings", None)
    with open(os.path.join(out_dir, name), "w") as fh:
        fh.write(roofline_svg(pts, c))
    return name, roofline_table(pts, c)
