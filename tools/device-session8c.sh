# Device run (H200), session 8: KIVI's key groups a lane a vec4 (write_kivi_kgroup_vec.wgsl) against a lane a code
# word, and q4_1 / q5_1 with staged stores against in place (write_ggml.wgsl STAGE), twice each, interleaved; then
# the KIVI and ggml writer suites on the H200. The vec4 key-group writer measured slower (2-bit 248.7 -> 270.0 us,
# 4-bit 202.0 -> 299.6) and was not kept, nor fast_write_bench.py's --kivi-words flag that chose it: the kernel is
# assets/bench/h200-2026-12-01-kivi-kgroup-vec4-experiment.txt.
source tools/device-env.sh
for pass in 1 2; do
  for v in new old; do
    f=""; [ $v = old ] && f="--kivi-words --no-stage"
    timeout 100 python3 tools/fast_write_bench.py --methods=kivi,q4_1,q5_1 --per-dispatch $f > "$OUT/w-$v-$pass.txt" 2>&1; echo "$v $pass rc=$?"
    grep -E "copy shader|\[fast\]|^  [0-9]: fast" "$OUT/w-$v-$pass.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
  done
done
t=$(date +%s); timeout 200 python3 -m pytest tests/test_fast_write_ggml.py tests/test_fast_writers.py -k "kivi or ggml or staged or exchange" -q -p no:cacheprovider 2>&1 | tail -3; echo "suites $(( $(date +%s) - t )) s"
