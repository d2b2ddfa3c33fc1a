"""The roofline drawn (Qt-free): the table and the SVG of kernels' points under the measured ceilings
(the model and the measurements are kvviz/bench/roofline.py)."""
from __future__ import annotations

import math
import os

from kvviz.bench.roofline import Ceilings, points_from_results
from kvviz.tables import Table


def roofline_table(points, c: Ceilings | None):
    rows = [[p.kernel, p.variant, p.bytes, p.flops, p.intensity, p.median_us, p.gflops, p.bound(c)] for p in points]
    return Table("roofline", ["kernel", "variant", "bytes", "flops", "flop_per_byte", "median_us", "gflops", "bound"],
                 rows, "Roofline: arithmetic intensity vs achieved GFLOP/s" + (
                     f" (copy {c.mem_gbps:.3g} GB/s, f32 FMA {c.f32_gflops:.3g} GFLOP/s)" if c else ""))


def roofline_svg(points, c: Ceilings | None, width: int = 720, height: int = 440) -> str:
    """A log-log roofline as SVG text (the report's figure; Qt-free). Kernels with 0 FLOPs are listed, not drawn
    (log axes)."""
    pts = [p for p in points if p.flops > 0 and p.bytes > 0 and math.isfinite(p.gflops) and p.gflops > 0]
    xs = [p.intensity for p in pts] + ([c.ridge] if c else [])
    ys = [p.gflops for p in pts] + ([c.f32_gflops] + ([c.f16_gflops] if c and c.f16_gflops else []) if c else [])
    if not xs:
        xs, ys = [0.01, 100], [0.01, 100]
    x0, x1 = 10 ** math.floor(math.log10(min(xs) / 2)), 10 ** math.ceil(math.log10(max(xs) * 2))
    y0, y1 = 10 ** math.floor(math.log10(min(ys) / 2)), 10 ** math.ceil(math.log10(max(ys) * 2))
    L, R, T, B = 70, 20, 30, 60
    W, Hh = width - L - R, height - T - B

    def X(v):
        return L + W * (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))

    def Y(v):
        return T + Hh * (1 - (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)))

    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<rect x="{L}" y="{T}" width="{W}" height="{Hh}" fill="none" stroke="#444"/>']
    for e in range(int(math.log10(x0)), int(math.log10(x1)) + 1):
        s.append(f'<line x1="{X(10**e):.1f}" y1="{T}" x2="{X(10**e):.1f}" y2="{T + Hh}" stroke="#ddd"/>'
                 f'<text x="{X(10**e):.1f}" y="{T + Hh + 15}" text-anchor="middle">{10**e:g}</text>')
    for e in range(int(math.log10(y0)), int(math.log10(y1)) + 1):
        s.append(f'<line x1="{L}" y1="{Y(10**e):.1f}" x2="{L + W}" y2="{Y(10**e):.1f}" stroke="#ddd"/>'
                 f'<text x="{L - 5}" y="{Y(10**e) + 4:.1f}" text-anchor="end">{10**e:g}</text>')
    s.append(f'<text x="{L + W / 2}" y="{height - 25}" text-anchor="middle">arithmetic intensity (FLOP / unique byte)</text>')
    s.append(f'<text x="15" y="{T + Hh / 2}" transform="rotate(-90 15 {T + Hh / 2})" text-anchor="middle">GFLOP/s</text>')
    if c:
        for peak, label, color in ((c.f32_gflops, "f32 FMA", "#c0392b"), (c.f16_gflops, "f16 FMA", "#8e44ad")):
            if not peak:
                continue
            ridge = peak / c.mem_gbps
            xa = max(x0, y0 / c.mem_gbps)
            s.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{X(xa):.1f},{Y(max(y0, c.mem_gbps * xa)):.1f} '
                     f'{X(min(ridge, x1)):.1f},{Y(min(peak, c.mem_gbps * min(ridge, x1))):.1f} {X(x1):.1f},{Y(peak):.1f}"/>')
            s.append(f'<text x="{X(x1) - 4:.1f}" y="{Y(peak) - 5:.1f}" text-anchor="end" fill="{color}">{label} {peak:.3g} GFLOP/s</text>')
        s.append(f'<text x="{L + 6}" y="{T + 14}" fill="#c0392b">copy {c.mem_gbps:.3g} GB/s</text>')
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    for i, p in enumerate(pts):
        col = colors[i % len(colors)]
        s.append(f'<circle cx="{X(p.intensity):.1f}" cy="{Y(p.gflops):.1f}" r="5" fill="{col}"/>')
        s.append(f'<text x="{X(p.intensity) + 7:.1f}" y="{Y(p.gflops) + 4:.1f}" fill="{col}">{_esc(p.kernel)}</text>')
    zero = [p.kernel for p in points if not p.flops]
    if zero:
        s.append(f'<text x="{L}" y="{height - 8}" fill="#666">0 FLOPs (not drawn): {_esc(", ".join(zero))[:110]}</text>')
    if c and c.is_software:
        s.append(f'<text x="{L + W - 4}" y="{T + 14}" text-anchor="end" fill="#b07000">software rasteriser: CPU times</text>')
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
