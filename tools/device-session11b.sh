# Device run (H200), session 11: the reduces' partitions spread over 4 groups of 64 threads, 64 partitions a step with
# every load of a step issued together and one meeting in workgroup memory (fast/reduce_partitions.wgsl; "wide")
# against session 10's reduces (one 64- or 128-thread loop taking 8 partitions a step, twice: commit ddc3aae;
# "chunk8"), interleaved, two passes: TurboQuant's paged decode at 1 x 61440, the int8 / f16 decodes at 1 x 131072
# and at the anchor shape (split + reduce, and the split alone). Then the context and batch sweeps (JSON for
# assets/bench). tools/ab-old11/chunk8 (not committed) held the old side; from a checkout:
#   mkdir -p tools/ab-old11/chunk8 && for f in decode_reduce.wgsl decode_tq_reduce.wgsl; do git show ddc3aae:shaders/fast/$f > tools/ab-old11/chunk8/$f; done
# It ran against a shared include, shaders/fast/reduce_partitions.wgsl, that both reduces used then; after 11c and
# 11d the wide reduce became its own file (fast/decode_reduce_wide.wgsl, 4 groups x 8, from 9 partitions) and
# TurboQuant's reduce stayed as it was, so this script no longer runs as it did (figures: assets/bench/h200-2026-12-01-reduce-ab-11.txt).
source tools/device-env.sh
mkdir -p /tmp/new && cp shaders/fast/decode_reduce.wgsl shaders/fast/decode_tq_reduce.wgsl /tmp/new/
red() { cp $1/decode_reduce.wgsl $1/decode_tq_reduce.wgsl shaders/fast/; }
for pass in 1 2; do
  for v in wide chunk8; do
    if [ $v = chunk8 ]; then red tools/ab-old11/chunk8; else red /tmp/new; fi
    timeout 60 python3 tools/tq_paged_vs_seq.py --shape decode-1x61440 2>&1 | grep -E "^decode" | cut -c1-90 | sed "s/^/tq $v $pass: /"
    for sh in "1 131072" "15 4096"; do
      timeout 90 python3 tools/fast_decode_tune.py $sh scattered int8,f16 --split > /tmp/dec.txt 2>&1; echo "dec $v $pass $sh rc=$?"
      grep -E "^(int8|f16) " /tmp/dec.txt | sed "s/^/$v $pass $sh: /"
    done
  done
done > "$OUT/reduce-ab.txt"
red /tmp/new
cat "$OUT/reduce-ab.txt"
for s in context batch; do
  t=$(date +%s); timeout 200 python3 -m kvviz bench --sweep $s --json "$OUT/sweep-$s.json" > "$OUT/sweep-$s.txt" 2>&1; echo "$s rc=$? $(( $(date +%s) - t )) s"
done
tail -12 "$OUT/sweep-context.txt"; tail -10 "$OUT/sweep-batch.txt"
