"""Tables of exactly what each panel plots, built from `Results` (Qt-free).

The window's panels draw from these tables and export them as CSV; `kvviz report` writes the same
tables headless, so a CSV row is always one plotted point (one bar, one cell, one curve sample).
"""
from __future__ import annotations

import csv
import math
import re
import shutil
import sys
import textwrap
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Table:
    """A named table: column names and rows of plain Python values. `units` names the unit of a column whose
    name does not already end with it (kl: "nats"); the CSV header then says it (`kl_nats`)."""

    name: str
    columns: list
    rows: list = field(default_factory=list)
    title: str = ""
    units: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> np.ndarray:
        i = self.columns.index(name)
        return np.asarray([r[i] for r in self.rows])

    def to_json(self) -> dict:
        return {"title": self.title, "columns": list(self.columns), "rows": [[clean(v) for v in r] for r in self.rows]}

    def headers(self) -> list:
        """The CSV header: each column's name with its unit where `units` gives one."""
        return [header_name(c, self.units.get(c, "")) for c in self.columns]

    def write_csv(self, path) -> str:
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(self.headers())
            for r in self.rows:
                w.writerow([_csv_value(v) for v in r])
        return str(path)


def clean(v):
    """A JSON-safe plain value: numpy scalars -> Python, NaN/Inf -> None."""
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if math.isfinite(v) else None
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.ndarray):
        return [clean(x) for x in v.tolist()]
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    return v


def header_name(column: str, unit: str) -> str:
    """`column` with its unit appended (kl, "nats" -> kl_nats) unless its name already ends with it."""
    if not unit or column.endswith(f"_{unit}") or column == unit:
        return column
    return f"{column}_{unit}"


def csv_float(v: float) -> str:
    """A float as a CSV cell: the shortest text that reads back as exactly this double (repr; Python, numpy,
    pandas and spreadsheets parse it). Times carry no float noise to begin with (kvviz.gpu.timing rounds
    them to the picosecond)."""
    return repr(float(v))


def _csv_value(v):
    """A CSV cell: a missing or non-finite number is an empty cell (spreadsheets and pandas read it as
    missing; 'nan' is not a number there); a float is `csv_float`."""
    if v is None:
        return ""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (float, np.floating)):
        return csv_float(v) if math.isfinite(float(v)) else ""
    if isinstance(v, np.integer):
        return int(v)
    return v


# ----------------------------------------------------------------------------- cache layout
def block_pool_table(res, columns: int | None = None) -> Table:
    """One row per physical block: where its cell sits in the grid, owner, logical index, tokens used."""
    batch = res.batch
    owner = batch.block_owner()
    fill = batch.block_fill()
    logical = np.full(batch.num_blocks, -1, dtype=np.int64)
    for s, blocks in enumerate(batch.seq_blocks):
        for i, b in enumerate(blocks):
            logical[int(b)] = i
    cols = columns or grid_columns(batch.num_blocks)
    rows = []
    for b in range(batch.num_blocks):
        rows.append([b, b // cols, b % cols, int(owner[b]), int(logical[b]), int(fill[b]), int(batch.block_size)])
    return Table("blocks", ["block", "grid_row", "grid_col", "sequence", "logical_index", "tokens_used", "block_size"],
                 rows, "Physical block pool (sequence -1 = free)")


def grid_columns(num_blocks: int, aspect: float = 2.0) -> int:
    """Columns of the block grid for a view `aspect` (width / height) times as wide as tall, 8..128."""
    aspect = min(12.0, max(0.5, float(aspect)))
    return int(min(128, max(8, math.ceil(math.sqrt(aspect * max(1, num_blocks))))))


def block_table_table(res) -> Table:
    """Each sequence's block table (logical -> physical), one row per used entry."""
    batch = res.batch
    rows = []
    for s, blocks in enumerate(batch.seq_blocks):
        n = int(batch.context_lens[s])
        for i, b in enumerate(blocks):
            rows.append([s, i, int(b), int(min(batch.block_size, n - i * batch.block_size))])
    return Table("block_tables", ["sequence", "logical_index", "physical_block", "tokens_used"], rows,
                 "Block tables: logical block -> physical block")


# ----------------------------------------------------------------------------------- scales
def _per_token(arr: np.ndarray, rows: np.ndarray, kv_head: int, num_tokens: int):
    """Per-token scale values of one KV head for the given token rows, and a note on the reduction."""
    a = np.asarray(arr)
    if a.ndim == 0 or a.size == 1:
        return np.full(len(rows), float(a.reshape(-1)[0]) if a.size else float("nan")), "one scale for the whole tensor"
    if a.shape[0] != num_tokens:
        flat = a.reshape(-1).astype(np.float64)
        return np.full(len(rows), float(np.mean(flat))), f"scales are not per token (shape {tuple(a.shape)}): mean shown"
    a = a[rows]
    if a.ndim >= 2:
        a = a[:, min(kv_head, a.shape[1] - 1)]
    note = ""
    if a.ndim > 1:
        note = f"mean of {int(np.prod(a.shape[1:]))} group scales per token"
        a = a.reshape(len(rows), -1).astype(np.float64).mean(axis=1)
    return a.astype(np.float64), note


def token_scales_table(res, seq: int, kv_head: int) -> Table:
    """Per-token K and V scale vs position for one sequence and KV head (token-row order)."""
    batch = res.batch
    rows = batch.token_rows(seq)
    pos = batch.token_pos[rows]
    ks, kn = _per_token(res.qkv.k_scales, rows, kv_head, batch.num_tokens)
    vs, vn = _per_token(res.qkv.v_scales, rows, kv_head, batch.num_tokens)
    # rows a method keeps unquantised (KIVI's float32 window of recent tokens) have no scale: missing, not 0
    kept = np.asarray((getattr(res.qkv, "extra", None) or {}).get("residual", []), bool)
    if kept.shape == (batch.num_tokens,) and kept[rows].any():
        ks, vs = np.where(kept[rows], np.nan, ks), np.where(kept[rows], np.nan, vs)
        kn = f"no scale for the {int(kept[rows].sum())} recent tokens kept in float32"
    note = "; ".join(sorted({n for n in (kn, vn) if n}))
    t = Table("scales", ["position", "k_scale", "v_scale"],
              [[int(p), float(k), float(v)] for p, k, v in zip(pos, ks, vs)],
              f"Per-token scales, sequence {seq}, KV head {kv_head}" + (f" ({note})" if note else ""))
    return t


def channel_amax_table(res, which: str) -> Table:
    """Per-channel max |x| of K or V, one row per heatmap cell (sequence, KV head, channel)."""
    a = np.asarray(res.k_channel_amax if which == "K" else res.v_channel_amax, np.float64)
    S, H, D = a.shape
    rows = [[s, h, d, float(a[s, h, d])] for s in range(S) for h in range(H) for d in range(D)]
    return Table(f"channel_amax_{which}", ["sequence", "kv_head", "channel", "amax"], rows,
                 f"Per-channel max |{which}| over each sequence's tokens")


# ------------------------------------------------------------------------------------ codes
def code_hist_table(res) -> Table:
    """K and V code counts, one row per bar pair: every representable code (zero counts included) at
    its bin (the integer code, or a float code's index among the format's values) with its value."""
    k, v = res.k_stats, res.v_stats
    vals = np.union1d(np.asarray(k.bin_values, np.float64), np.asarray(v.bin_values, np.float64))
    kmap = {float(a): int(b) for a, b in zip(np.asarray(k.bin_values, np.float64), k.counts)}
    vmap = {float(a): int(b) for a, b in zip(np.asarray(v.bin_values, np.float64), v.counts)}
    integral = k.axis == "code" and v.axis == "code"
    rows = [[int(x) if integral else i, int(x) if integral else float(x), kmap.get(float(x), 0), vmap.get(float(x), 0)]
            for i, x in enumerate(vals)]
    return Table("codes", ["bin", "code", "k_count", "v_count"], rows,
                 "Code histogram over real tokens (one row per representable code)")


def code_stats_table(res) -> Table:
    """The method's code statistics (KVMethod.code_statistics), each with its definition."""
    k, v = res.k_stats, res.v_stats
    names = list(k.stats) + [n for n in v.stats if n not in k.stats]
    rows = []
    for name in names:
        st = k.stats.get(name) or v.stats.get(name)
        kv = [float(x.stats[name].value) if name in x.stats else float("nan") for x in (k, v)]
        rows.append([name, st.label, kv[0], kv[1], st.unit, st.definition])
    rows.append(["total", "codes counted", int(k.total), int(v.total), "count", "codes over the real tokens the statistics count"])
    lo, hi = res.qkv.code_range
    rows.append(["code_min", "smallest code", float(lo), float(lo), "value", "smallest representable code"])
    rows.append(["code_max", "largest code", float(hi), float(hi), "value", "largest representable code"])
    return Table("code_stats", ["stat", "label", "K", "V", "unit", "definition"], rows, "Code statistics")


# -------------------------------------------------------------------------------- attention
METRIC_NAMES = ("max_weight_err", "kl", "cosine", "rel_l2", "topk_overlap")


def attention_weights_table(res, seq: int, head: int) -> Table:
    """f32 and quantised attention weights over positions of one sequence and query head."""
    n = int(res.batch.context_lens[seq])
    wr = np.asarray(res.w_ref[seq, head, :n], np.float64)
    wq = np.asarray(res.w_q[seq, head, :n], np.float64)
    rows = [[i, float(a), float(b), float(b - a)] for i, (a, b) in enumerate(zip(wr, wq))]
    return Table("weights", ["position", "w_f32", "w_quant", "diff"], rows,
                 f"Attention weights, sequence {seq}, query head {head} (softmax probabilities; diff = w_quant - w_f32)")


def head_metrics_table(res) -> Table:
    m = res.metrics
    S, H = m.kl.shape
    rows = [[s, h] + [float(getattr(m, k)[s, h]) for k in METRIC_NAMES] for s in range(S) for h in range(H)]
    return Table("head_metrics", ["sequence", "head", "max_weight_err", "kl", "cosine", "rel_l2", f"top{m.k}_overlap"],
                 rows, "Attention error per (sequence, query head): KL(f32 || quantised) of the weights in nats, "
                 "max |weight error|, cosine of the outputs, relative L2 error of the output, top-k overlap (fraction)",
                 {"kl": "nats"})


# ----------------------------------------------------------------------------------- timing
def timing_key(row) -> str:
    return f"{row.kernel} [{row.variant}]"


def timings_table(res, pinned: dict | None = None) -> Table:
    """One row per timed kernel (one bar in the bandwidth chart); delta vs a pinned run if given."""
    rows = []
    for t in res.timings:
        ref = (pinned or {}).get(timing_key(t))
        delta = 100.0 * (t.timing.median_us - ref) / ref if ref else float("nan")
        rows.append([t.kernel, t.variant, t.timing.median_us, t.timing.min_us, t.timing.p90_us,
                     len(t.timing.samples_us), int(t.bytes_moved), t.gbps, t.pct_of_copy, t.timing.method, delta])
    return Table("timings", ["kernel", "variant", "median_us", "min_us", "p90_us", "runs", "bytes", "gbps",
                             "pct_of_copy", "timing_method", "delta_vs_pin_pct"], rows,
                 "Kernel timings (median of runs, min-p90; gbps: GB/s = unique bytes / median, 1 GB = 1e9 bytes)")


def history_entry(res, index: int) -> dict:
    """What the history of runs keeps of one compute."""
    return {
        "run": index,
        "method": res.method.id,
        "context_lens": [int(x) for x in res.batch.context_lens],
        "heads": f"{res.config.num_heads}/{res.config.num_kv_heads}x{res.config.head_size}",
        "kl_mean": float(res.metrics.kl.mean()),
        "copy_gbps": float(res.copy_gbps),
        "medians": {timing_key(t): float(t.timing.median_us) for t in res.timings},
        "elapsed_s": float(res.elapsed_s),
    }


def history_table(entries) -> Table:
    """One row per (run, kernel): the median of every kernel in every run of the window."""
    rows = []
    for e in entries:
        for k, us in e["medians"].items():
            rows.append([e["run"], e["method"], e["heads"], ",".join(map(str, e["context_lens"])), k, us])
    return Table("history", ["run", "method", "shape", "context_lens", "kernel", "median_us"], rows,
                 "History of runs (median GPU time per kernel)", {"context_lens": "tokens"})


_PARTITIONS = re.compile(r" \(\d+ partitions?\)$")


def series_name(kernel: str) -> str:
    """A kernel's name without what a sweep point chooses for it: the fast decode's partition count (one
    series per kernel across a sweep, not one per partition count)."""
    return _PARTITIONS.sub("", str(kernel))


def partitions_of(kernel: str) -> int | None:
    m = re.search(r"\((\d+) partitions?\)$", str(kernel))
    return int(m.group(1)) if m else None


def sweep_table(points) -> Table:
    """One row per plotted sweep point (value, kernel)."""
    nan = float("nan")
    rows = []
    for p in points or []:
        rows.append([p["param"], p["value"], p["tokens"], "paged_attn_f32 (baseline)", p["baseline_us"],
                     nan, p.get("baseline_p90_us", nan), p["baseline_bytes"], p.get("baseline_p10_us", nan)])
        for name, k in p["method_kernels"].items():
            rows.append([p["param"], p["value"], p["tokens"], name, k["median_us"], k["min_us"], k["p90_us"], k["bytes"],
                         k.get("p10_us", nan)])
    return Table("sweep", ["param", "value", "tokens", "kernel", "median_us", "min_us", "p90_us", "bytes", "p10_us"], rows,
                 "Latency sweep (p10-p90: the spread of the timed runs)")


# ---------------------------------------------------------------------------------- compare
COMPARE_COLUMNS = ("name", "method", "options", "label", "bits_per_element", "kl_mean", "rel_l2")
COMPARE_TEXT = ("name", "method", "options", "label", "decode_impl", "error")
# the units of compare_methods' keys whose names do not say them (kvviz/analysis/compare.py)
COMPARE_UNITS = {"kl_mean": "nats", "kl_max": "nats"}


def options_text(options) -> str:
    """A method's options as one cell: "bits=2; qjl_scale=unbiased" (sorted by name)."""
    return "; ".join(f"{k}={v}" for k, v in sorted(dict(options or {}).items()))


def compare_name(row) -> str:
    """A comparison row's name: the method with the options that tell it from the method's other rows
    (compare_methods' "name", e.g. `turboquant qjl_scale=unbiased`); the key and every option without one."""
    if row.get("name"):
        return str(row["name"])
    opts = options_text({k: v for k, v in dict(row.get("options") or {}).items() if k != "context_len"})
    return f"{row.get('method', '')} {opts.replace('; ', ' ')}".strip()


def compare_table(rows) -> Table:
    """Method comparison: one row per method and options (one scatter point); every key the rows carry, the
    options as one text column."""
    rows = list(rows or [])
    cols = list(COMPARE_COLUMNS)
    for r in rows:
        for k in r:
            if k not in cols and not isinstance(r[k], (dict, list, tuple, np.ndarray)):
                cols.append(k)

    def cell(r, c):
        if c == "name":
            return compare_name(r)
        if c == "options":
            return options_text(r.get("options"))
        return r.get(c, "") if c in COMPARE_TEXT else r.get(c, float("nan"))

    return Table("compare", cols, [[cell(r, c) for c in cols] for r in rows],
                 "Method comparison on the same K/V (KL in nats)", {c: u for c, u in COMPARE_UNITS.items() if c in cols})


# ----------------------------------------------------------------------------- defaults
def default_panel_tables(res, compare_rows=None, sweep_points=None, history=None) -> dict:
    """Every panel's tables with default selections (sequence 0, head 0): what `kvviz report` writes."""
    out = {
        "cache_layout": [block_pool_table(res), block_table_table(res)],
        "scales": [token_scales_table(res, 0, 0), channel_amax_table(res, "K"), channel_amax_table(res, "V")],
        "codes": [code_hist_table(res), code_stats_table(res)],
        "attention": [attention_weights_table(res, 0, 0), head_metrics_table(res)],
        "timing": [timings_table(res), history_table(history or [history_entry(res, 1)])],
    }
    if sweep_points:
        out["timing"].append(sweep_table(sweep_points))
    if compare_rows:
        out["compare"] = [compare_table(compare_rows)]
    return out


# ------------------------------------------------------------------------------- text tables
WIDTH = 100  # columns of the CLI's text tables unless --wide (also when stdout is not a terminal: deterministic)
ELLIPSIS = "..."
WIDE_HELP = f"print every table cell whole (default: lines of at most {WIDTH} characters, long text shortened)"


def text_width(wide: bool = False) -> int | None:
    """The width the CLI prints its tables in: None (every cell whole) when `wide`, else WIDTH, or a narrower
    terminal's width; never more than WIDTH, so output piped to a file is the same on every terminal."""
    if wide:
        return None
    if sys.stdout.isatty():
        return max(40, min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns))
    return WIDTH


def shorten(text, width: int) -> str:
    """`text` in at most `width` characters: the start and the end kept, the middle cut with '...'."""
    text = str(text)
    if len(text) <= width:
        return text
    if width <= len(ELLIPSIS):
        return text[:max(0, width)]
    keep = width - len(ELLIPSIS)
    head = (keep + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head):]


def wrap(text, width: int, indent: str = "") -> list[str]:
    """`text` wrapped into lines of at most `width` characters, each after `indent` (a word longer than a line
    is broken)."""
    return textwrap.wrap(str(text), width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=True, break_on_hyphens=False) or [indent.rstrip()]


@dataclass(frozen=True)
class TextColumn:
    """A column of a text table: numbers are right-aligned; a text column with `min_width` may be
    shortened (middle ellipsis) down to that width when the table is too wide."""

    name: str
    numeric: bool = False
    min_width: int = 0


def fit_widths(columns, natural, width: int | None) -> list:
    """Column widths: the `natural` ones (the longest cell), the widest shortenable text column cut one
    character at a time until the row (single spaces between columns) fits `width` (None: no limit)."""
    w = list(natural)
    if width is None:
        return w
    total = sum(w) + len(w) - 1
    while total > width:
        cands = [i for i, c in enumerate(columns) if c.min_width and w[i] > c.min_width]
        if not cands:
            break
        i = max(cands, key=lambda j: (w[j] - columns[j].min_width, j))
        w[i] -= 1
        total -= 1
    return w


def text_row(cells, columns, widths) -> str:
    """One line of a text table: every cell in its column's width (a longer text cell shortened)."""
    out = []
    for cell, col, w in zip(cells, columns, widths):
        s = str(cell)
        if len(s) > w:
            s = shorten(s, w)
        out.append(f"{s:>{w}}" if col.numeric else f"{s:<{w}}")
    return " ".join(out).rstrip()


def text_table(columns, rows, width: int | None = WIDTH, notes=None, whole_note=None) -> list:
    """A text table as lines: header and rows, numbers right-aligned, columns aligned; with a `width` the long
    text cells are shortened in the middle so each line fits it (width None: every cell whole, as --wide).

    `notes` (one per row, or None): a line of text under its row, shortened to the width, or wrapped over
    several lines where `whole_note(note)` is true; with width None it follows the row on the same line."""
    cells = [[str(c) for c in r] for r in rows]
    natural = [max([len(c.name)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    widths = fit_widths(columns, natural, width)
    lines = [text_row([c.name for c in columns], columns, widths)]
    for n, r in enumerate(cells):
        line = text_row(r, columns, widths)
        note = notes[n] if notes else ""
        if note and width is None:
            lines.append(f"{line}  {note}")
            continue
        lines.append(line)
        if note:
            lines += wrap(note, width, "    ") if whole_note and whole_note(note) else ["    " + shorten(note, width - 4)]
    return lines


def grouped_table(columns, rows, groups, width: int | None = WIDTH, notes=None, whole_note=None) -> list:
    """text_table with a line naming each row's group (`groups`, one per row: a kernel's variant) above the first
    row of a run of rows of that group, so that no column is spent on it; wrapped to `width`."""
    table = text_table(columns, rows, width, notes, whole_note)
    lines, body, group = [table[0]], iter(table[1:]), object()
    line = next(body, None)
    for g in groups:
        if g != group:
            group = g
            lines += ["  " + ln.lstrip() if i else "- " + ln for i, ln in enumerate(paragraph(str(g), width and width - 2))]
        lines.append(line)
        line = next(body, None)
        while line is not None and line.startswith("    "):  # the row's note
            lines.append(line)
            line = next(body, None)
    return lines


def paragraph(text, width: int | None = WIDTH) -> list:
    """A line of prose wrapped to `width` (None: one line)."""
    return [text] if width is None else wrap(text, width)
