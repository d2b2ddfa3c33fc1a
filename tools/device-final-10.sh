# Device run (H200), 2026-12-01 (session 10, final): the anchor bench (tools/device-check.sh anchor-core: the README's
# decode table, seed / fast / f16 / torch in one run), every writer at the anchor (tools/fast_write_bench.py), then this
# session's new decode tests on the H200. It ran before the int8 codes took the f16-pair route (fast_decode.I8X4_VIA_F16):
# its int8 rows are the 2^23 trick's; tools/device-final-10b.sh ran the anchor bench again with the final code.
source tools/device-env.sh
t=$(date +%s); timeout 240 bash tools/device-check.sh anchor-core > /tmp/core.log 2>&1; echo "anchor-core rc=$? $(( $(date +%s) - t )) s"
grep -E "fast|torch|user|seed|first|copy" "$OUT/anchor-core.txt" | cut -c1-70,200-260
t=$(date +%s); timeout 100 python3 tools/fast_write_bench.py > /tmp/writers.txt 2>&1; echo "writers rc=$? $(( $(date +%s) - t )) s"
grep -E "copy shader|\[fast\]|seed layout \(default" /tmp/writers.txt | sed -E 's/^(.{0,40}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/' | tee "$OUT/writers-lines.txt"
t=$(date +%s); timeout 150 python3 -m pytest tests/test_fast_decode.py -k "reduce_partitions or block_ids or prefetch_layouts or partitions_single" -q -p no:cacheprovider 2>&1 | tail -2; echo "tests $(( $(date +%s) - t )) s"
