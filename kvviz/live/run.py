"""The state of one live decode run as the window shows it, without Qt (testable headless).

`LiveRun` holds what a live decode has produced so far: its `LiveConfig`, the model, the prefill
(block pools, prompt tokens), every `LiveStep`, the summary, and whether it runs, finished, was
stopped or failed. The window's live panel draws from it; `decode_run` is the job the window's
worker runs (load the model, prefill, step), reporting through plain callbacks.

Start / stop / cancel: `begin(cfg)` gives the run an id; events and steps of an older id are
ignored (`is_current`); `stop(why)` records why a cancel ends the run ("" = the user stopped it).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kvviz.errors import Cancelled
from kvviz.live.config import LiveConfig
from kvviz.sources.archs import QUANTISED_SHORT, summary_line, weights_line
from kvviz.live.decode import LiveDecoder
from kvviz.live.metrics import summarize_live
from kvviz.tables import Table, clean

# pool grid bands: (key in `tables_now`, label, colour index of the sequence palette)
PATHS = (("f32", "f32", 0), ("quant", "quant", 1), ("free", "free run", 3))
STEP_COLUMNS = ["step", "position", "fed_token", "fed_str", "f32_token", "f32_str", "quant_token", "quant_str",
                "kl", "top1_agree", "nll_delta", "p_f32", "p_quant_of_f32", "free_token", "free_str", "free_forked",
                "context_len", "blocks_quant", "new_blocks", "step_s"]
STATES = ("idle", "running", "done", "stopped", "failed")


def describe_model(cfg) -> str:
    """One line about a model's config (kvviz.sources.archs.ModelConfig): name, architecture, layers, heads,
    KV heads (GQA), head size, sliding window, RoPE and the path its forward runs on; with quantised
    weights, why its logits differ from llama.cpp's on the same file."""
    line = summary_line(cfg)
    if cfg.quantised_weights:
        line += f"; weights {weights_line(cfg)} ({QUANTISED_SHORT})"
    return line


@dataclass
class PoolBand:
    """One paged cache's block pool as the grid draws it: owner colour index (-1 free) and tokens per block."""

    key: str
    label: str
    color: int
    blocks: list
    owner: np.ndarray
    fill: np.ndarray
    new: list = field(default_factory=list)  # blocks allocated by the last step (outlined)


class LiveRun:
    """What one live decode has produced so far (see the module docstring)."""

    def __init__(self):
        self._ids = itertools.count(1)
        self.id = 0  # id of the run whose events are shown; 0 = none yet
        self.why = ""  # why a cancel ends the current run ("" = the user stopped it)
        self.config: LiveConfig | None = None
        self.state = "idle"
        self._reset()

    def _reset(self) -> None:
        self.steps: list = []
        self.max_new = self.config.n_new if self.config is not None else 0
        self.block_size = self.config.block_size if self.config is not None else 16
        self.policy_used = self.config.policy if self.config is not None else ""
        self.num_blocks = 0
        self.context_len = 0
        self.tables_now: dict = {}  # path -> block list
        self.prev_tables: dict = {}
        self.prompt_strs: list = []
        self.model_cfg = None
        self.describe: dict = {}
        self.summary: dict = {}
        self.timings: dict = {}
        self.view_state = CacheViewState()  # the cache view of the selected layer / KV head

    # ------------------------------------------------------------------ lifecycle
    def begin(self, cfg: LiveConfig) -> int:
        """A new run of `cfg`: the previous run's events are ignored from now on. Returns its id."""
        self.config = cfg
        self.id = next(self._ids)
        self.why = ""
        self._reset()
        self.state = "running"
        return self.id

    def is_current(self, run_id) -> bool:
        return run_id == self.id

    @property
    def running(self) -> bool:
        return self.state == "running"

    def stop(self, why: str = "") -> None:
        """Record why the running decode is being cancelled ("" = the user stopped it)."""
        self.why = why

    def set_model(self, cfg) -> None:
        self.model_cfg = cfg

    def set_prefilled(self, info: dict) -> None:
        self.num_blocks = int(info["num_blocks"])
        self.block_size = int(info["block_size"])
        self.context_len = int(info["context_len"])
        self.prompt_strs = list(info["prompt_strs"])
        self.describe = dict(info.get("describe", {}))
        self.timings["prefill_s"] = info.get("prefill_s")
        self.prev_tables = {}
        self.tables_now = {k: list(v) for k, v in info["tables"].items() if v}

    def add_step(self, st) -> None:
        self.steps.append(st)
        self.context_len = int(st.context_len)
        self.prev_tables = self.tables_now
        self.tables_now = {"f32": list(st.base_blocks), "quant": list(st.blocks)}
        if st.free_forked and st.free_blocks:
            self.tables_now["free"] = list(st.free_blocks)
        self.summary = summarize_live(self.steps, self.texts())

    def finish(self, result: dict | None = None, cancelled: bool = False, error: BaseException | None = None) -> None:
        if result is not None:
            self.describe = dict(result.get("describe", self.describe))
            self.timings.update(result.get("timings", {}))
        self.summary = summarize_live(self.steps, self.texts()) if self.steps else {}
        self.state = "failed" if error is not None else "stopped" if cancelled else "done"

    # ------------------------------------------------------------------ views
    def texts(self) -> dict:
        base = "".join(s.base_str for s in self.steps)
        free = "".join((s.free_str if s.free_str is not None else s.quant_str) for s in self.steps)
        return {"prompt": "".join(self.prompt_strs), "baseline": base, "quant_free": free,
                "quant_teacher_forced": "".join(s.quant_str for s in self.steps)}

    def divergence(self) -> int | None:
        """The first step where the free-running quantised text leaves the f32 one, or None."""
        for i, s in enumerate(self.steps):
            f = s.free_token if s.free_token is not None else s.quant_token
            if f != s.base_token:
                return i
        return None

    def headline(self) -> str:
        n = len(self.steps)
        return {"running": f"Step {n}/{self.max_new}", "done": f"Done: {n} steps",
                "stopped": f"Stopped after {n}/{self.max_new} steps"}.get(self.state, f"{n} steps")

    def pool_bands(self, highlight: bool, quant_new: list | None = None) -> list:
        """[PoolBand] of every path with a block table; with `highlight` each band names its new blocks
        (the quantised cache's from the step, the others' as the difference to the previous tables)."""
        n, bs, ctx = self.num_blocks, self.block_size, self.context_len
        out = []
        for key, label, color in PATHS:
            if key not in self.tables_now:
                continue
            blocks = self.tables_now[key]
            owner = np.full(n, -1, np.int64)
            fill = np.zeros(n, np.int64)
            for li, b in enumerate(blocks):
                if 0 <= b < n:
                    owner[b] = color
                    fill[b] = max(0, min(bs, ctx - li * bs))
            new = []
            if highlight:
                new = sorted(set(quant_new or []) if key == "quant" else set(blocks) - set(self.prev_tables.get(key, [])))
            out.append(PoolBand(key, label, color, blocks, owner, fill, new))
        return out

    def step_table(self) -> Table:
        tab = Table("steps", list(STEP_COLUMNS), title="live decode: one row per step")
        for s in self.steps:
            tab.rows.append([s.index, s.position, s.fed_token, s.fed_str, s.base_token, s.base_str, s.quant_token,
                             s.quant_str, float(s.kl), bool(s.top1_agree), float(s.nll_delta), float(s.base_p),
                             float(s.quant_p_of_base), s.free_token, s.free_str, bool(s.free_forked),
                             int(s.context_len), " ".join(str(b) for b in s.blocks),
                             " ".join(str(b) for b in s.new_blocks), float(sum(s.seconds.values()))])
        return tab

    def to_json(self) -> dict:
        return clean({
            "state": self.state,
            "config": {**self.describe, "max_new": self.max_new},
            "model": describe_model(self.model_cfg) if self.model_cfg is not None else "",
            "timings": self.timings,
            "summary": summarize_live(self.steps, self.texts()) if self.steps else {},
            "steps": [s.to_json() for s in self.steps],
        })


def _slug(label: str) -> str:
    """A CSV column name from an axis label: 'K scale' -> 'k_scale', '|k| norm (f16)' -> 'k_norm_f16'."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_") or "value"


def pick_weights(w, q_index: int):
    """The last step's attention weights [q heads of the group, positions] of one query head of the
    group (q_index), or their mean (q_index -1); None when not read."""
    if w is None or not len(w):
        return None
    a = np.asarray(w, np.float64)
    return a.mean(0) if q_index < 0 else a[q_index]


def view_scales(v: dict):
    """(K, V) per-position scales of a cache view as float arrays, or (None, None) when the cache has none."""
    sc = v.get("scales")
    if sc is None:
        return None, None
    return np.asarray(sc.k, np.float64), np.asarray(sc.v, np.float64)


class CacheViewState:
    """The cache view of a live run: the LiveDecoder.cache_view dict shown, the decoder's LiveWatch it came
    from (and the decoder, kept for reads after the run) and the (layer, KV head) a worker read is on its
    way for. While the decode runs the decoder reads the selection after every step; after the run a new
    selection needs one read (`read`, on the decoder's thread)."""

    def __init__(self):
        self.view: dict | None = None
        self.watch = None  # the LiveWatch of the decoder the steps come from
        self.decoder = None  # that decoder (the watch holds it weakly), for reads after the run
        self.reading: tuple | None = None

    def take(self, v: dict, selection: tuple, running: bool) -> None:
        """A view that came with a step: remember its watch; a selection made before the decoder existed
        is handed to the watch."""
        w = v.get("watch")
        if w is not None:
            self.watch = w
            self.decoder = w.decoder
            if running and w.selection != tuple(selection):
                w.select(*selection)
        self.view = v

    def select(self, selection: tuple, running: bool) -> bool:
        """A new selection: while running the decoder reads it after its next step; after the run True
        means a worker read (`read`) is needed, and `reading` is set to it."""
        w = self.watch
        if w is None:
            return False
        if running:
            w.select(*selection)
            return False
        v = self.view
        if v is None or (v.get("layer"), v.get("kv_head")) != tuple(selection):
            self.reading = tuple(selection)
            return True
        return False

    @staticmethod
    def read(watch, sel: tuple) -> dict:
        """The cache view of `sel` read through `watch` (GPU work: on the decoder's thread); a failure is
        a view with an "error" (shown in the view, not as a failed computation)."""
        try:
            return watch.read(*sel)
        except Exception as exc:  # noqa: BLE001
            return {"error": f"{type(exc).__name__}: {exc}", "watch": watch, "layer": sel[0], "kv_head": sel[1]}

    def accept(self, watch, v: dict) -> bool:
        """A worker read came back: False when it belongs to an older run."""
        if watch is not self.watch:
            return False
        if self.reading == (v.get("layer"), v.get("kv_head")):
            self.reading = None
        self.view = v
        return True

    def pending(self, selection: tuple, running: bool) -> str:
        """What the view is waiting for, as a note: a worker read, or the next step's read."""
        v, sel = self.view, tuple(selection)
        if self.reading is not None:
            return f" \u00b7 reading layer {self.reading[0]}, KV head {self.reading[1]} \u2026"
        if v is not None and self.watch is not None and (v.get("layer"), v.get("kv_head")) != sel:
            return f" \u00b7 layer {sel[0]}, KV head {sel[1]} from the next step" if running else ""
        return ""

    def table(self, q_index: int = -1) -> Table | None:
        """The view as a table: one row per position (its block, K / V scale, attention weights through
        the f32 and the quantised cache of query head `q_index` of the group, -1: their mean)."""
        v = self.view
        if v is None or "error" in v:
            return None
        n, bs = int(v["context_len"]), int(v["block_size"])
        sc = v.get("scales")
        k, vv = view_scales(v)
        wb, wq = pick_weights(v.get("weights_base"), q_index), pick_weights(v.get("weights_quant"), q_index)
        kname = _slug(sc.k_label) if sc is not None else "k_scale"
        vname = _slug(sc.v_label) if sc is not None else "v_scale"
        tab = Table("cache_view", ["position", "block", kname, vname, "w_f32", "w_quant"],
                    title=f"cache view: layer {v['layer']}, KV head {v['kv_head']}")
        blocks = list(v.get("blocks") or [])
        pos_blocks = v.get("position_blocks")  # a sliding-window layer's ring: None for positions it no longer holds
        if pos_blocks is None:
            pos_blocks = [blocks[p // bs] if p // bs < len(blocks) else None for p in range(n)]
        for p in range(n):
            tab.rows.append([p, pos_blocks[p] if p < len(pos_blocks) else None,
                             *(float(a[p]) if a is not None and p < len(a) else None for a in (k, vv, wb, wq))])
        return tab


def decode_run(load_model: Callable, cfg: LiveConfig, ctx, run_id, on_event: Callable, on_step: Callable,
               progress: Callable, cancel: Callable) -> dict:
    """Load the model, prefill `cfg.prompt` and decode `cfg.n_new` tokens step by step (in the worker).

    load_model(path, progress) -> the model; on_event(run_id, "model", (path, LlamaConfig)) and
    on_event(run_id, "prefilled", dict) after the prefill; on_step(run_id, LiveStep) after every step.
    Returns {"decoder", "summary", "describe", "timings"}; a cancel raises Cancelled.
    """
    model = load_model(cfg.model_path, progress)
    on_event(run_id, "model", (cfg.model_path, model.config))
    if cancel():
        raise Cancelled()
    dec = LiveDecoder.from_config(model, cfg, ctx=ctx, keep_distributions=False)
    progress(0.05, "prefill")

    def prefill(done, total):
        progress(0.05 + 0.15 * done / max(total, 1), f"prefill: layer {done}/{total}")

    dec.start(cfg.prompt, cfg.n_new, progress=prefill, cancel=cancel)
    on_event(run_id, "prefilled", {
        "num_blocks": dec.num_blocks, "block_size": dec.block_size, "context_len": dec.quant.cache.length,
        "prompt_strs": dec.tokenizer.token_strings(dec.prompt_ids), "describe": dec.describe(),
        "prefill_s": dec.timings.get("prefill_s", 0.0),
        "tables": {"f32": list(dec.base.cache.table.blocks) if dec.base.cache is not None else [],
                   "quant": list(dec.quant.cache.table.blocks)},
    })
    n = dec.max_new
    for i in range(n):
        if dec.finished:
            break
        st = dec.step(cancel)
        on_step(run_id, st)
        progress(0.2 + 0.8 * (i + 1) / n, f"step {i + 1}/{n}: KL {st.kl:.3g}")
    return {"decoder": dec, "summary": dec.summary(), "describe": dec.describe(),
            "timings": {k: v for k, v in dec.timings.items() if k != "steps_s"}}
