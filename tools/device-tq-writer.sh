# Device run (H200): the fast TurboQuant writer (kvviz/kernels/fast_write_tq.py). Its conformance suite and the paged
# decode's (whose writer test covers the general compressor), the writer at 4 / 8 / 16 lanes a row beside
# tq_general_compress and tq_compress with its words checked against the general compressor's on the device
# (tools/tq_writer_lanes.py), then the method's timed kernels (tools/time_method_kernels.py) at the anchor.
source tools/device-env.sh
step() { local s=$(date +%s) t=$1 f=$2; shift 2; timeout "$t" "$@" 2>&1 | grep -v XDG_RUNTIME > "$OUT/$f"; echo "## $f: rc=${PIPESTATUS[0]} $(( $(date +%s) - s )) s" | tee -a "$OUT/$f"; }
step 90 conformance.txt python3 -m pytest tests/test_fast_write_tq.py tests/test_fast_decode_tq_paged.py -q -p no:cacheprovider
tail -4 "$OUT/conformance.txt"
for s in decode-15x4096 decode-1x61440; do step 45 "lanes-$s.txt" python3 tools/tq_writer_lanes.py --shape $s; cat "$OUT/lanes-$s.txt"; done
step ${KERNELS_TIMEOUT:-50} kernels-decode-15x4096.txt python3 tools/time_method_kernels.py --shape decode-15x4096 turboquant
cat "$OUT/kernels-decode-15x4096.txt"
