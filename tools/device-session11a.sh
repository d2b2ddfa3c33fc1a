# Device run (H200), session 11: session 10's chunked reduces (fast/decode_reduce.wgsl and fast/decode_tq_reduce.wgsl:
# the partitions 8 at a time) timed where one sequence has many partitions, against the one-load-a-step reduces of
# commit 3d0f93e, interleaved, two passes: TurboQuant's paged decode at 1 x 61440 (tools/tq_paged_vs_seq.py) and the
# int8 / f16 decodes at 1 x 131072 (tools/fast_decode_tune.py --split: split alone and split + reduce). Then the
# context and batch sweeps with this session's code (JSON for assets/bench).
# tools/ab-old11 (not committed) held the old side; from a checkout:
#   mkdir -p tools/ab-old11 && for f in decode_reduce.wgsl decode_tq_reduce.wgsl; do git show 3d0f93e:shaders/fast/$f > tools/ab-old11/$f; done
# (Written with device-env.sh's ab_save / ab_use after it ran, the same steps.)
source tools/device-env.sh
R="shaders/fast/decode_reduce.wgsl shaders/fast/decode_tq_reduce.wgsl"
ab_save $R
for pass in 1 2; do
  for v in new old; do
    if [ $v = old ]; then ab_use tools/ab-old11 $R; else ab_use /tmp/new $R; fi
    timeout 60 python3 tools/tq_paged_vs_seq.py --shape decode-1x61440 2>&1 | grep -E "^decode" | cut -c1-90 | sed "s/^/tq $v $pass: /"
    timeout 90 python3 tools/fast_decode_tune.py 1 131072 scattered int8,f16 --split > "/tmp/dec-$v-$pass.txt" 2>&1; echo "dec $v $pass rc=$?"
    grep -E "^(int8|f16) " "/tmp/dec-$v-$pass.txt" | sed "s/^/$v $pass: /"
  done
done > "$OUT/reduce-ab.txt"
ab_use /tmp/new $R
cat "$OUT/reduce-ab.txt"; tail -5 /tmp/dec-new-1.txt
for s in context batch; do
  t=$(date +%s); timeout 200 python3 -m kvviz bench --sweep $s --json "$OUT/sweep-$s.json" > "$OUT/sweep-$s.txt" 2>&1; echo "$s rc=$? $(( $(date +%s) - t )) s"
done
tail -12 "$OUT/sweep-context.txt"; tail -10 "$OUT/sweep-batch.txt"
