# Device run (H200), session 9: KIVI's key-group writer, a workgroup a (group, KV head) that loads the 32-row tile
# once (write_kivi_kgroup.wgsl), against the thread-a-code-word kernel it replaced (tools/ab-old: HEAD's shader
# and launcher, swapped in), twice each, interleaved; then the KIVI suites on the H200.
# tools/ab-old (not committed) held commit d240cef's files, the A/B's old side; from a checkout: mkdir -p tools/ab-old &&
#   git show d240cef:shaders/fast/write_kivi_kgroup.wgsl > tools/ab-old/write_kivi_kgroup.wgsl
#   git show d240cef:kvviz/kernels/fast_write.py > tools/ab-old/fast_write.py
source tools/device-env.sh
mkdir -p /tmp/new && cp shaders/fast/write_kivi_kgroup.wgsl kvviz/kernels/fast_write.py /tmp/new/
for pass in 1 2; do
  for v in new old; do
    if [ $v = old ]; then cp tools/ab-old/write_kivi_kgroup.wgsl shaders/fast/; cp tools/ab-old/fast_write.py kvviz/kernels/;
    else cp /tmp/new/write_kivi_kgroup.wgsl shaders/fast/; cp /tmp/new/fast_write.py kvviz/kernels/; fi
    timeout 100 python3 tools/fast_write_bench.py --methods=kivi --per-dispatch > "$OUT/kivi-$v-$pass.txt" 2>&1; echo "$v $pass rc=$?"
    grep -E "copy shader|\[fast\]|^  [0-9]: fast" "$OUT/kivi-$v-$pass.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
  done
done
cp /tmp/new/write_kivi_kgroup.wgsl shaders/fast/; cp /tmp/new/fast_write.py kvviz/kernels/
t=$(date +%s); timeout 300 python3 -m pytest tests/test_fast_writers.py tests/test_fast_decode_kivi.py tests/test_live_kivi.py -k "kivi or KIVI" -q -p no:cacheprovider 2>&1 | tail -3; echo "suites $(( $(date +%s) - t )) s"
