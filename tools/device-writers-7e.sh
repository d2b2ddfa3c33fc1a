# Device run (H200), 2026-12-01 (session 7): the ggml writers a lane a block where a word-aligned unit of blocks
# (2 for q8_0 / q4_0 / q5_0 / iq4_nl, 4 for mxfp4) fits the smallest subgroup, the word two blocks share handed
# over by subgroupShuffleDown; the KIVI key-group writer's row loops two / four rows a step (their loads issued
# together). Timed against the previous files on the same machine (exp-ab/: HEAD's copies, swapped in for the
# second run), then the suites of those writers on the H200.
# exp-ab/ (not in the repository) held f0cb7e5's shaders/fast/write_ggml.wgsl, shaders/fast/write_kivi_kgroup.wgsl
# and kvviz/kernels/fast_write_ggml.py; the new files: e426642's, but for RU = 2 rows a step at 2-bit in the KIVI one.
source tools/device-env.sh
t=$(date +%s); timeout 150 python3 tools/fast_write_bench.py > "$OUT/writers-new.txt" 2>&1; echo "writers new rc=$? $(( $(date +%s) - t )) s"
mkdir -p /tmp/new && cp -r shaders kvviz /tmp/new/ && cp -r exp-ab/* . && rm -rf /tmp/kvviz-cache
t=$(date +%s); timeout 150 python3 tools/fast_write_bench.py > "$OUT/writers-old.txt" 2>&1; echo "writers old rc=$? $(( $(date +%s) - t )) s"
cp -r /tmp/new/shaders /tmp/new/kvviz . && rm -rf /tmp/kvviz-cache
t=$(date +%s); timeout 200 python3 -m pytest tests/test_fast_write_ggml.py tests/test_ggml_formats.py tests/test_fast_writers.py -q -p no:cacheprovider -k "ggml or kivi" 2>&1 | tail -3 > "$OUT/conformance.txt"; echo "conformance rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance.txt"
ab() { grep -E "\[fast\]|seed layout \(default" "$1" | sed -E 's/^(.{0,40}).* ([0-9.]+) us .*/\2 \1/'; }
paste <(ab "$OUT/writers-new.txt") <(ab "$OUT/writers-old.txt" | cut -d" " -f1)
