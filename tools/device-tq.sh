# Device run (H200): TurboQuant's fast split-K decode beside the seed flash kernel at the anchor and at
# 1 x 61440 tokens, then its conformance suite.
source tools/device-env.sh
for s in decode-15x4096 decode-1x61440; do timeout 150 python3 tools/time_method_kernels.py --shape $s turboquant 2>&1 | tail -7; done
timeout 200 python3 -m pytest tests/test_fast_decode_tq.py -q -p no:cacheprovider 2>&1 | tail -3
