"""Runs a tool with the fast decodes' reduce forced to one of its two kernels for every partition count
(kvviz.kernels.fast_decode.reduce_spec: decode_reduce.wgsl, "chunked", or decode_reduce_wide.wgsl, "wide"), for A/Bs
of the reduce on the device:
    python tools/reduce_pick_run.py chunked tools/fast_decode_tune.py 1 131072 scattered int8,f16 --split
"""
import runpy
import sys

from kvviz.kernels import fast_decode as fd

fd.WIDE_REDUCE_FROM = {"chunked": 1 << 30, "wide": 1}[sys.argv[1]]
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
