"""kvviz: a lab for KV-cache quantisation kernels.

Everything under kvviz/ except kvviz/ui is Qt-free, so it runs, tests and benchmarks headless.
"""
__version__ = "0.1.0"
