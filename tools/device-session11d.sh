# Device run (H200), session 11: the reduce as committed (fast_decode.reduce_spec: decode_reduce.wgsl up to 8
# partitions, decode_reduce_wide.wgsl from 9) against decode_reduce.wgsl for every count ("chunked", session 10's
# reduce; tools/reduce_pick_run.py), interleaved, two passes, at 4 x 4096 (15 partitions) and 1 x 131072 (60), int8
# and f16 (split + reduce, and the split alone). Then the context and batch sweeps (JSON for assets/bench).
source tools/device-env.sh
for pass in 1 2; do
  for v in picked chunked; do
    if [ $v = chunked ]; then run="tools/reduce_pick_run.py chunked"; else run=""; fi
    for sh in "4 4096" "1 131072"; do
      timeout 60 python3 $run tools/fast_decode_tune.py $sh scattered int8,f16 --split > /tmp/dec.txt 2>&1; echo "dec $v $pass $sh rc=$?"
      grep -E "^(int8|f16) " /tmp/dec.txt | cut -c1-6,70-150 | sed "s/^/$v $pass $sh: /"
    done
  done
done > "$OUT/reduce-ab.txt"
cat "$OUT/reduce-ab.txt"
for s in context batch; do
  t=$(date +%s); timeout 200 python3 -m kvviz bench --sweep $s --json "$OUT/sweep-$s.json" > "$OUT/sweep-$s.txt" 2>&1; echo "$s rc=$? $(( $(date +%s) - t )) s"
done
tail -12 "$OUT/sweep-context.txt"; tail -10 "$OUT/sweep-batch.txt"
