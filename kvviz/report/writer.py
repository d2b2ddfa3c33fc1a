"""The report folder (Qt-free): report.json (every number), report.md (a summary with the figures),
one CSV per panel table, the timings as a Chrome trace and the results themselves (results.npz,
kvviz.analysis.snapshot), so the report reopens in the window as it was computed.

The window (Ctrl+E) and `kvviz report` both call `write_report`; the window passes the PNGs it
rendered from its panels, `kvviz report` the ones it rendered offscreen (or none without Qt).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time

from kvviz.analysis.snapshot import FILE_NAME as RESULTS_FILE
from kvviz.analysis.snapshot import save_results
from kvviz.report.roofline import write_roofline
from kvviz.report.trace import write_chrome_trace
from kvviz.tables import Table, clean, compare_name, default_panel_tables, sweep_table

PANEL_TITLES = {
    "window": "Window",
    "overview": "Overview",
    "cache_layout": "Cache layout",
    "scales": "Scales",
    "codes": "Code histogram",
    "attention": "Attention error",
    "timing": "GPU timing",
    "compare": "Method comparison",
    "block_inspector": "Block inspector",
    "qjl_bias": "QJL bias",
    "live": "Live decode",
    "roofline": "Roofline (kernels at their arithmetic intensity under the device's ceilings)",
}


def _fmt(v, digits: int = 4) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if v != v:
            return "n/a"
        if v == 0:
            return "0"
        if abs(v) >= 1e4 or abs(v) < 1e-3:
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}g}"
    return str(v)


def report_json(res, tables: dict, figures: dict | None = None, compare_rows=None, sweep_points=None,
                history=None) -> dict:
    d = res.summary_json()
    d["panels"] = {panel: {t.name: t.to_json() for t in ts} for panel, ts in tables.items()}
    d["figures"] = dict(figures or {})
    if compare_rows is not None:
        d["compare"] = list(compare_rows)
    if sweep_points is not None:
        d["sweep"] = list(sweep_points)
    if history is not None:
        d["history"] = list(history)
    d["generated"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return clean(d)


def report_markdown(res, figures: dict | None = None, compare_rows=None, sweep_points=None) -> str:
    s = res.summary_json()
    a = res.adapter
    L = []
    L.append("# kvviz report")
    L.append("")
    L.append(f"- **Adapter:** {a.line()}")
    if a.is_software:
        L.append("- **Note:** this adapter is a software rasteriser (lavapipe/llvmpipe): the timings are CPU "
                 "times, not GPU times.")
    L.append(f"- **Source:** {res.source_note}")
    L.append(f"- **Method:** {res.method.label} (`{res.method.id}`)"
             + (f", options {json.dumps(res.method.options(), allow_nan=False)}" if res.method.options() else ""))
    L.append(f"- **Computed in:** {res.elapsed_s:.2f} s")
    if getattr(res, "warnings", None):
        L.append("")
        L.append("## Warnings")
        L.append("")
        for w in res.warnings:
            L.append(f"- **Warning:** {w}")
    L.append("")
    L.append("## Configuration")
    L.append("")
    L.append("| setting | value |")
    L.append("|---|---|")
    for k, v in res.config.to_json().items():
        L.append(f"| {k} | {json.dumps(v, allow_nan=False) if isinstance(v, (list, dict)) else v} |")
    b = s["batch"]
    L.append("")
    L.append(f"Batch: {b['num_seqs']} sequences, {b['num_tokens']} tokens, {b['blocks_used']} of {b['num_blocks']} "
             f"physical blocks used ({b['block_size']} tokens a block, {b['policy']} allocation).")
    L.append("")
    L.append("## Cache layout")
    for lay in res.layouts:
        L.append("")
        L.append(f"**{lay.which}**: {lay.bytes_per_token_per_head:g} bytes per token per KV head, "
                 f"{lay.bits_per_element:.3f} bits per element. {lay.description}")
        L.append("")
        L.append("| field | dtype | bits | count | per | note |")
        L.append("|---|---|---|---|---|---|")
        for f in lay.fields:
            L.append(f"| {f.name} | {f.dtype} | {f.bits} | {f.count} | {f.per} | {f.note} |")
        if lay.word_map:
            L.append("")
            L.append("Word map: " + "; ".join(x.strip() for x in lay.word_map.splitlines() if x.strip()))
    L.append("")
    L.append("## Attention error (quantised vs f32 baseline, both on the GPU)")
    L.append("")
    L.append("| metric | value |")
    L.append("|---|---|")
    for k, v in s["attention"].items():
        L.append(f"| {k} | {_fmt(v, 6)} |")
    L.append("")
    L.append("## Codes")
    L.append("")
    L.append("| stat | K | V | definition |")
    L.append("|---|---|---|---|")
    ks, vs = res.k_stats, res.v_stats
    for name in list(ks.stats) + [n for n in vs.stats if n not in ks.stats]:
        st = ks.stats.get(name) or vs.stats.get(name)
        txt = [x.stats[name].text() if name in x.stats else "n/a" for x in (ks, vs)]
        L.append(f"| {st.label} (`{name}`) | {txt[0]} | {txt[1]} | {st.definition} |")
    L.append(f"| codes counted (`total`) | {ks.total} | {vs.total} | codes over the real tokens |")
    L.append("")
    L.append("## GPU timings")
    L.append("")
    methods = sorted({t.timing.method for t in res.timings})
    runs = sorted({len(t.timing.samples_us) for t in res.timings})
    L.append(f"Timing method: **{', '.join(methods)}**; median of {', '.join(map(str, runs))} runs after warm-up, "
             f"min-p90 in brackets. Bandwidth = unique bytes moved / median; % of copy compares it with a "
             f"buffer copy measured in the same run ({res.copy_gbps:.2f} GB/s).")
    floor = res.timing_floor_us
    if floor == floor:
        L.append(f"Timing floor: a near-empty dispatch in its own pass takes {floor:.1f} us here; every row is timed in "
                 "the same frame, and a row near it is mostly the frame's fixed cost.")
    if a.is_software:
        L.append("")
        L.append("> lavapipe: CPU timings, not GPU.")
    L.append("")
    L.append("| kernel | variant | median us (min-p90) | bytes | GB/s | % of copy | timing method |")
    L.append("|---|---|---|---|---|---|---|")
    for t in res.timings:
        L.append(f"| {t.kernel} | {t.variant} | {t.timing.median_us:.1f} ({t.timing.min_us:.1f}-{t.timing.p90_us:.1f}) "
                 f"| {t.bytes_moved} | {t.gbps:.3f} | {t.pct_of_copy:.1f} | {t.timing.method} |")
    if sweep_points:
        t = sweep_table(sweep_points)
        L.append("")
        L.append(f"## Latency sweep over {sweep_points[0]['param']} (median us, {', '.join(methods)})")
        L.append("")
        L.append("| value | tokens | kernel | median us | bytes |")
        L.append("|---|---|---|---|---|")
        for r in t.rows:
            L.append(f"| {r[1]} | {r[2]} | {r[3]} | {r[4]:.1f} | {r[7]} |")
    if compare_rows:
        L.append("")
        L.append("## Method comparison (same K/V, same queries)")
        L.append("")
        L.append("| method | settings | bits/element | KL mean (nats) | rel L2 |")
        L.append("|---|---|---|---|---|")
        for r in compare_rows:
            L.append(f"| {r.get('label', r.get('method'))} | `{compare_name(r)}` | {_fmt(r.get('bits_per_element'))} "
                     f"| {_fmt(r.get('kl_mean'))} | {_fmt(r.get('rel_l2'))} |")
    if figures:
        L.append("")
        L.append("## Figures")
        for panel, path in figures.items():
            L.append("")
            L.append(f"### {PANEL_TITLES.get(panel, panel)}")
            L.append("")
            L.append(f"![{PANEL_TITLES.get(panel, panel)}]({path})")
    L.append("")
    return "\n".join(L)


_ACTIVE_STAGES: set = set()
_STAGES_LOCK = threading.Lock()


@contextlib.contextmanager
def staged_dir(out_dir):
    """Write a folder all at once: yields a hidden staging folder next to `out_dir`; when the block
    ends normally its files move into `out_dir`, when it raises (an error, Cancelled, Ctrl+C) the
    staging folder is removed and `out_dir` is left exactly as it was.

    A new or empty `out_dir` is replaced by one rename (atomic); into a folder that already holds
    files, each file moves with os.replace, so every file there is either the old one or the complete
    new one. Nested use on a staging folder yields it unchanged (the outer block commits).
    """
    out = os.path.abspath(str(out_dir))
    with _STAGES_LOCK:
        nested = out in _ACTIVE_STAGES
    if nested:
        yield out
        return
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=f".{os.path.basename(out) or 'report'}.partial-", dir=parent)
    with _STAGES_LOCK:
        _ACTIVE_STAGES.add(stage)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(stage, 0o777 & ~umask)  # mkdtemp makes it 0700; the report folder gets the usual mode
        yield stage
        _commit_stage(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        with _STAGES_LOCK:
            _ACTIVE_STAGES.discard(stage)


def _commit_stage(stage: str, out: str) -> None:
    if not os.path.lexists(out) or (os.path.isdir(out) and not os.listdir(out)):
        try:
            os.rename(stage, out)  # POSIX: replaces an empty folder in one step
            return
        except OSError:
            pass
    for root, _dirs, files in os.walk(stage):
        rel = os.path.relpath(root, stage)
        dest = out if rel == "." else os.path.join(out, rel)
        os.makedirs(dest, exist_ok=True)
        for f in files:
            os.replace(os.path.join(root, f), os.path.join(dest, f))
    shutil.rmtree(stage, ignore_errors=True)


def relocate(paths, stage: str, out_dir: str):
    """The paths `write_report` returned inside a staging folder, as they are after the commit."""
    stage, out = os.path.abspath(stage), os.path.abspath(str(out_dir))

    def one(p):
        if isinstance(p, (list, tuple)):
            return type(p)(one(x) for x in p)
        if isinstance(p, dict):
            return {k: one(v) for k, v in p.items()}
        if isinstance(p, str) and os.path.abspath(p).startswith(stage + os.sep):
            return os.path.join(out, os.path.relpath(os.path.abspath(p), stage))
        return p

    return one(paths)


def write_report(out_dir, res, tables: dict | None = None, figures: dict | None = None, compare_rows=None,
                 sweep_points=None, history=None) -> dict:
    """Write report.json, report.md, csv/<panel>_<table>.csv and trace.json into `out_dir`.

    tables: panel -> [Table] (default: every panel with default selections); figures: panel -> PNG
    path relative to out_dir. Returns {"json", "md", "trace", "csv": [...], "results"} paths.

    Written through `staged_dir`: an error or a cancel part-way leaves no half-written folder.
    """
    with staged_dir(out_dir) as stage:
        paths = _write_report_files(stage, res, tables, compare_rows, sweep_points, history, figures)
    return relocate(paths, stage, out_dir)


def _write_report_files(out_dir, res, tables, compare_rows, sweep_points, history, figures) -> dict:
    if tables is None:
        tables = default_panel_tables(res, compare_rows, sweep_points, history)
    if getattr(res, "timings", None):  # the roofline of the run's kernels (kvviz/bench/roofline.py), SVG + table

        name, rtab = write_roofline(out_dir, res)
        tables = {**tables, "roofline": [rtab]}
        if figures:  # beside the panels' figures (a report without them still has roofline.svg in its folder)
            figures = {**figures, "roofline": name}
    csv_dir = os.path.join(out_dir, "csv")
    os.makedirs(csv_dir, exist_ok=True)
    csvs = []
    for panel, ts in tables.items():
        for t in ts:
            assert isinstance(t, Table)
            csvs.append(t.write_csv(os.path.join(csv_dir, f"{panel}_{t.name}.csv")))
    jpath = os.path.join(out_dir, "report.json")
    with open(jpath, "w") as fh:
        json.dump(report_json(res, tables, figures, compare_rows, sweep_points, history), fh, indent=1, allow_nan=False)
    mpath = os.path.join(out_dir, "report.md")
    with open(mpath, "w") as fh:
        fh.write(report_markdown(res, figures, compare_rows, sweep_points))
    tpath = write_chrome_trace(os.path.join(out_dir, "trace.json"), res)
    rpath = save_results(res, os.path.join(out_dir, RESULTS_FILE),
                         {"compare_rows": compare_rows or [], "sweep_points": sweep_points or []})
    return {"json": jpath, "md": mpath, "trace": tpath, "csv": csvs, "results": rpath}
