# Device run (H200), session 13: (1) what the adapter offers through wgpu (features, among them "cooperative-matrix",
# wgpu's tensor-core path, which its Vulkan backend exposes only where the driver lists 8x8 f32 matrices);
# (2) the per-tensor writers (FP8 per-tensor, NVFP4) with the writer pass's row blocks in grid order against reversed
# (fast_write.REVERSE_ROWS), two interleaved passes; (3) the per-tensor writers' tests on the H200. The reversed order and its
# --rev-rows flag measured no gain and were removed before committing, so this script no longer runs as written; its output is
# assets/bench/h200-2026-12-02-per-tensor-row-order-13.txt.
source tools/device-env.sh
python3 - <<'PY' 2>&1 | tee "$OUT/adapter.txt"
import wgpu
a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
print(dict(a.info))
print("features:", sorted(a.features))
print("cooperative-matrix offered:", "cooperative-matrix" in a.features)
print("limits:", {k: v for k, v in sorted(a.limits.items()) if "workgroup" in k or "invocation" in k or "binding" in k})
PY
timeout 240 python3 tools/fast_write_bench.py 15 4096 --methods=nvfp4,fp8_e4m3 --rev-rows=off,on,off,on 2>&1 | grep -v "^fast int8\|^int8 seed" | tee "$OUT/rev-rows.txt"
timeout 150 python3 -m pytest tests/test_fast_writers.py -q -p no:cacheprovider -k "either_row_order or per_tensor" 2>&1 | tail -2 | tee "$OUT/writer-tests.txt"
timeout 120 python3 -m pytest tests/test_fast_write_ggml.py -q -p no:cacheprovider -k nvfp4 2>&1 | tail -2 | tee -a "$OUT/writer-tests.txt"
