# Device run (H200), session 10: A/Bs of three changes, interleaved, two passes each, at the anchor shape.
#  1. fast/decode_reduce.wgsl: the partitions CHUNK at a time, loads issued together (old: one loop step a partition);
#  2. each token's block-table entry loaded a step before its words, then a switch for every format (--bt-ahead=off:
#     old; now fast_decode.BT_AHEAD_FORMATS);
#     and the prefetch two steps ahead (--depth=2, fast_decode.PREFETCH_DEPTH);
#  3. the NVFP4 writer's group loop and staged-store loop, and write_ggml's staged-store loop, unrolled.
# Then a layout sweep of the exact int8 decode (rows, tokens a row per step).
# tools/ab-old10 (not committed) held commit 3d0f93e's files, the old side; from a checkout: mkdir -p tools/ab-old10 &&
#   for f in shaders/fast/decode_reduce.wgsl shaders/fast/write_nvfp4.wgsl shaders/fast/write_ggml.wgsl; do git show 3d0f93e:$f > tools/ab-old10/$(basename $f); done
# --depth=2 was an experimental flag of tools/fast_decode_tune.py (the prefetch two steps ahead); it measured slower and
# was removed before commit, so that step of this script no longer runs as it did (fast_decode.py records the figures).
source tools/device-env.sh
mkdir -p /tmp/new && cp shaders/fast/decode_reduce.wgsl shaders/fast/write_nvfp4.wgsl shaders/fast/write_ggml.wgsl /tmp/new/
red() { cp $1/decode_reduce.wgsl shaders/fast/; }
wr() { cp $1/write_nvfp4.wgsl $1/write_ggml.wgsl shaders/fast/; }
T=tools/fast_decode_tune.py
for pass in 1 2; do
  for v in new nobt oldred d2; do
    red /tmp/new; fl=""
    [ $v = nobt ] && fl="--bt-ahead=off"
    [ $v = d2 ] && fl="--depth=2"
    [ $v = oldred ] && red tools/ab-old10
    timeout 150 python3 $T 15 4096 scattered int8,f16,int4 --split $fl > "$OUT/dec-$v-$pass.txt" 2>&1; echo "dec $v $pass rc=$?"
    grep -E "^(int8|f16|int4) " "$OUT/dec-$v-$pass.txt" | sed "s/^/$v $pass: /"
  done
done
red /tmp/new
for pass in 1 2; do
  for v in new old; do
    if [ $v = old ]; then wr tools/ab-old10; else wr /tmp/new; fi
    timeout 90 python3 tools/fast_write_bench.py --methods=nvfp4,q8_0,q4_0,q5_1,mxfp4 > /tmp/wr-$v-$pass.txt 2>&1; echo "wr $v $pass rc=$?"
    grep -E "copy shader|\[fast\]" /tmp/wr-$v-$pass.txt | sed -E 's/^(.{0,50}).*(  [0-9.]+ us .*) \(gpu.*/\1 \2/' | sed "s/^/$v $pass: /"
  done
done
wr /tmp/new
timeout 100 python3 $T 15 4096 scattered int8 --split --rows=8,16 --unroll=2,4 --budget=80 > "$OUT/sweep.txt" 2>&1; echo "sweep rc=$?"
grep -E "^int8 " "$OUT/sweep.txt"
