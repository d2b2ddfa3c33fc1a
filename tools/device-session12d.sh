# Device run (H200), session 12: partition length where the grid is far from full (one sequence, or a few): the
# planner's pt (min_tokens = 256) against 32 .. 256 tokens a partition, int8 and f16, split + reduce.
source tools/device-env.sh
for sh in "1 512" "1 4096" "1 16384" "2 4096" "4 4096" "8 4096" "1 65536"; do
  timeout 100 python3 tools/fast_decode_tune.py $sh scattered int8,f16 --pt=0,32,64,128,256 > /tmp/t.txt 2>&1; echo "== $sh rc=$?"
  grep -E "^(int8|f16) " /tmp/t.txt | sed -E 's/ +checks=True +/ /; s/error (.{8}) ok.*/\1 ok/'
done 2>&1 | tee "$OUT/short-partitions.txt"
