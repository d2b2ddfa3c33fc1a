"""The window's panels, one module each. PANELS lists the dockable result panels in display order
(QjlBiasPanel and LivePanel run their own worker jobs and are not part of it)."""
from kvviz.ui.panels.attention import AttentionPanel
from kvviz.ui.panels.base import Panel
from kvviz.ui.panels.block_inspector import BlockInspectorPanel
from kvviz.ui.panels.cache_layout import CacheLayoutPanel
from kvviz.ui.panels.codes import CodesPanel
from kvviz.ui.panels.compare import ComparePanel
from kvviz.ui.panels.live import LivePanel
from kvviz.ui.panels.overview import OverviewPanel
from kvviz.ui.panels.qjl_bias import QjlBiasPanel
from kvviz.ui.panels.scales import ScalesPanel
from kvviz.ui.panels.timing import TimingPanel
from kvviz.ui.panels.workload import WorkloadPanel

PANELS = (CacheLayoutPanel, ScalesPanel, CodesPanel, AttentionPanel, TimingPanel, ComparePanel, BlockInspectorPanel)

__all__ = [
    "Panel", "PANELS", "OverviewPanel", "WorkloadPanel", "CacheLayoutPanel", "BlockInspectorPanel", "ScalesPanel",
    "CodesPanel", "AttentionPanel", "TimingPanel", "ComparePanel", "QjlBiasPanel", "LivePanel",
]
