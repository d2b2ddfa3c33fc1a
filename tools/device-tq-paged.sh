# Device run (H200): TurboQuant's paged fast decode. Its conformance suite (and the per-sequence one's), the paged
# decode beside the per-sequence fast decode at the anchor and at 1 x 61440 (tools/tq_paged_vs_seq.py), the method's
# timed kernels at both shapes (tools/time_method_kernels.py), then kvviz bench at the anchor and at 1 x 61440
# (each step with its own timeout; what finished is in $OUT).
source tools/device-env.sh
step() { local s=$(date +%s) t=$1 f=$2; shift 2; timeout "$t" "$@" 2>&1 | grep -v XDG_RUNTIME > "$OUT/$f"; echo "## $f: rc=${PIPESTATUS[0]} $(( $(date +%s) - s )) s" | tee -a "$OUT/$f"; }
step 60 conformance.txt python3 -m pytest tests/test_fast_decode_tq_paged.py tests/test_fast_decode_tq.py -q -p no:cacheprovider
tail -4 "$OUT/conformance.txt"
step 45 paged-vs-seq.txt python3 tools/tq_paged_vs_seq.py
cat "$OUT/paged-vs-seq.txt"
for s in decode-15x4096 decode-1x61440; do step 30 "kernels-$s.txt" python3 tools/time_method_kernels.py --shape $s turboquant; cat "$OUT/kernels-$s.txt"; done
for s in decode-15x4096 decode-1x61440; do step ${BENCH_TIMEOUT:-50} "bench-$s.txt" python3 -m kvviz bench --shape $s --methods turboquant --frontends glslang; grep -E "^==|tq|turboquant|copy_shader|## " "$OUT/bench-$s.txt"; done
