# Device run (H200), session 8: the FP8 e4m3 decode with its 2^8 unit folded into the query and the V scale
# (fast_decode.FP8_UNIT) against 4 multiplies a vec4 of codes, twice each, interleaved; then the writer suites again
# (after the test fix of the amax grid) and the fast decode's FP8 tests on the H200.
source tools/device-env.sh
for pass in 1 2; do
  for v in on off; do
    timeout 60 python3 tools/fast_decode_tune.py 15 4096 scattered fp8_e4m3 --lazy=default --fp8-unit=$v > "$OUT/fp8-unit-$v-$pass.txt" 2>&1; echo "unit $v $pass rc=$?"
    grep -E "^\| fp8" "$OUT/fp8-unit-$v-$pass.txt"
  done
done
t=$(date +%s); timeout 90 python3 -m pytest tests/test_fast_write_ggml.py tests/test_fp4_formats.py tests/test_fast_fp8_codes.py tests/test_fast_writers.py -k "fp8 or tensor or nvfp4 or ggml or q8 or stage or amax or exchange" -q -p no:cacheprovider 2>&1 | tail -2 > "$OUT/conformance-writers.txt"; echo "writer suites rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance-writers.txt"
t=$(date +%s); timeout 40 python3 -m pytest tests/test_fast_decode.py -k "fp8" -q -p no:cacheprovider 2>&1 | tail -2 > "$OUT/conformance-fp8-decode.txt"; echo "fp8 decode rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance-fp8-decode.txt"
