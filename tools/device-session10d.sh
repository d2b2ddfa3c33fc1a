# Device run (H200), session 10: int8 codes -> f32 by f16 pairs (fast_decode.I8X4_VIA_F16, --i8-f16=on) against the
# 2^23 trick alone (--i8-f16=off), for the exact int8 decode and the int8-query variant, 2 and 4 tokens a row per step,
# twice, interleaved; then tools/decode_diag.py (where the exact int8 decode's time goes) with the new conversion.
source tools/device-env.sh
T=tools/fast_decode_tune.py
for pass in 1 2; do
  for v in on off; do
    timeout 120 python3 $T 15 4096 scattered int8 --split --i8-f16=$v --qk=f32,i8 --unroll=2,4 > /tmp/cv-$v-$pass.txt 2>&1; echo "i8-f16 $v $pass rc=$?"
    grep -E "^int8 " /tmp/cv-$v-$pass.txt | sed "s/^/$v $pass: /"
  done
done
timeout 100 python3 tools/decode_diag.py 1 2>&1 | grep -E "pass"
