# Device run (H200), session 11: the reduce's shapes (fast/reduce_partitions.wgsl: GROUPS groups of 64 threads, CHUNK
# partitions a group a step, one online pass) each forced for every partition count (tools/reduce_shape_run.py),
# beside session 10's reduce (commit ddc3aae: one 64-thread loop, 8 partitions a step, two passes; "chunk8"), at
# 15 x 4096 (4 partitions), 4 x 4096 (15) and 1 x 131072 (60), int8 and f16 (split + reduce, and the split alone);
# then TurboQuant's paged decode with the shapes chosen by fast_decode.REDUCE_SHAPES ("auto") and chunk8 at
# 15 x 4096 and 1 x 61440, two passes. tools/ab-old11/chunk8 (not committed) held the old side; from a checkout:
#   mkdir -p tools/ab-old11/chunk8 && for f in decode_reduce.wgsl decode_tq_reduce.wgsl; do git show ddc3aae:shaders/fast/$f > tools/ab-old11/chunk8/$f; done
# It ran against the include shaders/fast/reduce_partitions.wgsl with GROUPS / CHUNK defines and a wrapper,
# tools/reduce_shape_run.py, that forced one shape; both were replaced by fast/decode_reduce_wide.wgsl and
# tools/reduce_pick_run.py, so this script no longer runs as it did (figures: assets/bench/h200-2026-12-01-reduce-ab-11.txt).
source tools/device-env.sh
mkdir -p /tmp/new && cp shaders/fast/decode_reduce.wgsl shaders/fast/decode_tq_reduce.wgsl /tmp/new/
red() { cp $1/decode_reduce.wgsl $1/decode_tq_reduce.wgsl shaders/fast/; }
for v in chunk8 1:8 4:8 4:16; do
  if [ $v = chunk8 ]; then red tools/ab-old11/chunk8; run=""; else red /tmp/new; run="tools/reduce_shape_run.py $v"; fi
  for sh in "15 4096" "4 4096" "1 131072"; do
    timeout 60 python3 $run tools/fast_decode_tune.py $sh scattered int8,f16 --split > /tmp/dec.txt 2>&1; echo "dec $v $sh rc=$?"
    grep -E "^(int8|f16) " /tmp/dec.txt | cut -c1-6,70-110 | sed "s/^/$v $sh: /"
  done
done > "$OUT/reduce-shapes.txt"
for pass in 1 2; do
  for v in auto chunk8; do
    if [ $v = chunk8 ]; then red tools/ab-old11/chunk8; else red /tmp/new; fi
    timeout 60 python3 tools/tq_paged_vs_seq.py 2>&1 | grep -E "^decode" | cut -c1-60 | sed "s/^/tq $v $pass: /"
  done
done >> "$OUT/reduce-shapes.txt"
red /tmp/new
cat "$OUT/reduce-shapes.txt"
