"""Live decoding of a real model through paged GPU KV caches (Qt-free)."""
from kvviz.methods.live_cache import (  # noqa: F401
    BlockTable, F32PagedCache, LiveCache, MethodPagedCache, RequantCache, TokenScales, cache_kind, make_live_cache,
)
from kvviz.live.decode import DEFAULT_PROMPT, LiveDecoder, LivePath, LiveStep, LiveWatch, run_live  # noqa: F401
from kvviz.sources.llama_numpy import Cancelled  # noqa: F401
