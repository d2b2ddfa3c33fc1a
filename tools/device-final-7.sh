# Device run (H200), 2026-12-01 (session 7, final): every writer at the anchor with this session's changes (the exact
# path out of the unrolled loops, pipelined ggml / NVFP4 loads, the ggml block exchange, int4's shuffle reduction, the
# KIVI key-group rows), then every writer's conformance suite on the H200.
source tools/device-env.sh
t=$(date +%s); timeout 150 python3 tools/fast_write_bench.py > "$OUT/writers.txt" 2>&1; echo "writers rc=$? $(( $(date +%s) - t )) s"
t=$(date +%s); timeout 240 python3 -m pytest tests/test_fast_writers.py tests/test_fast_fp8_codes.py tests/test_fast_write_ggml.py tests/test_ggml_formats.py tests/test_fp4_formats.py tests/test_fast_write_tq.py tests/test_live_kivi.py -q -p no:cacheprovider 2>&1 | tail -3 > "$OUT/conformance.txt"; echo "conformance rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance.txt"
grep -E "copy shader|\[fast\]|seed layout \(default" "$OUT/writers.txt" | sed -E 's/^(.{0,40}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
