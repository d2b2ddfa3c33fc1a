# Device run (H200), 2026-12-01 (session 7): the ggml writers (q8_0 .. mxfp4) loading their rows coalesced through workgroup memory,
# timed against the previous shader on the same machine (exp-ab/: HEAD's copy, swapped in for the second run),
# then the writers' conformance suites on the H200.
# exp-ab/ (not in the repository) held 6f9081b's write_ggml.wgsl; the staged shader timed as new is the diff at the
# end of assets/bench/h200-2026-12-01-ggml-staging-experiment.txt (applied to 6f9081b).
source tools/device-env.sh
t=$(date +%s); timeout 150 python3 tools/fast_write_bench.py > "$OUT/writers-new.txt" 2>&1; echo "writers new rc=$? $(( $(date +%s) - t )) s"
mkdir -p /tmp/new && cp shaders/fast/write_ggml.wgsl /tmp/new/ && cp exp-ab/fast/*.wgsl shaders/fast/ && rm -rf /tmp/kvviz-cache
t=$(date +%s); timeout 150 python3 tools/fast_write_bench.py > "$OUT/writers-old.txt" 2>&1; echo "writers old rc=$? $(( $(date +%s) - t )) s"
cp /tmp/new/*.wgsl shaders/fast/ && rm -rf /tmp/kvviz-cache
t=$(date +%s); timeout 200 python3 -m pytest tests/test_fast_write_ggml.py tests/test_ggml_formats.py -q -p no:cacheprovider 2>&1 | tail -3 > "$OUT/conformance.txt"; echo "conformance rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance.txt"
ab() { grep -E "\[fast\]|seed layout \(default" "$1" | sed -E 's/^(.{0,40}).* ([0-9.]+) us .*/\2 \1/'; }
paste <(ab "$OUT/writers-new.txt") <(ab "$OUT/writers-old.txt" | cut -d" " -f1)
