# Device run (H200), session 9: the asymmetric writers' codes by integer ops on the bits of q + 2^(K+1)
# (write_common.wgsl asym_codes4v_fast: no round, no float-to-int) and KIVI's key groups a workgroup a (group, head),
# against HEAD's write_common / key-group writer / launcher (tools/ab-old, swapped in), twice each, interleaved:
# KIVI 2 / 4-bit (per dispatch) and int4_group. Then the writer suites on the H200.
# tools/ab-old (not committed) held commit d240cef's files, the A/B's old side; from a checkout: mkdir -p tools/ab-old &&
#   git show d240cef:shaders/fast/write_kivi_kgroup.wgsl > tools/ab-old/write_kivi_kgroup.wgsl
#   git show d240cef:shaders/fast/write_common.wgsl > tools/ab-old/write_common.wgsl
#   git show d240cef:kvviz/kernels/fast_write.py > tools/ab-old/fast_write.py
source tools/device-env.sh
mkdir -p /tmp/new && cp shaders/fast/write_kivi_kgroup.wgsl shaders/fast/write_common.wgsl kvviz/kernels/fast_write.py /tmp/new/
swap() { for f in write_kivi_kgroup.wgsl write_common.wgsl; do cp $1/$f shaders/fast/; done; cp $1/fast_write.py kvviz/kernels/; }
for pass in 1 2; do
  for v in new old; do
    if [ $v = old ]; then swap tools/ab-old; else swap /tmp/new; fi
    timeout 100 python3 tools/fast_write_bench.py --methods=kivi,int4_group --per-dispatch > "$OUT/asym-$v-$pass.txt" 2>&1; echo "$v $pass rc=$?"
    grep -E "copy shader|\[fast\]|^  [0-9]: fast" "$OUT/asym-$v-$pass.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
  done
done
swap /tmp/new
t=$(date +%s); timeout 300 python3 -m pytest tests/test_fast_writers.py tests/test_fast_decode_kivi.py tests/test_live_kivi.py -q -p no:cacheprovider 2>&1 | tail -3; echo "suites $(( $(date +%s) - t )) s"
