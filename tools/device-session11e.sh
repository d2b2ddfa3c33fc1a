# Device run (H200), session 11: the conformance suites of the fast decodes that now take the wide reduce from 9
# partitions (fast/decode_reduce_wide.wgsl: per-token formats, KIVI, llama.cpp types, NVFP4), the long-context tests
# and the Kernel lab's Qt-free tests (its fast.reduce / fast.reduce_wide slots), each with its own timeout.
source tools/device-env.sh
step() { local s=$(date +%s) t=$1 f=$2; shift 2; timeout "$t" "$@" 2>&1 | grep -v XDG_RUNTIME > "$OUT/$f"; echo "## $f: rc=${PIPESTATUS[0]} $(( $(date +%s) - s )) s" | tee -a "$OUT/$f"; tail -4 "$OUT/$f"; }
step 200 fast-decodes.txt python3 -m pytest tests/test_fast_decode.py tests/test_fast_decode_kivi.py tests/test_fast_decode_ggml.py tests/test_fast_decode_nvfp4.py tests/test_fast_decode_variants.py -q -p no:cacheprovider
step 120 long-and-lab.txt python3 -m pytest tests/test_long_context.py tests/test_lab.py -q -p no:cacheprovider
