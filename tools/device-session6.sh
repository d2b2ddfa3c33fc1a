# Device run (H200), 2026-12-01 (session 6): the sweeps with the current kernels (context 512..131072 tokens of one
# sequence, batch 1..64 sequences of 4096; JSON for assets/bench) and the fast kernels' conformance suites on the H200.
source tools/device-env.sh
for s in context batch; do
  t=$(date +%s); timeout 250 python3 -m kvviz bench --sweep $s --json "$OUT/sweep-$s.json" > "$OUT/sweep-$s.txt" 2>&1
  echo "sweep $s rc=$? $(( $(date +%s) - t )) s"
done
t=$(date +%s)
timeout 280 python3 -m pytest tests/test_fast_decode.py tests/test_fast_decode_ggml.py tests/test_fast_decode_kivi.py \
  tests/test_fast_decode_nvfp4.py tests/test_fast_decode_tq.py tests/test_fast_decode_tq_paged.py tests/test_fast_decode_variants.py \
  tests/test_fast_writers.py tests/test_fast_write_tq.py -q -p no:cacheprovider 2>&1 | tail -4 > "$OUT/conformance.txt"
echo "conformance rc=$? $(( $(date +%s) - t )) s"; cat "$OUT/conformance.txt"
tail -12 "$OUT/sweep-context.txt" | cut -c1-200; tail -10 "$OUT/sweep-batch.txt" | cut -c1-200
