"""Reports without Qt: panel tables (CSV), report.json / report.md, Chrome traces, `kvviz report`.

Nothing here imports PySide6 or pyqtgraph; the figures come from kvviz.ui when it is importable.
"""
