# Device run (H200), 2026-12-01 (session 8, final): the anchor bench (seed, first-wave, fast incl. the int8-query
# variant, f16, torch, two user kernels: tools/device-check.sh anchor-core), every writer at the anchor
# (tools/fast_write_bench.py), then the conformance suites of the kernels changed this session on the H200.
source tools/device-env.sh
t=$(date +%s); timeout 240 bash tools/device-check.sh anchor-core > /tmp/core.log 2>&1; echo "anchor-core rc=$? $(( $(date +%s) - t )) s"
grep -E "fast|torch|user|seed|first|copy" "$OUT/anchor-core.txt" | cut -c1-70,200-260
t=$(date +%s); timeout 95 python3 tools/fast_write_bench.py > "$OUT/writers.txt" 2>&1; echo "writers rc=$? $(( $(date +%s) - t )) s"
grep -E "copy shader|\[fast\]|seed layout \(default" "$OUT/writers.txt" | sed -E 's/^(.{0,40}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
t=$(date +%s); timeout 120 python3 -m pytest tests/test_fast_write_ggml.py tests/test_fp4_formats.py tests/test_fast_fp8_codes.py tests/test_fast_writers.py -k "fp8 or tensor or nvfp4 or ggml or q8 or stage or amax or exchange" -q -p no:cacheprovider 2>&1 | tail -2 > "$OUT/conformance-writers.txt"; echo "writer suites rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance-writers.txt"
t=$(date +%s); timeout 75 python3 -m pytest tests/test_fast_decode.py -k "int8 or lazy or scatter" -q -p no:cacheprovider 2>&1 | tail -2 > "$OUT/conformance-decode.txt"; echo "decode suite rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance-decode.txt"
