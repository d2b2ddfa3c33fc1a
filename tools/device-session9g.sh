# Device run (H200), session 9: the TurboQuant writer's OR of code words over 4 / 8 lanes straight-line (write_tq.wgsl
# or4 / or8) instead of a loop naga bounds, against the kernel before (tools/ab-old3), twice each, interleaved; then
# the TurboQuant suites.
# tools/ab-old3 (not committed) held commit 0cc9e51's files, the A/B's old side; from a checkout: mkdir -p tools/ab-old3 &&
#   git show 0cc9e51:shaders/fast/write_tq.wgsl > tools/ab-old3/write_tq.wgsl
#   git show 0cc9e51:kvviz/kernels/fast_write_tq.py > tools/ab-old3/fast_write_tq.py
source tools/device-env.sh
mkdir -p /tmp/new && cp shaders/fast/write_tq.wgsl kvviz/kernels/fast_write_tq.py /tmp/new/
swap() { cp $1/write_tq.wgsl shaders/fast/; cp $1/fast_write_tq.py kvviz/kernels/; }
for pass in 1 2; do
  for v in new old; do
    if [ $v = old ]; then swap tools/ab-old3; else swap /tmp/new; fi
    timeout 60 python3 tools/fast_write_bench.py --methods=turboquant > "$OUT/tq-$v-$pass.txt" 2>&1; echo "$v $pass rc=$?"
    grep -E "copy shader|\[fast\]" "$OUT/tq-$v-$pass.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
  done
done
swap /tmp/new
t=$(date +%s); timeout 200 python3 -m pytest tests/test_fast_write_tq.py tests/test_fast_decode_tq_paged.py -q -p no:cacheprovider 2>&1 | tail -2; echo "suites $(( $(date +%s) - t )) s"
