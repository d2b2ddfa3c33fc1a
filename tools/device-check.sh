#!/usr/bin/env bash
# Runs on the lent GPU machine (see ../shared/tools/device-prep.sh): kernel conformance through both
# GLSL front ends, then the benchmark at the performance-anchor shape. Results land in $OUT.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/kvviz-cache
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L
python3 -m kvviz info 2>&1 | tee "$OUT/info.txt"
for t in "$@"; do
  case "$t" in
    conformance)
      python3 -m pytest tests/test_paged_conformance.py -q -p no:cacheprovider 2>&1 | tail -4 | tee "$OUT/conformance_glslang.txt"
      KVVIZ_GLSL_FRONTEND=naga-glsl python3 -m pytest tests/test_paged_conformance.py -q -p no:cacheprovider -x --tb=line 2>&1 | tail -8 | tee "$OUT/conformance_naga.txt" ;;
    long)
      python3 -m pytest tests/test_long_context.py -q -p no:cacheprovider -rs 2>&1 | tail -8 | tee "$OUT/long_context.txt"
      python3 tools/long_context_sweep.py 2>&1 | tee "$OUT/long_context_sweep.txt" ;;
    methods)
      python3 -m pytest tests/test_quant_methods.py tests/test_turboquant.py -q -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/methods.txt" ;;
    fast)
      python3 -m pytest tests/test_fast_decode.py -q -p no:cacheprovider 2>&1 | tail -6 | tee "$OUT/fast_decode.txt" ;;
    live)
      python3 -m pytest tests/test_live_model.py tests/test_live_decode.py -q -p no:cacheprovider -m "not slow" 2>&1 | tail -15 | tee "$OUT/live.txt" ;;
    bench)
      python3 -m kvviz bench --shape decode-15x4096 --compare-torch --json "$OUT/bench_h200.json" 2>&1 | tee "$OUT/bench_h200.txt" ;;
    anchor-core)  # seed, first-wave, fast, f16, torch and two user kernels from `kvviz kernel new`, one run
      python3 -m kvviz kernel new int8_token.writer_fast /tmp/mine_writer.wgsl
      python3 -m kvviz kernel new fast.decode_f32 /tmp/mine_decode.wgsl
      python3 -m kvviz bench --shape decode-15x4096 --compare-torch --frontends glslang \
        --methods f16,int8_token,fp8_e4m3,fp8_e5m2,int4_group \
        --kernel int8_token.writer_fast=/tmp/mine_writer.wgsl --kernel fast.decode_f32=/tmp/mine_decode.wgsl \
        --json "$OUT/anchor-core.json" 2>&1 | tee "$OUT/anchor-core.txt" ;;
    anchor-methods)  # the other methods one bench each (a slow oracle cannot take the others with it)
      for m in ${KVVIZ_METHODS:-q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl mxfp4 nvfp4 vllm_fp8_e4m3 vllm_fp8_e5m2 kivi turboquant}; do
        s=$(date +%s)
        timeout "${KVVIZ_METHOD_TIMEOUT:-150}" python3 -m kvviz bench --shape decode-15x4096 --frontends glslang --methods "$m" \
          --json "$OUT/anchor-$m.json" > "$OUT/anchor-$m.txt" 2>&1
        echo "$m: rc=$? $(( $(date +%s) - s )) s"
      done ;;
    bench-core)
      python3 -m kvviz bench --shape decode-15x4096 --compare-torch --no-methods --json "$OUT/bench_h200.json" 2>&1 | tee "$OUT/bench_h200.txt" ;;
  esac
done
