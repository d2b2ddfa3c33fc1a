# Device run (H200), session 8: the NVFP4 writer with its records staged through workgroup memory (write_nvfp4.wgsl
# STAGE) against in place, dispatch by dispatch (the amax pass, the writer); q8_0's roundf variant (Q8_TRUNC) against
# the default now that its stores are staged; twice each, interleaved.
source tools/device-env.sh
for pass in 1 2; do
  for v in stage no-stage trunc; do
    f=""; [ $v = no-stage ] && f=--no-stage; [ $v = trunc ] && f=--q8-trunc
    timeout 100 python3 tools/fast_write_bench.py --methods=nvfp4,q8_0 --per-dispatch $f > "$OUT/w-$v-$pass.txt" 2>&1; echo "$v $pass rc=$?"
    grep -E "copy shader|\[fast\]|^  [0-9]: fast" "$OUT/w-$v-$pass.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
  done
done
t=$(date +%s); timeout 200 python3 -m pytest tests/test_fast_write_ggml.py tests/test_fp4_formats.py -q -p no:cacheprovider 2>&1 | tail -2; echo "suites $(( $(date +%s) - t )) s"
