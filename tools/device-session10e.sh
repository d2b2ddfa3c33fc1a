# Device run (H200), session 10: each step's P.V one step late, beside the next step's logits (fast_decode.PV_SKEW,
# --skew=on) against in its own step (--skew=off), for the exact int8, f16 and int4 decodes and the int8-query variant
# at 4 tokens a row per step, twice, interleaved.
# --skew was an experimental flag of tools/fast_decode_tune.py; the variant measured slower and was removed before
# commit, so this script no longer runs as it did (fast_decode.py records the figures).
source tools/device-env.sh
T=tools/fast_decode_tune.py
for pass in 1 2; do
  for v in on off; do
    timeout 100 python3 $T 15 4096 scattered int8,f16,int4 --split --skew=$v > /tmp/sk-$v-$pass.txt 2>&1; echo "skew $v $pass rc=$?"
    grep -E "^(int8|f16|int4) " /tmp/sk-$v-$pass.txt | sed "s/^/$v $pass: /"
    timeout 60 python3 $T 15 4096 scattered int8 --split --skew=$v --qk=i8 --unroll=4 > /tmp/ski-$v-$pass.txt 2>&1; echo "skew i8 $v $pass rc=$?"
    grep -E "^int8 " /tmp/ski-$v-$pass.txt | sed "s/^/$v $pass: /"
  done
done
