# Device run (H200), 2026-12-01 (session 6, final): the anchor bench (seed, first-wave, fast incl. the int8-query
# variant, f16, torch, two user kernels: tools/device-check.sh anchor-core), the other methods' kernels timed, the
# TurboQuant paged decode at one sequence of 61440 tokens, and the conformance suites of the writers changed today.
source tools/device-env.sh
t=$(date +%s); bash tools/device-check.sh anchor-core > /tmp/core.log 2>&1; echo "anchor-core rc=$? $(( $(date +%s) - t )) s"
t=$(date +%s); timeout 150 python3 -m pytest tests/test_fast_writers.py tests/test_fast_write_ggml.py tests/test_fast_fp8_codes.py tests/test_fp4_formats.py -q -p no:cacheprovider 2>&1 | tail -2 > "$OUT/conformance.txt"; echo "conformance rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance.txt"
t=$(date +%s); timeout 120 python3 tools/time_method_kernels.py q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl mxfp4 nvfp4 kivi "kivi:bits=4,recent=0" turboquant > "$OUT/kernels.txt" 2>&1; echo "kernels rc=$? $(( $(date +%s) - t )) s"
t=$(date +%s); timeout 60 python3 tools/tq_paged_vs_seq.py --shape decode-1x61440 > "$OUT/tq-1x61440.txt" 2>&1; echo "tq rc=$? $(( $(date +%s) - t )) s"
grep -E "fast|torch|user|seed|first" "$OUT/anchor-core.txt" | cut -c1-70,200-260
grep -E "fast|copy" "$OUT/kernels.txt" | cut -c1-140; cat "$OUT/tq-1x61440.txt" | cut -c1-300
