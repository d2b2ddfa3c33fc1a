"""Cache layout panel: the physical block pool as a grid and every sequence's block table.

Each cell is one physical block, coloured by its owning sequence (free blocks grey); the coloured
part of a cell's width is its fill fraction, so a partly used last block shows as a partly
coloured cell. Hovering names the block; clicking opens it in the block inspector.
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QCursor, QPen
from PySide6.QtWidgets import (
    QAbstractItemView, QGraphicsRectItem, QLabel, QSplitter, QTableWidget, QTableWidgetItem, QToolTip,
)

from kvviz.tables import block_pool_table, block_table_table, grid_columns
from kvviz.ui.panels.base import Panel
from kvviz.ui.widgets.pool_grid import CELL, pool_image
from kvviz.ui.style import FREE_COLOR, qcolor, seq_color


class CacheLayoutPanel(Panel):
    key = "cache_layout"
    title = "Cache layout"
    baseline_keys = ("blocks_used", "bits_k", "bits_v")  # said against the pinned run (Panel.sync_deltas)
    block_clicked = Signal(int)

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.cols = 16
        self.pool = None
        self.btab = None
        self.selected_block = -1
        self.hover_block = -1

        self._relayout = QTimer(self)
        self._relayout.setSingleShot(True)
        self._relayout.setInterval(150)
        self._relayout.timeout.connect(self.refresh)
        split = QSplitter(Qt.Vertical)
        self.view = pg.GraphicsLayoutWidget()
        self.view.setMinimumHeight(120)
        self.vb = self.view.addViewBox(lockAspect=True, invertY=True, enableMouse=False)
        self.vb.setMenuEnabled(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.vb.addItem(self.image)
        self.sel_rect = QGraphicsRectItem(0, 0, CELL - 1, CELL - 1)
        pen = QPen(QColor(0, 0, 0))
        pen.setWidthF(2.0)
        pen.setCosmetic(True)
        self.sel_rect.setPen(pen)
        self.sel_rect.setBrush(QBrush(Qt.NoBrush))
        self.sel_rect.setVisible(False)
        self.vb.addItem(self.sel_rect)
        self.view.scene().sigMouseMoved.connect(self._mouse_moved)
        self.view.scene().sigMouseClicked.connect(self._mouse_clicked)
        self.view.setToolTip("Physical block pool: click a block to inspect it")
        split.addWidget(self.view)

        self.legend = QLabel("")
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.RichText)

        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setSelectionBehavior(QAbstractItemView.SelectItems)
        self.table.cellClicked.connect(self._table_clicked)
        self.table.verticalHeader().setDefaultSectionSize(20)
        self.table.horizontalHeader().setDefaultSectionSize(38)
        self.table.setToolTip("Block tables: row = sequence, column = logical block, cell = physical block")
        split.addWidget(self.table)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        self.body.addWidget(self.legend)
        self.body.addWidget(split, 1)

    # ---------------------------------------------------------------- draw
    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        b = res.batch
        self.cols = self._columns()
        self.pool = block_pool_table(res, self.cols)
        self.btab = block_table_table(res)
        owner = self.pool.column("sequence")
        fill = self.pool.column("tokens_used")
        img = pool_image(owner, fill, b.block_size, self.cols)
        self.image.setImage(img, levels=(0, 255), autoLevels=False)
        self.image.setRect(QRectF(0, 0, img.shape[1], img.shape[0]))
        self.vb.setRange(QRectF(0, 0, img.shape[1], img.shape[0]), padding=0.02)
        used = int((owner >= 0).sum())
        self.info.setText(f"{used}/{b.num_blocks} blocks used, {b.block_size} tokens each, {b.policy}")
        parts = []
        for s in range(b.num_seqs):
            r, g, bl = seq_color(s)
            parts.append(f"<span style='color:rgb({r},{g},{bl})'>&#9632;</span> seq {s} ({int(b.context_lens[s])} tok,"
                         f" {len(b.seq_blocks[s])} blk)")
        r, g, bl = FREE_COLOR
        parts.append(f"<span style='color:rgb({r},{g},{bl})'>&#9632;</span> free")
        self.legend.setText("&nbsp;&nbsp; ".join(parts) + "&nbsp;&nbsp; <i>(lighter part of a cell = unused slots)</i>")
        self._fill_table()
        if not 0 <= self.selected_block < b.num_blocks:
            self.selected_block = -1
        self._show_selection()

    def _columns(self) -> int:
        v = self.view
        aspect = v.width() / max(1, v.height()) if v.width() > 50 and v.height() > 50 else 3.0
        return grid_columns(self.res.batch.num_blocks, aspect) if self.res is not None else 16

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        super().resizeEvent(ev)
        if self.res is not None and self._columns() != self.cols:
            self._relayout.start()

    def _fill_table(self) -> None:
        b = self.res.batch
        width = max((len(x) for x in b.seq_blocks), default=0)
        self.table.clear()
        self.table.setRowCount(b.num_seqs)
        self.table.setColumnCount(width + 1)
        self.table.setHorizontalHeaderLabels(["tokens"] + [str(i) for i in range(width)])
        self.table.setVerticalHeaderLabels([f"seq {s}" for s in range(b.num_seqs)])
        self.table.setColumnWidth(0, 52)
        for s, blocks in enumerate(b.seq_blocks):
            n = int(b.context_lens[s])
            it = QTableWidgetItem(str(n))
            it.setTextAlignment(Qt.AlignCenter)
            self.table.setItem(s, 0, it)
            col = seq_color(s)
            light = qcolor([int(c * 0.35 + 255 * 0.65) for c in col])
            pale = qcolor([int(c * 0.12 + 255 * 0.88) for c in col])
            for i, blk in enumerate(blocks):
                used = min(b.block_size, n - i * b.block_size)
                it = QTableWidgetItem(str(int(blk)))
                it.setTextAlignment(Qt.AlignCenter)
                it.setBackground(light if used == b.block_size else pale)  # pale: partly filled
                it.setForeground(QColor(0, 0, 0))
                it.setData(Qt.UserRole, int(blk))
                it.setToolTip(self.tooltip_for(int(blk)))
                self.table.setItem(s, i + 1, it)

    # ------------------------------------------------------------- hit test
    def block_at(self, x: float, y: float) -> int:
        """Block under image coordinates (x, y), or -1."""
        if self.res is None or x < 0 or y < 0:
            return -1
        c, r = int(x // CELL), int(y // CELL)
        if c >= self.cols:
            return -1
        b = r * self.cols + c
        return b if b < self.res.batch.num_blocks else -1

    def cell_center(self, block: int) -> QPointF:
        r, c = divmod(block, self.cols)
        return QPointF(c * CELL + CELL / 2, r * CELL + CELL / 2)

    def tooltip_for(self, block: int) -> str:
        if self.res is None or not 0 <= block < self.res.batch.num_blocks:
            return ""
        row = self.pool.rows[block] if self.pool is not None else None
        b = self.res.batch
        if row is None or row[3] < 0:
            return f"block {block}: free"
        seq, logical, used = row[3], row[4], row[5]
        first = logical * b.block_size
        return (f"block {block}: sequence {seq}, logical block {logical}\n"
                f"tokens used {used}/{b.block_size} (positions {first}..{first + used - 1})")

    def _mouse_moved(self, pos) -> None:
        if self.res is None or not self.image.sceneBoundingRect().contains(pos):
            self.hover_block = -1
            return
        p = self.vb.mapSceneToView(pos)
        blk = self.block_at(p.x(), p.y())
        if blk != self.hover_block:
            self.hover_block = blk
            text = self.tooltip_for(blk)
            if text:
                QToolTip.showText(QCursor.pos(), text, self.view)
            else:
                QToolTip.hideText()

    def _mouse_clicked(self, ev) -> None:
        if self.res is None:
            return
        p = self.vb.mapSceneToView(ev.scenePos())
        blk = self.block_at(p.x(), p.y())
        if blk >= 0:
            self.select_block(blk)

    def _table_clicked(self, row: int, col: int) -> None:
        it = self.table.item(row, col)
        if it is not None and it.data(Qt.UserRole) is not None:
            self.select_block(int(it.data(Qt.UserRole)))

    def select_block(self, block: int) -> None:
        """The user picked a block: mark it and ask for it to be inspected."""
        self.show_block(block)
        self.block_clicked.emit(block)

    def show_block(self, block: int) -> None:
        """Mark a block as the selected one without asking for anything."""
        self.selected_block = block
        self._show_selection()

    def _show_selection(self) -> None:
        b = self.selected_block
        if b < 0:
            self.sel_rect.setVisible(False)
            return
        r, c = divmod(b, self.cols)
        self.sel_rect.setRect(c * CELL - 0.5, r * CELL - 0.5, CELL, CELL)
        self.sel_rect.setVisible(True)

    def tables(self) -> list:
        return [t for t in (self.pool, self.btab) if t is not None]
