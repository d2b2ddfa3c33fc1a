"""Overview (the window's central widget): the headline numbers of the current results as cards."""
from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QGridLayout, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout

from kvviz.tables import Table
from kvviz.ui.panels.base import DELTA_COLORS, Panel
from kvviz.ui.style import WARN_BG, WARN_FG

# the card of each headline number (kvviz.history.numbers) said against the pinned run
CARD_NUMBERS = {"bits_k": "bits_k", "bits_v": "bits_v", "kl_mean": "kl_mean", "cosine_min": "cosine_min",
                "rel_l2_mean": "rel_l2_mean", "topk": "topk_overlap_mean", "decode": "decode_us",
                "blocks": "blocks_used", "elapsed": "elapsed_s"}

CARDS = [
    ("method", "method"),
    ("bits_k", "K bits / element"),
    ("bits_v", "V bits / element"),
    ("kl_mean", "KL mean (nats)"),
    ("cosine_min", "output cosine (min)"),
    ("rel_l2_mean", "output rel. L2 (mean)"),
    ("topk", "top-8 overlap (mean)"),
    ("decode", "decode: method / f32"),
    ("blocks", "blocks used / pool"),
    ("elapsed", "computed in"),
]


class _Card(QFrame):
    def __init__(self, caption: str):
        super().__init__()
        self.setObjectName("card")
        self.setStyleSheet("#card { background: #f6f7f9; border: 1px solid #d5d8dc; border-radius: 5px; }")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 4, 8, 4)
        lay.setSpacing(0)
        self.value = QLabel("-")
        self.value.setStyleSheet("font-size: 12pt; font-weight: 600; color: #1b2a3a;")
        self.value.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.caption = QLabel(caption)
        self.caption.setStyleSheet("color: #5a6570; font-size: 8pt;")
        # the change against the pinned run, beside the value (hidden without a baseline)
        self.delta = QLabel("")
        self.delta.setStyleSheet("font-size: 8pt;")
        self.delta.hide()
        for lab in (self.value, self.caption):  # cards may shrink below their text on small screens
            lab.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
            lab.setMinimumWidth(30)
        top = QHBoxLayout()
        top.setSpacing(4)
        top.addWidget(self.value, 1)
        top.addWidget(self.delta, 0, Qt.AlignRight | Qt.AlignVCenter)
        lay.addLayout(top)
        lay.addWidget(self.caption)


class OverviewPanel(Panel):
    key = "overview"
    title = "Overview"
    reflowed = Signal()  # the cards' rows or the headline's height changed: the window refits its centre

    def __init__(self, state=None, parent=None):
        super().__init__(state, parent)
        self.summary = None
        self.headline = QLabel("Computing the default workload ...")
        self.headline.setWordWrap(True)
        self.headline.setMinimumWidth(200)
        self.headline.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.headline.setStyleSheet("font-size: 10pt;")
        self.info.hide()
        self.tools.addWidget(self.headline, 1)
        bar = self.layout().itemAt(0).layout()  # the headline takes the row's width (not the spacer before Export)
        bar.setStretch(0, 1)
        bar.setStretch(1, 0)
        # what the method could not represent (Results.warnings): a yellow line, hidden when there is none
        self.warn = QLabel("")
        self.warn.setWordWrap(True)
        self.warn.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.warn.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.warn.setStyleSheet(f"background:{WARN_BG}; color:{WARN_FG}; padding:3px; border-radius:3px;")
        self.warn.hide()
        self.body.addWidget(self.warn)
        self.grid = QGridLayout()
        self.grid.setSpacing(6)
        self.cards = {}
        for key, caption in CARDS:
            self.cards[key] = _Card(caption)
        self.columns = 0
        self._reflow(5)
        self.body.addLayout(self.grid)
        self.body.addStretch(1)

    CARD_WIDTH = 150  # px a card needs for its value ("0.99996", "48.3 / 51.2 ms") and caption

    def _reflow(self, cols: int) -> None:
        """Cards in `cols` columns (rows as needed): a narrow window gets more rows, never cut cards."""
        cols = max(1, min(len(CARDS), cols))
        if cols == self.columns:
            return
        self.columns = cols
        for c in self.cards.values():
            self.grid.removeWidget(c)
        for i, (key, _) in enumerate(CARDS):
            self.grid.addWidget(self.cards[key], i // cols, i % cols)
        for j in range(len(CARDS)):
            self.grid.setColumnStretch(j, 1 if j < cols else 0)
        self.reflowed.emit()

    baseline_keys = tuple(CARD_NUMBERS.values())

    def card_width(self) -> int:
        """px the widest card needs: CARD_WIDTH, or more for a value (and its change against the pinned run) or a
        caption wider than that holds (a slow decode's "179.6 / 171.9 ms"), with the card's margins and border."""
        need = self.CARD_WIDTH
        for c in self.cards.values():
            for lab in (c.value, c.caption, c.delta):
                lab.ensurePolished()  # the style sheet's font (12pt bold values)
            value = c.value.fontMetrics().horizontalAdvance(c.value.text())
            if not c.delta.isHidden():
                value += 4 + c.delta.fontMetrics().horizontalAdvance(c.delta.text())
            caption = c.caption.fontMetrics().horizontalAdvance(c.caption.text())
            need = max(need, value + 8 + 8 + 2 + 2, caption + 8 + 8 + 2 + 2)
        return need

    def sync_deltas(self) -> None:
        """Each card's change against the pinned run, beside its value; the cards reflow for the wider values."""
        changes = {k: c for k, _now, c in self.baseline_changes()}
        b = self.state.baseline if self.state is not None else None
        for card_key, num in CARD_NUMBERS.items():
            c = changes.get(num)
            lab = self.cards[card_key].delta
            if c is None:
                lab.hide()
                continue
            lab.setText(c.text)
            lab.setStyleSheet(f"font-size: 8pt; color: {DELTA_COLORS.get(c.verdict, '#5a6570')};")
            lab.setToolTip(f"against the pinned {b.title}" + (f": {c.verdict}" if c.verdict else ""))
            lab.show()
        self.delta_note.hide()
        self._reflow((self.width() - 10) // (self.card_width() + 6))

    def _fit_headline(self) -> None:
        w = max(100, self.headline.width())
        h = self.headline.heightForWidth(w)
        if h > 0 and h != self.headline.height():
            self.headline.setFixedHeight(h)
            self.reflowed.emit()

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        super().resizeEvent(ev)
        self._reflow((ev.size().width() - 10) // (self.card_width() + 6))
        self._fit_headline()

    def refresh(self) -> None:
        res = self.res
        if res is None:
            return
        s = res.metrics.summary()
        k_lay, v_lay = res.layouts
        by = {t.kernel: t for t in res.timings}
        method_decode = [t for t in res.timings if t.variant == res.method.label and ("attn" in t.kernel or "decode" in t.kernel)]
        base = by.get("paged_attn_f32")
        if not getattr(res, "timed", True):  # the window's preview: the kernels are being timed
            decode = "timing ..."
        elif method_decode and base:
            md = sum(t.timing.median_us for t in method_decode)
            decode = f"{md / 1000:.1f} / {base.timing.median_us / 1000:.1f} ms"
        else:
            decode = "-"
        used = int((res.batch.block_owner() >= 0).sum())
        values = {
            "method": res.method.id,
            "bits_k": f"{k_lay.bits_per_element:.3f}",
            "bits_v": f"{v_lay.bits_per_element:.3f}",
            "kl_mean": f"{s['kl_mean']:.3g}",
            "cosine_min": f"{s['cosine_min']:.5f}",
            "rel_l2_mean": f"{s['rel_l2_mean']:.3g}",
            "topk": f"{s.get(f'top{res.metrics.k}_overlap_mean', float('nan')):.3f}",
            "decode": decode,
            "blocks": f"{used} / {res.batch.num_blocks}",
            "elapsed": f"{res.elapsed_s:.2f} s",
        }
        for k, v in values.items():
            self.cards[k].value.setText(v)
        self.cards["topk"].caption.setText(f"top-{res.metrics.k} overlap (mean)")
        self._reflow((self.width() - 10) // (self.card_width() + 6))  # fewer columns for a wider value
        self.cards["method"].setToolTip(res.method.label)
        cfg = res.config
        stored = (f"<i>{html.escape(res.stored_as)}, as computed then</i> - " if getattr(res, "stored_as", "")
                  else "")
        self.headline.setText(
            f"{stored}<b>{res.method.label}</b> on {res.source_note}: {res.batch.num_seqs} sequences "
            f"({', '.join(str(int(x)) for x in res.batch.context_lens)} tokens), {cfg.num_heads} query / "
            f"{cfg.num_kv_heads} KV heads x {res.key.shape[2]}, blocks of {res.batch.block_size} "
            f"({res.batch.policy}), {cfg.frontend}")
        self._fit_headline()
        warnings = list(getattr(res, "warnings", None) or [])
        self.warn.setText("\n".join(f"\u26a0 {w}" for w in warnings))
        self.warn.setVisible(bool(warnings))
        self.summary = Table("overview", ["metric", "value"],
                             [[CARDS[i][1], values[CARDS[i][0]]] for i in range(len(CARDS))]
                             + [["warning", w] for w in warnings], "Headline numbers")

    def tables(self) -> list:
        return [self.summary] if self.summary is not None else []
