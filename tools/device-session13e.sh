# Device run (H200), session 13: the anchor bench without the methods' rows (seed, f32 baseline, the fast decodes of
# the seed layout and f32, the int8-query variant, torch SDPA bf16) and the context and batch sweeps, each now with
# the timing frame's floor measured in the same run (kvviz.kernels.fma.measure_timing_floor); JSON for assets/bench.
source tools/device-env.sh
t=$(date +%s); timeout 240 python3 -m kvviz bench --shape decode-15x4096 --compare-torch --frontends glslang --no-methods \
  --json "$OUT/anchor-floor.json" > "$OUT/anchor-floor.txt" 2>&1; echo "anchor rc=$? $(( $(date +%s) - t )) s"
grep -E "timing_floor|copy_shader|fast_decode|paged_attn_q8 |torch" "$OUT/anchor-floor.txt" | cut -c1-60,150-230
for s in context batch; do
  t=$(date +%s); timeout 230 python3 -m kvviz bench --sweep $s --json "$OUT/sweep-$s.json" > "$OUT/sweep-$s.txt" 2>&1; echo "$s rc=$? $(( $(date +%s) - t )) s"
done
grep -h "floor" "$OUT"/sweep-*.txt; tail -9 "$OUT/sweep-context.txt" | cut -c1-250; tail -8 "$OUT/sweep-batch.txt" | cut -c1-250
