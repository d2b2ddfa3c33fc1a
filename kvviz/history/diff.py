"""`kvviz diff A B` and the window's compare view: two runs, kernel by kernel, with a verdict.

Qt-free. A and B are run ids of the history or bench JSON files (`kvviz bench --json`). Kernels are
matched by name, variant and shape (when each side has a single shape, by name and variant, and a
shape difference is reported). For each pair: both medians and their p10-p90 spreads, the change of
the median, and a verdict decided from the samples themselves:

  Mann-Whitney U test, two-sided, at ALPHA = 0.01, on B's samples against A's (exact distribution for
  small samples without ties, the normal approximation with the tie correction otherwise). "faster"
  or "slower" when the test rejects "same distribution" (the direction from the U statistic: are
  B's samples mostly below A's), "within noise" when it does not. There is no fixed-% threshold: a
  1% change with tight samples can be real, a 20% change with wide ones may not be. Too few samples
  to ever reach ALPHA (3 against 3) is said, and reads "within noise".
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kvviz.errors import InvalidInput
from kvviz.history.db import HistoryDB, KernelRecord, Run, kernel_from_row, shape_label
from kvviz.tables import WIDTH, TextColumn, grouped_table, paragraph, text_table

ALPHA = 0.01
TEST_NAME = f"Mann-Whitney U, two-sided, alpha {ALPHA}"
FASTER, SLOWER, NOISE = "faster", "slower", "within noise"


@dataclass(frozen=True)
class Verdict:
    verdict: str
    p_value: float
    n_a: int
    n_b: int
    note: str = ""


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based) with ties sharing the mean rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), np.float64)
    xs = x[order]
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


@lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> tuple:
    """How many arrangements give each U = 0..n*m for samples of n and m without ties."""
    # f(n, m, u) = f(n-1, m, u-m) + f(n, m-1, u): build up row by row
    table = {}
    for i in range(n + 1):
        for j in range(m + 1):
            if i == 0 or j == 0:
                c = np.zeros(i * j + 1, np.float64)
                c[0] = 1.0
            else:
                c = np.zeros(i * j + 1, np.float64)
                a = table[(i - 1, j)]
                c[j:j + len(a)] += a
                b = table[(i, j - 1)]
                c[:len(b)] += b
            table[(i, j)] = c
    return tuple(table[(n, m)])


def mann_whitney(a, b) -> tuple[float, float]:
    """(U of b below a, two-sided p). U counts pairs (a_i, b_j) with b_j < a_i (ties count 1/2)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    n, m = len(a), len(b)
    r = _ranks(np.concatenate([a, b]))
    u_a = float(r[:n].sum() - n * (n + 1) / 2.0)  # pairs where a is above b: b faster
    ties = len(np.unique(np.concatenate([a, b]))) < n + m
    if not ties and n * m <= 400:
        counts = np.asarray(_u_counts(n, m))
        total = counts.sum()
        k = int(round(u_a))
        lo = counts[:k + 1].sum() / total
        hi = counts[k:].sum() / total
        return u_a, float(min(1.0, 2.0 * min(lo, hi)))
    mu = n * m / 2.0
    _, tc = np.unique(np.concatenate([a, b]), return_counts=True)
    N = n + m
    var = n * m / 12.0 * ((N + 1) - float((tc ** 3 - tc).sum()) / (N * (N - 1)))
    if var <= 0:
        return u_a, 1.0  # every sample equal
    z = (abs(u_a - mu) - 0.5) / math.sqrt(var)
    return u_a, float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0))))


def min_p_value(n: int, m: int) -> float:
    """The smallest two-sided p the exact test can give for n and m samples."""
    return 2.0 / math.comb(n + m, n) if n and m else 1.0


def compare_samples(a, b, alpha: float = ALPHA) -> Verdict:
    """Is B faster, slower, or within noise of A? (see the module doc)"""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return Verdict(NOISE, math.nan, n, m, "no samples on one side")
    u, p = mann_whitney(a, b)
    note = ""
    if min_p_value(n, m) > alpha:
        note = f"too few samples ({n} and {m}) to tell a difference at alpha {alpha}"
    if p < alpha:
        return Verdict(FASTER if u > n * m / 2.0 else SLOWER, p, n, m, note)
    return Verdict(NOISE, p, n, m, note)


# ------------------------------------------------------------------------------- loading runs
@dataclass(frozen=True)
class Side:
    """One side of a diff: what it is called and its timed kernels."""

    name: str
    adapter: str
    kernels: tuple  # KernelRecord


def load_side(spec: str, db_path=None) -> Side:
    """A run id (digits) of the history, or a bench JSON file."""
    s = str(spec).strip()
    if s.isdigit() and not os.path.exists(s):
        with HistoryDB(db_path, readonly=True) as db:
            run = db.run(int(s))
        return side_of_run(run)
    if not os.path.exists(s):
        raise InvalidInput(f"{spec!r} is neither a run id nor a file", "Give a run id from `kvviz runs list` or a "
                           "JSON file written by `kvviz bench --json`.")
    try:
        with open(s) as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {s}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{s} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
                           "Give a file written by `kvviz bench --json`.") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise InvalidInput(f"{s} is not a bench result (no 'rows' list)", "Give a file written by `kvviz bench --json`.")
    kernels = []
    for i, r in enumerate(data["rows"]):
        if not isinstance(r, dict) or "kernel" not in r:
            raise InvalidInput(f"{s}: row {i} is not a bench row (no 'kernel')")
        if r.get("samples_us"):
            try:
                kernels.append(kernel_from_row(r))
            except (TypeError, ValueError) as exc:
                raise InvalidInput(f"{s}: row {i} ({r.get('kernel')}) has unreadable samples: {exc}") from None
    if not kernels:
        raise InvalidInput(f"{s} holds no timed kernels (no row has samples_us)",
                           "Bench files from before samples were kept cannot be compared.")
    adapter = data.get("adapter") or {}
    return Side(os.path.basename(s), str(adapter.get("name", "")) if isinstance(adapter, dict) else "", tuple(kernels))


def side_of_run(run: Run) -> Side:
    return Side(f"run {run.id}", run.adapter_name, tuple(run.kernels))


# ------------------------------------------------------------------------------------ the diff
def _stats(k: KernelRecord) -> dict:
    return {"median_us": k.median_us, "p10_us": k.p10_us, "p90_us": k.p90_us, "runs": len(k.samples_us),
            "source_hash": k.source_hash}


def diff(a: Side, b: Side, alpha: float = ALPHA) -> dict:
    """Kernel by kernel comparison of B against A (plain, JSON-ready dict)."""
    shapes_a = list(dict.fromkeys(k.shape_key for k in a.kernels))
    shapes_b = list(dict.fromkeys(k.shape_key for k in b.kernels))
    across = len(shapes_a) == 1 and len(shapes_b) == 1
    notes = []
    if across and shapes_a != shapes_b:
        notes.append(f"the shapes differ: A {shape_label(a.kernels[0].shape)}; B {shape_label(b.kernels[0].shape)}")
    if a.adapter and b.adapter and a.adapter != b.adapter:
        notes.append(f"the adapters differ: A {a.adapter}; B {b.adapter}")

    def key(k: KernelRecord):
        return (k.name, k.variant) if across else (k.shape_key, k.name, k.variant)

    ka = {}
    for k in a.kernels:
        ka.setdefault(key(k), k)
    kb = {}
    for k in b.kernels:
        kb.setdefault(key(k), k)
    rows, only_a, only_b = [], [], []
    for k, x in ka.items():
        y = kb.get(k)
        if y is None:
            only_a.append({"kernel": x.name, "variant": x.variant, "shape": shape_label(x.shape)})
            continue
        v = compare_samples(x.samples_us, y.samples_us, alpha)
        ma, mb = x.median_us, y.median_us
        rows.append({
            "kernel": x.name, "variant": x.variant, "shape": shape_label(y.shape),
            "a": _stats(x), "b": _stats(y),
            "change_pct": 100.0 * (mb - ma) / ma if ma > 0 else None,
            "p_value": v.p_value, "verdict": v.verdict, "note": v.note,
            "source_changed": (x.source_hash != y.source_hash) if (x.source_hash and y.source_hash) else None,
        })
    for k, y in kb.items():
        if k not in ka:
            only_b.append({"kernel": y.name, "variant": y.variant, "shape": shape_label(y.shape)})
    counts = {v: sum(r["verdict"] == v for r in rows) for v in (FASTER, SLOWER, NOISE)}
    return {"a": {"name": a.name, "adapter": a.adapter}, "b": {"name": b.name, "adapter": b.adapter},
            "test": TEST_NAME if alpha == ALPHA else f"Mann-Whitney U, two-sided, alpha {alpha}",
            "rows": rows, "only_in_a": only_a, "only_in_b": only_b, "counts": counts, "notes": notes}


DIFF_COLUMNS = (TextColumn("kernel", min_width=16), TextColumn("A median (p10-p90) us", True),
                TextColumn("B median (p10-p90) us", True), TextColumn("change", True), TextColumn("p", True),
                TextColumn("verdict"))
WIDE_DIFF_COLUMNS = DIFF_COLUMNS[:1] + (TextColumn("variant"),) + DIFF_COLUMNS[1:]


def format_diff(d: dict, width: int | None = WIDTH) -> str:
    """The comparison as text: one table per shape, lines of at most `width` characters (a kernel's variant on a
    line above its rows, long kernel names shortened in the middle, a row's note under it); width None: a
    variant column and every cell whole."""
    lines = [f"A: {d['a']['name']} ({d['a']['adapter'] or 'adapter unknown'})",
             f"B: {d['b']['name']} ({d['b']['adapter'] or 'adapter unknown'})",
             f"verdict: {d['test']} on each kernel's timed samples (B against A)"]
    lines += [f"note: {n}" for n in d["notes"]]
    lines = [p for line in lines for p in paragraph(line, width)]

    def us(x):
        return f"{x:,.1f}" if width is None else f"{x:.0f}" if abs(x) >= 1000 else f"{x:.1f}"

    def stat(s):
        return f"{us(s['median_us'])} ({us(s['p10_us'])}-{us(s['p90_us'])})"

    shapes = {}  # shape -> (rows, variants, notes), in the rows' order
    for r in d["rows"]:
        rows, variants, notes = shapes.setdefault(r["shape"], ([], [], []))
        ch = "-" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%"
        rows.append([r["kernel"]] + ([r["variant"]] if width is None else [])
                    + [stat(r["a"]), stat(r["b"]), ch, f"{r['p_value']:.2g}", r["verdict"]])
        variants.append(r["variant"])
        notes.append("; ".join(x for x in (r["note"], "source changed" if r["source_changed"] else "") if x))
    for shape, (rows, variants, notes) in shapes.items():
        lines += ["", f"== {shape}"] + (text_table(WIDE_DIFF_COLUMNS, rows, None, notes) if width is None else
                                        grouped_table(DIFF_COLUMNS, rows, variants, width, notes))
    for side, key in (("A", "only_in_a"), ("B", "only_in_b")):
        if d[key]:
            lines.append("")
            lines += paragraph(f"only in {side}: " + ", ".join(f"{x['kernel']} [{x['variant']}]" for x in d[key]), width)
    c = d["counts"]
    lines += ["", f"{c[FASTER]} faster, {c[SLOWER]} slower, {c[NOISE]} within noise"]
    return "\n".join(lines)
