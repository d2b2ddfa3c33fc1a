"""Every quantisation method module is imported here so that it registers itself."""
from kvviz.methods import int8_seed  # noqa: F401
from kvviz.methods.base import KVMethod, get_method, register, registry  # noqa: F401
