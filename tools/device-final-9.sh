# Device run (H200), 2026-12-01 (session 9, final): KIVI's key-group side words a thread a channel (RS threads share a
# column's 4 channels) against one thread writing all four (HEAD's kernel, tools/ab-old2), twice each, interleaved;
# the anchor bench (tools/device-check.sh anchor-core), every writer at the anchor (tools/fast_write_bench.py), then
# the suites of the kernels changed this session on the H200.
# tools/ab-old2 (not committed) held commit a881282's files, the A/B's old side; from a checkout: mkdir -p tools/ab-old2 &&
#   git show a881282:shaders/fast/write_kivi_kgroup.wgsl > tools/ab-old2/write_kivi_kgroup.wgsl
source tools/device-env.sh
K=shaders/fast/write_kivi_kgroup.wgsl; cp $K /tmp/kg-new.wgsl
for pass in 1 2; do
  for v in new old; do
    if [ $v = old ]; then cp tools/ab-old2/write_kivi_kgroup.wgsl $K; else cp /tmp/kg-new.wgsl $K; fi
    timeout 60 python3 tools/fast_write_bench.py --methods=kivi --per-dispatch > "$OUT/side-$v-$pass.txt" 2>&1; echo "side $v $pass rc=$?"
    grep -E "copy shader|\[fast\]|^  [0-9]: fast" "$OUT/side-$v-$pass.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
  done
done
cp /tmp/kg-new.wgsl $K
t=$(date +%s); timeout 240 bash tools/device-check.sh anchor-core > /tmp/core.log 2>&1; echo "anchor-core rc=$? $(( $(date +%s) - t )) s"
grep -E "fast|torch|user|seed|first|copy" "$OUT/anchor-core.txt" | cut -c1-70,200-260
t=$(date +%s); timeout 95 python3 tools/fast_write_bench.py > "$OUT/writers.txt" 2>&1; echo "writers rc=$? $(( $(date +%s) - t )) s"
grep -E "copy shader|\[fast\]|seed layout \(default" "$OUT/writers.txt" | sed -E 's/^(.{0,40}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
t=$(date +%s); timeout 200 python3 -m pytest tests/test_fast_writers.py tests/test_fast_decode_kivi.py tests/test_live_kivi.py -q -p no:cacheprovider 2>&1 | tail -2 > "$OUT/conformance.txt"; echo "suites rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance.txt"
t=$(date +%s); timeout 100 python3 -m pytest tests/test_lab_slots_more.py tests/test_lab.py -k "kivi or writer" -q -p no:cacheprovider 2>&1 | tail -2 > "$OUT/conformance-lab.txt"; echo "lab suites rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance-lab.txt"
