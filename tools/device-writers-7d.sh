# Device run (H200), 2026-12-01 (session 7): software-pipelined loads in the ggml writers (q8_0 .. mxfp4: the next
# block's 8 vec4s issued before a block is quantised) and the NVFP4 writer (the next group's), and the int4 writer's
# group statistics reduced by shuffles over their 4-lane span where the default takes workgroup memory; timed
# against the previous files on the same machine (exp-ab/: HEAD's copies, swapped in for the second run), then the
# suites of those writers on the H200.
# exp-ab/ (not in the repository) held 55efceb's shaders/fast/write_ggml.wgsl, shaders/fast/write_nvfp4.wgsl and
# kvviz/kernels/fast_write.py (`git show 55efceb:<path>`); the new files: f0cb7e5's.
source tools/device-env.sh
t=$(date +%s); timeout 150 python3 tools/fast_write_bench.py > "$OUT/writers-new.txt" 2>&1; echo "writers new rc=$? $(( $(date +%s) - t )) s"
mkdir -p /tmp/new && cp -r shaders kvviz /tmp/new/ && cp -r exp-ab/* . && rm -rf /tmp/kvviz-cache
t=$(date +%s); timeout 150 python3 tools/fast_write_bench.py > "$OUT/writers-old.txt" 2>&1; echo "writers old rc=$? $(( $(date +%s) - t )) s"
cp -r /tmp/new/shaders /tmp/new/kvviz . && rm -rf /tmp/kvviz-cache
t=$(date +%s); timeout 200 python3 -m pytest tests/test_fast_write_ggml.py tests/test_ggml_formats.py tests/test_fp4_formats.py tests/test_fast_writers.py -q -p no:cacheprovider -k "ggml or nvfp4 or int4 or fp4" 2>&1 | tail -3 > "$OUT/conformance.txt"; echo "conformance rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance.txt"
ab() { grep -E "\[fast\]|seed layout \(default" "$1" | sed -E 's/^(.{0,40}).* ([0-9.]+) us .*/\2 \1/'; }
paste <(ab "$OUT/writers-new.txt") <(ab "$OUT/writers-old.txt" | cut -d" " -f1)
