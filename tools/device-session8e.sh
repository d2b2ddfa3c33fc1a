# Device run (H200), session 8: the per-tensor amax pass (write_fp8_amax.wgsl: the slot and the values now loaded
# together) at 1, 4, 16 and 64 row blocks a workgroup (fast_write.AMAX_BLOCKS), for NVFP4 and FP8 per-tensor,
# dispatch by dispatch; then q8_0 with its roundf default (Q8_TRUNC) against the bit-level form.
source tools/device-env.sh
for n in 1 4 16 64 4; do
  timeout 100 python3 tools/fast_write_bench.py --methods=nvfp4,fp8_e4m3 --per-dispatch --amax-blocks=$n > "$OUT/amax-$n.txt" 2>&1; echo "amax blocks $n rc=$?"
  grep -E "copy shader|\[fast\]|^  [0-9]: fast" "$OUT/amax-$n.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
done
for f in "" --no-q8-trunc; do
  timeout 60 python3 tools/fast_write_bench.py --methods=q8_0 $f > "$OUT/q8$f.txt" 2>&1; echo "q8_0 $f rc=$?"
  grep -E "\[fast\]" "$OUT/q8$f.txt" | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/'
done
