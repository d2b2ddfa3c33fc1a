# Device run (H200), 2026-12-01 (session 7): the writers' exact path moved out of the unrolled main loop (branch-free
# round_mul4 / asym_codes4_fast, unsure words redone after it: int8_token, int4, KIVI, FP8 through write_redo.wgsl),
# timed against the previous shaders on the same machine (exp-ab/: HEAD's copies, swapped in for the second run),
# then the writers' conformance suites on the H200.
# exp-ab/ (not in the repository) held 3427b48's shaders/fast/{write_common,write_fp8,write_int8,write_int4,
# write_kivi_tok,write_kivi_kgroup}.wgsl, made with `git show 3427b48:<path>` before the run; the new files: 6f9081b's.
source tools/device-env.sh
t=$(date +%s); timeout 150 python3 tools/fast_write_bench.py > "$OUT/writers-new.txt" 2>&1; echo "writers new rc=$? $(( $(date +%s) - t )) s"
mkdir -p /tmp/new && cp shaders/fast/write_*.wgsl /tmp/new/ && cp exp-ab/fast/*.wgsl shaders/fast/ && rm -rf /tmp/kvviz-cache
t=$(date +%s); timeout 150 python3 tools/fast_write_bench.py > "$OUT/writers-old.txt" 2>&1; echo "writers old rc=$? $(( $(date +%s) - t )) s"
cp /tmp/new/*.wgsl shaders/fast/ && rm -rf /tmp/kvviz-cache
t=$(date +%s); timeout 200 python3 -m pytest tests/test_fast_writers.py tests/test_fast_fp8_codes.py -q -p no:cacheprovider 2>&1 | tail -3 > "$OUT/conformance.txt"; echo "conformance rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance.txt"
ab() { grep -E "\[fast\]|seed layout \(default" "$1" | sed -E 's/^(.{0,40}).* ([0-9.]+) us .*/\2 \1/'; }
paste <(ab "$OUT/writers-new.txt") <(ab "$OUT/writers-old.txt" | cut -d" " -f1)
