# Device run (H200), session 9: int8_token's codes by round_fixed4 (integer ops on the bits of q + 3 x 2^7, no round
# and no float-to-int), against 361feda's write_common / write_int8 (tools/ab-old2, swapped in), twice each,
# interleaved; the KIVI / int4 rows ride along (their code path moved into round_fixed4, the same ops). Then the
# writer suites on the H200.
# tools/ab-old2 (not committed) held commit 361feda's files, the A/B's old side; from a checkout: mkdir -p tools/ab-old2 &&
#   git show 361feda:shaders/fast/write_common.wgsl > tools/ab-old2/write_common.wgsl
#   git show 361feda:shaders/fast/write_int8.wgsl > tools/ab-old2/write_int8.wgsl
source tools/device-env.sh
mkdir -p /tmp/new && cp shaders/fast/write_common.wgsl shaders/fast/write_int8.wgsl /tmp/new/
swap() { cp $1/write_common.wgsl $1/write_int8.wgsl shaders/fast/; }
for pass in 1 2; do
  for v in new old; do
    if [ $v = old ]; then swap tools/ab-old2; else swap /tmp/new; fi
    timeout 100 python3 tools/fast_write_bench.py --methods=int8_token,kivi,int4_group > "$OUT/i8-$v-$pass.txt" 2>&1; echo "$v $pass rc=$?"
    grep -E "copy shader|\[fast\]|seed layout" "$OUT/i8-$v-$pass.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
  done
done
swap /tmp/new
t=$(date +%s); timeout 300 python3 -m pytest tests/test_fast_writers.py -q -p no:cacheprovider 2>&1 | tail -3; echo "suites $(( $(date +%s) - t )) s"
