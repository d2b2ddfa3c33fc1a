#!/usr/bin/env bash
# kvviz's checks and measurements on a GPU machine, by named steps:
#
#   bash tools/gpu-machine.sh STEP [STEP ...]        e.g.  bash tools/gpu-machine.sh info conformance anchor
#
# On a machine without network access, run tools/gpu-prep.sh first where there is one and bring .whl/ and
# .gl/ along: where there is no .venv, this script installs them (the Debian packages unpacked into /, which
# needs root; the wheels into /tmp/kvviz-site) before the first step. With a .venv (`make setup`) it uses
# .venv/bin/python; PY=... overrides either. Results go to $OUT (default out/gpu), named as in assets/bench
# without the device prefix: copy one there as assets/bench/<device>-<name> to replace the recorded result.
#
# Steps (docs/benchmarks.md says which table each one reproduces):
#   info          the adapter, its limits, the loop limit, the shader compilers, the methods (info.txt)
#   conformance   the seed kernels' conformance suite through glslang, then through naga's GLSL front end
#                 (which fails on NVIDIA: not counted)
#   tests         the GPU suites of the fast kernels, the methods and long contexts (no Qt needed)
#   live          the live-model tests (SmolLM2 when installed, a tiny random model otherwise)
#   anchor        the anchor decode table: seed, first-wave, fast, f16, f32, torch SDPA and two user
#                 kernels from `kvviz kernel new`, one bench (anchor-decode.txt / .json)
#   floor         the anchor's core rows with the timing floor (anchor-timing-floor.txt / .json), the
#                 timing frame (timing-frame.txt) and a decode's fixed cost (fixed-cost-16x*.txt)
#   methods       the other methods' kernels at the anchor, timed without the end-to-end check
#                 (method-kernels.txt)
#   writers       every writer at the anchor, seed / first wave / fast (writers.txt)
#   sweeps        the context and the batch sweep (sweep-context.txt / .json, sweep-batch.txt / .json)
#   residency     how many split-kernel workgroups an SM holds (occupancy.txt)
#   diag          where the exact int8 decode's time goes (decode-diag.txt)
#   tensor-cores  whether wgpu lets a kernel use the tensor cores (tensor-cores.txt)
#   all           info conformance tests anchor floor methods writers sweeps residency diag tensor-cores
set -uo pipefail
cd "$(dirname "$0")/.."

steps=("$@")
[ ${#steps[@]} -eq 0 ] && { sed -n '2,29p' "$0"; exit 2; }
[ "${steps[*]}" = all ] && steps=(info conformance tests anchor floor methods writers sweeps residency diag tensor-cores)

if [ -x .venv/bin/python ]; then
  PY=${PY:-.venv/bin/python}
else
  if compgen -G ".gl/*.deb" >/dev/null; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/kvviz-site \
      .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/kvviz-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  PY=${PY:-python3}
fi
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kvviz-cache}
# NVIDIA's container runtime puts the Vulkan ICD here; the loader does not look there by itself.
nv_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$nv_icd" ] && [ -z "${VK_DRIVER_FILES:-}" ] && export VK_DRIVER_FILES=$nv_icd
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
ANCHOR=(--shape decode-15x4096 --frontends glslang)
PYTEST=(-m pytest -q -p no:cacheprovider)

run() {  # run NAME CMD...: the command's output to $OUT/NAME and the terminal, with its exit status and time
  local name=$1 t rc; shift
  t=$(date +%s)
  "$@" 2>&1 | tee "$OUT/$name"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || failed=1
  echo "== $name: rc=$rc, $(( $(date +%s) - t )) s"
}
failed=0

tensor_cores() {
  "$PY" - <<'EOF'
# Does the adapter offer wgpu's "cooperative-matrix" feature (WGSL coop_mat8x8 / coop_mat16x16), and does a
# device open with it? wgpu marks the feature experimental; wgpu-native's C API has no switch for
# experimental features, so where the device is refused no kernel here can use the tensor cores.
import wgpu
import kvviz.gpu.runtime as R
from kvviz.errors import GpuUnavailable
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
info = adapter.info
print(f"{info.get('device')} ({info.get('backend_type')}, driver {info.get('description')}), "
      f"wgpu-py {wgpu.__version__}, wgpu-native {wgpu.backends.wgpu_native.__version__}")
offered = "cooperative-matrix" in adapter.features
print("adapter offers cooperative-matrix:", offered)
if offered:
    R.WANTED_FEATURES = R.WANTED_FEATURES + ("cooperative-matrix",)
    try:
        rt = R.GpuRuntime()
        print("device opened with cooperative-matrix:", "cooperative-matrix" in rt.features)
    except GpuUnavailable as exc:
        print("device with cooperative-matrix refused:", " ".join(str(exc).split()))
EOF
}

for step in "${steps[@]}"; do
  case "$step" in
    info)
      command -v nvidia-smi >/dev/null && nvidia-smi -L
      run info.txt "$PY" -m kvviz info ;;
    conformance)
      run conformance-glslang.txt "$PY" "${PYTEST[@]}" tests/test_paged_conformance.py
      # The same grid through naga's GLSL front end: it miscompiles the seed kernels' barriers on NVIDIA, so
      # there it fails (the reason kvviz compiles GLSL with glslang); shown, not counted as a failure.
      ok=$failed
      KVVIZ_GLSL_FRONTEND=naga-glsl run conformance-naga-glsl.txt "$PY" "${PYTEST[@]}" -x --tb=line \
        tests/test_paged_conformance.py
      failed=$ok ;;
    tests)
      run tests.txt "$PY" "${PYTEST[@]}" tests/test_fast_decode.py tests/test_fast_decode_variants.py \
        tests/test_fast_decode_ggml.py tests/test_fast_decode_kivi.py tests/test_fast_decode_nvfp4.py \
        tests/test_fast_decode_tq.py tests/test_fast_decode_tq_paged.py tests/test_fast_writers.py \
        tests/test_fast_write_ggml.py tests/test_fast_write_tq.py tests/test_fast_fp8_codes.py \
        tests/test_quant_methods.py tests/test_turboquant.py tests/test_long_context.py ;;
    live)
      run live.txt "$PY" "${PYTEST[@]}" -m "not slow" tests/test_live_model.py tests/test_live_decode.py ;;
    anchor)
      "$PY" -m kvviz kernel new --force int8_token.writer_fast /tmp/mine_writer.wgsl
      "$PY" -m kvviz kernel new --force fast.decode_f32 /tmp/mine_decode.wgsl
      run anchor-decode.txt "$PY" -m kvviz bench "${ANCHOR[@]}" --compare-torch \
        --methods f16,int8_token,fp8_e4m3,fp8_e5m2,int4_group \
        --kernel int8_token.writer_fast=/tmp/mine_writer.wgsl --kernel fast.decode_f32=/tmp/mine_decode.wgsl \
        --json "$OUT/anchor-decode.json" ;;
    floor)
      run anchor-timing-floor.txt "$PY" -m kvviz bench "${ANCHOR[@]}" --compare-torch --no-methods \
        --json "$OUT/anchor-timing-floor.json"
      run timing-frame.txt "$PY" tools/timing_frame.py
      for ctx in 64 4096; do  # 16 sequences: 1 partition of 4 steps a workgroup, then the anchor's grid
        run "fixed-cost-16x$ctx.txt" "$PY" tools/decode_diag.py 2 16 "$ctx" --fixed
      done ;;
    methods)
      run method-kernels.txt "$PY" tools/time_method_kernels.py q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl mxfp4 nvfp4 \
        kivi kivi:bits=4,recent=0 turboquant ;;
    writers)
      run writers.txt "$PY" tools/fast_write_bench.py ;;
    sweeps)
      for s in context batch; do
        run "sweep-$s.txt" "$PY" -m kvviz bench --sweep "$s" --json "$OUT/sweep-$s.json"
      done ;;
    residency)
      run occupancy.txt "$PY" tools/residency_probe.py 1024 int8,f16,i8q ;;
    diag)
      run decode-diag.txt "$PY" tools/decode_diag.py 2 ;;
    tensor-cores)
      run tensor-cores.txt tensor_cores ;;
    *)
      echo "gpu-machine.sh: unknown step '$step' (steps: info conformance tests live anchor floor methods" \
           "writers sweeps residency diag tensor-cores all)" >&2
      exit 2 ;;
  esac
done
exit $failed
