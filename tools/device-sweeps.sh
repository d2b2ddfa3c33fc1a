# Device run (H200): the context sweep (1 sequence, 512..131072 tokens) and the batch sweep (1..64 sequences of
# 4096) of the seed and fast decodes, JSON for assets/bench.
source tools/device-env.sh
for s in context batch; do
  timeout 280 python3 -m kvviz bench --sweep $s --json "$OUT/sweep-$s.json" > "$OUT/sweep-$s.txt" 2>&1; echo "$s rc=$?"
done
tail -30 "$OUT/sweep-context.txt"; tail -30 "$OUT/sweep-batch.txt"
