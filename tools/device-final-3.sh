# Device run (H200), 2026-12-01 afternoon: the anchor bench after the scatter softmax, the unrolled writers and the
# FP8 conversion (seed, first-wave, fast incl. the int8-query variant, f16, torch, user kernels: tools/device-check.sh
# anchor-core), the siblings' and TurboQuant's kernels timed, the per-token formats' layouts, and the conformance
# suites of the fast decodes and writers on the H200.
source tools/device-env.sh
bash tools/device-check.sh anchor-core > /tmp/core.log 2>&1; echo "anchor-core rc=$?"
timeout 150 python3 tools/time_method_kernels.py q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl mxfp4 kivi "kivi:bits=4,recent=0" turboquant > "$OUT/kernels.txt" 2>&1; echo "kernels rc=$?"
timeout 90 python3 tools/fast_decode_tune.py 15 4096 scattered fp8_e4m3,int4 --split > "$OUT/fp8-int4.txt" 2>&1; echo "tune rc=$?"
timeout 170 python3 -m pytest tests/test_fast_decode.py tests/test_fast_decode_ggml.py tests/test_fast_writers.py -q -p no:cacheprovider 2>&1 | tail -2 | tee "$OUT/conformance.txt"
grep -E "fast|torch|user|seed|first" "$OUT/anchor-core.txt" | cut -c1-60,200-260
grep -E "fast|copy" "$OUT/kernels.txt"
grep "^|" "$OUT/fp8-int4.txt"
