"""Block inspector (RenderDoc buffer-viewer spirit): one physical block of the quantised cache.

Tokens x words as raw hex (what sits in GPU memory), the fields the method decodes from them
(`Session.inspect_block` -> [TokenRecord]) and the method's layout described as data (fields,
widths, bytes per token, bits per element, word map) from `Results.layouts`.
"""
from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView, QComboBox, QLabel, QSpinBox, QSplitter, QTableWidget, QTableWidgetItem, QTabWidget, QTextBrowser,
)

from kvviz.tables import Table
from kvviz.ui.panels.base import Panel


def fmt_value(v) -> str:
    a = np.asarray(v)
    if a.ndim == 0:
        x = a.item()
        return f"{x:.7g}" if isinstance(x, float) else str(x)
    if a.dtype.kind == "f":
        return " ".join(f"{x:.5g}" for x in a.reshape(-1))
    return " ".join(str(int(x)) for x in a.reshape(-1))


def layout_html(lay) -> str:
    rows = "".join(
        f"<tr><td><b>{html.escape(f.name)}</b></td><td>{html.escape(f.dtype)}</td><td align=right>{f.bits}</td>"
        f"<td align=right>{f.count}</td><td align=right>{f.total_bits}</td><td>{html.escape(f.per)}</td>"
        f"<td>{html.escape(f.note)}</td></tr>"
        for f in lay.fields
    )
    wm = "<br>".join(html.escape(x) for x in lay.word_map.splitlines()) if lay.word_map else "-"
    return (
        f"<p><b>{html.escape(lay.which)} cache of {html.escape(lay.method)}</b>: "
        f"{lay.bytes_per_token_per_head:g} bytes per token per KV head, "
        f"<b>{lay.bits_per_element:.3f} bits per element</b> (head size {lay.head_size}).</p>"
        f"<table border=1 cellspacing=0 cellpadding=3>"
        f"<tr><th>field</th><th>dtype</th><th>bits</th><th>count</th><th>total bits</th><th>per</th><th>note</th></tr>"
        f"{rows}</table><p><b>Word map:</b> <tt>{wm}</tt></p><p>{html.escape(lay.description)}</p>"
    )


class BlockInspectorPanel(Panel):
    key = "block_inspector"
    title = "Block inspector"

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.records = []
        self.shown = None  # (block, kv_head, which) of the records shown
        self.words_table = None
        self.fields_table = None
        self.block = QSpinBox()
        self.block.setPrefix("block ")
        self.block.setKeyboardTracking(False)
        self.which = QComboBox()
        self.which.addItems(["K", "V"])
        self.kv_head = QSpinBox()
        self.kv_head.setPrefix("KV head ")
        self.kv_head.setKeyboardTracking(False)
        for w in (self.block, self.which, self.kv_head):
            self.tools.addWidget(w)
        self.block.valueChanged.connect(self._request)
        self.kv_head.valueChanged.connect(self._request)
        self.which.currentIndexChanged.connect(self._request)

        self.header = QLabel("Click a block in the Cache layout panel.")
        self.header.setWordWrap(True)
        self.body.addWidget(self.header)
        split = QSplitter(Qt.Vertical)
        self.layout_view = QTextBrowser()
        self.layout_view.setMinimumHeight(80)
        split.addWidget(self.layout_view)
        tabs = QTabWidget()
        mono = QFont("monospace")
        mono.setStyleHint(QFont.TypeWriter)
        self.words = QTableWidget()
        self.words.setFont(mono)
        self.decoded = QTableWidget()
        self.decoded.setFont(mono)
        for t in (self.words, self.decoded):
            t.setEditTriggers(QAbstractItemView.NoEditTriggers)
            t.verticalHeader().setDefaultSectionSize(19)
        tabs.addTab(self.words, "Raw words (hex)")
        tabs.addTab(self.decoded, "Decoded fields")
        self.tabs = tabs
        split.addWidget(tabs)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 3)
        self.body.addWidget(split, 1)

    # ------------------------------------------------------------------ inputs
    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        self.block.blockSignals(True)
        self.kv_head.blockSignals(True)
        self.block.setRange(0, max(0, res.batch.num_blocks - 1))
        self.kv_head.setRange(0, max(0, res.key.shape[1] - 1))
        self.block.blockSignals(False)
        self.kv_head.blockSignals(False)
        which = self.which.currentText()
        lay = res.layouts[0] if which == "K" else res.layouts[1]
        self.layout_view.setHtml(layout_html(lay))
        self.records = []
        self.shown = None
        self._clear()

    def show_block(self, block: int) -> None:
        """Inspect `block` (called when a cell of the pool grid is clicked)."""
        self.block.blockSignals(True)
        self.block.setValue(int(block))
        self.block.blockSignals(False)
        self._request()

    def _request(self, *args) -> None:
        if self.res is None:
            return
        which = self.which.currentText()
        lay = self.res.layouts[0] if which == "K" else self.res.layouts[1]
        self.layout_view.setHtml(layout_html(lay))
        if self.state is not None:
            self.header.setText(f"Reading block {self.block.value()} ({which}, KV head {self.kv_head.value()}) ...")
            self.state.inspect_requested.emit(self.block.value(), self.kv_head.value(), which)

    def selection(self) -> tuple:
        return self.block.value(), self.kv_head.value(), self.which.currentText()

    # ------------------------------------------------------------------ output
    def _clear(self) -> None:
        self.words.clear()
        self.words.setRowCount(0)
        self.decoded.clear()
        self.decoded.setRowCount(0)
        self.words_table = self.fields_table = None
        self.header.setText("Click a block in the Cache layout panel.")

    def set_records(self, records, block: int, kv_head: int, which: str) -> None:
        res = self.res
        self.records = list(records)
        self.shown = (int(block), int(kv_head), which)
        owner = int(res.batch.block_owner()[block]) if res is not None else -1
        used = sum(1 for r in self.records if r.position >= 0)
        if owner >= 0:
            logical = list(res.batch.seq_blocks[owner]).index(block)
            self.header.setText(f"<b>Block {block}</b> - sequence {owner}, logical block {logical}, "
                                f"{used}/{len(self.records)} slots used - {which}, KV head {kv_head}")
        else:
            self.header.setText(f"<b>Block {block}</b> - free (contents are whatever the pool holds) - {which}, "
                                f"KV head {kv_head}")
        nwords = max((len(np.asarray(r.words).reshape(-1)) for r in self.records), default=0)
        # every row says what it is (block, K or V, KV head) so the CSV stands alone; the tables on screen leave
        # those three columns out (the header above them says it)
        where = ["block", "kv", "kv_head"]
        at = [int(block), which, int(kv_head)]
        wcols = where + ["slot", "position"] + [f"w{i}" for i in range(nwords)]
        wrows = []
        fnames = []
        for r in self.records:
            for k in r.fields:
                if k not in fnames:
                    fnames.append(k)
        # one-number fields (scale, zero, norm) before the per-element arrays (codes): a long codes column
        # never pushes the scale out of view
        fnames.sort(key=lambda k: any(np.ndim(r.fields.get(k, 0)) > 0 for r in self.records))
        frows = []
        for r in self.records:
            words = np.asarray(r.words, dtype=np.uint32).reshape(-1)
            wrows.append(at + [int(r.slot), int(r.position)] + [f"{int(w):08x}" for w in words])
            frows.append(at + [int(r.slot), int(r.position)] + [fmt_value(r.fields.get(k, "")) for k in fnames])
        self.words_table = Table("words", wcols, wrows, f"Block {block} {which} KV head {kv_head}: raw u32 words")
        self.fields_table = Table("fields", where + ["slot", "position"] + fnames, frows,
                                  f"Block {block} {which} KV head {kv_head}: decoded fields")
        self._fill(self.words, self.words_table, 72)
        self._fill(self.decoded, self.fields_table, 90)

    SHOWN_FROM = 3  # the tables' first columns (block, kv, kv_head) are the header's, not shown again

    def _fill(self, view: QTableWidget, table: Table, width: int) -> None:
        columns = table.columns[self.SHOWN_FROM:]
        rows = [r[self.SHOWN_FROM:] for r in table.rows]
        view.clear()
        view.setRowCount(len(rows))
        view.setColumnCount(len(columns))
        view.setHorizontalHeaderLabels(columns)
        view.verticalHeader().setVisible(False)
        for i, row in enumerate(rows):
            unused = row[1] < 0
            for j, v in enumerate(row):
                it = QTableWidgetItem(str(v))
                if j >= 2 and len(str(v)) > 16:
                    it.setToolTip(str(v))
                if unused:
                    it.setForeground(QColor(150, 150, 150))
                view.setItem(i, j, it)
        view.setColumnWidth(0, 48)
        view.setColumnWidth(1, 60)
        fm = view.fontMetrics()
        for j in range(2, len(columns)):
            longest = max((len(str(r[j])) for r in rows), default=0)
            longest = max(longest, len(str(columns[j])))
            # a long array column is capped (its full text is the cell's tooltip and in the CSV)
            view.setColumnWidth(j, max(width, min(self.MAX_COLUMN, fm.horizontalAdvance("0") * (longest + 2))))

    MAX_COLUMN = 360  # px

    def tables(self) -> list:
        return [t for t in (self.words_table, self.fields_table) if t is not None]
