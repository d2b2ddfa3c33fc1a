"""The run history (SQLite, across sessions) and run diffs. Qt-free.

`db.HistoryDB`: every `kvviz bench` and every window run with its samples; `diff`: two runs (or bench
JSON files) kernel by kernel, with a verdict from the samples (Mann-Whitney U).
"""
from kvviz.history.db import HistoryDB, HistoryError, KernelRecord, Run, default_path
from kvviz.history.diff import compare_samples, diff, format_diff, load_side

__all__ = ["HistoryDB", "HistoryError", "KernelRecord", "Run", "default_path", "compare_samples", "diff",
           "format_diff", "load_side"]
