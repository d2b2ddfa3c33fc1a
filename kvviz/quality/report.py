"""A quality run's result as strict JSON, CSV (one line per row) and Markdown, and as text lines for the CLI."""
from __future__ import annotations

import csv
import json
import math

import numpy as np

from kvviz.quality import stats as qs
from kvviz.tables import Table, TextColumn, clean, text_table

CSV_COLUMNS = ("spec", "part", "scored_positions", "bits_per_element", "ppl", "ppl_err", "ppl_base", "ppl_base_err",
               "ln_ppl_ratio", "ln_ppl_ratio_err", "kld_mean", "kld_err", "kld_median", "kld_p90", "kld_p95",
               "kld_p99", "kld_p99_9", "kld_max", "same_top", "same_top_err", "dp_rms", "dp_rms_err", "dp_max",
               "cache_path", "forward", "wall_s", "error")
LAYER_CSV_COLUMNS = ("spec", "layer", "kld_mean", "kld_err", "ln_ppl_ratio", "ln_ppl_ratio_err", "same_top",
                     "same_top_err", "attention_error", "error")


def write_json(result: dict, path) -> None:
    with open(path, "w") as f:
        json.dump(clean(result), f, indent=1, allow_nan=False)
        f.write("\n")


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    return v


def write_csv(result: dict, path) -> None:
    """One line per row; with per-layer results, a second table below a blank line."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in result["rows"]:
            w.writerow([_cell(r.get(c)) for c in CSV_COLUMNS])
        if result.get("layers") or _has_layer_error(result):
            w.writerow([])
            w.writerow(LAYER_CSV_COLUMNS)
            for r in layer_rows(result):
                w.writerow([_cell(r.get(c)) for c in LAYER_CSV_COLUMNS])


def _has_layer_error(result: dict) -> bool:
    return any(r.get("layer_error") for r in result["rows"])


def layer_rows(result: dict) -> list[dict]:
    """Per (method, layer): the attention-output error of the K+V run, and the KLD of the layer quantised
    alone where it was measured."""
    alone = {(r["spec"], r["layer"]): r for r in result.get("layers", [])}
    out = []
    for r in result["rows"]:
        if r.get("part") != "kv" or "error" in r and not r.get("layer_error"):
            continue
        for li, e in enumerate(r.get("layer_error") or []):
            d = {"spec": r["spec"], "layer": li, "attention_error": e}
            d.update({k: v for k, v in alone.get((r["spec"], li), {}).items() if k not in ("spec", "layer")})
            out.append(d)
    return out


def fmt_err(v, e, digits: int = 3) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    if e is None or not math.isfinite(e):
        return f"{v:.{digits}g}"
    return f"{v:.{digits}g} ± {e:.2g}"


def pct_cell(v, e, digits: int = 2) -> str:
    """'98.92 ± 0.32' (percent; the value alone without an error)."""
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{100 * v:.{digits}f}" + (f" ± {100 * e:.{digits}f}" if e is not None and math.isfinite(e) else "")


def _pct(v, e) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{100 * v:.2f} ± {100 * e:.2f} %" if e is not None and math.isfinite(e) else f"{100 * v:.2f} %"


def describe(result: dict) -> list[str]:
    """What the run measured, in sentences (the Markdown's head, the CLI's comment lines)."""
    ch, m, b = result["chunking"], result["model"], result["baseline"]
    files = ", ".join(result["text"]["files"])
    t = result["text"]
    used = (f"its first {t['tokens']} of {t['text_tokens']} tokens" if t.get("text_tokens", t["tokens"]) > t["tokens"]
            else f"{t['tokens']} tokens")
    return [
        f"Model {m['file']} ({m['n_layers']} layers, {m['n_heads']}/{m['n_kv_heads']} heads, head size "
        f"{m['head_size']}); text {files} ({used}); {ch['chunks']} chunks of "
        f"{ch['ctx']} tokens, positions {ch['first_scored']}..{ch['ctx'] - 2} of each scored: "
        f"{ch['scored']} scored positions.",
        f"Baseline: the {b['cache']}, " + ("read from its stored distributions" if b.get("reused") else
                                           f"computed in {b.get('wall_s', 0):.0f} s and stored")
        + f" ({b['folder']}); the stored distributions lie {b['kld_floor']:.1e} nats (mean KL) from the exact "
          "ones. Adapter: " + result.get("adapter", "") + "." + _forward(result),
    ]


def _forward(result: dict) -> str:
    """Which forward computed the rows (and the baseline, where another did), as sentences."""
    f = result.get("forward")
    if not f:
        return ""
    out = f" Forward: {f['path']} ({f['reason']})."
    base = (result.get("baseline") or {}).get("forward")
    if base and not base.startswith(f"forward: {f['path']} "):
        out += f" Baseline {base}."  # "Baseline forward: numpy (...)": a stored baseline another forward computed
    return out


MD_HEAD = ("| method | part | bits/el | scored | PPL | ln(PPL/PPL_base) | mean KLD | median KLD | p99 KLD | max KLD | "
           "same top-1 | RMS Δp | attention error |")


def markdown(result: dict) -> str:
    lines = [f"# KV-cache quality on {result['model']['file']}", "", *describe(result), ""]
    if result.get("command"):
        lines += [f"Command: `{result['command']}`", ""]
    lines += [MD_HEAD, "|" + "---|" * (MD_HEAD.count("|") - 1)]
    for r in result["rows"]:
        lines.append(md_row(r))
    stride = result.get("settings", {}).get("error_stride", 16)
    lines += ["", f"Attention error: the relative RMS error of a layer's attention output against float32 attention "
                  f"over the same q, K and V (every {stride}th query), the median over the layers and the worst "
                  "layer; every layer's is in the JSON and CSV."]
    alone = result.get("layers") or []
    if alone:
        specs = list(dict.fromkeys(r["spec"] for r in alone))
        layers = sorted({r["layer"] for r in alone})
        by = {(r["spec"], r["layer"]): r for r in alone}
        lines += ["", "Mean KLD with only one layer's cache quantised (the others f32):", "",
                  "| layer | " + " | ".join(f"`{s}`" for s in specs) + " |", "|---|" + "---|" * len(specs)]
        for li in layers:
            cells = [by.get((s, li), {}) for s in specs]
            lines.append(f"| {li} | " + " | ".join(c.get("error") and "failed" or fmt_err(c.get("kld_mean"),
                                                                                      c.get("kld_err"))
                                                   for c in cells) + " |")
    return "\n".join(lines) + "\n"


def attention_error_cell(r: dict) -> str:
    """'0.0113 (worst 0.0232, layer 19)': the median over the layers and the worst one."""
    e = np.asarray([x if x is not None else np.nan for x in (r.get("layer_error") or [])], np.float64)
    if not e.size or not np.isfinite(e).any():
        return "n/a"
    worst = int(np.nanargmax(e))
    return f"{np.nanmedian(e):.3g} (worst {e[worst]:.3g}, layer {worst})"


def _num(v, f: str) -> str:
    return "n/a" if v is None or not math.isfinite(v) else format(v, f)


def md_row(r: dict) -> str:
    if r.get("error"):
        return f"| `{r['spec']}` | {r.get('part_label', '')} | | | failed: {r['error']} | | | | | | | | |"
    return (f"| `{r['spec']}` | {r['part_label']} | {_num(r.get('bits_per_element'), '.2f')} | "
            f"{r['scored_positions']} | {fmt_err(r['ppl'], r['ppl_err'], 5)} | "
            f"{fmt_err(r['ln_ppl_ratio'], r['ln_ppl_ratio_err'])} | {fmt_err(r['kld_mean'], r['kld_err'])} | "
            f"{_num(r['kld_median'], '.3g')} | {_num(r['kld_p99'], '.3g')} | {_num(r['kld_max'], '.3g')} | "
            f"{_pct(r['same_top'], r['same_top_err'])} | {_pct(r['dp_rms'], r['dp_rms_err'])} | "
            f"{attention_error_cell(r)} |")


TEXT_COLUMNS = (TextColumn("method", min_width=10), TextColumn("part"), TextColumn("bits", True),
                TextColumn("PPL", True), TextColumn("mean KLD", True), TextColumn("p99 KLD", True),
                TextColumn("same top-1 %", True), TextColumn("s", True))


def text_cells(r: dict) -> list:
    if r.get("error"):
        return None
    name = r["spec"] if r.get("layer") is None else f"{r['spec']} (layer {r['layer']} alone)"
    return [name, r["part_label"], _num(r.get("bits_per_element"), ".2f"), fmt_err(r["ppl"], r["ppl_err"], 5),
            fmt_err(r["kld_mean"], r["kld_err"]), _num(r["kld_p99"], ".3g"),
            pct_cell(r["same_top"], r.get("same_top_err")), f"{r.get('wall_s', 0):.0f}"]


def text_lines(result: dict, width) -> list[str]:
    rows, notes = [], []
    for r in result["rows"]:
        cells = text_cells(r)
        if cells is None:
            rows.append([r["spec"], r.get("part_label", ""), "", "", "", "", "", ""])
            notes.append(f"failed: {r['error']}")
        else:
            rows.append(cells)
            notes.append("")
    return text_table(TEXT_COLUMNS, rows, width, notes)


# ------------------------------------------------------------------------------ tables of what the window plots
def rows_table(result: dict) -> Table:
    """One line per row: the Quality panel's table."""
    cols = ["method", "part", "bits_per_element", "scored", "ppl", "ppl_err", "kld_mean", "kld_err", "kld_median",
            "kld_p99", "kld_max", "same_top", "same_top_err", "dp_rms", "dp_rms_err", "error"]
    t = Table("quality", cols, title="KV-cache quality against the f32 paged cache")
    for r in result.get("rows", []):
        t.rows.append([r["spec"], r.get("part_label", ""), r.get("bits_per_element"), r.get("scored_positions"),
                       *(r.get(k) for k in cols[4:-1]), r.get("error", "")])
    return t


def histogram_table(result: dict) -> Table:
    """The KLD distribution of each K+V row: count per log10 bin (bin = its lower edge)."""
    t = Table("kld_distribution", ["method", "log10_kld_from", "log10_kld_to", "count"],
              title="per-position KLD, counts on log10 bins (below / above the range: the first / last line)")
    for r in _ok(result):
        h = r.get("kld_histogram")
        if not h:
            continue
        edges = qs.histogram_edges(h)
        t.rows.append([r["spec"], None, float(edges[0]), h["below"]])
        t.rows += [[r["spec"], float(a), float(b), int(c)] for a, b, c in zip(edges[:-1], edges[1:], h["counts"])]
        t.rows.append([r["spec"], float(edges[-1]), None, h["above"]])
    return t


def position_table(result: dict) -> Table:
    t = Table("kld_by_position", ["method", "position_from", "position_to", "count", "kld_mean", "kld_err"],
              title="mean KLD against the position in the chunk")
    for r in _ok(result):
        for b in (r.get("kld_by_position") or {}).get("bins", []):
            t.rows.append([r["spec"], b["from"], b["to"], b["count"], b["kld_mean"], b["kld_err"]])
    return t


def layer_table(result: dict) -> Table:
    t = Table("layers", ["method", "layer", "attention_error", "kld_alone", "kld_alone_err"],
              title="per layer: attention-output error, and the KLD with only that layer quantised")
    for r in layer_rows(result):
        t.rows.append([r["spec"], r["layer"], r.get("attention_error"), r.get("kld_mean"), r.get("kld_err")])
    return t


def pareto_table(result: dict) -> Table:
    t = Table("bits_vs_kld", ["method", "bits_per_element", "kld_mean", "kld_err", "on_front"],
              title="bits per element against mean KLD (K+V rows); on_front: no other row has fewer bits and a "
                    "lower KLD")
    ok = [r for r in _ok(result) if r.get("bits_per_element") is not None and r.get("kld_mean") is not None]
    for r in ok:
        beaten = any(o is not r and o["bits_per_element"] <= r["bits_per_element"] and o["kld_mean"] <= r["kld_mean"]
                     and (o["bits_per_element"] < r["bits_per_element"] or o["kld_mean"] < r["kld_mean"]) for o in ok)
        t.rows.append([r["spec"], r["bits_per_element"], r["kld_mean"], r["kld_err"], not beaten])
    return t


def _ok(result: dict) -> list:
    return [r for r in result.get("rows", []) if not r.get("error") and r.get("part") == "kv"]
