"""Every quantisation method module is imported here so that it registers itself."""
from kvviz.methods import fp8, int4, int8, int8_seed, kivi, turboquant  # noqa: F401
from kvviz.methods.base import KVMethod, get_method, register, registry  # noqa: F401
